"""Vector blocks written as LLVM IR, for loops that LLVM's vectorizer compiles badly:
the 3-tap stride-2 average and max forwards (:func:`sum3_stride2_block`,
:func:`max3_stride2_block`), and the short rows of
the tiled max backward (:func:`route2_block`) and forwards (:func:`max2_block`).
Reductions of a whole row in a fixed number of lanes are :mod:`.lanes`'.

A window of 3 taps at stride 2 along W reads ``x[r + 2*ow + j]`` for ``j`` in 0, 1, 2.
Taps 0 and 2 both fall on even offsets, so the vectorizer puts them in one interleaved
group, cannot serve both from it, and loads one of them element by element: eight
scalar loads and inserts per tap row for eight outputs. The ResNet 3x3/2 average
forward then ran compute-bound, not waiting on memory.

:func:`sum3_stride2_block` needs no shuffle until the end: a vector loaded at tap ``j``
of window 0 holds tap ``j`` of windows 0-3 in its even lanes, so three such vectors
added lane by lane give four windows' sums in the even lanes (the odd lanes are never
used), and one more group gives the next four. Blocks that reach into the W padding
mask the padded taps out, so whole rows, edges included, are done in blocks. The
additions and the division are IEEE operations in the kernels' order, written
without fast-math flags, so the block returns exactly what the scalar loop returns;
only the loads differ.
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._vector_ir import (
    arguments,
    contiguous_1d,
    integer_1d,
    lane_numbers,
    resize_lanes,
    splat,
    vector_load,
    vector_store,
)

BLOCK = 8  # outputs per block

# The sums of windows 0-3 sit in the even lanes of one vector and those of windows 4-7
# in the odd lanes of another (see sum3_stride2_block): pick them in order
_EVEN_THEN_ODD = (0, 2, 4, 6, 9, 11, 13, 15)


def _three_tap_windows(context, builder, real, x_data, rows, start_v, width, width_v,
                       fill, begin, fold, numbers=None):
    """Fold the taps of eight 3-tap stride-2 windows (see :func:`sum3_stride2_block`)
    in order: tap row by tap row, tap by tap. ``rows`` = (first, n_d, step_d, n_h,
    step_h) as IR values; ``width``, the width argument's type: None, or an integer
    whose value ``width_v`` is the row width outside which taps are not read and count
    as ``fill``. ``begin(tap, number)`` gives the state (a list of vectors) of the first
    tap, ``fold(state, tap, number)`` the state after one more, where ``number`` is the
    tap's number in its window (an i32): ``numbers`` = (of the first tap, step from one
    jd to the next) as i32 IR values, the step from one jh to the next being 3; zeros
    if None. Returns the state of each half: windows 0-3 in the even lanes, windows 4-7
    in the odd ones."""
    first_v, n_d_v, step_d_v, n_h_v, step_h_v = rows
    element = context.get_value_type(real)
    vector = ir.VectorType(element, BLOCK)
    i64, i32 = ir.IntType(64), ir.IntType(32)
    # Half 0 (windows 0-3) reads taps j as one vector from tap j of window 0, so lane
    # 2k holds window k's tap j; half 1 (windows 4-7) starts one element before tap j
    # of window 4, so that no load reaches past the last tap, and lane 2(k - 4) + 1
    # holds it. Folding the three vectors lane by lane folds the windows without a
    # shuffle; the other lanes are never used.
    shifts = [[half + j for j in range(3)] for half in (0, 7)]
    masked = not isinstance(width, types.NoneType)
    if masked:
        # lane l of the load at shift s is column start + s + l; columns fit in 32 bits
        # (they are below the row's width), and 32-bit compares give the loads' mask
        # without repacking
        iota = ir.Constant(ir.VectorType(i32, BLOCK), list(range(BLOCK)))
        fills = ir.Constant(vector, [fill] * BLOCK)
        high = splat(builder, builder.trunc(width_v, i32), BLOCK)
        load_masked = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vector, [vector.as_pointer(), i32,
                                     ir.VectorType(ir.IntType(1), BLOCK), vector]),
            f"llvm.masked.load.v{BLOCK}{'f32' if real.bitwidth == 32 else 'f64'}.p0")
        masks = []
        for half in shifts:
            masks.append([])
            for shift in half:
                columns = builder.add(splat(builder, builder.trunc(
                    builder.add(start_v, i64(shift)), i32), BLOCK), iota)
                masks[-1].append(builder.and_(
                    builder.icmp_signed(">=", columns, ir.Constant(columns.type, None)),
                    builder.icmp_signed("<", columns, high)))

    def load(index, half, j):
        if not masked:
            return vector_load(context, builder, x_data, index, element, BLOCK)
        pointer = builder.bitcast(builder.gep(x_data, [index]), vector.as_pointer())
        return builder.call(load_masked, [
            pointer, i32(context.get_abi_sizeof(element)), masks[half][j], fills])

    def fold_row(row_start, row_number, states):
        s = builder.add(row_start, start_v)
        folded = []
        for half, half_shifts in enumerate(shifts):
            taps = [load(builder.add(s, i64(shift)), half, j)
                    for j, shift in enumerate(half_shifts)]
            tap_numbers = [builder.add(row_number, i32(j)) for j in range(3)]
            state = (begin(taps[0], tap_numbers[0]) if states is None
                     else fold(states[half], taps[0], tap_numbers[0]))
            folded.append(fold(fold(state, taps[1], tap_numbers[1]), taps[2], tap_numbers[2]))
        return folded

    # the tap rows after the first, in one loop: the row start moves by step_h, or to
    # the next jd's first row when jh wraps (a select, not a branch), and the taps'
    # numbers likewise
    first_number, number_step_d = numbers if numbers is not None else (i32(0), i32(0))
    slots = [[cgutils.alloca_once_value(builder, v) for v in state]
             for state in fold_row(first_v, first_number, None)]
    row_start = cgutils.alloca_once_value(builder, first_v)
    row_number = cgutils.alloca_once_value(builder, first_number)
    jh = cgutils.alloca_once_value(builder, i64(0))
    next_plane = builder.sub(step_d_v, builder.mul(builder.sub(n_h_v, i64(1)), step_h_v))
    next_plane_number = builder.sub(number_step_d, builder.mul(
        builder.trunc(builder.sub(n_h_v, i64(1)), i32), i32(3)))
    with cgutils.for_range_slice(builder, i64(1), builder.mul(n_d_v, n_h_v), i64(1),
                                 inc=True):
        jh_next = builder.add(builder.load(jh), i64(1))
        wraps = builder.icmp_signed("==", jh_next, n_h_v)
        builder.store(builder.select(wraps, i64(0), jh_next), jh)
        builder.store(builder.add(builder.load(row_start),
                                  builder.select(wraps, next_plane, step_h_v)), row_start)
        builder.store(builder.add(builder.load(row_number),
                                  builder.select(wraps, next_plane_number, i32(3))), row_number)
        folded = fold_row(builder.load(row_start), builder.load(row_number),
                          [[builder.load(v) for v in half] for half in slots])
        for half_slots, state in zip(slots, folded, strict=True):
            for slot, value in zip(half_slots, state, strict=True):
                builder.store(value, slot)
    return [[builder.load(v) for v in half] for half in slots]


def _in_window_order(builder, halves):
    """One vector of the eight windows' values from the halves' used lanes."""
    return builder.shuffle_vector(halves[0], halves[1], lane_numbers(_EVEN_THEN_ODD))


def _three_tap_types(xf, yf, width, integers):
    """The float type of a 3-tap stride-2 block's arrays if its arguments are valid."""
    real = xf.dtype if isinstance(xf, types.Array) else None
    if (isinstance(real, types.Float) and contiguous_1d(xf) and contiguous_1d(yf, real)
            and all(isinstance(i, types.Integer) for i in integers)
            and isinstance(width, (types.NoneType, types.Integer))):
        return real
    return None


