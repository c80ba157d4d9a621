"""Row-pass forward kernels for C-contiguous ``(N, C, D, H, W)`` arrays.

The general kernels visit one window at a time, which the compiler cannot vectorize.
These visit one output row at a time: for every real tap row ``(jd, jh)`` of the
row's windows, one pass over the output positions folds that input row's taps in.
Inside the pass the W taps of a window are a few named loads, so the loop over
output positions vectorizes (SIMD across ``ow``). Padding in D and H costs nothing
(only real tap rows are visited); windows cut by the W padding are done one by one.

Taps are folded in row-major window order and compared strictly, so the winner (the
first maximum, or the first NaN) and the sums' order are exactly the general kernels'.
The vectorized passes exist for the common W geometries: (kernel, stride) of (2, 2),
(3, 2) and (4, 4) with no W dilation; :func:`~poolgrad.kernels.dispatch.row_interior`
tells whether a plan qualifies. Indices are unsigned so that NumPy's negative-index wraparound (which
blocks vectorization) is never compiled in.
"""

import numpy as np
from numba import njit, prange, uint64
from numba.extending import overload

from . import JIT_OPTIONS, constant, parallel_kernel
from .max_pool import max_backward_row, max_pool_row
from .simd import (BLOCK, PREFETCH_BYTES, ROUTE_BYTES, max2_block, max3_stride2_block,
                   prefetch, route2_block, route3_stride2_blocks, sum3_stride2_block)


# Helpers are plain compiled calls (``_row``), which LLVM inlines, unless a loop needs
# them inlined by Numba itself to vectorize (``_inline``, which compiles slower: the
# per-tap helpers of the max passes as plain calls cut a first vjp's compile by 6 s at
# the same speed).
_row = njit(**JIT_OPTIONS)
_inline = njit(inline="always", **JIT_OPTIONS)
# Overloads (compiled-code functions whose implementation Numba picks by argument types)
# are cached with the kernels that call them
_OVERLOAD_OPTIONS = {key: value for key, value in JIT_OPTIONS.items() if key != "cache"}


@_inline
def _fold_max(best, tap, v, v_tap):
    """One max step: the later value wins only if larger. ``v > best ? v : best`` is
    x86's maxss/maxps and the tap a cmov/blend: no branch, in vector loops and in the
    scalar tails of short rows alike (a float select written any other way became a
    branch there, mispredicted on random data). A NaN ``v`` does not win here: the
    passes report NaNs and the kernel redoes those rows exactly."""
    wins = v > best
    return (v if wins else best), (v_tap if wins else tap)


@_row
def _max_of_row(xf, i, kw, best, tap, t, nan):
    """Fold the ``kw`` taps ``xf[i:i+kw]``, numbered from ``t``, into (best, tap); ``nan``
    becomes true if one of them is NaN."""
    v = xf[i]
    best, tap = _fold_max(best, tap, v, t)
    return _max_of_rest(xf, i, kw, best, tap, t, nan | (v != v))


@_row
def _max_of_rest(xf, i, kw, best, tap, t, nan):
    """Fold the taps ``xf[i+1:i+kw]`` (numbered from ``t + 1``) into (best, tap)."""
    v = xf[i + uint64(1)]
    nan |= v != v
    best, tap = _fold_max(best, tap, v, t + 1)
    if kw >= 3:
        v = xf[i + uint64(2)]
        nan |= v != v
        best, tap = _fold_max(best, tap, v, t + 2)
    if kw >= 4:
        v = xf[i + uint64(3)]
        nan |= v != v
        best, tap = _fold_max(best, tap, v, t + 3)
    return best, tap, nan


@_inline
def _max_loop(xf, r0, r1, n_rows, kw, sw, yf, pf, yb, lo, hi, t0, t1, first):
    nan = False
    for ow in range(lo, hi):
        i = uint64(r0 + sw * ow)
        v = xf[i]
        best, tap, nan = _max_of_rest(xf, i, kw, v, t0, t0, nan | (v != v))
        if n_rows >= 2:
            best, tap, nan = _max_of_row(xf, uint64(r1 + sw * ow), kw, best, tap, t1, nan)
        o = uint64(yb + ow)
        if not first:
            best, tap = _fold_max(yf[o], np.int64(pf[o]), best, tap)
        yf[o] = best
        pf[o] = tap
    return nan


