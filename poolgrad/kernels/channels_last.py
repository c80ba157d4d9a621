"""Channels-last kernels: arrays ``(N, D, H, W, C)`` with C fastest in memory.

Neighbouring channels share their window geometry, so every innermost loop here runs
along C over contiguous memory with no branches, and vectorizes for any kernel,
stride, padding or dilation. Each kernel makes the same operations, in the same order,
as its ``(N, C, D, H, W)`` counterpart in :mod:`.max_pool` or :mod:`.sum_pool`, so the
two layouts give the same bits.

Parallel loops own whole output rows ``(n, od, oh)`` (forward) or input rows
``(n, id, ih)`` (backward, gathering through the plan's cover tables).
"""

import numpy as np
from numba import njit, prange

from . import JIT_OPTIONS, beats, parallel_kernel


@parallel_kernel
def max_pool_forward(x, table, dilation, extent, tap_like, y, pos):
    """Channels-last :func:`poolgrad.kernels.max_pool.max_pool_forward`: ``y`` = the
    window maximum, ``pos`` = its tap; the first maximum (the first NaN) wins.

    Each window is folded in a private buffer whose taps have the values' width
    (``tap_like``'s dtype: int32 for float32, int64 for float64), then stored. A select
    of a float and a uint8 in one loop, folded in place in ``y`` and ``pos``, kept the
    loop scalar on AVX2 CPUs (Zen 3): 8x slower."""
    n_batch, n_chan = x.shape[0], x.shape[4]
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    ext_h, ext_w = extent[1], extent[2]
    for row in prange(n_batch * out_d * out_h):
        oh = row % out_h
        rest = row // out_h
        od = rest % out_d
        n = rest // out_d
        start_d, first_d, end_d = table[0, 0, od], table[0, 1, od], table[0, 2, od]
        start_h, first_h, end_h = table[1, 0, oh], table[1, 1, oh], table[1, 2, oh]
        best = np.empty(n_chan, x.dtype)
        best_tap = np.empty(n_chan, tap_like.dtype)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            first = True
            for jd in range(first_d, end_d):
                xd = start_d + jd * dil_d
                for jh in range(first_h, end_h):
                    xh = start_h + jh * dil_h
                    tap_dh = (jd * ext_h + jh) * ext_w
                    for jw in range(first_w, end_w):
                        values = x[n, xd, xh, start_w + jw * dil_w]
                        tap = tap_like.dtype.type(tap_dh + jw)
                        if first:
                            for c in range(n_chan):
                                best[c] = values[c]
                                best_tap[c] = tap
                            first = False
                        else:
                            for c in range(n_chan):
                                wins = beats(values[c], best[c])
                                best[c] = values[c] if wins else best[c]
                                best_tap[c] = tap if wins else best_tap[c]
            out = y[n, od, oh, ow]
            won = pos[n, od, oh, ow]
            for c in range(n_chan):
                out[c] = best[c]
                won[c] = best_tap[c]


@njit(inline="always", **JIT_OPTIONS)
def _fold_values(best, row, start_w, first_w, end_w, dil_w, first):
    """Fold the taps ``[first_w, end_w)`` of one window row (``row[w]`` the C values at
    column ``w``) into ``best``, in tap order: two to four taps in one pass over C, so
    ``best`` is loaded and stored once per tap row, not once per tap (one tap, or more
    than four, one pass per tap)."""
    count = end_w - first_w
    w0 = start_w + first_w * dil_w
    if count == 2:
        a, b = row[w0], row[w0 + dil_w]
        for c in range(len(best)):
            m = a[c] if first | beats(a[c], best[c]) else best[c]
            best[c] = b[c] if beats(b[c], m) else m
    elif count == 3:
        a, b, d = row[w0], row[w0 + dil_w], row[w0 + 2 * dil_w]
        for c in range(len(best)):
            m = a[c] if first | beats(a[c], best[c]) else best[c]
            m = b[c] if beats(b[c], m) else m
            best[c] = d[c] if beats(d[c], m) else m
    elif count == 4:
        a, b, d, e = row[w0], row[w0 + dil_w], row[w0 + 2 * dil_w], row[w0 + 3 * dil_w]
        for c in range(len(best)):
            m = a[c] if first | beats(a[c], best[c]) else best[c]
            m = b[c] if beats(b[c], m) else m
            m = d[c] if beats(d[c], m) else m
            best[c] = e[c] if beats(e[c], m) else m
    else:
        for jw in range(first_w, end_w):
            a = row[start_w + jw * dil_w]
            take_all = first and jw == first_w
            for c in range(len(best)):
                best[c] = a[c] if take_all | beats(a[c], best[c]) else best[c]


