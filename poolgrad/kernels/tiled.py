"""Kernels for windows that tile the input (stride = kernel along every axis, no padding,
no dilation: VGG's 2x2/2, 1-d k/k, 3-d 2x2x2/2): max forwards (values only, and with
winners) and the average forward for W kernels of 2 and 4, and the max backward for any
W width, which writes every input element once instead of gathering.
"""

import numpy as np
from numba import prange, uint64

from . import constant, parallel_kernel
from .row_passes import max_loop, max_values_loop, redo_row, width_witness
from .simd import ROUTE_BYTES, max2_block, route2_block
from .walk import (
    helper,
    inlined,
    next_row,
    prefetch_ahead,
    prefetch_count,
    row_steps,
    step_start,
)


@inlined
def sum_tile_loop(xf, r0, r1, n_rows, kw, yf, yb, out_w, first, last, factor, divisor,
                   zero):
    """Add ``n_rows`` (1 or 2) tap rows (``r<k> + ow*kw + jw`` for jw < kw) to the sums
    ``yf[yb:yb + out_w]``, tap by tap in row-major order (``first``: start them);
    ``last``: then divide them as :func:`~.row_passes.avg_pool_forward_rows` does. Constant counts
    and flags in each loop, as in :func:`~.row_passes._max_pass`."""
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


# Tiled windows (stride = kernel along every axis, no padding, no dilation: VGG's 2x2/2,
# 1-d k/k, 3-d 2x2x2/2) read each input element once, and an output row's tap rows lie at
# fixed offsets from its first. These kernels keep no per-row window table and no W
# edges: on short rows (VGG's deep 7-wide ones) such per-row bookkeeping cost more than
# the loads, and the general row kernels ran far slower than these.


@helper
def _tap_row_offsets(ext_d, ext_h, in_h, in_w):
    """Where each tap row of a tiling window (row-major over (jd, jh)) starts, from the
    first: the same for every output row, so computed once per call."""
    offsets = np.empty(ext_d * ext_h, np.int64)
    for jd in range(ext_d):
        for jh in range(ext_h):
            offsets[jd * ext_h + jh] = (jd * in_h + jh) * in_w
    return offsets


@inlined
def _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h):
    """Where the first tap row of output row ``(plane, od, oh)`` starts."""
    return ((plane * in_d + od * ext_d) * in_h + oh * ext_h) * in_w


@inlined
def _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h, in_w, ext_d, ext_h):
    """``(oh, od, plane)`` of the next output row and where its first tap row starts: one
    step of ``ext_h`` input rows down, or (past a slice's last row) recomputed."""
    if oh + 1 < out_h:
        return oh + 1, od, plane, xb + ext_h * in_w
    oh, od, plane = next_row(oh, od, plane, out_h, out_d)
    return oh, od, plane, _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)


@inlined
def _max_values_tile(xf, xb, offsets, kw, yf, yb, out_w):
    """Output row ``yb`` of a tiled max forward, values only: the first two tap rows in
    one pass, each later one in a pass of its own. Returns whether a tap was NaN."""
    if len(offsets) == 1:
        return max_values_loop(xf, xb, xb, xb, 1, kw, kw, yf, yb, 0, out_w, True)
    r1 = xb + offsets[1]
    nan = max_values_loop(xf, xb, r1, r1, 2, kw, kw, yf, yb, 0, out_w, True)
    for tap_row in range(2, len(offsets)):
        r = xb + offsets[tap_row]
        nan |= max_values_loop(xf, r, r, r, 1, kw, kw, yf, yb, 0, out_w, False)
    return nan


@inlined
def _max_recorded_tile(xf, xb, offsets, kw, yf, pf, yb, out_w):
    """:func:`_max_values_tile` with the winners' tap numbers in ``pf``."""
    if len(offsets) == 1:
        return max_loop(xf, xb, xb, 1, kw, kw, yf, pf, yb, 0, out_w, 0, 0, True)
    nan = max_loop(xf, xb, xb + offsets[1], 2, kw, kw, yf, pf, yb, 0, out_w, 0, kw, True)
    for tap_row in range(2, len(offsets)):
        r = xb + offsets[tap_row]
        nan |= max_loop(xf, r, r, 1, kw, kw, yf, pf, yb, 0, out_w, tap_row * kw, 0, False)
    return nan


# the two loops of the tiled max forwards' rows, as their ``form`` argument: a
# compile-time choice (:func:`~.kernels.constant`)
TILE_LOOPS, IN_BLOCKS = constant(1), constant(2)


def row_form(kernel_w: int, out_w: int, itemsize: int) -> np.ndarray:
    """The ``form`` argument of the tiled max forwards: :data:`IN_BLOCKS` (rows in
    vector blocks) for a W kernel of 2 and rows of at least one block but shorter than
    32 windows, else :data:`TILE_LOOPS`. On VGG's deep 7-wide rows the compiler's loops
    ran only their scalar tails; long rows vectorize well as they are. Chosen at compile
    time: a choice per call, made inside the kernel, left a branch whose layout made the
    deep rows 0.64-0.75 ms where the compiled choice takes 0.53-0.57 (docs/performance.md)."""
    blocks = kernel_w == 2 and ROUTE_BYTES // itemsize <= 2 * out_w and out_w < 32
    return IN_BLOCKS if blocks else TILE_LOOPS