def _max_pass(xf, r0, r1, n_rows, width, yf, pf, yb, lo, hi, t0, t1, first):
    """Fold ``n_rows`` (1 or 2) tap rows into ``yf/pf[yb + ow]``, ow in [lo, hi): row ``k``
    reads ``xf[r<k> + ow*sw + jw]`` (jw < kw) as taps ``t<k> + jw``. ``first``: nothing
    folded in yet. Returns whether a tap was NaN (the result is then not PyTorch's).
    ``width``: see :func:`width_witness`; compiled code only.

    Each W width has a function of its own (:func:`_max_pass_2` ...) whose loops have
    constant geometry, row count and ``first``, so they have no branch and no
    conditional load, and vectorize: left to LLVM, the test of ``first`` stayed inside
    the loop on AVX2 CPUs (Zen 3), which ran it scalar, 10x slower."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(_max_pass, inline="always", jit_options=_OVERLOAD_OPTIONS)
def _max_pass_of_width(xf, r0, r1, n_rows, width, yf, pf, yb, lo, hi, t0, t1, first):
    chosen = {2: _max_pass_2, 3: _max_pass_3, 4: _max_pass_4}[width.ndim]

    def impl(xf, r0, r1, n_rows, width, yf, pf, yb, lo, hi, t0, t1, first):
        return chosen(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first)
    return impl


@_inline
def _max_group(xf, r0, r1, n_rows, kw, sw, yf, pf, yb, lo, hi, t0, t1, first):
    if first:
        if n_rows == 1:
            return _max_loop(xf, r0, r1, 1, kw, sw, yf, pf, yb, lo, hi, t0, t1, True)
        return _max_loop(xf, r0, r1, 2, kw, sw, yf, pf, yb, lo, hi, t0, t1, True)
    if n_rows == 1:
        return _max_loop(xf, r0, r1, 1, kw, sw, yf, pf, yb, lo, hi, t0, t1, False)
    return _max_loop(xf, r0, r1, 2, kw, sw, yf, pf, yb, lo, hi, t0, t1, False)


# one compiled function per (kernel, stride) along W, each with constant geometry
@_row
def _max_pass_2(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first):
    return _max_group(xf, r0, r1, n_rows, 2, 2, yf, pf, yb, lo, hi, t0, t1, first)


@_row
def _max_pass_3(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first):
    return _max_group(xf, r0, r1, n_rows, 3, 2, yf, pf, yb, lo, hi, t0, t1, first)


@_row
def _max_pass_4(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first):
    return _max_group(xf, r0, r1, n_rows, 4, 4, yf, pf, yb, lo, hi, t0, t1, first)


@_inline
def _sum_tile_loop(xf, r0, r1, n_rows, kw, yf, yb, out_w, first, last, factor, divisor,
                   zero):
    """Add ``n_rows`` (1 or 2) tap rows (``r<k> + ow*kw + jw`` for jw < kw) to the sums
    ``yf[yb:yb + out_w]``, tap by tap in row-major order (``first``: start them);
    ``last``: then divide them as :func:`avg_pool_forward_rows` does. Constant counts
    and flags in each loop, as in :func:`_max_pass`."""
    for ow in range(out_w):
        o = uint64(yb + ow)
        i = uint64(r0 + kw * ow)
        total = xf[i] if first else yf[o] + xf[i]
        for jw in range(1, kw):
            total += xf[i + uint64(jw)]
        if n_rows == 2:
            i = uint64(r1 + kw * ow)
            for jw in range(kw):
                total += xf[i + uint64(jw)]
        if last:
            total = (total + zero) / (factor * divisor[2, uint64(ow)])
        yf[o] = total


@_row
def _sum_pass(xf, xb, kw, sw, yf, yb, lo, hi, first):
    """Add the taps ``xf[xb + ow*sw + jw]`` to ``yf[yb + ow]`` one by one, in order
    (``first``: ``yf`` holds nothing yet; constant in each loop, as in :func:`_max_pass`)."""
    if first:
        _sum_geometry(xf, xb, kw, sw, yf, yb, lo, hi, True)
    else:
        _sum_geometry(xf, xb, kw, sw, yf, yb, lo, hi, False)


@_inline
def _sum_geometry(xf, xb, kw, sw, yf, yb, lo, hi, first):
    if kw == 2 and sw == 2:
        for ow in range(lo, hi):
            i = uint64(xb + 2 * ow)
            o = uint64(yb + ow)
            total = xf[i] if first else yf[o] + xf[i]
            yf[o] = total + xf[i + uint64(1)]
    elif kw == 3 and sw == 2:
        for ow in range(lo, hi):
            i = uint64(xb + 2 * ow)
            o = uint64(yb + ow)
            total = xf[i] if first else yf[o] + xf[i]
            total += xf[i + uint64(1)]
            yf[o] = total + xf[i + uint64(2)]
    else:  # kw == 4 and sw == 4
        for ow in range(lo, hi):
            i = uint64(xb + 4 * ow)
            o = uint64(yb + ow)
            total = xf[i] if first else yf[o] + xf[i]
            total += xf[i + uint64(1)]
            total += xf[i + uint64(2)]
            yf[o] = total + xf[i + uint64(3)]


@_row
def row_steps(n_rows):
    """``(steps, rows per step)``: a parallel step takes a run of consecutive rows (up to
    32, keeping at least 256 steps), so that only its first row's (plane, od, oh) costs
    integer divisions. Short rows (VGG's deep 7-wide ones) spent a third of their time
    on them."""
    per_step = max(1, min(32, n_rows // 256))
    return (n_rows + per_step - 1) // per_step, per_step


@_row
def step_start(row, out_h, out_d):
    """``(oh, od, plane)`` of output row ``row``."""
    return row % out_h, (row // out_h) % out_d, row // (out_h * out_d)


@_row
def next_row(oh, od, plane, out_h, out_d):
    """``(oh, od, plane)`` of the row after ``(oh, od, plane)``."""
    oh += 1
    if oh == out_h:
        oh = 0
        od += 1
        if od == out_d:
            od = 0
            plane += 1
    return oh, od, plane


@_row
def prefetch_count(n_streams, per_row, itemsize):
    """How many elements each output row asks for ahead (see :func:`prefetch_ahead`):
    ``per_row``, the input the next row adds, if the tap rows form one stream (a
    2-d window) of 512 B to 8 KB per row, else none. (The global average, one stream
    of short planes, asks for every plane.) Measured on 2x2/2 max forwards
    (two threads): 8x64x224x224 took 0.65x the time, 32x64x112x112 0.86x and
    32x128x56x56 0.94x, but 28-wide rows took 1.19x (the asking costs more than it
    saves), 1-d rows of 16 KB 1.25x and 3-d windows (a stream per slice) 1.03-1.07x."""
    nbytes = per_row * itemsize
    return per_row if n_streams == 1 and 512 <= nbytes <= 8192 else 0


@_inline
def prefetch_ahead(xf, first, count):
    """Ask for ``count`` elements of the input :data:`~poolgrad.kernels.simd.PREFETCH_BYTES`
    past ``first``, the first tap row of the output row in hand."""
    if count > 0:
        prefetch(xf, first + PREFETCH_BYTES // xf.itemsize, count)


@_row
def block_tap_rows(table, dilation, od, oh, plane, in_d, in_h, in_w):
    """The real tap rows of output row ``(plane, od, oh)`` as the blocks of
    :mod:`.simd` take them, ``(first, n_d, step_d, n_h, step_h)``: they start at
    ``first + jd*step_d + jh*step_h`` for ``jd`` < ``n_d`` and ``jh`` < ``n_h``."""
    start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
    first = ((plane * in_d + start_d + first_d * dilation[0]) * in_h + start_h
             + first_h * dilation[1]) * in_w
    return (first, end_d - first_d, dilation[0] * in_h * in_w, end_h - first_h,
            dilation[1] * in_w)


@_row
def block_place(block, out_w, column, in_w):
    """``(at, start, edge)`` of block ``block`` (a multiple of ``BLOCK``) of an output
    row ``out_w`` windows long whose window 0 starts at column ``column`` (3 taps,
    stride 2): its first window, where that window starts, and whether its taps, columns
    ``start`` to ``start + 2*BLOCK``, reach outside ``[0, in_w)``. The last block ends at
    ``out_w`` and may overlap the one before: it writes the same values again, which
    costs less than a scalar tail."""
    at = min(block, out_w - BLOCK)
    start = column + 2 * at
    return at, start, start < 0 or start + 2 * BLOCK >= in_w


@_row
def input_per_row(table, out_h, in_h, in_w):
    """How far the tap rows move from one output row to the next along H (the H stride
    in rows; a whole slice when there is one output row)."""
    return (table[1, 0, 1] - table[1, 0, 0]) * in_w if out_h > 1 else in_h * in_w


@_row
def _redo_row(x, table, dilation, extent, y, pos, plane, od, oh):
    """Output row ``(plane, od, oh)`` of a max forward, redone window by window (a tap
    was NaN: the first NaN must win); the winners go to ``pos``, or to a scratch row if
    it is None (values only)."""
    n, c = plane // x.shape[1], plane % x.shape[1]
    if pos is None:
        max_pool_row(x, table, dilation, extent, y[n, c, od, oh],
                     np.empty(y.shape[4], np.int64), n, c, od, oh)
    else:
        max_pool_row(x, table, dilation, extent, y[n, c, od, oh], pos[n, c, od, oh],
                     n, c, od, oh)


@_row
def row_windows(table, od, oh):
    """``(start, first, end)`` along D of slice ``od``, then along H of row ``oh``: where
    the output row's windows start and which of their tap rows are real."""
    return (table[0, 0, od], table[0, 1, od], table[0, 2, od],
            table[1, 0, oh], table[1, 1, oh], table[1, 2, oh])


@parallel_kernel
def max_pool_forward_rows(x, table, extent, dilation, interior, width, y, pos):
    """Same result as :func:`~poolgrad.kernels.max_pool.max_pool_forward` for plans that
    :func:`~.dispatch.row_interior` accepts. ``interior`` = (lo, hi, stride): the output columns
    whose windows lie wholly inside the input along W, and the W stride. A row whose
    windows read a NaN is redone window by window (NaN must win, the first one)."""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    dil_d, dil_h = dilation[0], dilation[1]
    ext_h, ext_w = extent[1], extent[2]
    lo, hi = interior[0], interior[1]
    xf, yf, pf = x.ravel(), y.ravel(), pos.ravel()
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)  # plane: n * n_chan + c
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
            yb = row * out_w
            # tap rows are folded in passes of up to two: (r0, t0), (r1, t1)
            r0 = r1 = t0 = t1 = 0
            n_rows = 0
            first = True  # no tap row folded in yet
            passed = False  # no pass over the interior yet
            nan = False  # a tap read so far is NaN
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    xb = ((plane * in_d + start_d + jd * dil_d) * in_h + start_h
                          + jh * dil_h) * in_w
                    tap0 = (jd * ext_h + jh) * ext_w
                    # windows cut by the W padding, one by one
                    for edge in range(out_w - (hi - lo)):
                        ow = edge if edge < lo else edge + hi - lo
                        o = uint64(yb + ow)
                        for jw in range(table[2, 1, ow], table[2, 2, ow]):
                            v = xf[uint64(xb + table[2, 0, ow] + jw)]
                            nan |= v != v
                            if first and jw == table[2, 1, ow]:
                                yf[o] = v
                                pf[o] = tap0 + jw
                            else:
                                best, tap = _fold_max(yf[o], np.int64(pf[o]), v, tap0 + jw)
                                yf[o] = best
                                pf[o] = tap
                    first = False
                    if n_rows == 0:
                        r0, t0 = xb + table[2, 0, 0], tap0
                    else:
                        r1, t1 = xb + table[2, 0, 0], tap0
                    n_rows += 1
                    if n_rows == 2 or (jd == end_d - 1 and jh == end_h - 1):
                        nan |= _max_pass(xf, r0, r1, n_rows, width, yf, pf, yb, lo, hi,
                                         t0, t1, not passed)
                        passed = True
                        n_rows = 0
            if nan:
                _redo_row(x, table, dilation, extent, y, pos, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


# Values only: a forward that wants no gradient and no indices (inference) keeps no
# winners, so it folds nothing but values, the first up to three tap rows in one pass
# (the whole window of a 2-d 3x3 or 2x2 layer, so ``y`` is written once).


@_inline
def _max_values_loop(xf, r0, r1, r2, n_rows, kw, sw, yf, yb, lo, hi, first):
    nan = False
    for ow in range(lo, hi):
        i = uint64(r0 + sw * ow)
        best = xf[i]
        nan |= best != best
        for jw in range(1, kw):  # constant counts: unrolled
            v = xf[i + uint64(jw)]
            nan |= v != v
            best = v if v > best else best
        for k in range(1, n_rows):
            i = uint64((r1 if k == 1 else r2) + sw * ow)
            for jw in range(kw):
                v = xf[i + uint64(jw)]
                nan |= v != v
                best = v if v > best else best
        o = uint64(yb + ow)
        if not first:
            earlier = yf[o]
            best = best if best > earlier else earlier  # the earlier taps win ties
        yf[o] = best
    return nan


@_inline
def _max_values_group(xf, r0, r1, r2, n_rows, kw, sw, yf, yb, lo, hi, first):
    if not first:  # the later passes take one row each
        return _max_values_loop(xf, r0, r1, r2, 1, kw, sw, yf, yb, lo, hi, False)
    if n_rows == 1:
        return _max_values_loop(xf, r0, r1, r2, 1, kw, sw, yf, yb, lo, hi, True)
    if n_rows == 2:
        return _max_values_loop(xf, r0, r1, r2, 2, kw, sw, yf, yb, lo, hi, True)
    return _max_values_loop(xf, r0, r1, r2, 3, kw, sw, yf, yb, lo, hi, True)


# one compiled function per (kernel, stride) along W, each with constant geometry
@_row
def _max_values_2(xf, r0, r1, r2, n_rows, yf, yb, lo, hi, first):
    return _max_values_group(xf, r0, r1, r2, n_rows, 2, 2, yf, yb, lo, hi, first)


@_row
def _max_values_3(xf, r0, r1, r2, n_rows, yf, yb, lo, hi, first):
    return _max_values_group(xf, r0, r1, r2, n_rows, 3, 2, yf, yb, lo, hi, first)


@_row
def _max_values_4(xf, r0, r1, r2, n_rows, yf, yb, lo, hi, first):
    return _max_values_group(xf, r0, r1, r2, n_rows, 4, 4, yf, yb, lo, hi, first)


def _max_values_pass(xf, r0, r1, r2, n_rows, width, yf, yb, lo, hi, first):
    """Fold ``n_rows`` tap rows (1 to 3; ``r<k> + ow*sw + jw`` for jw < kw) into
    ``yf[yb + ow]``, ow in [lo, hi) (``first``: write). Returns whether a tap was NaN.
    Constant geometry, row count and ``first`` in each loop, as in :func:`_max_pass`.

    ``width``: an empty array with one dimension per tap along W (:func:`width_witness`).
    Numba picks the pass for that width when it types the kernel, so a kernel compiles
    the loops of its own width only (the three widths' loops together doubled the cold
    start of a first ``max_pool``). Compiled code only."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(_max_values_pass, inline="always", jit_options=_OVERLOAD_OPTIONS)
def _max_values_pass_of_width(xf, r0, r1, r2, n_rows, width, yf, yb, lo, hi, first):
    chosen = {2: _max_values_2, 3: _max_values_3, 4: _max_values_4}[width.ndim]

    def impl(xf, r0, r1, r2, n_rows, width, yf, yb, lo, hi, first):
        return chosen(xf, r0, r1, r2, n_rows, yf, yb, lo, hi, first)
    return impl


def width_witness(kernel_w: int) -> np.ndarray:
    """The ``width`` argument of the max-forward row kernels: the W kernel as a
    compile-time :func:`~poolgrad.kernels.constant` (each width in
    ``dispatch.ROW_PASS_W`` has one stride; in the tiled kernels the stride is the
    kernel)."""
    return constant(kernel_w)


@parallel_kernel
def max_values_forward_rows(x, table, extent, dilation, interior, width, y):
    """The ``y`` of :func:`max_pool_forward_rows` without the winners. A row whose
    windows read a NaN is redone exactly (its winners go to a scratch row)."""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    dil_d, dil_h = dilation[0], dilation[1]
    lo, hi = interior[0], interior[1]  # the W stride comes with the width (see width_witness)
    xf, yf = x.ravel(), y.ravel()
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
            yb = row * out_w
            n_taps = (end_d - first_d) * (end_h - first_h)
            # the first pass takes up to three tap rows (a 2-d window of up to three rows
            # is then folded in one pass, writing y once), each later pass one
            group = min(n_taps, 3)
            r0 = r1 = r2 = 0
            n_rows = 0  # tap rows waiting for the next pass
            done = 0  # tap rows seen
            nan = False
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    xb = ((plane * in_d + start_d + jd * dil_d) * in_h + start_h
                          + jh * dil_h) * in_w
                    for edge in range(out_w - (hi - lo)):  # windows cut by the W padding
                        ow = edge if edge < lo else edge + hi - lo
                        o = uint64(yb + ow)
                        for jw in range(table[2, 1, ow], table[2, 2, ow]):
                            v = xf[uint64(xb + table[2, 0, ow] + jw)]
                            nan |= v != v
                            if done == 0 and jw == table[2, 1, ow]:
                                yf[o] = v
                            else:
                                yf[o] = v if v > yf[o] else yf[o]
                    r = xb + table[2, 0, 0]
                    if n_rows == 0:
                        r0 = r
                    elif n_rows == 1:
                        r1 = r
                    else:
                        r2 = r
                    n_rows += 1
                    done += 1
                    if n_rows == group:  # the last tap row always completes a group
                        nan |= _max_values_pass(xf, r0, r1, r2, n_rows, width, yf, yb,
                                                lo, hi, done == n_rows)
                        n_rows = 0
                        group = 1
            if nan:
                _redo_row(x, table, dilation, extent, y, None, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@parallel_kernel
def max_values_forward_blocks(x, table, extent, dilation, y):
    """:func:`max_values_forward_rows` for the plans of the dispatch's ``_stride2_blocks`` (3
    taps at stride 2 along W, rows of at least one block): each row in blocks of
    :func:`~poolgrad.kernels.simd.max3_stride2_block`, the windows cut by the W padding
    included, so ``y`` is written once. Rows that read a NaN are redone exactly. (On
    AlexNet's 27-wide rows the loops of :func:`max_values_forward_rows` loaded one of
    the taps element by element, as the average's did; see :mod:`.simd`.)"""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    xf, yf = x.ravel(), y.ravel()
    column = table[2, 0, 0]  # where window 0 starts along W; window ow starts 2*ow further
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            first, n_d, step_d, n_h, step_h = block_tap_rows(table, dilation, od, oh, plane,
                                                             in_d, in_h, in_w)
            # a 2-d window's 3 tap rows as constants (see avg_pool_forward_blocks)
            if n_d == 1 and n_h == 3:
                nan = _max_row_in_blocks(xf, first, 1, 0, 3, step_h, column, in_w, yf,
                                         row * out_w, out_w)
            else:
                nan = _max_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, in_w,
                                         yf, row * out_w, out_w)
            if nan:
                _redo_row(x, table, dilation, extent, y, None, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@_inline
def _max_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, in_w, yf, yb, out_w):
    """One output row of :func:`max_values_forward_blocks` (the blocks of
    :func:`_mean_row_in_blocks`). Returns whether a tap was NaN."""
    nan = False
    for block in range(0, out_w, BLOCK):
        at, start, edge = block_place(block, out_w, column, in_w)
        if edge:
            nan |= max3_stride2_block(xf, first, n_d, step_d, n_h, step_h, start, yf,
                                      yb + at, in_w, None, 0, 0)
        else:
            nan |= max3_stride2_block(xf, first, n_d, step_d, n_h, step_h, start, yf,
                                      yb + at, None, None, 0, 0)
    return nan


