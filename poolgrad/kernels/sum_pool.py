"""Average and Lp pooling: sums over the real taps of each window.

Average: ``y = sum(x) / divisor``; its gradient spreads ``dy / divisor`` evenly.
Lp (ONNX LpPool): ``y = sum(|x|^p) ** (1/p)``; ``dy/dx = sign(x) * (|x| / y)^(p-1)``.
The divisor is ``divisor[0, od] * divisor[1, oh] * divisor[2, ow]`` (see
:meth:`poolgrad.geometry.WindowPlan.divisor_table`), in the compute dtype.
"""

import numpy as np
from numba import prange

from . import jit, parallel_kernel
from .lanes import lane_sum
from .powers import (
    UNSCALED,
    clamped,
    in_range,
    passes,
    raised,
    raised_less_one,
    relative_mean,
    relative_scale,
    root,
    scaled,
    sign_of,
)
from .simd import PREFETCH_BYTES, prefetch
from .walk import inlined, row_index, row_windows


@parallel_kernel
def avg_pool_forward(x, table, dilation, divisor, y):
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    zero = np.zeros(1, y.dtype)[0]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            total = zero
            for jd in range(first_d, end_d):
                xd = start_d + jd * dil_d
                for jh in range(first_h, end_h):
                    xh = start_h + jh * dil_h
                    for jw in range(first_w, end_w):
                        total += x[n, c, xd, xh, start_w + jw * dil_w]
            y[n, c, od, oh, ow] = total / (divisor[0, od] * divisor[1, oh] * divisor[2, ow])


