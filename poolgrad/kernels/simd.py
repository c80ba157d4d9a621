"""Vector blocks written as LLVM IR, for loops that LLVM's vectorizer compiles badly:
the 3-tap stride-2 average forward (:func:`sum3_stride2_block`) and the max backward's
routing of short rows (:func:`route2_block`, at the end of this module).

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
        x_arg, rows_arg, n_rows_v, start_v, y_arg, out_v, div_arg, at_v, factor_v, zero_v = [
            context.cast(builder, value, ty, types.int64) if isinstance(ty, types.Integer)
            else value for value, ty in zip(args, signature.args)]
        x_ty, rows_ty, y_ty, div_ty = (signature.args[i] for i in (0, 1, 4, 6))
        x_data = context.make_array(x_ty)(context, builder, x_arg).data
        rows_data = context.make_array(rows_ty)(context, builder, rows_arg).data
        y_data = context.make_array(y_ty)(context, builder, y_arg).data
        div_data = context.make_array(div_ty)(context, builder, div_arg).data
        element = context.get_value_type(real)
        vector = ir.VectorType(element, BLOCK)
        align = context.get_abi_sizeof(element)
        i64 = ir.IntType(64)

        def address(data, index):
            return builder.bitcast(builder.gep(data, [index]), vector.as_pointer())

        def load(data, index):
            return builder.load(address(data, index), align=align)

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

        def splat(scalar):
            lanes = ir.Constant(vector, ir.Undefined)
            for k in range(BLOCK):
                lanes = builder.insert_element(lanes, scalar, i64(k))
            return lanes

        counts = builder.fmul(splat(factor_v), load(div_data, at_v))
        means = builder.fadd(builder.fdiv(builder.load(total), counts), splat(zero_v))
        builder.store(means, address(y_data, out_v), align=align)
        return context.get_dummy_value()

    return sig, codegen


# ------------------------------------------------------------------------------ routing
#
# The tiled max backward writes every element of dx once: tap (jh, jw) of window ow gets
# the window's gradient if it won, else 0. With a W kernel of 2 the compiler vectorizes
# long rows, but VGG's deep layers have rows of 7 windows: shorter than one vector, so
# every element took the scalar tail, and the backward ran compute-bound (4.8 ms on one
# thread, 2.4 ms on two: it scaled with the cores, not with memory). A block routes 4 windows (float32) to
# 8 elements of each of two tap rows with a few vector operations; rows of any length
# take whole blocks, the last one overlapping the one before.

ROUTE_BYTES = 32  # bytes of dx per block: 8 float32 or 4 float64 elements


def _integer_1d(ty):
    return _contiguous_1d(ty) and isinstance(ty.dtype, types.Integer)


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
        dy_arg, pos_arg, out_v, dx_arg, at0_v, tap0_v, at1_v, tap1_v, fb_arg = [
            context.cast(builder, value, ty, types.int64) if isinstance(ty, types.Integer)
            else value for value, ty in zip(args, signature.args)]
        dy_ty, pos_ty, dx_ty, fb_ty = (signature.args[i] for i in (0, 1, 3, 8))
        data = {name: context.make_array(ty)(context, builder, arg).data
                for name, ty, arg in (("dy", dy_ty, dy_arg), ("pos", pos_ty, pos_arg),
                                      ("dx", dx_ty, dx_arg), ("fb", fb_ty, fb_arg))}
        word = ir.IntType(bits.bitwidth)
        lanes = ROUTE_BYTES * 8 // bits.bitwidth
        windows = lanes // 2
        pos_word = ir.IntType(pos_ty.dtype.bitwidth)
        i64 = ir.IntType(64)

        def load(name, element, count, index):
            pointer = builder.bitcast(builder.gep(data[name], [index]),
                                      ir.VectorType(element, count).as_pointer())
            return builder.load(pointer, align=element.width // 8)

        def splat(scalar, count):
            return builder.shuffle_vector(
                builder.insert_element(ir.Constant(ir.VectorType(scalar.type, 1),
                                                   ir.Undefined), scalar, i64(0)),
                ir.Constant(ir.VectorType(scalar.type, 1), ir.Undefined),
                ir.Constant(ir.VectorType(ir.IntType(32), count), [0] * count))

        def constant(value, count=windows):
            return ir.Constant(ir.VectorType(word, count), [value] * count)

        negative_zero, exponent, quiet = (
            splat(builder.load(builder.gep(data["fb"], [i64(k)])), windows) for k in range(3))
        gradient = load("dy", word, windows, out_v)
        gradient_or_zero = builder.select(builder.icmp_unsigned("==", gradient, negative_zero),
                                          constant(0), gradient)
        nan = builder.and_(
            builder.icmp_unsigned("==", builder.and_(gradient, exponent), exponent),
            builder.icmp_unsigned("!=", builder.and_(gradient, builder.or_(
                quiet, builder.sub(quiet, constant(1)))), constant(0)))
        routed = builder.select(nan, builder.or_(gradient, quiet), gradient_or_zero)
        winner = load("pos", pos_word, windows, out_v)
        if pos_word.width < word.width:
            winner = builder.zext(winner, ir.VectorType(word, windows))
        elif pos_word.width > word.width:  # positions are below the window size
            winner = builder.trunc(winner, ir.VectorType(word, windows))
        twice = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [k // 2 for k in range(lanes)])
        routed = builder.shuffle_vector(routed, routed, twice)
        winner = builder.shuffle_vector(winner, winner, twice)
        alternate = ir.Constant(ir.VectorType(word, lanes), [k % 2 for k in range(lanes)])
        for at, tap in ((at0_v, tap0_v), (at1_v, tap1_v)):
            taps = builder.add(splat(builder.trunc(tap, word) if word.width < 64 else tap,
                                     lanes), alternate)
            values = builder.select(builder.icmp_unsigned("==", winner, taps), routed,
                                    constant(0, lanes))
            pointer = builder.bitcast(builder.gep(data["dx"], [at]),
                                      ir.VectorType(word, lanes).as_pointer())
            builder.store(values, pointer, align=word.width // 8)
        return context.get_dummy_value()

    return sig, codegen


def _max2_codegen(real, record):
    """The code of :func:`max2_block` (``record``: and of :func:`max2_recorded_block`)."""

    def codegen(context, builder, signature, args):
        x_arg, base_v, off_arg, start_v, y_arg, out_v = [
            context.cast(builder, value, ty, types.int64) if isinstance(ty, types.Integer)
            else value for value, ty in zip(args[:6], signature.args[:6])]
        x_data = context.make_array(signature.args[0])(context, builder, x_arg).data
        offsets_array = context.make_array(signature.args[2])(context, builder, off_arg)
        y_data = context.make_array(signature.args[4])(context, builder, y_arg).data
        element = context.get_value_type(real)
        size = context.get_abi_sizeof(element)
        lanes = ROUTE_BYTES // size
        windows = lanes // 2
        i64, i32 = ir.IntType(64), ir.IntType(32)
        n_rows = builder.extract_value(offsets_array.shape, 0)
        first = builder.add(base_v, start_v)

        def taps(row):
            offset = builder.load(builder.gep(offsets_array.data, [row]))
            pointer = builder.bitcast(builder.gep(x_data, [builder.add(first, offset)]),
                                      ir.VectorType(element, lanes).as_pointer())
            loaded = builder.load(pointer, align=size)
            nan = builder.fcmp_unordered("uno", loaded, loaded)
            return [builder.shuffle_vector(loaded, loaded, _lanes(range(j, lanes, 2)))
                    for j in (0, 1)], nan

        def tap_numbers(number):
            return ir.Constant(ir.VectorType(i32, windows), [number] * windows)

        def fold(best, tap, value, number):
            # a later tap wins only if larger (see rows._fold_max)
            wins = builder.fcmp_ordered(">", value, best)
            return (builder.select(wins, value, best),
                    builder.select(wins, number, tap) if record else tap)

        def fold_row(best, tap, row, t):
            (tap0, tap1), nan = taps(row)
            best, tap = fold(best, tap, tap0, t)
            return fold(best, tap, tap1, builder.add(t, tap_numbers(1))) + (nan,)

        (tap0, tap1), nan = taps(i64(0))
        best, tap = fold(tap0, tap_numbers(0), tap1, tap_numbers(1))
        state = [cgutils.alloca_once_value(builder, v) for v in (best, tap, nan)]
        with cgutils.for_range_slice(builder, i64(1), n_rows, i64(1), inc=True) as (row, _):
            row_taps = builder.trunc(builder.mul(row, i64(2)), i32)
            t = builder.insert_element(ir.Constant(ir.VectorType(i32, windows), ir.Undefined),
                                       row_taps, i64(0))
            t = builder.shuffle_vector(t, t, _lanes([0] * windows))
            best, tap, nan = fold_row(*(builder.load(v) for v in state[:2]), row, t)
            builder.store(best, state[0])
            builder.store(tap, state[1])
            builder.store(builder.or_(builder.load(state[2]), nan), state[2])
        pointer = builder.bitcast(builder.gep(y_data, [out_v]),
                                  ir.VectorType(element, windows).as_pointer())
        builder.store(builder.load(state[0]), pointer, align=size)
        if record:
            pos_ty = signature.args[6]
            pos_data = context.make_array(pos_ty)(context, builder, args[6]).data
            word = ir.IntType(pos_ty.dtype.bitwidth)
            tap = builder.load(state[1])
            tap = (builder.trunc(tap, ir.VectorType(word, windows)) if word.width < 32 else
                   builder.zext(tap, ir.VectorType(word, windows)) if word.width > 32 else tap)
            pointer = builder.bitcast(builder.gep(pos_data, [out_v]),
                                      ir.VectorType(word, windows).as_pointer())
            builder.store(tap, pointer, align=word.width // 8)
        mask = builder.bitcast(builder.load(state[2]), ir.IntType(lanes))  # one movmsk
        return builder.icmp_unsigned("!=", mask, ir.IntType(lanes)(0))

    return codegen


def _max2_types(xf, base, offsets, start, yf, out):
    real = xf.dtype if isinstance(xf, types.Array) else None
    if (isinstance(real, types.Float) and _contiguous_1d(xf) and _contiguous_1d(yf, real)
            and _contiguous_1d(offsets, types.int64)
            and all(isinstance(i, types.Integer) for i in (base, start, out))):
        return real
    return None


@intrinsic
def max2_block(typingctx, xf, base, offsets, start, yf, out):
    """Maxima of the windows ``out, out + 1, ...`` (W kernel 2, stride 2), as many as
    :data:`ROUTE_BYTES` of ``x`` per tap row cover (4 float32 or 2 float64), written to
    ``yf[out:]``. Window ``k``'s taps are ``xf[base + offsets[i] + start + 2*k + j]``,
    folded tap row by tap row and tap by tap as the row kernels fold them (a later tap
    wins only if larger). Returns whether a tap was NaN: the kernels redo such rows."""
    real = _max2_types(xf, base, offsets, start, yf, out)
    if real is None:
        return None
    return types.boolean(xf, base, offsets, start, yf, out), _max2_codegen(real, False)


@intrinsic
def max2_recorded_block(typingctx, xf, base, offsets, start, yf, out, pf):
    """:func:`max2_block` that also writes each window's winner, its tap number
    ``2*i + j``, to ``pf[out:]`` (tap numbers must fit ``pf``'s unsigned type)."""
    real = _max2_types(xf, base, offsets, start, yf, out)
    if real is None or not (_integer_1d(pf) and not pf.dtype.signed):
        return None
    return (types.boolean(xf, base, offsets, start, yf, out, pf),
            _max2_codegen(real, True))
