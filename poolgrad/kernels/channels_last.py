"""Channels-last kernels: arrays ``(N, D, H, W, C)`` with C fastest in memory.

Neighbouring channels share their window geometry, so every innermost loop here runs
along C over contiguous memory with no branches, and vectorizes for any kernel,
stride, padding or dilation. Each kernel gives the bits of its ``(N, C, D, H, W)``
counterpart in :mod:`.max_pool` or :mod:`.sum_pool`: the same operations in the same
order, or, in the folds of :func:`max_values_forward`, a rule proved to select the same
element (see the comment above :func:`max_of_4`).

Parallel loops own whole output rows ``(n, od, oh)`` (forward) or input rows
``(n, id, ih)`` (backward, gathering through the plan's cover tables).
"""

import numpy as np
from numba import prange

from . import beats, jit, larger, parallel_kernel
from .walk import row_index, row_windows


@jit(inline="always")
def _fold_taps(best, best_tap, row, start_w, first_w, end_w, dil_w, tap, first):
    """:func:`_fold_values` that also keeps the winners: ``best_tap[c]`` is the tap of
    ``best[c]``, and the taps of this window row are numbered from ``tap``. Two or three
    taps are folded in one pass over C (VGG's 2x2/2 and the 3x3/2 layers), so ``best``
    and ``best_tap`` are loaded and stored once per tap row; other counts one pass per
    tap. A third case for four taps (the 1-d k=4 layer) was level there and made the
    two-tap case slower. ``tap`` has the values' width, for the reason given in
    :func:`max_pool_forward`."""
    count = end_w - first_w
    w0 = start_w + first_w * dil_w
    if count == 2:
        a, b = row[w0], row[w0 + dil_w]
        for c in range(len(best)):
            take_a = first | beats(a[c], best[c])
            m = a[c] if take_a else best[c]
            t = tap if take_a else best_tap[c]
            take_b = beats(b[c], m)
            best[c] = b[c] if take_b else m
            best_tap[c] = tap + 1 if take_b else t
    elif count == 3:
        a, b, d = row[w0], row[w0 + dil_w], row[w0 + 2 * dil_w]
        for c in range(len(best)):
            take_a = first | beats(a[c], best[c])
            m = a[c] if take_a else best[c]
            t = tap if take_a else best_tap[c]
            take_b = beats(b[c], m)
            m = b[c] if take_b else m
            t = tap + 1 if take_b else t
            take_d = beats(d[c], m)
            best[c] = d[c] if take_d else m
            best_tap[c] = tap + 2 if take_d else t
    else:
        for jw in range(first_w, end_w):
            a = row[start_w + jw * dil_w]
            take_all = first and jw == first_w
            t = tap + (jw - first_w)
            for c in range(len(best)):
                take = take_all | beats(a[c], best[c])
                best[c] = a[c] if take else best[c]
                best_tap[c] = t if take else best_tap[c]


