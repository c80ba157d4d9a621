"""Reductions of a contiguous row in a fixed number of lanes, written as LLVM IR: one
vector of lanes, no fast-math, so the same roundings (and the same winner) as a loop
in that order would give, which LLVM left scalar or vectorized badly. Sums
(:func:`lane_dot`, :func:`lane_sum`: attention pooling, the global average) and the
first maximum with its position (:func:`lane_max`, :func:`window_max`: the global max
and wide windows)."""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._vector_ir import arguments, contiguous_1d, lane_numbers, splat, vector_load


@intrinsic
def lane_dot(typingctx, a, b, lanes):
    """``sum_l a[l] * b[l]`` over the whole of ``a`` (float64) and ``b`` (float32,
    widened, or float64), in ``lanes.ndim`` lanes (a compile-time constant, a power of
    2): lane ``k`` adds the products ``l = k mod lanes`` in increasing ``l`` from +0,
    then the lanes are added by halving (lane ``k`` += lane ``k + h`` for ``h =
    lanes/2, ..., 1``). The sum that a loop of the same order gives, which LLVM left
    scalar: one vector of lanes, no fast-math, so the same roundings. The products past
    the last whole group go to lanes 0, 1, ... one by one."""
    count = lanes.ndim if isinstance(lanes, types.Array) else 0
    if not (contiguous_1d(a, types.float64) and contiguous_1d(b)
            and b.dtype in (types.float32, types.float64) and count & (count - 1) == 0):
        return None
    sig = types.float64(a, b, lanes)

    def codegen(context, builder, signature, args):
        a_data, b_data, _ = arguments(context, builder, signature, args)
        length = builder.extract_value(context.make_array(a)(context, builder, args[0]).shape, 0)
        f64, i64, i32 = ir.DoubleType(), ir.IntType(64), ir.IntType(32)
        b_type = context.get_value_type(b.dtype)

        def products(index, width):
            pa = vector_load(context, builder, a_data, index, f64, width)
            pb = vector_load(context, builder, b_data, index, b_type, width)
            return builder.fmul(pa, pb if b_type == f64 else builder.fpext(pb, pa.type))

        full = builder.sub(length, builder.srem(length, i64(count)))
        acc = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(f64, count),
                                                             [0.0] * count))
        with cgutils.for_range_slice(builder, i64(0), full, i64(count), inc=True) as (at, _):
            builder.store(builder.fadd(builder.load(acc), products(at, count)), acc)
        with cgutils.for_range_slice(builder, full, length, i64(1), inc=True) as (at, _):
            lane, total = builder.trunc(builder.sub(at, full), i32), builder.load(acc)
            added = builder.fadd(builder.extract_element(total, lane),
                                 builder.extract_element(products(at, 1), i32(0)))
            builder.store(builder.insert_element(total, added, lane), acc)
        total, half = builder.load(acc), count // 2
        while half >= 1:
            total = builder.fadd(builder.shuffle_vector(total, total, lane_numbers(range(half))),
                                 builder.shuffle_vector(total, total,
                                                        lane_numbers(range(half, 2 * half))))
            half //= 2
        return builder.extract_element(total, i32(0))

    return sig, codegen


SUM_LANES = 8  # running sums of lane_sum: one vector of float32 or float64


