"""Max pooling: forward keeps the winning tap of each window; backward routes to it."""

import numpy as np
from numba import prange

from . import beats, jit, parallel_kernel
from .lanes import lane_max, window_max
from .walk import row_index, row_windows


# a plain call, not inlined: inlined into the parallel kernels it tripled their compile time
@jit()
def max_pool_row(x, table, dilation, extent, y_row, pos_row, n, c, od, oh):
    """Output row ``(n, c, od, oh)`` window by window, exactly: in ``y_row`` the maximum
    of each window's real taps, in ``pos_row`` its tap number (row-major over
    ``extent``). The first maximum wins; a NaN beats everything and the first NaN wins.
    Padding is never read, so it never wins. The row-pass kernels call it for rows that
    hold a NaN."""
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    ext_h, ext_w = extent[1], extent[2]
    start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
    for ow in range(len(y_row)):
        start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
        best = x[n, c, start_d + first_d * dil_d, start_h + first_h * dil_h,
                 start_w + first_w * dil_w]
        best_tap = (first_d * ext_h + first_h) * ext_w + first_w
        for jd in range(first_d, end_d):
            xd = start_d + jd * dil_d
            for jh in range(first_h, end_h):
                xh = start_h + jh * dil_h
                tap_dh = (jd * ext_h + jh) * ext_w
                for jw in range(first_w, end_w):
                    v = x[n, c, xd, xh, start_w + jw * dil_w]
                    wins = beats(v, best)
                    best = v if wins else best
                    best_tap = tap_dh + jw if wins else best_tap
        y_row[ow] = best
        pos_row[ow] = best_tap


@parallel_kernel(any_layout=True)
def max_pool_forward(x, table, dilation, extent, y, pos):
    """``y[n, c, o]`` = max over the real taps of window ``o``; ``pos`` = its tap number
    (see :func:`max_pool_row`): the first maximum, PyTorch's argmax."""
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h = y.shape[2], y.shape[3]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        max_pool_row(x, table, dilation, extent, y[n, c, od, oh], pos[n, c, od, oh], n, c, od, oh)


@jit()
def max_backward_row(dy, pos, cover_ptr, cover_out, cover_tap, extent, dx_row, n, c, i_d, ih):
    """Input row ``(n, c, i_d, ih)`` of the max-pool gradient, exactly, into ``dx_row``:
    each element sums ``dy[o]`` over the windows ``o`` whose winning tap reads it, in
    increasing output order. The row-pass kernels call it for rows whose gradient holds
    an infinity or a NaN."""
    ext_h, ext_w = extent[1], extent[2]
    zero = np.zeros(1, dx_row.dtype)[0]
    for iw in range(len(dx_row)):
        total = zero
        for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
            od = cover_out[0, a]
            tap_d = cover_tap[0, a]
            for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                oh = cover_out[1, b]
                tap_dh = (tap_d * ext_h + cover_tap[1, b]) * ext_w
                for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                    ow = cover_out[2, e]
                    if pos[n, c, od, oh, ow] == tap_dh + cover_tap[2, e]:
                        total += dy[n, c, od, oh, ow]
        dx_row[iw] = total