@inlined
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
def max_values_forward_tiled(x, table, extent, dilation, width, form, y):
    """Reads ``x``, writes ``y``: the values of the max forward, for windows that tile the
    input with a W kernel of 2 or 4 (the dispatch's ``_tiled_forward``). ``width``: the W
    kernel as a compile-time constant (:func:`~.row_passes.width_witness`; the stride
    is the kernel here). Rows that read a NaN are redone window by window."""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_d, ext_h = extent[0], extent[1]
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
            # tested here, in the loop's body: form's type makes it a constant
            blocks = form.ndim == IN_BLOCKS.ndim
            if (_max_in_blocks(xf, xb, offsets, yf, None, row * out_w, out_w) if blocks else
                    _max_values_tile(xf, xb, offsets, width.ndim, yf, row * out_w, out_w)):
                redo_row(x, table, dilation, extent, y, None, plane, od, oh)
            oh, od, plane, xb = _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h,
                                                in_w, ext_d, ext_h)


# the recorded forward is a kernel of its own: one kernel for both (``pos`` None for the
# values only, a `pos is None` test choosing the loops) made a first vjp compile longer
@parallel_kernel
def max_pool_forward_tiled(x, table, extent, dilation, width, form, y, pos):
    """Reads ``x``, writes ``y`` and the winners ``pos``, for the plans of
    :func:`max_values_forward_tiled` and with its loop."""
    n_batch, n_chan, in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_d, ext_h = extent[0], extent[1]
    offsets = _tap_row_offsets(ext_d, ext_h, in_h, in_w)
    xf, yf, pf = x.ravel(), y.ravel(), pos.ravel()
    ahead = prefetch_count(ext_d, ext_h * in_w, xf.itemsize)
    n_out_rows = n_batch * n_chan * out_d * out_h
    steps, per_step = row_steps(n_out_rows)
    for step in prange(steps):
        oh, od, plane = step_start(step * per_step, out_h, out_d)
        xb = _tiled_row_base(plane, od, oh, in_d, in_h, in_w, ext_d, ext_h)
        for row in range(step * per_step, min((step + 1) * per_step, n_out_rows)):
            prefetch_ahead(xf, xb, ahead)
            # tested here, in the loop's body: form's type makes it a constant
            blocks = form.ndim == IN_BLOCKS.ndim
            if (_max_in_blocks(xf, xb, offsets, yf, pf, row * out_w, out_w) if blocks else
                    _max_recorded_tile(xf, xb, offsets, width.ndim, yf, pf, row * out_w,
                                       out_w)):
                redo_row(x, table, dilation, extent, y, pos, plane, od, oh)
            oh, od, plane, xb = _next_tiled_row(oh, od, plane, xb, out_h, out_d, in_d, in_h,
                                                in_w, ext_d, ext_h)


@inlined
def _sum_tile(xf, xb, offsets, kw, yf, yb, out_w, factor, divisor, zero):
    """Output row ``yb`` of a tiled average forward (see :func:`_max_values_tile`): the
    pass of the last tap row divides."""
    n_taps = len(offsets)
    if n_taps == 1:
        sum_tile_loop(xf, xb, xb, 1, kw, yf, yb, out_w, True, True, factor, divisor, zero)
        return
    r = xb + offsets[1]
    if n_taps == 2:
        sum_tile_loop(xf, xb, r, 2, kw, yf, yb, out_w, True, True, factor, divisor, zero)
        return
    sum_tile_loop(xf, xb, r, 2, kw, yf, yb, out_w, True, False, factor, divisor, zero)
    for tap_row in range(2, n_taps - 1):
        r = xb + offsets[tap_row]
        sum_tile_loop(xf, r, r, 1, kw, yf, yb, out_w, False, False, factor, divisor, zero)
    r = xb + offsets[n_taps - 1]
    sum_tile_loop(xf, r, r, 1, kw, yf, yb, out_w, False, True, factor, divisor, zero)


@parallel_kernel
def avg_pool_forward_tiled(x, extent, divisor, plus_zero, width, y):
    """Reads ``x``, writes ``y``: the bits of :func:`~.row_passes.avg_pool_forward_rows`
    for the plans of :func:`max_values_forward_tiled`, with its loop: the first pass
    adds two tap rows, each later pass one, and the last pass divides."""
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


# ------------------------------------------------------------------ tiling windows
#
# Where the windows tile the input (stride = kernel, no padding, no dilation: VGG's
# 2x2/2), every input element is read by at most one window, so backward writes each
# element once instead of gathering. The gradients are moved as integer bit patterns:
# an integer select is a cmov (or a blend), where a float select in the scalar tail of
# a short row (VGG's 7-wide rows are nothing but tail) became a mispredicted branch.


@inlined
def _gradient_bits(g, float_bits):
    """The bits ``g`` of a gradient with the gather's ``0 + dy`` applied: a -0 becomes +0
    and a signalling NaN is quieted. ``float_bits``: the bits of -0, of the exponent
    field and of the quiet-NaN flag."""
    negative_zero, exponent, quiet = float_bits[0], float_bits[1], float_bits[2]
    g = g if g != negative_zero else 0
    nan = ((g & exponent) == exponent) & ((g & (quiet | (quiet - 1))) != 0)
    return g | quiet if nan else g


@inlined
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


@inlined
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


@inlined
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
    its :func:`~.row_passes.width_witness` (compiled with that width constant), any
    other as a 5-d one (one compile, which reads the width from ``extent``)."""
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