@intrinsic
def sum3_stride2_block(typingctx, xf, first, n_d, step_d, n_h, step_h, start, yf, out,
                       divisor, at, factor, zero, width):
    """Eight means of 3-tap stride-2 windows, written to ``yf[out:out + 8]``.

    The windows' tap rows start at ``r = first + jd*step_d + jh*step_h`` for ``jd`` <
    ``n_d`` and ``jh`` < ``n_h`` (both at least 1). Output ``k``'s taps are
    ``xf[r + start + 2*k + j]``, added tap row by tap row (jd, then jh, in increasing
    order) and tap by tap (``j`` = 0, 1, 2) from the first tap, and the sum becomes
    ``(sum + zero) / (factor * divisor[at + k])``: the order and operations of
    :func:`~poolgrad.kernels.row_passes.avg_pool_forward_rows`.

    ``width`` None: every tap is read and must be in bounds. An integer: the taps whose
    column ``start + 2*k + j`` lies outside ``[0, width)`` (the W padding, or past the
    row's end with ceil_mode) are not read and add +0 in their place. That changes at
    most the sign of a zero sum, which ``+ zero`` (+0) makes +0 as it does in the
    kernels (see there), before the division. Nothing outside the taps and
    ``divisor[at:at + 8]`` is read.
    """
    real = _three_tap_types(xf, yf, width, (first, n_d, step_d, n_h, step_h, start, out, at))
    if not (real is not None and contiguous_1d(divisor, real) and factor == real
            and zero == real):
        return None
    sig = types.void(xf, first, n_d, step_d, n_h, step_h, start, yf, out, divisor, at,
                     factor, zero, width)

    def codegen(context, builder, signature, args):
        x_data, first_v, n_d_v, step_d_v, n_h_v, step_h_v, start_v, y_data, out_v, div_data, \
            at_v, factor_v, zero_v, width_v = arguments(context, builder, signature, args)
        halves = _three_tap_windows(
            context, builder, real, x_data, (first_v, n_d_v, step_d_v, n_h_v, step_h_v),
            start_v, width, width_v, 0.0, lambda tap, _: [tap],
            lambda state, tap, _: [builder.fadd(state[0], tap)])
        total = _in_window_order(builder, [half[0] for half in halves])
        element = context.get_value_type(real)
        counts = builder.fmul(splat(builder, factor_v, BLOCK),
                              vector_load(context, builder, div_data, at_v, element, BLOCK))
        means = builder.fdiv(builder.fadd(total, splat(builder, zero_v, BLOCK)), counts)
        vector_store(context, builder, means, y_data, out_v)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def max3_stride2_block(typingctx, xf, first, n_d, step_d, n_h, step_h, start, yf, out,
                       width, pf, tap_first, tap_step_d):
    """Eight maxima of 3-tap stride-2 windows, written to ``yf[out:out + 8]``: the taps
    of :func:`sum3_stride2_block`, folded in the same order as the row kernels fold them
    (a later tap wins only if larger). Returns whether a tap was NaN: the kernels redo
    such rows.

    ``pf`` None: values only. Then taps outside ``[0, width)`` (``width`` an integer)
    are not read and count as -inf, which no real tap loses to but -inf itself, of the
    same bits. ``pf`` an unsigned array: the winners' tap numbers go to
    ``pf[out:out + 8]`` as well; ``width`` must be None (a padded -inf tap would win
    the window of real -infs), the taps of the first tap row are numbered from
    ``tap_first`` (0, 1, 2 along W), each next jh adds 3 and each next jd
    ``tap_step_d``, as in the row kernels' ``(jd * ext_h + jh) * 3 + jw``."""
    real = _three_tap_types(xf, yf, width, (first, n_d, step_d, n_h, step_h, start, out,
                                            tap_first, tap_step_d))
    record = not isinstance(pf, types.NoneType)
    if real is None or (record and not (integer_1d(pf) and not pf.dtype.signed
                                        and isinstance(width, types.NoneType))):
        return None
    sig = types.boolean(xf, first, n_d, step_d, n_h, step_h, start, yf, out, width, pf,
                        tap_first, tap_step_d)

    def codegen(context, builder, signature, args):
        x_data, first_v, n_d_v, step_d_v, n_h_v, step_h_v, start_v, y_data, out_v, \
            width_v, pf_data, tap_first_v, tap_step_d_v = arguments(
                context, builder, signature, args)
        i32 = ir.IntType(32)

        def begin(tap, number):
            state = [tap, builder.fcmp_unordered("uno", tap, tap)]
            return state + [splat(builder, number, BLOCK)] if record else state

        def fold(state, tap, number):
            wins = builder.fcmp_ordered(">", tap, state[0])
            folded = [builder.select(wins, tap, state[0]),
                      builder.or_(state[1], builder.fcmp_unordered("uno", tap, tap))]
            if record:
                folded.append(builder.select(wins, splat(builder, number, BLOCK), state[2]))
            return folded

        numbers = (builder.trunc(tap_first_v, i32), builder.trunc(tap_step_d_v, i32))
        halves = _three_tap_windows(
            context, builder, real, x_data, (first_v, n_d_v, step_d_v, n_h_v, step_h_v),
            start_v, width, width_v, float("-inf"), begin, fold, numbers)
        vector_store(context, builder, _in_window_order(builder, [half[0] for half in halves]),
               y_data, out_v)
        if record:
            taps = _in_window_order(builder, [half[2] for half in halves])
            vector_store(context, builder,
                         resize_lanes(builder, taps, signature.args[10].dtype.bitwidth),
                         pf_data, out_v)
        # every lane read holds a tap of these windows (columns start to start + 16), so
        # a NaN in any lane is a NaN tap
        mask = builder.bitcast(builder.or_(halves[0][1], halves[1][1]), ir.IntType(BLOCK))
        return builder.icmp_unsigned("!=", mask, ir.IntType(BLOCK)(0))

    return sig, codegen


