"""Weighted window averages: SoftPool and stochastic pooling's evaluation mode, and
stochastic pooling's sampling.

Each window's output is ``y = sum_j w_j x_j`` over its real taps (padding is never
read), with weights that depend on the window's own values:

* ``SOFT`` (SoftPool, Stergiou et al. 2021): ``w_j = exp(x_j - M) / S``, ``M`` the
  window's maximum (so no exponential overflows) and ``S = sum_j exp(x_j - M)``.
  ``norm[o] = M + log(S)``, and ``dy/dx_j = w_j * (1 + x_j - y)``.
* ``SELF`` (stochastic pooling at test time, Zeiler & Fergus 2013): ``w_j = x_j / S``,
  ``S = sum_j x_j`` over non-negative inputs; ``y = 0`` where ``S = 0``.
  ``norm[o] = S``, and ``dy/dx_j = (2 x_j - y) / S``.

The forward walks output rows and the backward gathers per input row through the
plan's cover tables, adding the windows in increasing output order: no races, and the
same bits at any thread count. Sums run in row-major window order from +0.

:func:`stochastic_pool_sample` picks one real tap per window with probability
``x_j / S``: the first tap whose running sum exceeds ``u * S``, for a uniform draw
``u`` in ``[0, 1)`` given per window (the first real tap where ``S = 0``; a tap of
weight 0 is never drawn otherwise), and writes
its tap number like a max pooling's winner, so the max pooling's backward routes it.
"""

import numpy as np
from numba import prange

from . import parallel_kernel
from .walk import row_index, row_windows

SOFT, SELF = 0, 1


@parallel_kernel
def weighted_pool_forward(x, table, kind, y, norm):
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    zero = np.zeros(1, y.dtype)[0]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            largest = x[n, c, start_d + first_d, start_h + first_h, start_w + first_w]
            if kind == SOFT:
                for xd in range(start_d + first_d, start_d + end_d):
                    for xh in range(start_h + first_h, start_h + end_h):
                        for xw in range(start_w + first_w, start_w + end_w):
                            v = x[n, c, xd, xh, xw]
                            largest = v if (v > largest) | (v != v) else largest
            total = zero
            weighted = zero
            for xd in range(start_d + first_d, start_d + end_d):
                for xh in range(start_h + first_h, start_h + end_h):
                    for xw in range(start_w + first_w, start_w + end_w):
                        v = x[n, c, xd, xh, xw]
                        w = np.exp(v - largest) if kind == SOFT else v
                        total += w
                        weighted += w * v
            if kind == SOFT:
                y[n, c, od, oh, ow] = weighted / total
                norm[n, c, od, oh, ow] = largest + np.log(total)
            else:
                y[n, c, od, oh, ow] = weighted / total if total != 0 else zero
                norm[n, c, od, oh, ow] = total


@parallel_kernel
def weighted_pool_backward(x, y, norm, dy, kind, cover_ptr, cover_out, dx):
    """``dx[i]`` = sum over the windows ``o`` reading ``i`` of ``dy[o] * dy[o]/dx[i]``
    (the module docstring's formulas); a ``SELF`` window with ``S = 0`` sends 0."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    zero = np.zeros(1, dx.dtype)[0]
    one = np.ones(1, dx.dtype)[0]
    for row in prange(n_batch * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            value = x[n, c, i_d, ih, iw]
            total = zero
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        out = y[n, c, od, oh, ow]
                        scale = norm[n, c, od, oh, ow]
                        if kind == SOFT:
                            total += dy[n, c, od, oh, ow] * (
                                np.exp(value - scale) * (one + value - out))
                        elif scale != 0:
                            total += dy[n, c, od, oh, ow] * ((value + value - out) / scale)
            dx[n, c, i_d, ih, iw] = total


@parallel_kernel
def stochastic_pool_sample(x, table, extent, draws, y, pos):
    """One tap per window, drawn with probability ``x_j / S`` by ``draws`` (the module
    docstring): its value into ``y``, its tap number (row-major over ``extent``) into
    ``pos``."""
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    zero = np.zeros(1, x.dtype)[0]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            total = zero
            for xd in range(start_d + first_d, start_d + end_d):
                for xh in range(start_h + first_h, start_h + end_h):
                    for xw in range(start_w + first_w, start_w + end_w):
                        total += x[n, c, xd, xh, xw]
            threshold = draws[n, c, od, oh, ow] * total
            # the fallbacks: the first tap where S = 0, the last positive one where
            # rounding leaves the running sum at or below u * S
            chosen_d, chosen_h, chosen_w = first_d, first_h, first_w
            running = zero
            found = False
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    for jw in range(first_w, end_w):
                        if not found:
                            v = x[n, c, start_d + jd, start_h + jh, start_w + jw]
                            running += v
                            if v > 0:
                                chosen_d, chosen_h, chosen_w = jd, jh, jw
                                found = running > threshold
            y[n, c, od, oh, ow] = x[n, c, start_d + chosen_d, start_h + chosen_h,
                                    start_w + chosen_w]
            pos[n, c, od, oh, ow] = (chosen_d * ext_h + chosen_h) * ext_w + chosen_w