@parallel_kernel
def max_pool_forward(x, table, dilation, extent, tap_like, y, pos):
    """Channels-last :func:`poolgrad.kernels.max_pool.max_pool_forward`: ``y`` = the
    window maximum, ``pos`` = its tap; the first maximum (the first NaN) wins.

    The maxima are folded in place in ``y``, one window row at a time; their taps in a
    private buffer as wide as the values (``tap_like``'s dtype: int32 for float32, int64
    for float64), narrowed into ``pos`` once per window. A select of a float and a uint8
    in one loop kept the loop scalar on AVX2 CPUs. Folding a window row per pass instead
    of a tap per pass (:func:`_fold_taps`) made it much faster."""
    n_batch, n_chan = x.shape[0], x.shape[4]
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    ext_h, ext_w = extent[1], extent[2]
    tap_type = tap_like.dtype.type
    for row in prange(n_batch * out_d * out_h):
        n, _, od, oh = row_index(row, 1, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        best_tap = np.empty(n_chan, tap_like.dtype)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            best = y[n, od, oh, ow]
            first = True
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    _fold_taps(best, best_tap, x[n, start_d + jd * dil_d, start_h + jh * dil_h],
                               start_w, first_w, end_w, dil_w,
                               tap_type((jd * ext_h + jh) * ext_w + first_w), first)
                    first = False
            won = pos[n, od, oh, ow]
            for c in range(n_chan):
                won[c] = best_tap[c]


@jit(inline="always")
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


@jit(inline="always")
def _nan_or(q, v):
    """``q`` if it is a NaN, else ``v``."""
    return q if q != q else v


# The fused folds below split the exact rule (:func:`beats`) in two chains over the taps
# in order. :func:`larger` gives the first maximum (a tie keeps the earlier tap) when no
# tap is a NaN, or when the first one is: a NaN maximum is never replaced. ``_nan_or``
# gives the first NaN, if any. The window's maximum is that NaN if there is one, else the
# first chain's result: the bits of folding with ``beats``, in two compares and two
# selects per tap instead of three compares, two logic operations and a select.
# AlexNet's 3x3/2 (32x96x55x55, two threads) went from 1.18 to 0.89 ms (937caf9).


@jit(inline="always")
def max_of_4(out, a, b, d, e):
    """``out`` = the maximum of four taps in window order (``a`` first; each the C
    values of one tap), in one pass over C: nothing but ``out`` is stored, once. A
    2x2 window's taps, or one row of up to four (a shorter row repeats its last, as in
    :func:`_max_rows_of_3`)."""
    for c in range(len(out)):
        m = larger(e[c], larger(d[c], larger(b[c], a[c])))
        q = _nan_or(_nan_or(_nan_or(a[c], b[c]), d[c]), e[c])
        out[c] = _nan_or(q, m)


@jit(inline="always")
def _max_rows_of_3(out, r0, r1, r2, w0, w1, w2):
    """``out`` = the maximum of a window of up to three tap rows of up to three taps
    (columns ``w0, w1, w2``), in one pass over C. A smaller window repeats its last row
    or column: folding a tap again right after it changes nothing (it cannot beat a
    maximum that already includes it, and a NaN maximum is never replaced), so the
    result has the bits of folding each tap once."""
    a0, a1, a2 = r0[w0], r0[w1], r0[w2]
    b0, b1, b2 = r1[w0], r1[w1], r1[w2]
    d0, d1, d2 = r2[w0], r2[w1], r2[w2]
    for c in range(len(out)):
        m = larger(a2[c], larger(a1[c], a0[c]))
        m = larger(b2[c], larger(b1[c], larger(b0[c], m)))
        m = larger(d2[c], larger(d1[c], larger(d0[c], m)))
        q = _nan_or(_nan_or(a0[c], a1[c]), a2[c])
        q = _nan_or(_nan_or(_nan_or(q, b0[c]), b1[c]), b2[c])
        q = _nan_or(_nan_or(_nan_or(q, d0[c]), d1[c]), d2[c])
        out[c] = _nan_or(q, m)


@jit(inline="always")
def max_4x2(out, r0, r1, r2, r3, w0, dil_w):
    """``out`` = the maximum of four tap rows of two taps (a 2x2x2 window), in one
    pass over C."""
    a0, a1, b0, b1 = r0[w0], r0[w0 + dil_w], r1[w0], r1[w0 + dil_w]
    d0, d1, e0, e1 = r2[w0], r2[w0 + dil_w], r3[w0], r3[w0 + dil_w]
    for c in range(len(out)):
        m = larger(b1[c], larger(b0[c], larger(a1[c], a0[c])))
        m = larger(e1[c], larger(e0[c], larger(d1[c], larger(d0[c], m))))
        q = _nan_or(_nan_or(_nan_or(a0[c], a1[c]), b0[c]), b1[c])
        q = _nan_or(_nan_or(_nan_or(_nan_or(q, d0[c]), d1[c]), e0[c]), e1[c])
        out[c] = _nan_or(q, m)


@jit(inline="always")
def _first_column(table, ow, dil_w):
    """The input column of output column ``ow``'s first real tap."""
    return table[2, 0, ow] + table[2, 1, ow] * dil_w


@jit(inline="always")
def _run_end(table, ow, out_w, count):
    """The end of the run of output columns from ``ow`` whose windows have ``count``
    real taps along W, as ``ow``'s: all the interior columns are one run."""
    end = ow + 1
    while end < out_w and table[2, 2, end] - table[2, 1, end] == count:
        end += 1
    return end


@parallel_kernel
def max_values_forward(x, table, dilation, y):
    """The ``y`` of :func:`max_pool_forward` without the winners (inference).

    Windows of two to four real tap rows of two taps (2x2, 2x2x2), of two or three
    rows of two or three taps (3x3 and its cut edges) and of one row of two to four
    taps (1-d) are folded in one pass over C,
    writing each output once; with C in the tens, a pass per tap row spent more on its
    loop than on the taps. Other windows are folded in place one tap row at a time: a
    float select alone vectorizes.

    The fold is chosen once per run of columns with the same window width
    (:func:`_run_end`), not once per column: with C of 32 to 64, that choice cost 5-10%
    of the pass."""
    n_batch = x.shape[0]
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    for row in prange(n_batch * out_d * out_h):
        n, _, od, oh = row_index(row, 1, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        rows_d, rows_h = end_d - first_d, end_h - first_h
        # the window's tap rows in order; a missing fourth or third repeats the last
        d0, h0 = start_d + first_d * dil_d, start_h + first_h * dil_h
        r0 = x[n, d0, h0]
        r1 = x[n, d0 + (rows_d > 1) * dil_d, h0] if rows_h == 1 else x[n, d0, h0 + dil_h]
        r2 = r1
        r3 = r1
        if rows_d * rows_h == 4 and rows_h == 2:
            r2 = x[n, d0 + dil_d, h0]
            r3 = x[n, d0 + dil_d, h0 + dil_h]
        elif rows_d == 1 and rows_h == 3:
            r2 = x[n, d0, h0 + 2 * dil_h]
        rows = rows_d * rows_h
        out_row = y[n, od, oh]
        ow = 0
        while ow < out_w:
            count = table[2, 2, ow] - table[2, 1, ow]
            end = _run_end(table, ow, out_w, count)
            if (rows == 2) & (count == 2):
                for o in range(ow, end):
                    w0 = _first_column(table, o, dil_w)
                    max_of_4(out_row[o], r0[w0], r0[w0 + dil_w], r1[w0], r1[w0 + dil_w])
            elif (rows_d == 1) & (rows_h >= 2) & (rows_h <= 3) & (count >= 2) & (count <= 3):
                for o in range(ow, end):
                    w0 = _first_column(table, o, dil_w)
                    _max_rows_of_3(out_row[o], r0, r1, r2, w0, w0 + dil_w,
                                   w0 + (count - 1) * dil_w)
            elif (rows == 1) & (count >= 2) & (count <= 4):
                for o in range(ow, end):
                    w0 = _first_column(table, o, dil_w)
                    last = w0 + (count - 1) * dil_w
                    max_of_4(out_row[o], r0[w0], r0[w0 + dil_w],
                              r0[min(w0 + 2 * dil_w, last)], r0[last])
            elif (rows == 4) & (rows_h == 2) & (count == 2):
                for o in range(ow, end):
                    max_4x2(out_row[o], r0, r1, r2, r3, _first_column(table, o, dil_w), dil_w)
            else:
                for o in range(ow, end):
                    first = True
                    for jd in range(first_d, end_d):
                        for jh in range(first_h, end_h):
                            _fold_values(out_row[o],
                                         x[n, start_d + jd * dil_d, start_h + jh * dil_h],
                                         table[2, 0, o], table[2, 1, o], table[2, 2, o], dil_w,
                                         first)
                            first = False
            ow = end


@parallel_kernel
def max_pool_backward(dy, pos, cover_ptr, cover_out, cover_tap, extent, tap_like, plus_zero,
                      dx):
    """Channels-last :func:`poolgrad.kernels.max_pool.max_pool_backward`.

    Each element is ``0 + `` the sum of the gradients of the windows it won, in output
    order: a -0 gradient gives +0, as in the NCHW kernels. ``plus_zero`` (a 1-element
    array holding +0) is that 0, loaded, so that the compiler (allowed to ignore the sign
    of zeros) cannot drop the addition. Winners are compared at ``tap_like``'s width
    (the values' width) and the selects pick a zero of the values' type: a uint8 compare
    or an integer 0 (which made the sum a float64) kept the loops from vectorizing well.

    Input rows whose every element is read by exactly one window (VGG's 2x2/2, any
    tiling) are written in one pass, with no zeroing."""
    n_batch, in_d, in_h, in_w, n_chan = dx.shape
    ext_h, ext_w = extent[1], extent[2]
    tap_type = tap_like.dtype.type
    zero = plus_zero[0]
    single_w = True
    for iw in range(in_w):
        single_w &= cover_ptr[2, iw + 1] - cover_ptr[2, iw] == 1
    for row in prange(n_batch * in_d * in_h):
        n, _, i_d, ih = row_index(row, 1, in_d, in_h)
        if (single_w & (cover_ptr[0, i_d + 1] - cover_ptr[0, i_d] == 1)
                & (cover_ptr[1, ih + 1] - cover_ptr[1, ih] == 1)):
            a, b = cover_ptr[0, i_d], cover_ptr[1, ih]
            od, oh = cover_out[0, a], cover_out[1, b]
            tap_dh = (cover_tap[0, a] * ext_h + cover_tap[1, b]) * ext_w
            for iw in range(in_w):
                e = cover_ptr[2, iw]
                tap = tap_type(tap_dh + cover_tap[2, e])
                total = dx[n, i_d, ih, iw]
                grad = dy[n, od, oh, cover_out[2, e]]
                won = pos[n, od, oh, cover_out[2, e]]
                for c in range(n_chan):
                    total[c] = zero + (grad[c] if tap_type(won[c]) == tap else zero)
            continue
        for iw in range(in_w):
            total = dx[n, i_d, ih, iw]
            total[:] = zero
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                tap_d = cover_tap[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    tap_dh = (tap_d * ext_h + cover_tap[1, b]) * ext_w
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        tap = tap_type(tap_dh + cover_tap[2, e])
                        grad = dy[n, od, oh, ow]
                        won = pos[n, od, oh, ow]
                        for c in range(n_chan):
                            # adding a zero leaves total's bits alone (it is never -0)
                            total[c] += grad[c] if tap_type(won[c]) == tap else zero


@jit(inline="always")
def _add_taps(total, row, start_w, first_w, end_w, dil_w):
    """Add the taps ``[first_w, end_w)`` of one window row to ``total``, in tap order:
    three taps in one pass over C, so ``total`` is loaded and stored once per tap row
    (as :func:`_fold_values` does for the maxima), any other count one pass per tap.
    One pass made three taps faster; for two taps one pass measured slower than two (a
    whole 2x2 window is one pass of its own: see :func:`avg_pool_forward`)."""
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


@jit(inline="always")
def _mean_run_end(table, divisor, ow, out_w, count):
    """:func:`_run_end`, cut where the divisor along W changes: every interior column is
    one run, whose division and fold are chosen once."""
    end = _run_end(table, ow, out_w, count)
    same = ow + 1
    while same < end and divisor[2, same] == divisor[2, ow]:
        same += 1
    return same


@parallel_kernel
def avg_pool_forward(x, table, dilation, divisor, plus_zero, y):
    """Channels-last :func:`poolgrad.kernels.sum_pool.avg_pool_forward`.

    A 2-d window of two real tap rows of two taps (VGG's 2x2/2) is summed and divided
    in one pass over C, so ``y`` is written once, with no zeroing pass and no division
    pass, which is faster. Its sum starts from the first tap, not from 0, so a window of
    -0s sums to -0: ``plus_zero`` (a 1-element array holding +0, loaded so that the
    compiler cannot drop it) is added to the sum before its division, which makes that
    +0, as a sum that starts from 0 does, and leaves every other sum alone. Full 3x3
    windows (ResNet's 3x3/2) likewise take one pass (:func:`_mean_3x3`).

    The fold and the divisor are chosen once per run of columns (:func:`_mean_run_end`),
    not once per column: with C of 64, the per-column choice cost 6-9% of a 2x2/2 pass."""
    zero = plus_zero[0]
    n_batch = x.shape[0]
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    dil_d, dil_h, dil_w = dilation[0], dilation[1], dilation[2]
    for row in prange(n_batch * out_d * out_h):
        n, _, od, oh = row_index(row, 1, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        rows = (end_d - first_d == 1) * (end_h - first_h)  # tap rows of a 2-d window
        xd = start_d + first_d * dil_d
        r0 = x[n, xd, start_h + first_h * dil_h]
        r1 = x[n, xd, start_h + (first_h + (rows > 1)) * dil_h]
        r2 = x[n, xd, start_h + (first_h + 2 * (rows > 2)) * dil_h]
        out_row = y[n, od, oh]
        lead = divisor[0, od] * divisor[1, oh]
        ow = 0
        while ow < out_w:
            count = table[2, 2, ow] - table[2, 1, ow]
            end = _mean_run_end(table, divisor, ow, out_w, count)
            window = lead * divisor[2, ow]
            if (rows == 2) & (count == 2):
                for o in range(ow, end):
                    w0 = _first_column(table, o, dil_w)
                    a, b, d, e = r0[w0], r0[w0 + dil_w], r1[w0], r1[w0 + dil_w]
                    total = out_row[o]
                    for c in range(len(total)):
                        total[c] = ((((a[c] + b[c]) + d[c]) + e[c]) + zero) / window
            elif (rows == 3) & (count == 3):
                for o in range(ow, end):
                    _mean_3x3(out_row[o], r0, r1, r2, _first_column(table, o, dil_w), dil_w,
                              window, zero)
            else:
                for o in range(ow, end):
                    _mean(out_row[o], x, n, start_d, first_d, end_d, dil_d, start_h, first_h,
                          end_h, dil_h, table[2, 0, o], table[2, 1, o], table[2, 2, o], dil_w,
                          window)
            ow = end


@jit(inline="always")
def _mean_3x3(out, r0, r1, r2, w0, dil_w, window, zero):
    """``out`` = the mean of a full window of three tap rows of three taps, in one pass
    over C: the sum :func:`_mean` makes, from the loaded +0 ``zero`` and in tap order,
    then the division, each output written once instead of in five passes."""
    w1, w2 = w0 + dil_w, w0 + 2 * dil_w
    a0, a1, a2, b0, b1, b2 = r0[w0], r0[w1], r0[w2], r1[w0], r1[w1], r1[w2]
    d0, d1, d2 = r2[w0], r2[w1], r2[w2]
    for c in range(len(out)):
        total = ((zero + a0[c]) + a1[c]) + a2[c]
        total = ((total + b0[c]) + b1[c]) + b2[c]
        out[c] = (((total + d0[c]) + d1[c]) + d2[c]) / window


@jit(inline="always")
def _mean(total, x, n, start_d, first_d, end_d, dil_d, start_h, first_h, end_h, dil_h,
          start_w, first_w, end_w, dil_w, window):
    """``total`` = the mean of one window over ``window`` taps: a sum that starts from
    0, a pass of :func:`_add_taps` per tap row, then a division pass."""
    total[:] = 0
    for jd in range(first_d, end_d):
        for jh in range(first_h, end_h):
            _add_taps(total, x[n, start_d + jd * dil_d, start_h + jh * dil_h], start_w,
                      first_w, end_w, dil_w)
    for c in range(len(total)):
        total[c] = total[c] / window


@parallel_kernel
def avg_pool_backward(dy, divisor, cover_ptr, cover_out, dx):
    """Channels-last :func:`poolgrad.kernels.sum_pool.avg_pool_backward`."""
    n_batch, in_d, in_h, in_w, n_chan = dx.shape
    for row in prange(n_batch * in_d * in_h):
        n, _, i_d, ih = row_index(row, 1, in_d, in_h)
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


_SPREAD_ROWS = 64  # rows of dx per parallel step of global_avg_backward


@parallel_kernel
def global_avg_backward(dy, divisor, dx):
    """Channels-last :func:`poolgrad.kernels.sum_pool.global_avg_backward` on ``(N, C)``
    and ``(N, L, C)`` views: ``dx[n, j, :] = dy[n, :] / divisor``, the planes kernel's
    bits (a -0 gradient stays -0; the windowed backward adds it to +0). Each image's
    shares are divided once, then copied along L in blocks of :data:`_SPREAD_ROWS`
    rows, the parallel steps, so that one image also takes both threads."""
    n_batch, length, n_chan = dx.shape
    blocks = (length + _SPREAD_ROWS - 1) // _SPREAD_ROWS
    for step in prange(n_batch * blocks):
        n, first = step // blocks, step % blocks * _SPREAD_ROWS
        share = np.empty(n_chan, dx.dtype)
        for c in range(n_chan):
            share[c] = dy[n, c] / divisor
        for j in range(first, min(first + _SPREAD_ROWS, length)):
            row = dx[n, j]
            for c in range(n_chan):
                row[c] = share[c]