# ------------------------------------------------------------------------------ routing
#
# The tiled max backward writes every element of dx once: tap (jh, jw) of window ow gets
# the window's gradient if it won, else 0. With a W kernel of 2 the compiler vectorizes
# long rows, but VGG's deep layers have rows of 7 windows: shorter than one vector, so
# every element took the scalar tail, and the backward ran compute-bound (it scaled with
# the cores, not with memory). A block routes 4 windows (float32) to 8 elements of each
# of two tap rows with a few vector operations; rows of any length take whole blocks,
# the last one overlapping the one before. The tiled max forwards' short rows had the
# same scalar tails: :func:`max2_block`.

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
    bits = dy_bits.dtype if integer_1d(dy_bits) else None
    if not (bits is not None and bits.bitwidth in (32, 64) and integer_1d(pos)
            and contiguous_1d(dx_bits, bits) and contiguous_1d(float_bits, bits)
            and all(isinstance(i, types.Integer) for i in (out, at0, tap0, at1, tap1))):
        return None
    sig = types.void(dy_bits, pos, out, dx_bits, at0, tap0, at1, tap1, float_bits)

    def codegen(context, builder, signature, args):
        dy_data, pos_data, out_v, dx_data, at0_v, tap0_v, at1_v, tap1_v, fb_data = (
            arguments(context, builder, signature, args))
        word = ir.IntType(bits.bitwidth)
        lanes = ROUTE_BYTES * 8 // bits.bitwidth
        windows = lanes // 2
        pos_word = ir.IntType(signature.args[1].dtype.bitwidth)

        def constant(value, count=windows):
            return ir.Constant(ir.VectorType(word, count), [value] * count)

        negative_zero, exponent, quiet = (
            splat(builder, builder.load(builder.gep(fb_data, [ir.IntType(64)(k)])), windows)
            for k in range(3))
        gradient = vector_load(context, builder, dy_data, out_v, word, windows)
        gradient_or_zero = builder.select(builder.icmp_unsigned("==", gradient, negative_zero),
                                          constant(0), gradient)
        nan = builder.and_(
            builder.icmp_unsigned("==", builder.and_(gradient, exponent), exponent),
            builder.icmp_unsigned("!=", builder.and_(gradient, builder.or_(
                quiet, builder.sub(quiet, constant(1)))), constant(0)))
        routed = builder.select(nan, builder.or_(gradient, quiet), gradient_or_zero)
        winner = resize_lanes(
            builder, vector_load(context, builder, pos_data, out_v, pos_word, windows),
            word.width)
        twice = lane_numbers([k // 2 for k in range(lanes)])
        routed = builder.shuffle_vector(routed, routed, twice)
        winner = builder.shuffle_vector(winner, winner, twice)
        alternate = ir.Constant(ir.VectorType(word, lanes), [k % 2 for k in range(lanes)])
        for at, tap in ((at0_v, tap0_v), (at1_v, tap1_v)):
            taps = builder.add(splat(builder, builder.trunc(tap, word) if word.width < 64
                                      else tap, lanes), alternate)
            values = builder.select(builder.icmp_unsigned("==", winner, taps), routed,
                                    constant(0, lanes))
            vector_store(context, builder, values, dx_data, at)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def route3_stride2_blocks(typingctx, dyf, pf, out, n_blocks, dxf, at, tap):
    """Add the routed gradients of ``n_blocks`` blocks of eight 3-tap stride-2 windows
    (``out`` to ``out + 8*n_blocks``) to the input columns ``dxf[at:at + 16*n_blocks]``
    that their taps 0 and 1 cover: window ``out + k`` starts at ``at + 2*k``, its taps
    are numbered ``tap``, ``tap + 1``, ``tap + 2``, and a tap gets ``dyf[out + k]`` if it
    is the winner ``pf[out + k]``, else +0. An even column gets tap 2 of the window
    before (none for the first) and then tap 0 of its own, an odd one tap 1: added in
    increasing output order, as :func:`~poolgrad.kernels.gather_rows._max_back_pass` adds them.
    Tap 2 of the last window (column ``at + 16*n_blocks``) is left to the caller.

    The row loop it replaces read the two columns of a window as two strided streams,
    which the vectorizer served element by element; here a block loads the 16 columns
    as two vectors and splits them into even and odd lanes with two shuffles."""
    real = dyf.dtype if isinstance(dyf, types.Array) else None
    if not (isinstance(real, types.Float) and contiguous_1d(dyf) and contiguous_1d(dxf, real)
            and integer_1d(pf) and not pf.dtype.signed
            and all(isinstance(i, types.Integer) for i in (out, n_blocks, at, tap))):
        return None
    sig = types.void(dyf, pf, out, n_blocks, dxf, at, tap)

    def codegen(context, builder, signature, args):
        dy_data, pos_data, out_v, n_blocks_v, dx_data, at_v, tap_v = arguments(
            context, builder, signature, args)
        element = context.get_value_type(real)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        zeros = ir.Constant(ir.VectorType(element, BLOCK), [0.0] * BLOCK)
        numbers = [splat(builder, builder.trunc(builder.add(tap_v, i64(j)), i32), BLOCK)
                   for j in range(3)]
        pos_word = ir.IntType(signature.args[1].dtype.bitwidth)
        # tap 2 of the previous block's windows: none before the first block
        carried = cgutils.alloca_once_value(builder, zeros)
        with cgutils.for_range(builder, n_blocks_v) as loop:
            o = builder.add(out_v, builder.mul(loop.index, i64(BLOCK)))
            i = builder.add(at_v, builder.mul(loop.index, i64(2 * BLOCK)))
            gradients = vector_load(context, builder, dy_data, o, element, BLOCK)
            winners = resize_lanes(
                builder, vector_load(context, builder, pos_data, o, pos_word, BLOCK), 32)
            routed = [builder.select(builder.icmp_unsigned("==", winners, number), gradients,
                                     zeros) for number in numbers]
            # lane k: tap 2 of window k - 1
            before = builder.shuffle_vector(
                builder.load(carried), routed[2],
                lane_numbers([BLOCK - 1] + list(range(BLOCK, 2 * BLOCK - 1))))
            builder.store(routed[2], carried)
            low = vector_load(context, builder, dx_data, i, element, BLOCK)
            high_at = builder.add(i, i64(BLOCK))
            high = vector_load(context, builder, dx_data, high_at, element, BLOCK)
            even = builder.shuffle_vector(low, high, lane_numbers(range(0, 2 * BLOCK, 2)))
            odd = builder.shuffle_vector(low, high, lane_numbers(range(1, 2 * BLOCK, 2)))
            even = builder.fadd(builder.fadd(even, before), routed[0])
            odd = builder.fadd(odd, routed[1])
            interleave = [k // 2 + (k % 2) * BLOCK for k in range(2 * BLOCK)]
            for half, at in ((interleave[:BLOCK], i), (interleave[BLOCK:], high_at)):
                vector_store(context, builder,
                             builder.shuffle_vector(even, odd, lane_numbers(half)), dx_data, at)
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
    if not (isinstance(real, types.Float) and contiguous_1d(xf) and contiguous_1d(yf, real)
            and contiguous_1d(offsets, types.int64)
            and all(isinstance(i, types.Integer) for i in (base, start, out))
            and (not record or integer_1d(pf) and not pf.dtype.signed)):
        return None
    sig = types.boolean(xf, base, offsets, start, yf, out, pf)

    def codegen(context, builder, signature, args):
        x_data, base_v, offsets_data, start_v, y_data, out_v, pf_data = arguments(
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
            loaded = vector_load(context, builder, x_data, builder.add(first, offset), element,
                           lanes)
            nan = builder.fcmp_unordered("uno", loaded, loaded)
            return [builder.shuffle_vector(loaded, loaded, lane_numbers(range(j, lanes, 2)))
                    for j in (0, 1)], nan

        def fold(best, tap, value, number):
            # a later tap wins only if larger (see row_passes.fold_max)
            wins = builder.fcmp_ordered(">", value, best)
            return (builder.select(wins, value, best),
                    builder.select(wins, number, tap) if record else tap)

        def tap_numbers(row):  # of taps 0 of tap row ``row`` (an i64)
            return splat(builder, builder.trunc(builder.mul(row, i64(2)), i32), windows)

        one = splat(builder, i32(1), windows)
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
        vector_store(context, builder, builder.load(state[0]), y_data, out_v)
        if record:
            vector_store(context, builder, resize_lanes(builder, builder.load(state[1]),
                                             signature.args[6].dtype.bitwidth),
                   pf_data, out_v)
        mask = builder.bitcast(builder.load(state[2]), ir.IntType(lanes))  # one movmsk
        return builder.icmp_unsigned("!=", mask, ir.IntType(lanes)(0))

    return sig, codegen


# ----------------------------------------------------------------------------- prefetch
#
# The row kernels read x in order, yet the hardware prefetcher can leave them waiting
# on memory: the ResNet 3x3/2 average forward ran slower than a loop that only reads x
# and writes y, and no slower once each output row asked for the input a few rows
# ahead; the VGG 2x2/2 max forward gained too (walk.prefetch_count says where the
# kernels ask).

PREFETCH_BYTES = 8192  # how far ahead of the tap rows in use the kernels ask for input
_LINE = 64  # bytes per cache line


@intrinsic
def prefetch(typingctx, xf, begin, count):
    """Ask for the cache lines of ``xf[begin:begin + count]`` (a hint: nothing is read,
    and indices past the end of ``xf`` are left out)."""
    if not (isinstance(xf, types.Array) and xf.layout == "C" and xf.ndim == 1
            and isinstance(begin, types.Integer) and isinstance(count, types.Integer)):
        return None
    sig = types.void(xf, begin, count)

    def codegen(context, builder, signature, args):
        x_data, begin_v, count_v = arguments(context, builder, signature, args)
        size = builder.extract_value(
            context.make_array(signature.args[0])(context, builder, args[0]).shape, 0)
        i64, i32, bytes_pointer = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [bytes_pointer, i32, i32, i32]),
            "llvm.prefetch.p0")
        per_line = i64(_LINE // context.get_abi_sizeof(context.get_value_type(xf.dtype)))
        end = builder.select(builder.icmp_signed("<", builder.add(begin_v, count_v), size),
                             builder.add(begin_v, count_v), size)
        with cgutils.for_range_slice(builder, begin_v, end, per_line, inc=True) as (at, _):
            pointer = builder.bitcast(builder.gep(x_data, [at]), bytes_pointer)
            # a read, kept in every cache level, of data (not instructions)
            builder.call(hint, [pointer, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