@parallel_kernel
def max_pool_forward_blocks(x, table, extent, dilation, interior, y, pos):
    """:func:`max_pool_forward_rows` (values and winners) for plans that
    the dispatch's ``_recorded_stride2_blocks`` accepts: the windows clear of the W padding in
    blocks of :func:`~poolgrad.kernels.simd.max3_stride2_block`, which records the
    winners too, and the few cut by it (ResNet's first) one by one. Rows that read a
    NaN are redone exactly. (The row passes loaded one of the three taps element by
    element, as in the values-only forward: AlexNet's 3x3/2 took 8.1 ms there.)"""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    number_step_d = extent[1] * 3  # from one tap row of a window to the next along D
    lo, hi = interior[0], interior[1]
    xf, yf, pf = x.ravel(), y.ravel(), pos.ravel()
    column = table[2, 0, 0]  # where window 0 starts along W; window ow starts 2*ow further
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            first, n_d, step_d, n_h, step_h = block_tap_rows(table, dilation, od, oh, plane,
                                                             in_d, in_h, in_w)
            number = (table[0, 1, od] * extent[1] + table[1, 1, oh]) * 3
            yb = row * out_w
            nan = _record_cut_windows(xf, first, n_d, step_d, n_h, step_h, table, number,
                                      number_step_d, yf, pf, yb, lo, hi, out_w)
            # a 2-d window's 3 tap rows as constants (see avg_pool_forward_blocks)
            if n_d == 1 and n_h == 3:
                nan |= _record_row_in_blocks(xf, first, 1, 0, 3, step_h, column, number,
                                             number_step_d, yf, pf, yb, lo, hi)
            else:
                nan |= _record_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column,
                                             number, number_step_d, yf, pf, yb, lo, hi)
            if nan:
                _redo_row(x, table, dilation, extent, y, pos, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@_inline
def _record_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, number,
                          number_step_d, yf, pf, yb, lo, hi):
    """Windows ``[lo, hi)`` of one output row of :func:`max_pool_forward_blocks`, in
    blocks; the last ends at ``hi`` and may overlap the one before (see
    :func:`block_place`). Returns whether a tap was NaN."""
    nan = False
    for block in range(lo, hi, BLOCK):
        at = min(block, hi - BLOCK)
        nan |= max3_stride2_block(xf, first, n_d, step_d, n_h, step_h, column + 2 * at, yf,
                                  yb + at, None, pf, number, number_step_d)
    return nan