@parallel_kernel
def max_pool_backward(dy, pos, cover_ptr, cover_out, cover_tap, extent, dx):
    """``dx[i]`` = sum of ``dy[o]`` over the windows ``o`` whose winning tap reads ``i``.

    Gathers per input element through the cover tables, visiting windows in increasing
    output order: the same additions, in the same order, as a serial scatter.
    """
    n_batch, n_chan, in_d, in_h = dx.shape[0], dx.shape[1], dx.shape[2], dx.shape[3]
    for row in prange(n_batch * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        max_backward_row(dy, pos, cover_ptr, cover_out, cover_tap, extent, dx[n, c, i_d, ih],
                         n, c, i_d, ih)


@parallel_kernel
def max_pool_tie_count(x, table, dilation, y, ties):
    """``ties[o]``: how many real taps of window ``o`` equal its maximum (1 for NaN)."""
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            best = y[n, c, od, oh, ow]
            count = 0
            for jd in range(first_d, end_d):
                xd = start_d + jd * dil_d
                for jh in range(first_h, end_h):
                    xh = start_h + jh * dil_h
                    for jw in range(first_w, end_w):
                        if x[n, c, xd, xh, start_w + jw * dil_w] == best:
                            count += 1
            ties[n, c, od, oh, ow] = max(count, 1)


@parallel_kernel
def max_pool_backward_split(x, y, dy, ties, pos, cover_ptr, cover_out, cover_tap, extent, dx):
    """Like :func:`max_pool_backward`, but every tap equal to the maximum gets an equal
    share ``dy[o] / ties[o]``. A NaN window routes to its winning tap alone."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    ext_h, ext_w = extent[1], extent[2]
    zero = np.zeros(1, dx.dtype)[0]
    for row in prange(n_batch * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            value = x[n, c, i_d, ih, iw]
            total = zero
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                tap_d = cover_tap[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    tap_dh = (tap_d * ext_h + cover_tap[1, b]) * ext_w
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        if (value == y[n, c, od, oh, ow]
                                or pos[n, c, od, oh, ow] == tap_dh + cover_tap[2, e]):
                            total += dy[n, c, od, oh, ow] / ties[n, c, od, oh, ow]
            dx[n, c, i_d, ih, iw] = total


@parallel_kernel
def window_positions_to_indices(pos, table, dilation, extent, in_h, in_w, indices):
    """PyTorch's indices: the flat position of each winner inside its (n, c) input plane."""
    n_batch, n_chan, out_d, out_h, out_w = pos.shape
    ext_h, ext_w = extent[1], extent[2]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        for ow in range(out_w):
            tap = np.int64(pos[n, c, od, oh, ow])
            jw = tap % ext_w
            jh = (tap // ext_w) % ext_h
            jd = tap // (ext_w * ext_h)
            xd = table[0, 0, od] + jd * dilation[0]
            xh = table[1, 0, oh] + jh * dilation[1]
            xw = table[2, 0, ow] + jw * dilation[2]
            indices[n, c, od, oh, ow] = (xd * in_h + xh) * in_w + xw


@jit()  # a call: the rare path
def _first_nan(xf, begin, count_d, step_d, count_h, step_h, width, taps_h):
    """The number of the first NaN, in row-major order, of the window that
    :func:`~.lanes.window_max` takes with the same arguments (it saw one)."""
    for jd in range(count_d):
        for jh in range(count_h):
            row = begin + jd * step_d + jh * step_h
            for jw in range(width):
                if xf[row + jw] != xf[row + jw]:
                    return (jd * count_h + jh) * taps_h + jw
    return 0


@parallel_kernel
def global_max_forward(x, y, pos):
    """``y[p]`` = the maximum of the plane ``x[p, :]`` (C-contiguous ``(planes, L)``
    views, float32 or float64) and ``pos[p]`` its position:
    :func:`max_pool_forward`'s answer for one window over the whole plane (its tap
    number is the position), the first maximum, a NaN beating everything and the first
    NaN winning. A vector of running maxima and their positions
    (:func:`~.lanes.lane_max`), where the general kernel folds tap by tap. (Asking for
    the input 8 KB ahead, as the global average does, made it slower.)"""
    planes, length = x.shape
    xf = x.ravel()
    for p in prange(planes):
        start = p * length
        offset, nan = lane_max(xf, start, length)
        if nan:  # the first NaN wins
            offset = _first_nan(xf, start, 1, 0, 1, 0, length, length)
        y[p] = xf[start + offset]
        pos[p] = offset


@parallel_kernel
def max_pool_forward_wide(x, table, dilation, extent, y, pos):
    """:func:`max_pool_forward` for a C-contiguous ``x`` whose windows are not dilated
    along W, with its values and winners: each window's real taps in one
    :func:`~.lanes.window_max` (a window holding a NaN scanned for its first). For
    windows too wide or too irregular for the row passes (adaptive bins, sliding
    windows wider than 4), which the general kernel folds tap by tap."""
    n_batch, n_chan, out_d, out_h = y.shape[0], y.shape[1], y.shape[2], y.shape[3]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        _wide_row(x, table, dilation, extent, y[n, c, od, oh], pos[n, c, od, oh], n, c, od,
                  oh)


@jit()  # a call, as max_pool_row
def _wide_row(x, table, dilation, extent, y_row, pos_row, n, c, od, oh):
    """Output row ``(n, c, od, oh)`` of :func:`max_pool_forward_wide`."""
    in_h, in_w = x.shape[3], x.shape[4]
    xf, ext_h, ext_w = x.ravel(), extent[1], extent[2]
    step_d, step_h = dilation[0] * in_h * in_w, dilation[1] * in_w
    start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
    rows_d, rows_h = end_d - first_d, end_h - first_h
    corner = ((n * x.shape[1] + c) * x.shape[2] + start_d + first_d * dilation[0]) * in_h
    corner = (corner + start_h + first_h * dilation[1]) * in_w
    for ow in range(len(y_row)):
        start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
        begin = corner + start_w + first_w
        number, nan = window_max(xf, begin, rows_d, step_d, rows_h, step_h, end_w - first_w,
                                 ext_w)
        if nan:  # the first NaN in row-major order wins
            number = _first_nan(xf, begin, rows_d, step_d, rows_h, step_h, end_w - first_w,
                                ext_w)
        row, jw = divmod(number, ext_w)
        jd, jh = divmod(row, rows_h)
        y_row[ow] = xf[begin + jd * step_d + jh * step_h + jw]
        pos_row[ow] = ((first_d + jd) * ext_h + first_h + jh) * ext_w + first_w + jw