@parallel_kernel
def avg_pool_backward(dy, divisor, cover_ptr, cover_out, dx):
    """``dx[i]`` = sum of ``dy[o] / divisor[o]`` over the windows that read ``i``."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    zero = np.zeros(1, dx.dtype)[0]
    for row in prange(n_batch * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            total = zero
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        total += dy[n, c, od, oh, ow] / (
                            divisor[0, od] * divisor[1, oh] * divisor[2, ow])
            dx[n, c, i_d, ih, iw] = total


@inlined
def _lp_window_sum(x, n, c, xd0, first_d, end_d, dil_d, xh0, first_h, end_h, dil_h, xw0,
                   first_w, end_w, dil_w, scale, p, whole):
    """``sum (|x| * scale)^p`` over a window's real taps, in tap order from +0;
    ``scale`` as :func:`.powers.scaled` takes it."""
    total = 0.0
    for jd in range(first_d, end_d):
        xd = xd0 + jd * dil_d
        for jh in range(first_h, end_h):
            xh = xh0 + jh * dil_h
            for jw in range(first_w, end_w):
                z = clamped(np.float64(x[n, c, xd, xh, xw0 + jw * dil_w]), None)
                total += raised(scaled(z, scale), p, whole)
    return total


@parallel_kernel(any_layout=True)
def lp_pool_forward(x, table, dilation, p, whole, y):
    """``y = (sum over real taps of |x|^p) ** (1/p)``; padding adds 0. ``p`` float64,
    ``whole`` a compile-time power (:func:`.powers.power_form`) or None. The sum runs
    in float64 in tap order, unscaled, and again relative to the window's largest ``|x|``
    where it left the range: the arithmetic of :mod:`.power_mean`'s kernels with ``eps``
    None, which serve the windows they can with these bits."""
    for row in prange(x.shape[0] * x.shape[1] * y.shape[2] * y.shape[3]):
        # the body as a call (the index cast: one signature): Numba's parallel passes
        # copy a body over and over, and this scalar kernel gains nothing from inlining
        _lp_forward_row(x, table, dilation, p, whole, y, np.int64(row))


@jit()
def _lp_forward_row(x, table, dilation, p, whole, y, row):
    """One row of outputs of :func:`lp_pool_forward` (its parallel loop's body)."""
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    precise = y.itemsize == 8
    n, c, od, oh = row_index(row, x.shape[1], y.shape[2], y.shape[3])
    start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
    for ow in range(y.shape[4]):
        start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
        total = _lp_window_sum(x, n, c, start_d, first_d, end_d, dil_d, start_h, first_h,
                               end_h, dil_h, start_w, first_w, end_w, dil_w, UNSCALED, p,
                               whole)
        if in_range(total):
            y[n, c, od, oh, ow] = root(total, p, whole, precise)
            continue
        largest = 0.0
        for jd in range(first_d, end_d):
            for jh in range(first_h, end_h):
                for jw in range(first_w, end_w):
                    z = clamped(np.float64(x[n, c, start_d + jd * dil_d, start_h + jh * dil_h,
                                             start_w + jw * dil_w]), None)
                    largest = z if z > largest else largest
        total = _lp_window_sum(x, n, c, start_d, first_d, end_d, dil_d, start_h, first_h,
                               end_h, dil_h, start_w, first_w, end_w, dil_w,
                               relative_scale(largest), p, whole)
        y[n, c, od, oh, ow] = relative_mean(largest, total, 1.0, p, whole, precise)


@parallel_kernel(any_layout=True)
def lp_pool_backward(x, y, dy, p, whole, cover_ptr, cover_out, dx):
    """``dx[i]`` = sum over windows ``o`` reading ``i`` (in increasing order) of
    ``dy[o] * (|x[i]| / y[o])^(p-1)``, times ``sign(x[i])``; 0 where ``x[i]`` is 0 (the
    subgradient). In float64, as :mod:`.power_mean`'s kernels with ``eps`` None, whose
    Lp arithmetic (:mod:`.powers`) both kernels call."""
    for row in prange(dx.shape[0] * dx.shape[1] * dx.shape[2] * dx.shape[3]):
        # the body as a call, as in lp_pool_forward
        _lp_backward_row(x, y, dy, p, whole, cover_ptr, cover_out, dx, np.int64(row))


@jit()
def _lp_backward_row(x, y, dy, p, whole, cover_ptr, cover_out, dx, row):
    """One row of inputs of :func:`lp_pool_backward` (its parallel loop's body)."""
    zero = np.zeros(1, dx.dtype)[0]
    n, c, i_d, ih = row_index(row, dx.shape[1], dx.shape[2], dx.shape[3])
    for iw in range(dx.shape[4]):
        v = np.float64(x[n, c, i_d, ih, iw])
        if not passes(v, None):
            dx[n, c, i_d, ih, iw] = zero
            continue
        total = 0.0
        for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
            od = cover_out[0, a]
            for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                oh = cover_out[1, b]
                for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                    ow = cover_out[2, e]
                    r = scaled(clamped(v, None),
                               relative_scale(np.float64(y[n, c, od, oh, ow])))
                    total += np.float64(dy[n, c, od, oh, ow]) * raised_less_one(r, p, whole)
        dx[n, c, i_d, ih, iw] = total * sign_of(v, None)


@parallel_kernel
def global_avg_forward(x, divisor, y):
    """``y[p] = sum(x[p, :]) / divisor`` for C-contiguous ``(planes, L)`` views.

    Eight running sums (elements 8k to 8k+7: one vector of float32 or float64, then the
    tail; :func:`~.lanes.lane_sum`, since LLVM left eight scalar sums scalar) hide the
    latency of the additions; the order is fixed, so the result is the same at any
    thread count. Planes shorter than 8 KB ask for the input 8 KB further on (see
    :mod:`.simd`), which measured faster than leaving it to the hardware prefetcher;
    longer ones, which it follows, ran slower for the asking.
    """
    planes, length = x.shape
    zero = np.zeros(1, y.dtype)[0]
    xf = x.ravel()
    ahead = PREFETCH_BYTES // xf.itemsize
    asks = length < ahead
    for p in prange(planes):
        if asks:
            prefetch(xf, p * length + ahead, length)
        y[p] = lane_sum(xf, p * length, length, zero) / divisor


@parallel_kernel
def global_avg_backward(dy, divisor, dx):
    """``dx[p, :] = dy[p] / divisor``: the mean spreads its gradient evenly."""
    planes, length = dx.shape
    for p in prange(planes):
        share = dy[p] / divisor
        for j in range(length):
            dx[p, j] = share
