"""Channels-last forwards for windows that tile the input: stride = kernel along every
axis, no padding, no dilation and no cut window (VGG's 2x2/2, 3-d 2x2x2/2, 1-d k4/4).

Output column ``o`` of output row ``(n, od, oh)`` reads input columns ``k_w o`` to
``k_w o + k_w - 1`` of the tap rows ``(k_d od + jd, k_h oh + jh)``: no window table to
read, no run of columns to find and no fold to choose, so the loop along C is the whole
pass, as in the NCHW :mod:`.tiled` kernels. The max folds are :mod:`.channels_last`'s
own (:func:`~.channels_last.max_of_4`, :func:`~.channels_last.max_4x2`), and the
average's sum is its counterpart's: the same bits.
"""

from numba import prange

from . import jit, parallel_kernel
from .channels_last import max_4x2, max_of_4
from .walk import row_index

# The (D, H, W) extents :func:`max_values_forward` folds (the dispatch's rule)
MAX_EXTENTS = ((1, 2, 2), (2, 2, 2), (1, 1, 4))


@jit(inline="always")
def _tap_row(x, n, od, oh, jd, jh, extent):
    """The ``(W, C)`` input row that tap row ``(jd, jh)`` of output row ``(n, od, oh)``
    reads."""
    return x[n, extent[0] * od + jd, extent[1] * oh + jh]


@parallel_kernel
def max_values_forward(x, extent, y):
    """The values of :func:`.channels_last.max_values_forward` for tiling windows of
    ``extent`` ``(D, H, W)``, one of :data:`MAX_EXTENTS`; the loop is chosen once per
    output row."""
    n_batch, out_d, out_h, out_w = y.shape[:4]
    for row in prange(n_batch * out_d * out_h):
        n, _, od, oh = row_index(row, 1, out_d, out_h)
        out_row = y[n, od, oh]
        r0 = _tap_row(x, n, od, oh, 0, 0, extent)
        if extent[2] == 4:  # one tap row of four
            for o in range(out_w):
                w = 4 * o
                max_of_4(out_row[o], r0[w], r0[w + 1], r0[w + 2], r0[w + 3])
            continue
        r1 = _tap_row(x, n, od, oh, 0, 1, extent)
        if extent[0] == 1:  # two tap rows of two
            for o in range(out_w):
                w = 2 * o
                max_of_4(out_row[o], r0[w], r0[w + 1], r1[w], r1[w + 1])
        else:  # four tap rows of two
            r2, r3 = _tap_row(x, n, od, oh, 1, 0, extent), _tap_row(x, n, od, oh, 1, 1, extent)
            for o in range(out_w):
                max_4x2(out_row[o], r0, r1, r2, r3, 2 * o, 1)


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
        top, bottom = _tap_row(x, n, od, oh, 0, 0, extent), _tap_row(x, n, od, oh, 0, 1, extent)
        out_row = y[n, od, oh]
        for o in range(out_w):
            a, b, d, e = top[2 * o], top[2 * o + 1], bottom[2 * o], bottom[2 * o + 1]
            out = out_row[o]
            for c in range(channels):
                out[c] = ((((a[c] + b[c]) + d[c]) + e[c]) + zero) / window