@_row
def _record_cut_windows(xf, first, n_d, step_d, n_h, step_h, table, number, number_step_d,
                        yf, pf, yb, lo, hi, out_w):
    """The windows of one output row of :func:`max_pool_forward_blocks` that the W
    padding cuts (outside ``[lo, hi)``), one by one and tap by tap in the kernels'
    order. Returns whether a tap was NaN. (The general kernels'
    :func:`~poolgrad.kernels.max_pool.max_pool_row` does the same per row, but called for
    these windows in every row it took ResNet's 3x3/2 from 7.3 to 10.8 ms.)"""
    nan = False
    for edge in range(out_w - (hi - lo)):
        ow = edge if edge < lo else edge + hi - lo
        o = uint64(yb + ow)
        best, tap = yf[o], np.int64(0)  # (typing only: the first tap replaces them)
        taken = False
        for jd in range(n_d):
            for jh in range(n_h):
                xb = first + jd * step_d + jh * step_h + table[2, 0, ow]
                t = number + jd * number_step_d + jh * 3
                for jw in range(table[2, 1, ow], table[2, 2, ow]):
                    v = xf[uint64(xb + jw)]
                    nan |= v != v
                    if not taken:
                        best, tap = v, np.int64(t + jw)
                        taken = True
                    else:
                        best, tap = _fold_max(best, tap, v, np.int64(t + jw))
        yf[o] = best
        pf[o] = tap
    return nan


# Tiled windows (stride = kernel along every axis, no padding, no dilation: VGG's 2x2/2,
# 1-d k/k, 3-d 2x2x2/2) read each input element once, and an output row's tap rows lie at
# fixed offsets from its first. These kernels keep no per-row window table and no W
# edges: on short rows (VGG's deep 7-wide ones) such per-row bookkeeping cost more than
# the loads, and the general row kernels ran at a third of these speeds.


@_row
def _tap_row_offsets(ext_d, ext_h, in_h, in_w):
    """Where each tap row of a tiling window (row-major over (jd, jh)) starts, from the
    first: the same for every output row, so computed once per call."""
    offsets = np.empty(ext_d * ext_h, np.int64)
    for jd in range(ext_d):
        for jh in range(ext_h):
            offsets[jd * ext_h + jh] = (jd * in_h + jh) * in_w
    return offsets


