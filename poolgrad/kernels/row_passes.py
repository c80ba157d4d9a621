"""Forward row passes for C-contiguous ``(N, C, D, H, W)`` arrays: max (with winners,
and values only) and average.

The general kernels visit one window at a time, which the compiler cannot vectorize.
These visit one output row at a time: for every real tap row ``(jd, jh)`` of the
row's windows, one pass over the output positions folds that input row's taps in.
Inside the pass the W taps of a window are a few named loads, so the loop over
output positions vectorizes (SIMD across ``ow``). Padding in D and H costs nothing
(only real tap rows are visited); windows cut by the W padding are done one by one.

They serve the W geometries of ``dispatch.ROW_PASS_W``: (kernel, stride) of (2, 2),
(3, 2) and (4, 4) with no W dilation (:func:`~poolgrad.kernels.dispatch.row_interior`).
Taps are folded in row-major window order, so the results keep the contracts of
:mod:`poolgrad.kernels` (first maximum, first NaN, sums in window order, +0 for a
window of -0s). Indices are unsigned so that NumPy's negative-index wraparound (which
blocks vectorization) is never compiled in.
"""

import numpy as np
from numba import prange, uint64
from numba.extending import overload

from . import JIT_OPTIONS, constant, parallel_kernel
from .max_pool import max_pool_row
from .walk import (
    helper,
    inlined,
    next_row,
    row_steps,
    row_windows,
    step_start,
)


@inlined
def fold_max(best, tap, v, v_tap):
    """One max step: the later value wins only if larger. ``v > best ? v : best`` is
    x86's maxss/maxps and the tap a cmov/blend: no branch, in vector loops and in the
    scalar tails of short rows alike (a float select written any other way became a
    branch there, mispredicted on random data). A NaN ``v`` does not win here: the
    passes report NaNs and the kernel redoes those rows exactly."""
    wins = v > best
    return (v if wins else best), (v_tap if wins else tap)


@helper
def _max_of_row(xf, i, kw, best, tap, t, nan):
    """Fold the ``kw`` taps ``xf[i:i+kw]``, numbered from ``t``, into (best, tap); ``nan``
    becomes true if one of them is NaN."""
    v = xf[i]
    best, tap = fold_max(best, tap, v, t)
    return _max_of_rest(xf, i, kw, best, tap, t, nan | (v != v))


@helper
def _max_of_rest(xf, i, kw, best, tap, t, nan):
    """Fold the taps ``xf[i+1:i+kw]`` (numbered from ``t + 1``) into (best, tap)."""
    v = xf[i + uint64(1)]
    nan |= v != v
    best, tap = fold_max(best, tap, v, t + 1)
    if kw >= 3:
        v = xf[i + uint64(2)]
        nan |= v != v
        best, tap = fold_max(best, tap, v, t + 2)
    if kw >= 4:
        v = xf[i + uint64(3)]
        nan |= v != v
        best, tap = fold_max(best, tap, v, t + 3)
    return best, tap, nan


@inlined
def max_loop(xf, r0, r1, n_rows, kw, sw, yf, pf, yb, lo, hi, t0, t1, first):
    """The loop of :func:`_max_pass` for one W geometry (``kw`` taps, stride ``sw``),
    row count and ``first``, all constant where it is inlined. Reads the tap rows at
    ``r0`` (and ``r1``), writes ``yf/pf[yb + ow]`` for ow in [lo, hi); returns whether a
    tap was NaN."""
    nan = False
    for ow in range(lo, hi):
        i = uint64(r0 + sw * ow)
        v = xf[i]
        best, tap, nan = _max_of_rest(xf, i, kw, v, t0, t0, nan | (v != v))
        if n_rows >= 2:
            best, tap, nan = _max_of_row(xf, uint64(r1 + sw * ow), kw, best, tap, t1, nan)
        o = uint64(yb + ow)
        if not first:
            best, tap = fold_max(yf[o], np.int64(pf[o]), best, tap)
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
    the loop on AVX2 CPUs, which ran it scalar."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(_max_pass, inline="always", jit_options=JIT_OPTIONS)
def _max_pass_of_width(xf, r0, r1, n_rows, width, yf, pf, yb, lo, hi, t0, t1, first):
    """Numba's implementation of :func:`_max_pass`: the pass of ``width.ndim`` taps."""
    chosen = {2: _max_pass_2, 3: _max_pass_3, 4: _max_pass_4}[width.ndim]

    def impl(xf, r0, r1, n_rows, width, yf, pf, yb, lo, hi, t0, t1, first):
        return chosen(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first)
    return impl


