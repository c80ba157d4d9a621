"""Vector blocks written as LLVM IR, for loops that LLVM's vectorizer compiles badly:
the 3-tap stride-2 average forward (:func:`sum3_stride2_block`), and the short rows of
the tiled max backward (:func:`route2_block`) and forwards (:func:`max2_block`), at the
end of this module.

A window of 3 taps at stride 2 along W reads ``x[r + 2*ow + j]`` for ``j`` in 0, 1, 2.
Taps 0 and 2 both fall on even offsets, so the vectorizer puts them in one interleaved
group, cannot serve both from it, and loads one of them element by element: eight
scalar loads and inserts per tap row for eight outputs. The ResNet 3x3/2 average
forward then ran compute-bound at 1.2-1.5 ns per output on one thread.

:func:`sum3_stride2_block` states the loads and picks outright: two 8-lane loads give
taps 0 and 1 (even and odd lanes), two more give tap 2. The additions and the division
are IEEE operations in the kernels' order, written without fast-math flags, so the
block returns exactly what the scalar loop returns; only the loads and shuffles differ.
A stand-alone loop of these blocks ran as fast as a loop that only reads every cache
line of ``x`` and writes ``y``; the kernel that uses them adds its per-row work.
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

BLOCK = 8  # outputs per block

# Picks from two 8-lane loads, concatenated (lanes 0-7, then 8-15):
_EVEN = (0, 2, 4, 6, 8, 10, 12, 14)  # taps 0, from x[s + 0:16]
_ODD = (1, 3, 5, 7, 9, 11, 13, 15)  # taps 1, from the same
# taps 2 are x[s + 2 + 2k]: from x[s + 2:10] and x[s + 9:17], so that no load reaches
# past the last tap, x[s + 16] (which may be the last element of x)
_EVEN_FROM_TWO = (0, 2, 4, 6, 9, 11, 13, 15)


def _lanes(picks):
    return ir.Constant(ir.VectorType(ir.IntType(32), len(picks)), list(picks))


def _contiguous_1d(ty, dtype=None):
    return (isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C"
            and (dtype is None or ty.dtype == dtype))


def _integer_1d(ty):
    return _contiguous_1d(ty) and isinstance(ty.dtype, types.Integer)


def _arguments(context, builder, signature, args):
    """An intrinsic's arguments as its code uses them: integers widened to int64, arrays
    as the address of their first element, anything else as it is."""
    values = []
    for value, ty in zip(args, signature.args):
        if isinstance(ty, types.Integer):
            value = context.cast(builder, value, ty, types.int64)
        elif isinstance(ty, types.Array):
            value = context.make_array(ty)(context, builder, value).data
        values.append(value)
    return values


def _load(context, builder, data, index, element, count):
    """``count`` elements from ``data[index]`` as one vector (aligned to an element)."""
    pointer = builder.bitcast(builder.gep(data, [index]),
                              ir.VectorType(element, count).as_pointer())
    return builder.load(pointer, align=context.get_abi_sizeof(element))


def _store(context, builder, vector, data, index):
    """Store ``vector`` at ``data[index]`` (aligned to an element)."""
    pointer = builder.bitcast(builder.gep(data, [index]), vector.type.as_pointer())
    builder.store(vector, pointer, align=context.get_abi_sizeof(vector.type.element))


def _splat(builder, scalar, count):
    """A vector of ``count`` copies of ``scalar``."""
    vector = ir.VectorType(scalar.type, count)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.IntType(32)(0))
    return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined), _lanes([0] * count))


@intrinsic
def sum3_stride2_block(typingctx, xf, rows, n_rows, start, yf, out, divisor, at, factor,
                       zero):
    """Eight means of 3-tap stride-2 windows, written to ``yf[out:out + 8]``.

    Output ``k``'s taps are ``xf[rows[i] + start + 2*k + j]``, added tap row by tap row
    (``i`` < ``n_rows``, at least 1) and tap by tap (``j`` = 0, 1, 2) from the first
    tap, and the sum becomes ``sum / (factor * divisor[at + k]) + zero``: the order and
    operations of :func:`~poolgrad.kernels.rows.avg_pool_forward_rows`. Every index
    must be in bounds; nothing outside the taps and ``divisor[at:at + 8]`` is read.
    """
    real = xf.dtype if isinstance(xf, types.Array) else None
    if not (isinstance(real, types.Float) and _contiguous_1d(xf) and _contiguous_1d(yf, real)
            and _contiguous_1d(divisor, real) and _contiguous_1d(rows, types.int64)
            and factor == real and zero == real
            and all(isinstance(i, types.Integer) for i in (n_rows, start, out, at))):
        return None
    sig = types.void(xf, rows, n_rows, start, yf, out, divisor, at, factor, zero)

    def codegen(context, builder, signature, args):
        x_data, rows_data, n_rows_v, start_v, y_data, out_v, div_data, at_v, factor_v, \
            zero_v = _arguments(context, builder, signature, args)
        element = context.get_value_type(real)
        i64 = ir.IntType(64)

        def load(data, index):
            return _load(context, builder, data, index, element, BLOCK)

        def taps(row):
            s = builder.add(builder.load(builder.gep(rows_data, [row])), start_v)
            low, high = load(x_data, s), load(x_data, builder.add(s, i64(8)))
            shifted_low = load(x_data, builder.add(s, i64(2)))
            shifted_high = load(x_data, builder.add(s, i64(9)))
            return (builder.shuffle_vector(low, high, _lanes(_EVEN)),
                    builder.shuffle_vector(low, high, _lanes(_ODD)),
                    builder.shuffle_vector(shifted_low, shifted_high, _lanes(_EVEN_FROM_TWO)))

        tap0, tap1, tap2 = taps(i64(0))
        total = cgutils.alloca_once_value(builder, builder.fadd(builder.fadd(tap0, tap1), tap2))
        with cgutils.for_range_slice(builder, i64(1), n_rows_v, i64(1), inc=True) as (row, _):
            tap0, tap1, tap2 = taps(row)
            running = builder.fadd(builder.load(total), tap0)
            builder.store(builder.fadd(builder.fadd(running, tap1), tap2), total)
        counts = builder.fmul(_splat(builder, factor_v, BLOCK), load(div_data, at_v))
        means = builder.fadd(builder.fdiv(builder.load(total), counts),
                             _splat(builder, zero_v, BLOCK))
        _store(context, builder, means, y_data, out_v)
        return context.get_dummy_value()

    return sig, codegen


# ------------------------------------------------------------------------------ routing
#
# The tiled max backward writes every element of dx once: tap (jh, jw) of window ow gets
# the window's gradient if it won, else 0. With a W kernel of 2 the compiler vectorizes
# long rows, but VGG's deep layers have rows of 7 windows: shorter than one vector, so
# every element took the scalar tail, and the backward ran compute-bound (4.8 ms on one
# thread, 2.4 ms on two: it scaled with the cores, not with memory). A block routes 4
# windows (float32) to 8 elements of each of two tap rows with a few vector operations;
# rows of any length take whole blocks, the last one overlapping the one before. The
# tiled max forwards' short rows had the same scalar tails: :func:`max2_block`.

ROUTE_BYTES = 32  # bytes of a tap row per block: 8 float32 or 4 float64 elements


@intrinsic
def route2_block(typingctx, dy_bits, pos, out, dx_bits, at0, tap0, at1, tap1, float_bits):
    """Route the gradients of the windows ``out, out + 1, ...`` (W kernel 2, stride 2) to
    :data:`ROUTE_BYTES` of two input rows: ``dx_bits[at0 + 2*k + j]`` gets the gradient
    bits of window ``out + k`` if its winner ``pos[out + k]`` is tap ``tap0 + j``, else 0,
    and ``dx_bits[at1 + 2*k + j]`` likewise for tap ``tap1 + j`` (pass the same row twice
    to write one). The gradient bits are those of ``0 + dy``, as the tiled kernel's
    ``_gradient_bits``: -0 becomes +0 and a signalling NaN is quieted. ``float_bits``
    holds the bits of -0, of the exponent field and of the quiet-NaN flag."""
    bits = dy_bits.dtype if _integer_1d(dy_bits) else None
    if not (bits is not None and bits.bitwidth in (32, 64) and _integer_1d(pos)
            and _contiguous_1d(dx_bits, bits) and _contiguous_1d(float_bits, bits)
            and all(isinstance(i, types.Integer) for i in (out, at0, tap0, at1, tap1))):
        return None
    sig = types.void(dy_bits, pos, out, dx_bits, at0, tap0, at1, tap1, float_bits)

    def codegen(context, builder, signature, args):
        dy_data, pos_data, out_v, dx_data, at0_v, tap0_v, at1_v, tap1_v, fb_data = (
            _arguments(context, builder, signature, args))
        word = ir.IntType(bits.bitwidth)
        lanes = ROUTE_BYTES * 8 // bits.bitwidth
        windows = lanes // 2
        pos_word = ir.IntType(signature.args[1].dtype.bitwidth)

        def constant(value, count=windows):
            return ir.Constant(ir.VectorType(word, count), [value] * count)

        negative_zero, exponent, quiet = (
            _splat(builder, builder.load(builder.gep(fb_data, [ir.IntType(64)(k)])), windows)
            for k in range(3))
        gradient = _load(context, builder, dy_data, out_v, word, windows)
        gradient_or_zero = builder.select(builder.icmp_unsigned("==", gradient, negative_zero),
                                          constant(0), gradient)
        nan = builder.and_(
            builder.icmp_unsigned("==", builder.and_(gradient, exponent), exponent),
            builder.icmp_unsigned("!=", builder.and_(gradient, builder.or_(
                quiet, builder.sub(quiet, constant(1)))), constant(0)))
        routed = builder.select(nan, builder.or_(gradient, quiet), gradient_or_zero)
        winner = _load(context, builder, pos_data, out_v, pos_word, windows)
        if pos_word.width < word.width:
            winner = builder.zext(winner, ir.VectorType(word, windows))
        elif pos_word.width > word.width:  # positions are below the window size
            winner = builder.trunc(winner, ir.VectorType(word, windows))
        twice = _lanes([k // 2 for k in range(lanes)])
        routed = builder.shuffle_vector(routed, routed, twice)
        winner = builder.shuffle_vector(winner, winner, twice)
        alternate = ir.Constant(ir.VectorType(word, lanes), [k % 2 for k in range(lanes)])
        for at, tap in ((at0_v, tap0_v), (at1_v, tap1_v)):
            taps = builder.add(_splat(builder, builder.trunc(tap, word) if word.width < 64
                                      else tap, lanes), alternate)
            values = builder.select(builder.icmp_unsigned("==", winner, taps), routed,
                                    constant(0, lanes))
            _store(context, builder, values, dx_data, at)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def max2_block(typingctx, xf, base, offsets, start, yf, out, pf):
    """Maxima of the windows ``out, out + 1, ...`` (W kernel 2, stride 2), as many as
    :data:`ROUTE_BYTES` of ``x`` per tap row cover (4 float32 or 2 float64), written to
    ``yf[out:]``, and their winners, tap numbers ``2*i + j``, to ``pf[out:]`` unless
    ``pf`` is None (values only; the numbers must fit ``pf``'s unsigned type). Window
    ``k``'s taps are ``xf[base + offsets[i] + start + 2*k + j]``, folded tap row by tap
    row and tap by tap as the row kernels fold them (a later tap wins only if larger).
    Returns whether a tap was NaN: the kernels redo such rows."""
    real = xf.dtype if isinstance(xf, types.Array) else None
    record = not isinstance(pf, types.NoneType)
    if not (isinstance(real, types.Float) and _contiguous_1d(xf) and _contiguous_1d(yf, real)
            and _contiguous_1d(offsets, types.int64)
            and all(isinstance(i, types.Integer) for i in (base, start, out))
            and (not record or _integer_1d(pf) and not pf.dtype.signed)):
        return None
    sig = types.boolean(xf, base, offsets, start, yf, out, pf)

    def codegen(context, builder, signature, args):
        x_data, base_v, offsets_data, start_v, y_data, out_v, pf_data = _arguments(
            context, builder, signature, args)
        n_rows = builder.extract_value(
            context.make_array(signature.args[2])(context, builder, args[2]).shape, 0)
        element = context.get_value_type(real)
        lanes = ROUTE_BYTES // context.get_abi_sizeof(element)
        windows = lanes // 2
        i64, i32 = ir.IntType(64), ir.IntType(32)
        first = builder.add(base_v, start_v)

        def taps(row):
            offset = builder.load(builder.gep(offsets_data, [row]))
            loaded = _load(context, builder, x_data, builder.add(first, offset), element,
                           lanes)
            nan = builder.fcmp_unordered("uno", loaded, loaded)
            return [builder.shuffle_vector(loaded, loaded, _lanes(range(j, lanes, 2)))
                    for j in (0, 1)], nan

        def fold(best, tap, value, number):
            # a later tap wins only if larger (see rows._fold_max)
            wins = builder.fcmp_ordered(">", value, best)
            return (builder.select(wins, value, best),
                    builder.select(wins, number, tap) if record else tap)

        def tap_numbers(row):  # of taps 0 of tap row ``row`` (an i64)
            return _splat(builder, builder.trunc(builder.mul(row, i64(2)), i32), windows)

        one = _splat(builder, i32(1), windows)
        (tap0, tap1), nan = taps(i64(0))
        best, tap = fold(tap0, tap_numbers(i64(0)), tap1, one)
        state = [cgutils.alloca_once_value(builder, v) for v in (best, tap, nan)]
        with cgutils.for_range_slice(builder, i64(1), n_rows, i64(1), inc=True) as (row, _):
            (tap0, tap1), nan = taps(row)
            numbers = tap_numbers(row)
            best, tap = fold(builder.load(state[0]), builder.load(state[1]), tap0, numbers)
            best, tap = fold(best, tap, tap1, builder.add(numbers, one))
            builder.store(best, state[0])
            builder.store(tap, state[1])
            builder.store(builder.or_(builder.load(state[2]), nan), state[2])
        _store(context, builder, builder.load(state[0]), y_data, out_v)
        if record:
            word = ir.VectorType(ir.IntType(signature.args[6].dtype.bitwidth), windows)
            tap = builder.load(state[1])
            tap = (builder.trunc(tap, word) if word.element.width < 32 else
                   builder.zext(tap, word) if word.element.width > 32 else tap)
            _store(context, builder, tap, pf_data, out_v)
        mask = builder.bitcast(builder.load(state[2]), ir.IntType(lanes))  # one movmsk
        return builder.icmp_unsigned("!=", mask, ir.IntType(lanes)(0))

    return sig, codegen