@parallel_kernel
def max_values_forward(x, table, dilation, y):
    """The ``y`` of :func:`max_pool_forward` without the winners (inference), folded in
    place one window row at a time: a float select alone vectorizes."""
    n_batch = x.shape[0]
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    for row in prange(n_batch * out_d * out_h):
        oh = row % out_h
        rest = row // out_h
        od = rest % out_d
        n = rest // out_d
        start_d, first_d, end_d = table[0, 0, od], table[0, 1, od], table[0, 2, od]
        start_h, first_h, end_h = table[1, 0, oh], table[1, 1, oh], table[1, 2, oh]
        for ow in range(out_w):
            best = y[n, od, oh, ow]
            first = True
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    _fold_values(best, x[n, start_d + jd * dil_d, start_h + jh * dil_h],
                                 table[2, 0, ow], table[2, 1, ow], table[2, 2, ow], dil_w, first)
                    first = False


@parallel_kernel
def max_pool_backward(dy, pos, cover_ptr, cover_out, cover_tap, extent, dx):
    """Channels-last :func:`poolgrad.kernels.max_pool.max_pool_backward`."""
    n_batch, in_d, in_h, in_w, n_chan = dx.shape
    ext_h, ext_w = extent[1], extent[2]
    for row in prange(n_batch * in_d * in_h):
        ih = row % in_h
        rest = row // in_h
        i_d = rest % in_d
        n = rest // in_d
        for iw in range(in_w):
            total = dx[n, i_d, ih, iw]
            total[:] = 0
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                tap_d = cover_tap[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    tap_dh = (tap_d * ext_h + cover_tap[1, b]) * ext_w
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        tap = tap_dh + cover_tap[2, e]
                        grad = dy[n, od, oh, ow]
                        won = pos[n, od, oh, ow]
                        for c in range(n_chan):
                            # adding 0 leaves total's bits alone (it is never -0), and
                            # the select vectorizes where a branch would not
                            total[c] += grad[c] if won[c] == tap else 0


@njit(inline="always", **JIT_OPTIONS)
def _add_taps(total, row, start_w, first_w, end_w, dil_w):
    """Add the taps ``[first_w, end_w)`` of one window row to ``total``, in tap order:
    three taps in one pass over C, so ``total`` is loaded and stored once per tap row
    (as :func:`_fold_values` does for the maxima), any other count one pass per tap.
    ResNet's 3x3/2 average took 3.7 ms instead of 4.1 on two threads; for two taps one
    pass measured slower than two."""
    count = end_w - first_w
    w0 = start_w + first_w * dil_w
    if count == 3:
        a, b, d = row[w0], row[w0 + dil_w], row[w0 + 2 * dil_w]
        for c in range(len(total)):
            total[c] = ((total[c] + a[c]) + b[c]) + d[c]
    else:
        for jw in range(first_w, end_w):
            a = row[start_w + jw * dil_w]
            for c in range(len(total)):
                total[c] += a[c]


@parallel_kernel
def avg_pool_forward(x, table, dilation, divisor, y):
    """Channels-last :func:`poolgrad.kernels.sum_pool.avg_pool_forward`."""
    n_batch, n_chan = x.shape[0], x.shape[4]
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    for row in prange(n_batch * out_d * out_h):
        oh = row % out_h
        rest = row // out_h
        od = rest % out_d
        n = rest // out_d
        start_d, first_d, end_d = table[0, 0, od], table[0, 1, od], table[0, 2, od]
        start_h, first_h, end_h = table[1, 0, oh], table[1, 1, oh], table[1, 2, oh]
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            total = y[n, od, oh, ow]
            total[:] = 0
            for jd in range(first_d, end_d):
                xd = start_d + jd * dil_d
                for jh in range(first_h, end_h):
                    _add_taps(total, x[n, xd, start_h + jh * dil_h], start_w, first_w, end_w,
                              dil_w)
            window = divisor[0, od] * divisor[1, oh] * divisor[2, ow]
            for c in range(n_chan):
                total[c] = total[c] / window


@parallel_kernel
def avg_pool_backward(dy, divisor, cover_ptr, cover_out, dx):
    """Channels-last :func:`poolgrad.kernels.sum_pool.avg_pool_backward`."""
    n_batch, in_d, in_h, in_w, n_chan = dx.shape
    for row in prange(n_batch * in_d * in_h):
        ih = row % in_h
        rest = row // in_h
        i_d = rest % in_d
        n = rest // in_d
        for iw in range(in_w):
            total = dx[n, i_d, ih, iw]
            total[:] = 0
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        window = divisor[0, od] * divisor[1, oh] * divisor[2, ow]
                        grad = dy[n, od, oh, ow]
                        for c in range(n_chan):
                            total[c] += grad[c] / window