@_inline
def _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h):
    """Where the first tap row of output row ``(plane, od, oh)`` starts."""
    return ((plane * in_d + od * ext_d) * in_h + oh * ext_h) * in_w


@_inline
def _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h, in_w, ext_d, ext_h):
    """``(oh, od, plane)`` of the next output row and where its first tap row starts: one
    step of ``ext_h`` input rows down, or (past a slice's last row) recomputed."""
    if oh + 1 < out_h:
        return oh + 1, od, plane, xb + ext_h * in_w
    oh, od, plane = next_row(oh, od, plane, out_h, out_d)
    return oh, od, plane, _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)


@_inline
def _max_values_tile(xf, xb, offsets, kw, yf, yb, out_w):
    """Output row ``yb`` of a tiled max forward, values only: the first two tap rows in
    one pass, each later one in a pass of its own. Returns whether a tap was NaN."""
    if len(offsets) == 1:
        return _max_values_loop(xf, xb, xb, xb, 1, kw, kw, yf, yb, 0, out_w, True)
    r1 = xb + offsets[1]
    nan = _max_values_loop(xf, xb, r1, r1, 2, kw, kw, yf, yb, 0, out_w, True)
    for tap_row in range(2, len(offsets)):
        r = xb + offsets[tap_row]
        nan |= _max_values_loop(xf, r, r, r, 1, kw, kw, yf, yb, 0, out_w, False)
    return nan


@_inline
def _max_recorded_tile(xf, xb, offsets, kw, yf, pf, yb, out_w):
    """:func:`_max_values_tile` with the winners' tap numbers in ``pf``."""
    if len(offsets) == 1:
        return _max_loop(xf, xb, xb, 1, kw, kw, yf, pf, yb, 0, out_w, 0, 0, True)
    nan = _max_loop(xf, xb, xb + offsets[1], 2, kw, kw, yf, pf, yb, 0, out_w, 0, kw, True)
    for tap_row in range(2, len(offsets)):
        r = xb + offsets[tap_row]
        nan |= _max_loop(xf, r, r, 1, kw, kw, yf, pf, yb, 0, out_w, tap_row * kw, 0, False)
    return nan


@_row
def _short_in_blocks(kw, out_w, itemsize):
    """Whether the tiled max forwards take rows in vector blocks: a W kernel of 2 and rows
    of at least one block but shorter than 32 windows. On VGG's deep 7-wide rows the
    compiler's loops ran only their scalar tails; long rows vectorize well as they are.
    The kernels ask once per call: asked per row inside the tile helpers, it cost 4-5%
    on those rows."""
    return kw == 2 and ROUTE_BYTES // itemsize <= 2 * out_w and out_w < 32


@_inline
def _max_in_blocks(xf, xb, offsets, yf, pf, yb, out_w):
    """Output row ``yb`` of a tiled max forward with a W kernel of 2 in blocks of
    :func:`~poolgrad.kernels.simd.max2_block`, with the winners in ``pf`` unless it is
    None. The row is at least one block wide; its last block ends at the row's end,
    overlapping the one before. Returns whether a tap was NaN."""
    lanes = ROUTE_BYTES // xf.itemsize
    covered_w = 2 * out_w
    nan = False
    for block in range(0, covered_w, lanes):
        at = min(block, covered_w - lanes)
        nan |= max2_block(xf, xb, offsets, at, yf, yb + at // 2, pf)
    return nan


@parallel_kernel
def max_values_forward_tiled(x, table, extent, dilation, width, y):
    """The ``y`` of :func:`max_values_forward_rows` for plans whose windows tile the input
    (the dispatch's ``_tiled_forward``). ``width``: see :func:`width_witness` (its stride
    is the kernel here). Rows that read a NaN are redone exactly."""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_d, ext_h = extent[0], extent[1]
    offsets = _tap_row_offsets(ext_d, ext_h, in_h, in_w)
    xf, yf = x.ravel(), y.ravel()
    blocks = _short_in_blocks(width.ndim, out_w, xf.itemsize)
    ahead = prefetch_count(ext_d, ext_h * in_w, xf.itemsize)
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        xb = _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            prefetch_ahead(xf, xb, ahead)
            if (_max_in_blocks(xf, xb, offsets, yf, None, row * out_w, out_w) if blocks else
                    _max_values_tile(xf, xb, offsets, width.ndim, yf, row * out_w, out_w)):
                _redo_row(x, table, dilation, extent, y, None, plane, od, oh)
            oh, od, plane, xb = _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h,
                                                in_w, ext_d, ext_h)


# the recorded forward is a kernel of its own: one kernel for both (``pos`` None for the
# values only, a `pos is None` test choosing the loops) made a first vjp compile 3.5 s longer
@parallel_kernel
def max_pool_forward_tiled(x, table, extent, dilation, width, y, pos):
    """:func:`max_pool_forward_rows` (values and winners) for plans whose windows tile the
    input, with the loop of :func:`max_values_forward_tiled`."""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_d, ext_h = extent[0], extent[1]
    offsets = _tap_row_offsets(ext_d, ext_h, in_h, in_w)
    xf, yf, pf = x.ravel(), y.ravel(), pos.ravel()
    blocks = _short_in_blocks(width.ndim, out_w, xf.itemsize)
    ahead = prefetch_count(ext_d, ext_h * in_w, xf.itemsize)
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        xb = _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            prefetch_ahead(xf, xb, ahead)
            if (_max_in_blocks(xf, xb, offsets, yf, pf, row * out_w, out_w) if blocks else
                    _max_recorded_tile(xf, xb, offsets, width.ndim, yf, pf, row * out_w,
                                       out_w)):
                _redo_row(x, table, dilation, extent, y, pos, plane, od, oh)
            oh, od, plane, xb = _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h,
                                                in_w, ext_d, ext_h)


@_inline
def _sum_tile(xf, xb, offsets, kw, yf, yb, out_w, factor, divisor, zero):
    """Output row ``yb`` of a tiled average forward (see :func:`_max_values_tile`): the
    pass of the last tap row divides."""
    n_taps = len(offsets)
    if n_taps == 1:
        _sum_tile_loop(xf, xb, xb, 1, kw, yf, yb, out_w, True, True, factor, divisor, zero)
        return
    r = xb + offsets[1]
    if n_taps == 2:
        _sum_tile_loop(xf, xb, r, 2, kw, yf, yb, out_w, True, True, factor, divisor, zero)
        return
    _sum_tile_loop(xf, xb, r, 2, kw, yf, yb, out_w, True, False, factor, divisor, zero)
    for tap_row in range(2, n_taps - 1):
        r = xb + offsets[tap_row]
        _sum_tile_loop(xf, r, r, 1, kw, yf, yb, out_w, False, False, factor, divisor, zero)
    r = xb + offsets[n_taps - 1]
    _sum_tile_loop(xf, r, r, 1, kw, yf, yb, out_w, False, True, factor, divisor, zero)