@intrinsic
def lane_sum(typingctx, xf, begin, length, zero):
    """``sum(xf[begin:begin + length])`` in ``zero``'s dtype, in :data:`SUM_LANES`
    running sums: lane ``k`` adds elements ``8j + k`` in increasing ``j`` from +0, the
    lanes are added in adjacent pairs (``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 +
    s7))``), then the elements past the last whole group one by one. The sum that eight
    scalar running sums give, which LLVM left scalar: no fast-math, so the same
    roundings."""
    if not (contiguous_1d(xf) and xf.dtype in (types.float32, types.float64)
            and zero in (types.float32, types.float64)
            and isinstance(begin, types.Integer) and isinstance(length, types.Integer)):
        return None
    sig = zero(xf, begin, length, zero)

    def codegen(context, builder, signature, args):
        x_data, begin_v, length_v, _ = arguments(context, builder, signature, args)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        element, total_type = context.get_value_type(xf.dtype), context.get_value_type(zero)

        def widened(at, count):  # x's elements at begin + at, in the sum's dtype
            v = vector_load(context, builder, x_data, builder.add(begin_v, at), element, count)
            wide = ir.VectorType(total_type, count)
            return (v if element == total_type else builder.fpext(v, wide)
                    if zero == types.float64 else builder.fptrunc(v, wide))

        full = builder.sub(length_v, builder.srem(length_v, i64(SUM_LANES)))
        sums = cgutils.alloca_once_value(
            builder, ir.Constant(ir.VectorType(total_type, SUM_LANES), [0.0] * SUM_LANES))
        with cgutils.for_range_slice(builder, i64(0), full, i64(SUM_LANES), inc=True) as (at, _):
            builder.store(builder.fadd(builder.load(sums), widened(at, SUM_LANES)), sums)
        paired = builder.load(sums)
        while paired.type.count > 1:
            count = paired.type.count
            paired = builder.fadd(
                builder.shuffle_vector(paired, paired, lane_numbers(range(0, count, 2))),
                builder.shuffle_vector(paired, paired, lane_numbers(range(1, count, 2))))
        total = cgutils.alloca_once_value(builder, builder.extract_element(paired, i32(0)))
        with cgutils.for_range_slice(builder, full, length_v, i64(1), inc=True) as (at, _):
            builder.store(builder.fadd(builder.load(total),
                                       builder.extract_element(widened(at, 1), i32(0))), total)
        return builder.load(total)

    return sig, codegen


MAX_LANES = 16  # the running maxima of lane_max and window_max


def _fold_max(context, builder, xf_type, x_data, begin, rows, width):
    """The LLVM IR of :func:`window_max`: ``rows`` is ``[(count, step, number), ...]``,
    the loops over tap rows, outermost first (a row's first element at ``begin`` plus
    each loop's ``index * step``, its first number ``sum index * number``); ``width`` the
    taps of each row. Returns ``(number, nan)`` values."""
    i64, i32, i1 = ir.IntType(64), ir.IntType(32), ir.IntType(1)
    element = context.get_value_type(xf_type.dtype)
    vector = ir.VectorType(element, MAX_LANES)
    first = builder.load(builder.gep(x_data, [begin]))
    best = cgutils.alloca_once_value(builder, splat(builder, first, MAX_LANES))
    where = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(i32, MAX_LANES),
                                                           [0] * MAX_LANES))
    nans = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(i1, MAX_LANES),
                                                          [0] * MAX_LANES))
    offsets = ir.Constant(ir.VectorType(i32, MAX_LANES), list(range(MAX_LANES)))
    full = builder.sub(width, builder.srem(width, i64(MAX_LANES)))
    load_masked = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vector, [vector.as_pointer(), i32,
                                                 ir.VectorType(i1, MAX_LANES), vector]),
        f"llvm.masked.load.v{MAX_LANES}{'f32' if xf_type.dtype == types.float32 else 'f64'}.p0")

    def fold(values, number):  # the lanes' numbers: int32, half the width of int64's
        kept = builder.load(best)
        wins = builder.fcmp_ordered(">", values, kept)
        builder.store(builder.select(wins, values, kept), best)
        numbers = builder.add(splat(builder, builder.trunc(number, i32), MAX_LANES), offsets)
        builder.store(builder.select(wins, numbers, builder.load(where)), where)
        builder.store(builder.or_(builder.load(nans),
                                  builder.fcmp_unordered("uno", values, values)), nans)

    def row(start, number):
        with cgutils.for_range_slice(builder, i64(0), full, i64(MAX_LANES), inc=True) as (
                at, _):
            fold(vector_load(context, builder, x_data, builder.add(start, at), element,
                             MAX_LANES), builder.add(number, at))
        # the rest as one group, its missing lanes filled with the first element (which
        # never wins: every lane starts from it) and never read
        with builder.if_then(builder.icmp_signed("<", full, width)):
            rest = splat(builder, builder.trunc(builder.sub(width, full), i32), MAX_LANES)
            pointer = builder.bitcast(builder.gep(x_data, [builder.add(start, full)]),
                                      vector.as_pointer())
            fold(builder.call(load_masked, [
                pointer, i32(context.get_abi_sizeof(element)),
                builder.icmp_signed("<", offsets, rest), splat(builder, first, MAX_LANES)]),
                builder.add(number, full))

    def loops(level, start, number):
        if level == len(rows):
            row(start, number)
            return
        count, step, numbers = rows[level]
        with cgutils.for_range(builder, count) as loop:
            loops(level + 1, builder.add(start, builder.mul(loop.index, step)),
                  builder.add(number, builder.mul(loop.index, numbers)))

    loops(0, begin, i64(0))
    kept, numbers, half = builder.load(best), builder.load(where), MAX_LANES // 2
    while half >= 1:  # by halving: the larger, or the equal of smaller number
        low, high = lane_numbers(range(half)), lane_numbers(range(half, 2 * half))
        value, top = (builder.shuffle_vector(kept, kept, high),
                      builder.shuffle_vector(kept, kept, low))
        number, top_at = (builder.shuffle_vector(numbers, numbers, high),
                          builder.shuffle_vector(numbers, numbers, low))
        takes = builder.or_(builder.fcmp_ordered(">", value, top),
                            builder.and_(builder.fcmp_ordered("==", value, top),
                                         builder.icmp_signed("<", number, top_at)))
        kept, numbers = builder.select(takes, value, top), builder.select(takes, number, top_at)
        half //= 2
    any_nan = builder.icmp_unsigned("!=", builder.bitcast(builder.load(nans),
                                                          ir.IntType(MAX_LANES)),
                                    ir.IntType(MAX_LANES)(0))
    return builder.sext(builder.extract_element(numbers, i64(0)), i64), any_nan


