"""Channels-last forwards for windows that tile the input: stride = kernel along every
axis, no padding, no dilation and no cut window (VGG's 2x2/2, 3-d 2x2x2/2, 1-d k4/4).

Output column ``o`` of output row ``(n, od, oh)`` reads input columns ``k_w o`` to
``k_w o + k_w - 1`` of the tap rows ``(k_d od + jd, k_h oh + jh)``: no window table to
read, no run of columns to find and no fold to choose, so the loop along C is the whole
pass, as in the NCHW :mod:`.tiled` kernels. Each kernel gives the bits of its
:mod:`.channels_last` counterpart: the same operations in the same order.
"""

from numba import prange

from . import jit, parallel_kernel
from .channels_last import larger, nan_or
from .walk import row_index


@jit(inline="always")
def _tap_row(x, y, row, jd, jh, extent):
    """Tap row ``(jd, jh)`` of output row ``row`` (numbered in C order over
    ``(N, D, H)``): the ``(W, C)`` input row its windows read there."""
    n, _, od, oh = row_index(row, 1, y.shape[1], y.shape[2])
    return x[n, extent[0] * od + jd, extent[1] * oh + jh]


@parallel_kernel
def max_values_forward(x, extent, y):
    """The values of :func:`.channels_last.max_values_forward` for tiling windows of
    ``extent`` ``(D, H, W)`` (1, 2, 2), (2, 2, 2) or (1, 1, 4): the maximum of each
    window's taps in row-major order by :func:`.channels_last._max_of_4`'s rule (the
    first NaN, else the first maximum)."""
    n_batch, out_d, out_h, out_w, channels = y.shape
    for row in prange(n_batch * out_d * out_h):
        n, _, od, oh = row_index(row, 1, out_d, out_h)
        out_row = y[n, od, oh]
        r0, r1 = _tap_row(x, y, row, 0, 0, extent), _tap_row(x, y, row, 0, extent[1] - 1, extent)
        if extent[2] == 4:  # one tap row of four
            for o in range(out_w):
                a, b, d, e, out = r0[4 * o], r0[4 * o + 1], r0[4 * o + 2], r0[4 * o + 3], out_row[o]
                for c in range(channels):
                    m = larger(e[c], larger(d[c], larger(b[c], a[c])))
                    q = nan_or(nan_or(nan_or(a[c], b[c]), d[c]), e[c])
                    out[c] = nan_or(q, m)
        elif extent[0] == 1:  # two tap rows of two
            for o in range(out_w):
                a, b, d, e, out = r0[2 * o], r0[2 * o + 1], r1[2 * o], r1[2 * o + 1], out_row[o]
                for c in range(channels):
                    m = larger(e[c], larger(d[c], larger(b[c], a[c])))
                    q = nan_or(nan_or(nan_or(a[c], b[c]), d[c]), e[c])
                    out[c] = nan_or(q, m)
        else:  # four tap rows of two
            r2, r3 = _tap_row(x, y, row, 1, 0, extent), _tap_row(x, y, row, 1, 1, extent)
            for o in range(out_w):
                a0, a1, b0, b1 = r0[2 * o], r0[2 * o + 1], r1[2 * o], r1[2 * o + 1]
                d0, d1, e0, e1 = r2[2 * o], r2[2 * o + 1], r3[2 * o], r3[2 * o + 1]
                out = out_row[o]
                for c in range(channels):
                    m = larger(b1[c], larger(b0[c], larger(a1[c], a0[c])))
                    m = larger(e1[c], larger(e0[c], larger(d1[c], larger(d0[c], m))))
                    q = nan_or(nan_or(nan_or(a0[c], a1[c]), b0[c]), b1[c])
                    q = nan_or(nan_or(nan_or(nan_or(q, d0[c]), d1[c]), e0[c]), e1[c])
                    out[c] = nan_or(q, m)


@parallel_kernel
def avg_pool_forward_quads(x, extent, divisor, plus_zero, y):
    """:func:`.channels_last.avg_pool_forward` for tiling windows of ``extent`` (1, 2,
    2): every window has the same divisor, and each sum is its 2x2 sum from the first
    tap, with ``plus_zero`` added before the division (a window of -0s gives +0)."""
    n_batch, out_d, out_h, out_w, channels = y.shape
    zero = plus_zero[0]
    window = divisor[0, 0] * divisor[1, 0] * divisor[2, 0]  # the windows are all full
    for row in prange(n_batch * out_d * out_h):
        n, _, od, oh = row_index(row, 1, out_d, out_h)
        top, bottom, out_row = _tap_row(x, y, row, 0, 0, extent), _tap_row(
            x, y, row, 0, 1, extent), y[n, od, oh]
        for o in range(out_w):
            a, b, d, e = top[2 * o], top[2 * o + 1], bottom[2 * o], bottom[2 * o + 1]
            out = out_row[o]
            for c in range(channels):
                out[c] = ((((a[c] + b[c]) + d[c]) + e[c]) + zero) / window