@parallel_kernel
def avg_pool_forward_tiled(x, extent, divisor, plus_zero, width, y):
    """The result of :func:`avg_pool_forward_rows` for plans whose windows tile the input
    (the dispatch's ``_tiled_forward``), with the loop of :func:`max_pool_forward_tiled`:
    the first pass adds two tap rows, each later pass one, and the last pass divides."""
    zero = plus_zero[0]
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_d, ext_h = extent[0], extent[1]
    kw = width.ndim
    offsets = _tap_row_offsets(ext_d, ext_h, in_h, in_w)
    xf, yf = x.ravel(), y.ravel()
    ahead = prefetch_count(ext_d, ext_h * in_w, xf.itemsize)
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        xb = _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            prefetch_ahead(xf, xb, ahead)
            yb = row * out_w
            _sum_tile(xf, xb, offsets, kw, yf, yb, out_w, divisor[0, od] * divisor[1, oh],
                      divisor, zero)
            oh, od, plane, xb = _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h,
                                                in_w, ext_d, ext_h)


@parallel_kernel
def avg_pool_forward_rows(x, table, extent, dilation, interior, divisor, plus_zero, y):
    """Same result as :func:`~poolgrad.kernels.sum_pool.avg_pool_forward` for plans that
    :func:`~.dispatch.row_interior` accepts (see :func:`max_pool_forward_rows`).

    The sums start from their first tap, not from 0, so a window of -0s sums to -0:
    ``plus_zero`` (a 1-element array holding +0) is added to every sum before its
    division, which turns that -0 into the +0 of a sum that starts from 0 and leaves
    every other sum alone. (Added to the mean instead, it also turned the -0 of a tiny
    negative mean that underflows into +0.) It is an array, not a constant, so that the
    compiler (allowed to ignore the sign of zeros) cannot drop the addition."""
    zero = plus_zero[0]
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    dil_d, dil_h = dilation[0], dilation[1]
    lo, hi, stride_w = interior[0], interior[1], interior[2]
    xf, yf = x.ravel(), y.ravel()
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
            yb = row * out_w
            first = True
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    xb = ((plane * in_d + start_d + jd * dil_d) * in_h + start_h
                          + jh * dil_h) * in_w
                    _sum_pass(xf, xb + table[2, 0, 0], extent[2], stride_w, yf, yb, lo, hi,
                              first)
                    for edge in range(out_w - (hi - lo)):
                        ow = edge if edge < lo else edge + hi - lo
                        o = uint64(yb + ow)
                        for jw in range(table[2, 1, ow], table[2, 2, ow]):
                            v = xf[uint64(xb + table[2, 0, ow] + jw)]
                            yf[o] = v if first and jw == table[2, 1, ow] else yf[o] + v
                    first = False
            factor = divisor[0, od] * divisor[1, oh]
            for ow in range(out_w):
                o = uint64(yb + ow)
                yf[o] = (yf[o] + zero) / (factor * divisor[2, uint64(ow)])
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@parallel_kernel
def avg_pool_forward_blocks(x, table, extent, dilation, divisor, plus_zero, y):
    """:func:`avg_pool_forward_rows` for the plans of the dispatch's ``_stride2_blocks``: the
    same bits, with each row in blocks of :data:`~poolgrad.kernels.simd.BLOCK` outputs
    (see :mod:`poolgrad.kernels.simd`), the windows cut by the W padding included. A
    block adds all of its windows' tap rows and divides at once, so ``y`` is written
    once.
    (A separate kernel: in :func:`avg_pool_forward_rows`
    the block path slowed the short rows it does not serve, by a third on 7-wide
    rows.)"""
    zero = plus_zero[0]
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    xf, yf = x.ravel(), y.ravel()
    divisor_w = divisor[2]
    column = table[2, 0, 0]  # where window 0 starts along W; window ow starts 2*ow further
    ahead = prefetch_count(extent[0], input_per_row(table, out_h, in_h, in_w),
                           x.itemsize)
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            first, n_d, step_d, n_h, step_h = block_tap_rows(table, dilation, od, oh, plane,
                                                             in_d, in_h, in_w)
            factor = divisor[0, od] * divisor[1, oh]
            prefetch_ahead(xf, first, ahead)
            # a 2-d window's 3 tap rows as constants, which lets the compiler unroll the
            # blocks' tap-row loop: the ResNet 3x3/2 rows took 6.3 ms instead of 7.3
            # (one thread, data in cache, 16 times the 2x64x112x112 input); the same
            # test inside the blocks, where it is made for every block, cost 1-2%
            if n_d == 1 and n_h == 3:
                _mean_row_in_blocks(xf, first, 1, 0, 3, step_h, column, in_w, yf,
                                    row * out_w, out_w, factor, divisor_w, zero)
            else:
                _mean_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, in_w, yf,
                                    row * out_w, out_w, factor, divisor_w, zero)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@_inline
def _mean_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, in_w, yf, yb, out_w,
                        factor, divisor_w, zero):
    """One output row of :func:`avg_pool_forward_blocks`, whose tap rows are those of
    :func:`~poolgrad.kernels.simd.sum3_stride2_block`, in blocks; the blocks that reach
    into the W padding leave its taps out."""
    for block in range(0, out_w, BLOCK):
        at, start, edge = block_place(block, out_w, column, in_w)
        if edge:
            sum3_stride2_block(xf, first, n_d, step_d, n_h, step_h, start, yf, yb + at,
                               divisor_w, at, factor, zero, in_w)
        else:
            sum3_stride2_block(xf, first, n_d, step_d, n_h, step_h, start, yf, yb + at,
                               divisor_w, at, factor, zero, None)


# ------------------------------------------------------------------------------ backward
#
# Backward row passes gather per input row, like the general kernels: each input row is
# zeroed, then every output row whose windows read it (in increasing output order) adds
# its contributions along W: first the windows cut by the front padding, then the
# interior, then the windows cut by the end padding. Contributions to one element thus
# arrive in increasing output order, and the sums are the general kernels', bit for bit.


@_inline
def _routed(dyf, pf, o, t, zero, one):
    """The gradient output ``o`` sends to its tap ``t``: ``dy * 1`` if ``t`` won, else
    ``dy * 0``. For a finite ``dy`` that is ``dy`` or a zero, and adding a zero leaves
    the sum's bits alone (it starts at +0 and is never -0): the bits of the gather's
    ``if won: total += dy``, without a float select, which in the scalar tails of short
    rows became a mispredicted branch. An infinite or NaN ``dy`` leaves a non-finite
    value in its row, and the kernel redoes such rows exactly."""
    return dyf[o] * (one if pf[o] == t else zero)