def _float_row(xf):
    return contiguous_1d(xf) and xf.dtype in (types.float32, types.float64)


@intrinsic
def lane_max(typingctx, xf, begin, length):
    """``(offset, nan)`` for ``xf[begin:begin + length]`` (``1 <= length < 2^31``): the
    offset of its first largest element, NaNs left out, and whether it holds a NaN
    (where the caller's rule, the first NaN wins, needs a scan of its own; the offset
    is then 0 if the first element is the NaN): :func:`window_max` of one row."""
    if not (_float_row(xf) and isinstance(begin, types.Integer)
            and isinstance(length, types.Integer)):
        return None
    sig = types.Tuple((types.int64, types.boolean))(xf, begin, length)

    def codegen(context, builder, signature, args):
        x_data, begin_v, length_v = arguments(context, builder, signature, args)
        return context.make_tuple(builder, signature.return_type, _fold_max(
            context, builder, xf, x_data, begin_v, [], length_v))

    return sig, codegen


@intrinsic
def window_max(typingctx, xf, begin, count_d, step_d, count_h, step_h, width, taps_h):
    """``(number, nan)`` for a window of ``count_d * count_h`` rows of ``width`` taps in
    ``xf``: row ``(jd, jh)`` starts at ``begin + jd step_d + jh step_h``, and its tap
    ``jw`` is numbered ``(jd count_h + jh) taps_h + jw`` (row-major: ``taps_h >=
    width``, numbers under 2^31). ``number`` is the first largest tap's, NaNs left out,
    and ``nan`` whether the window holds one (the caller's rule, the first NaN wins,
    needs a scan of its own; ``number`` is then 0 if the first tap is the NaN, every
    lane having started from it). Lane ``k`` of :data:`MAX_LANES` keeps the first largest
    of the taps ``k (mod MAX_LANES)`` of each row, a row's taps past its last whole
    group taken as one more group under a mask; the lanes are then compared by halving
    (the larger, or the equal of smaller number, wins: the first maximum in any order,
    ``-0`` and ``+0`` as one). (A loop over an array of lanes kept them in memory.)"""
    integers = (begin, count_d, step_d, count_h, step_h, width, taps_h)
    if not (_float_row(xf) and all(isinstance(t, types.Integer) for t in integers)):
        return None
    sig = types.Tuple((types.int64, types.boolean))(xf, *integers)

    def codegen(context, builder, signature, args):
        x_data, begin_v, n_d, s_d, n_h, s_h, width_v, t_h = arguments(
            context, builder, signature, args)
        return context.make_tuple(builder, signature.return_type, _fold_max(
            context, builder, xf, x_data, begin_v,
            [(n_d, s_d, builder.mul(n_h, t_h)), (n_h, s_h, t_h)], width_v))

    return sig, codegen
