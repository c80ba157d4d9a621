"""Backward row passes for C-contiguous ``(N, C, D, H, W)`` arrays (max with
``ties="first"``, and average), for the W geometries of the forward row passes
(:mod:`.row_passes`). Each input row is gathered from the output rows whose windows
read it, in increasing output order, so the sums are the general kernels', bit for bit.
"""

import numpy as np
from numba import prange, uint64

from . import parallel_kernel
from .max_pool import max_backward_row
from .simd import BLOCK, route3_stride2_blocks
from .walk import helper, inlined

# ------------------------------------------------------------------------------ backward
#
# Backward row passes gather per input row, like the general kernels: each input row is
# zeroed, then every output row whose windows read it (in increasing output order) adds
# its contributions along W: first the windows cut by the front padding, then the
# interior, then the windows cut by the end padding. Contributions to one element thus
# arrive in increasing output order, and the sums are the general kernels', bit for bit.


@inlined
def _routed(dyf, pf, o, t, zero, one):
    """The gradient output ``o`` sends to its tap ``t``: ``dy * 1`` if ``t`` won, else
    ``dy * 0``. For a finite ``dy`` that is ``dy`` or a zero, and adding a zero leaves
    the sum's bits alone (it starts at +0 and is never -0): the bits of the gather's
    ``if won: total += dy``, without a float select, which in the scalar tails of short
    rows became a mispredicted branch. An infinite or NaN ``dy`` leaves a non-finite
    value in its row, and the kernel redoes such rows exactly."""
    return dyf[o] * (one if pf[o] == t else zero)


@helper
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


@helper
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