@_row
def _max_back_pass(dyf, pf, ob, dxf, xb, kw, sw, lo, hi, t, zero, one):
    """Add output row ``ob``'s routed gradients for ow in [lo, hi) to the input row whose
    window ``ow`` starts at column ``xb + ow*sw``; its taps are numbered from ``t``."""
    if kw == 2 and sw == 2:
        for ow in range(lo, hi):
            i, o = uint64(xb + 2 * ow), uint64(ob + ow)
            dxf[i] += _routed(dyf, pf, o, t, zero, one)
            dxf[i + uint64(1)] += _routed(dyf, pf, o, t + 1, zero, one)
    elif kw == 4 and sw == 4:
        for ow in range(lo, hi):
            i, o = uint64(xb + 4 * ow), uint64(ob + ow)
            dxf[i] += _routed(dyf, pf, o, t, zero, one)
            dxf[i + uint64(1)] += _routed(dyf, pf, o, t + 1, zero, one)
            dxf[i + uint64(2)] += _routed(dyf, pf, o, t + 2, zero, one)
            dxf[i + uint64(3)] += _routed(dyf, pf, o, t + 3, zero, one)
    elif hi > lo:  # kw == 3, sw == 2: column 2*ow is tap 2 of ow - 1, then tap 0 of ow
        # whole blocks of windows in vector code, the rest here; a block routes with a
        # select (+0 where a tap lost): for a finite dy the bits of _routed's product
        blocks = (hi - lo) // BLOCK
        rest = lo + blocks * BLOCK
        if blocks > 0:
            route3_stride2_blocks(dyf, pf, ob + lo, blocks, dxf, xb + 2 * lo, t)
        else:
            i, o = uint64(xb + 2 * lo), uint64(ob + lo)
            dxf[i] += _routed(dyf, pf, o, t, zero, one)
            dxf[i + uint64(1)] += _routed(dyf, pf, o, t + 1, zero, one)
            rest = lo + 1
        for ow in range(rest, hi):
            i, o = uint64(xb + 2 * ow), uint64(ob + ow)
            dxf[i] = (dxf[i] + _routed(dyf, pf, o - uint64(1), t + 2, zero, one)
                      + _routed(dyf, pf, o, t, zero, one))
            dxf[i + uint64(1)] += _routed(dyf, pf, o, t + 1, zero, one)
        dxf[uint64(xb + 2 * hi)] += _routed(dyf, pf, uint64(ob + hi - 1), t + 2, zero, one)


@_row
def _avg_back_pass(dyf, ob, factor, divisor, dxf, xb, kw, sw, lo, hi):
    """Like :func:`_max_back_pass` for average pooling: every tap gets
    ``dy / (factor * divisor[2, ow])``."""
    if kw == 2 and sw == 2:
        for ow in range(lo, hi):
            i = uint64(xb + 2 * ow)
            g = dyf[uint64(ob + ow)] / (factor * divisor[2, uint64(ow)])
            dxf[i] += g
            dxf[i + uint64(1)] += g
    elif kw == 4 and sw == 4:
        for ow in range(lo, hi):
            i = uint64(xb + 4 * ow)
            g = dyf[uint64(ob + ow)] / (factor * divisor[2, uint64(ow)])
            dxf[i] += g
            dxf[i + uint64(1)] += g
            dxf[i + uint64(2)] += g
            dxf[i + uint64(3)] += g
    elif hi > lo:  # kw == 3, sw == 2
        g = dyf[uint64(ob + lo)] / (factor * divisor[2, lo])
        i = uint64(xb + 2 * lo)
        dxf[i] += g
        dxf[i + uint64(1)] += g
        for ow in range(lo + 1, hi):
            i = uint64(xb + 2 * ow)
            before = dyf[uint64(ob + ow - 1)] / (factor * divisor[2, uint64(ow - 1)])
            g = dyf[uint64(ob + ow)] / (factor * divisor[2, uint64(ow)])
            dxf[i] = dxf[i] + before + g
            dxf[i + uint64(1)] += g
        dxf[uint64(xb + 2 * hi)] += dyf[uint64(ob + hi - 1)] / (factor * divisor[2, hi - 1])


