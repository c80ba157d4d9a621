"""Forward kernels for 3 taps at stride 2 along W (ResNet's and AlexNet's 3x3/2), in
vector blocks of :data:`~poolgrad.kernels.simd.BLOCK` windows: the average and the max
without winners do whole rows (the blocks that reach into the W padding mask its taps
out); the max with winners does the windows clear of the W padding in blocks and the
cut ones one by one. Rows whose taps hold a NaN are redone window by window.

Why blocks: LLVM's vectorizer loads one of the three taps element by element (taps 0
and 2 fall on even offsets of one interleaved group; see :mod:`.simd`).
"""

import numpy as np
from numba import prange, uint64

from . import parallel_kernel
from .row_passes import fold_max, redo_row
from .simd import BLOCK, max3_stride2_block, sum3_stride2_block
from .walk import (
    block_place,
    block_tap_rows,
    helper,
    inlined,
    input_per_row,
    next_row,
    prefetch_ahead,
    prefetch_count,
    row_steps,
    step_start,
)


@parallel_kernel
def max_values_forward_blocks(x, table, extent, dilation, y):
    """Reads ``x``, writes ``y``: the values of
    :func:`~.row_passes.max_values_forward_rows`, for 3 taps at stride 2 along W and
    rows of at least one block (the dispatch's ``_stride2_blocks``): each row in blocks of
    :func:`~poolgrad.kernels.simd.max3_stride2_block`, the windows cut by the W padding
    included, so ``y`` is written once. Rows that read a NaN are redone exactly. (On
    AlexNet's 27-wide rows the loops of :func:`~.row_passes.max_values_forward_rows` loaded one of
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
                redo_row(x, table, dilation, extent, y, None, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@inlined
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
    """:func:`~.row_passes.max_pool_forward_rows` (values and winners) for plans that
    the dispatch's ``_recorded_stride2_blocks`` accepts: the windows clear of the W padding in
    blocks of :func:`~poolgrad.kernels.simd.max3_stride2_block`, which records the
    winners too, and the few cut by it (ResNet's first) one by one. Rows that read a
    NaN are redone exactly. (The row passes loaded one of the three taps element by
    element, as in the values-only forward.)"""
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
                redo_row(x, table, dilation, extent, y, pos, plane, od, oh)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@inlined
def _record_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, number,
                          number_step_d, yf, pf, yb, lo, hi):
    """Windows ``[lo, hi)`` of one output row of :func:`max_pool_forward_blocks`, in
    blocks; the last ends at ``hi`` and may overlap the one before (see
    :func:`~.walk.block_place`). Returns whether a tap was NaN."""
    nan = False
    for block in range(lo, hi, BLOCK):
        at = min(block, hi - BLOCK)
        nan |= max3_stride2_block(xf, first, n_d, step_d, n_h, step_h, column + 2 * at, yf,
                                  yb + at, None, pf, number, number_step_d)
    return nan


@helper
def _record_cut_windows(xf, first, n_d, step_d, n_h, step_h, table, number, number_step_d,
                        yf, pf, yb, lo, hi, out_w):
    """The windows of one output row of :func:`max_pool_forward_blocks` that the W
    padding cuts (outside ``[lo, hi)``), one by one and tap by tap in the kernels'
    order. Returns whether a tap was NaN. (The general kernels'
    :func:`~poolgrad.kernels.max_pool.max_pool_row` does the same per row, but a call
    for these windows in every row made the kernel slower.)"""
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
                        best, tap = fold_max(best, tap, v, np.int64(t + jw))
        yf[o] = best
        pf[o] = tap
    return nan


@parallel_kernel
def avg_pool_forward_blocks(x, table, extent, dilation, divisor, plus_zero, y):
    """Reads ``x``, writes ``y``: the bits of :func:`~.row_passes.avg_pool_forward_rows`
    for the plans of the dispatch's ``_stride2_blocks``, with each row in blocks of
    :data:`~poolgrad.kernels.simd.BLOCK` outputs
    (see :mod:`poolgrad.kernels.simd`), the windows cut by the W padding included. A
    block adds all of its windows' tap rows and divides at once, so ``y`` is written
    once.
    (A separate kernel: in :func:`~.row_passes.avg_pool_forward_rows`
    the block path slowed the short rows it does not serve.)"""
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
            # blocks' tap-row loop, which made these rows faster; the same test inside
            # the blocks, where it is made for every block, was slower
            if n_d == 1 and n_h == 3:
                _mean_row_in_blocks(xf, first, 1, 0, 3, step_h, column, in_w, yf,
                                    row * out_w, out_w, factor, divisor_w, zero)
            else:
                _mean_row_in_blocks(xf, first, n_d, step_d, n_h, step_h, column, in_w, yf,
                                    row * out_w, out_w, factor, divisor_w, zero)
            oh, od, plane = next_row(oh, od, plane, out_h, out_d)


@inlined
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