@inlined
def _max_group(xf, r0, r1, n_rows, kw, sw, yf, pf, yb, lo, hi, t0, t1, first):
    """:func:`max_loop` with ``n_rows`` and ``first`` made constants, one loop each."""
    if first:
        if n_rows == 1:
            return max_loop(xf, r0, r1, 1, kw, sw, yf, pf, yb, lo, hi, t0, t1, True)
        return max_loop(xf, r0, r1, 2, kw, sw, yf, pf, yb, lo, hi, t0, t1, True)
    if n_rows == 1:
        return max_loop(xf, r0, r1, 1, kw, sw, yf, pf, yb, lo, hi, t0, t1, False)
    return max_loop(xf, r0, r1, 2, kw, sw, yf, pf, yb, lo, hi, t0, t1, False)


# one compiled function per (kernel, stride) along W, each with constant geometry
@helper
def _max_pass_2(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first):
    """:func:`_max_pass` for 2 taps at stride 2 (and the 3 and 4 below: (3, 2), (4, 4))."""
    return _max_group(xf, r0, r1, n_rows, 2, 2, yf, pf, yb, lo, hi, t0, t1, first)


@helper
def _max_pass_3(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first):
    return _max_group(xf, r0, r1, n_rows, 3, 2, yf, pf, yb, lo, hi, t0, t1, first)


@helper
def _max_pass_4(xf, r0, r1, n_rows, yf, pf, yb, lo, hi, t0, t1, first):
    return _max_group(xf, r0, r1, n_rows, 4, 4, yf, pf, yb, lo, hi, t0, t1, first)


@helper
def _sum_pass(xf, xb, kw, sw, yf, yb, lo, hi, first):
    """Add the taps ``xf[xb + ow*sw + jw]`` to ``yf[yb + ow]`` one by one, in order
    (``first``: ``yf`` holds nothing yet; constant in each loop, as in :func:`_max_pass`)."""
    if first:
        _sum_geometry(xf, xb, kw, sw, yf, yb, lo, hi, True)
    else:
        _sum_geometry(xf, xb, kw, sw, yf, yb, lo, hi, False)


@inlined
def _sum_geometry(xf, xb, kw, sw, yf, yb, lo, hi, first):
    """The loop of :func:`_sum_pass` for each W geometry of ``ROW_PASS_W``, its taps as
    named loads so that the loop vectorizes."""
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


@helper
def redo_row(x, table, dilation, extent, y, pos, plane, od, oh):
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
                                best, tap = fold_max(yf[o], np.int64(pf[o]), v, tap0 + jw)
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
                redo_row(x, table, dilation, extent, y, pos, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


# Values only: a forward that wants no gradient and no indices (inference) keeps no
# winners, so it folds nothing but values, the first up to three tap rows in one pass
# (the whole window of a 2-d 3x3 or 2x2 layer, so ``y`` is written once).


@inlined
def max_values_loop(xf, r0, r1, r2, n_rows, kw, sw, yf, yb, lo, hi, first):
    """The loop of :func:`_max_values_pass` for one W geometry, row count (1 to 3) and
    ``first``, constant where it is inlined: reads the tap rows at ``r0`` to ``r2``,
    writes ``yf[yb + ow]`` for ow in [lo, hi); returns whether a tap was NaN."""
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


@inlined
def _max_values_group(xf, r0, r1, r2, n_rows, kw, sw, yf, yb, lo, hi, first):
    """:func:`max_values_loop` with ``n_rows`` and ``first`` made constants."""
    if not first:  # the later passes take one row each
        return max_values_loop(xf, r0, r1, r2, 1, kw, sw, yf, yb, lo, hi, False)
    if n_rows == 1:
        return max_values_loop(xf, r0, r1, r2, 1, kw, sw, yf, yb, lo, hi, True)
    if n_rows == 2:
        return max_values_loop(xf, r0, r1, r2, 2, kw, sw, yf, yb, lo, hi, True)
    return max_values_loop(xf, r0, r1, r2, 3, kw, sw, yf, yb, lo, hi, True)


# one compiled function per (kernel, stride) along W, each with constant geometry
@helper
def _max_values_2(xf, r0, r1, r2, n_rows, yf, yb, lo, hi, first):
    """:func:`_max_values_pass` for 2 taps at stride 2 (and below: (3, 2), (4, 4))."""
    return _max_values_group(xf, r0, r1, r2, n_rows, 2, 2, yf, yb, lo, hi, first)


@helper
def _max_values_3(xf, r0, r1, r2, n_rows, yf, yb, lo, hi, first):
    return _max_values_group(xf, r0, r1, r2, n_rows, 3, 2, yf, yb, lo, hi, first)


@helper
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


@overload(_max_values_pass, inline="always", jit_options=JIT_OPTIONS)
def _max_values_pass_of_width(xf, r0, r1, r2, n_rows, width, yf, yb, lo, hi, first):
    """Numba's implementation of :func:`_max_values_pass`: the pass of ``width.ndim``
    taps."""
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
                redo_row(x, table, dilation, extent, y, None, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


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