@parallel_kernel
def max_pool_backward_rows(dy, pos, cover_ptr, cover_out, cover_tap, table, extent,
                           interior, dx):
    """Same result as :func:`~poolgrad.kernels.max_pool.max_pool_backward` for C-contiguous
    ``dy`` and plans that :func:`~.dispatch.row_interior` accepts. Rows that come out with an
    infinity or a NaN are redone exactly (see :func:`_routed`)."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    out_d, out_h, out_w = dy.shape[2], dy.shape[3], dy.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    lo, hi, stride_w = interior[0], interior[1], interior[2]
    dyf, pf, dxf = dy.ravel(), pos.ravel(), dx.ravel()
    zero = np.zeros(1, dx.dtype)[0]
    one = np.ones(1, dx.dtype)[0]
    for row in prange(n_batch * n_chan * in_d * in_h):
        ih = row % in_h
        i_d = (row // in_h) % in_d
        plane = row // (in_h * in_d)
        xb = row * in_w
        for iw in range(in_w):
            dxf[uint64(xb + iw)] = zero
        for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
            od, jd = cover_out[0, a], cover_tap[0, a]
            for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                oh, jh = cover_out[1, b], cover_tap[1, b]
                ob = ((plane * out_d + od) * out_h + oh) * out_w
                t = (jd * ext_h + jh) * ext_w
                for edge in range(out_w - (hi - lo)):
                    ow = edge if edge < lo else edge + hi - lo
                    if ow == hi:  # the front-cut windows are done: now the interior
                        _max_back_pass(dyf, pf, ob, dxf, xb + table[2, 0, 0], ext_w, stride_w,
                                       lo, hi, t, zero, one)
                    for jw in range(table[2, 1, ow], table[2, 2, ow]):
                        i = uint64(xb + table[2, 0, ow] + jw)
                        dxf[i] += _routed(dyf, pf, uint64(ob + ow), t + jw, zero, one)
                if hi == out_w:
                    _max_back_pass(dyf, pf, ob, dxf, xb + table[2, 0, 0], ext_w, stride_w,
                                   lo, hi, t, zero, one)
        finite = True
        for iw in range(in_w):
            v = dxf[uint64(xb + iw)]
            finite &= v - v == zero  # false for an infinity or a NaN
        if not finite:
            n, c = plane // n_chan, plane % n_chan
            max_backward_row(dy, pos, cover_ptr, cover_out, cover_tap, extent,
                             dx[n, c, i_d, ih], n, c, i_d, ih)


@parallel_kernel
def avg_pool_backward_rows(dy, divisor, cover_ptr, cover_out, table, extent, interior, dx):
    """Same result as :func:`~poolgrad.kernels.sum_pool.avg_pool_backward` for C-contiguous
    ``dy`` and plans that :func:`~.dispatch.row_interior` accepts."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    out_d, out_h, out_w = dy.shape[2], dy.shape[3], dy.shape[4]
    lo, hi, stride_w = interior[0], interior[1], interior[2]
    dyf, dxf = dy.ravel(), dx.ravel()
    zero = np.zeros(1, dx.dtype)[0]
    for row in prange(n_batch * n_chan * in_d * in_h):
        ih = row % in_h
        i_d = (row // in_h) % in_d
        plane = row // (in_h * in_d)
        xb = row * in_w
        for iw in range(in_w):
            dxf[uint64(xb + iw)] = zero
        for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
            od = cover_out[0, a]
            for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                oh = cover_out[1, b]
                ob = ((plane * out_d + od) * out_h + oh) * out_w
                factor = divisor[0, od] * divisor[1, oh]
                for edge in range(out_w - (hi - lo)):
                    ow = edge if edge < lo else edge + hi - lo
                    if ow == hi:
                        _avg_back_pass(dyf, ob, factor, divisor, dxf, xb + table[2, 0, 0],
                                       extent[2], stride_w, lo, hi)
                    g = dyf[uint64(ob + ow)] / (factor * divisor[2, ow])
                    for jw in range(table[2, 1, ow], table[2, 2, ow]):
                        dxf[uint64(xb + table[2, 0, ow] + jw)] += g
                if hi == out_w:
                    _avg_back_pass(dyf, ob, factor, divisor, dxf, xb + table[2, 0, 0],
                                   extent[2], stride_w, lo, hi)


# ------------------------------------------------------------------ tiling windows
#
# Where the windows tile the input (stride = kernel, no padding, no dilation: VGG's
# 2x2/2), every input element is read by at most one window, so backward writes each
# element once instead of gathering. The gradients are moved as integer bit patterns:
# an integer select is a cmov (or a blend), where a float select in the scalar tail of
# a short row (VGG's 7-wide rows are nothing but tail) became a mispredicted branch.


@_inline
def _gradient_bits(g, float_bits):
    """The bits ``g`` of a gradient with the gather's ``0 + dy`` applied: a -0 becomes +0
    and a signalling NaN is quieted. ``float_bits``: the bits of -0, of the exponent
    field and of the quiet-NaN flag."""
    negative_zero, exponent, quiet = float_bits[0], float_bits[1], float_bits[2]
    g = g if g != negative_zero else 0
    nan = ((g & exponent) == exponent) & ((g & (quiet | (quiet - 1))) != 0)
    return g | quiet if nan else g


@_inline
def _route_row(dyi, pf, ob, out_w, dxi, xb, kw, t, float_bits):
    """Input row ``dxi[xb:xb + out_w*kw]`` from output row ``ob``, whose taps along W are
    numbered from ``t``: each tap gets its window's gradient if it won, else +0."""
    for ow in range(out_w):
        o = uint64(ob + ow)
        g = _gradient_bits(dyi[o], float_bits)
        won = pf[o]
        i = uint64(xb + kw * ow)
        for jw in range(kw):  # unrolled for the constant widths 2 and 4
            dxi[i + uint64(jw)] = g if won == t + jw else 0


@_inline
def _route_pair(dyi, pf, ob, out_w, dxi, r0, r1, kw, float_bits):
    """The first two tap rows (at ``r0`` and ``r1``) of output row ``ob`` in one loop, as
    :func:`_route_row`: a short row reads its gradients and winners once. Long rows
    take one loop per tap row, which vectorizes better."""
    for ow in range(out_w):
        o = uint64(ob + ow)
        g = _gradient_bits(dyi[o], float_bits)
        won = pf[o]
        i = uint64(r0 + kw * ow)
        for jw in range(kw):
            dxi[i + uint64(jw)] = g if won == jw else 0
        i = uint64(r1 + kw * ow)
        for jw in range(kw):
            dxi[i + uint64(jw)] = g if won == kw + jw else 0


@_inline
def _route_rows_in_blocks(dyi, pf, ob, dxi, xb, offsets, covered_w, float_bits):
    """All tap rows of output row ``ob`` (W kernel 2), as :func:`_route_row` gives them,
    two tap rows at a time in blocks of :data:`~poolgrad.kernels.simd.ROUTE_BYTES`
    (see :func:`~poolgrad.kernels.simd.route2_block`). ``covered_w`` is at least one
    block; the last block of a row ends at ``covered_w`` and may overlap the one before,
    writing the same values again."""
    lanes = ROUTE_BYTES // dxi.itemsize
    n_taps = len(offsets)
    for tap_row in range(0, n_taps, 2):
        r0 = xb + offsets[tap_row]
        # an odd last tap row is written twice by the same block
        r1 = xb + offsets[min(tap_row + 1, n_taps - 1)]
        t1 = 2 * min(tap_row + 1, n_taps - 1)
        for block in range(0, covered_w, lanes):
            at = min(block, covered_w - lanes)
            route2_block(dyi, pf, ob + at // 2, dxi, r0 + at, 2 * tap_row, r1 + at, t1,
                         float_bits)


def tiled_width(kernel_w: int) -> np.ndarray:
    """The ``width`` argument of :func:`max_pool_backward_tiled`: a W kernel of 2 or 4 as
    its :func:`width_witness` (compiled with that width constant), any other as a 5-d one
    (one compile, which reads the width from ``extent``)."""
    return width_witness(kernel_w if kernel_w in (2, 4) else 5)


@parallel_kernel
def max_pool_backward_tiled(dy_bits, pos, extent, width, float_bits, dx_bits):
    """Same result as :func:`~poolgrad.kernels.max_pool.max_pool_backward` for plans whose
    windows tile the input (:attr:`~poolgrad.geometry.WindowPlan.tiles`), on the integer
    views of C-contiguous ``dy`` and ``dx``. ``width``: see :func:`tiled_width`;
    ``float_bits``: see :func:`_gradient_bits`.

    Each output row writes the ``kd * kh`` input rows it covers (a parallel step owns a
    run of output rows, as in :func:`max_pool_forward_tiled`); the last rows of a plane
    also zero the input rows no window reads. With a W kernel of 2 the rows go in vector
    blocks (:func:`~poolgrad.kernels.simd.route2_block`), 8 float32 or 4 float64 at a
    time; other widths, and rows narrower than a block, in the loops of
    :func:`_route_row`."""
    n_batch, n_chan, in_d, in_h, in_w = dx_bits.shape
    out_d, out_h, out_w = dy_bits.shape[2], dy_bits.shape[3], dy_bits.shape[4]
    ext_d, ext_h = extent[0], extent[1]
    kw = width.ndim if width.ndim < 5 else extent[2]
    offsets = _tap_row_offsets(ext_d, ext_h, in_h, in_w)
    n_taps = len(offsets)
    dyi, pf, dxi = dy_bits.ravel(), pos.ravel(), dx_bits.ravel()
    covered_w = out_w * kw
    blocks = kw == 2 and covered_w >= ROUTE_BYTES // dxi.itemsize
    # tap rows routed before the loop over tap rows: all of them in blocks, or the first
    # two by _route_pair
    ahead = n_taps if blocks else (2 if n_taps > 1 and out_w < 32 else 0)
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        xb = _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            ob = row * out_w
            if blocks:
                _route_rows_in_blocks(dyi, pf, ob, dxi, xb, offsets, covered_w, float_bits)
            elif ahead:
                _route_pair(dyi, pf, ob, out_w, dxi, xb, xb + offsets[1], kw, float_bits)
            for tap_row in range(n_taps):
                r = xb + offsets[tap_row]
                if tap_row >= ahead:
                    _route_row(dyi, pf, ob, out_w, dxi, r, kw, tap_row * kw, float_bits)
                if covered_w < in_w:  # columns that no window reads
                    for iw in range(covered_w, in_w):
                        dxi[uint64(r + iw)] = 0
            # input rows that no window reads: below the last output row of each slice,
            # and the slices behind the last output slice
            if oh == out_h - 1:
                for jd in range(ext_d):
                    base = (plane * in_d + od * ext_d + jd) * in_h
                    for ih in range(out_h * ext_h, in_h):
                        for iw in range(in_w):
                            dxi[uint64((base + ih) * in_w + iw)] = 0
                if od == out_d - 1:
                    for i_d in range(out_d * ext_d, in_d):
                        for iw in range(in_h * in_w):
                            dxi[uint64((plane * in_d + i_d) * in_h * in_w + iw)] = 0
            oh, od, plane, xb = _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h,
                                                in_w, ext_d, ext_h)
