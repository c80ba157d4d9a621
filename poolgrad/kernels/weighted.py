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

Both compute in float64 whatever the dtype, with :mod:`.elementary`'s ``exp`` and
``log``. ``weighted_pool_*`` walk output rows (forward) or gather per input row through
the plan's cover tables, adding the windows in increasing output order (backward): no
races, and the same bits at any thread count. Sums run in row-major window order from
+0. ``weighted_rows_*`` serve windows with no padding on NCHW planes or channels-last
images as rows (the backward only windows that do not overlap), with their bits.

:func:`stochastic_pool_sample` picks one real tap per window with probability
``x_j / S``: the first tap whose running sum exceeds ``u * S``, for a uniform draw
``u`` in ``[0, 1)`` given per window (the first real tap where ``S = 0``; a tap of
weight 0 is never drawn otherwise), and writes
its tap number like a max pooling's winner, so the max pooling's backward routes it.
"""

import numpy as np
from numba import prange, uint64

from . import elementary, parallel_kernel
from .walk import gather_tap, inlined, row_index, row_windows, rows_task, scatter_tap

SOFT, SELF = 0, 1


@inlined
def _weight(v, largest, kind):
    return elementary.exp(v - largest) if kind == SOFT else v


@inlined
def _finish(largest, total, weighted, kind):
    """``(y, norm)`` of a window from its sums (float64)."""
    if kind == SOFT:
        return weighted / total, largest + elementary.log(total)
    return (weighted / total if total != 0 else 0.0), total


@inlined
def _share(value, out, scale, dy, kind):
    """``dy * dy/dx`` of a tap of value ``value`` in a window (``out``, ``scale``: its
    ``y`` and ``norm``), float64."""
    if kind == SOFT:
        return dy * (elementary.exp(value - scale) * (1.0 + value - out))
    return dy * ((value + value - out) / scale) if scale != 0 else 0.0


@parallel_kernel
def weighted_pool_forward(x, table, kind, y, norm):
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            largest = np.float64(x[n, c, start_d + first_d, start_h + first_h,
                                   start_w + first_w])
            if kind == SOFT:
                for xd in range(start_d + first_d, start_d + end_d):
                    for xh in range(start_h + first_h, start_h + end_h):
                        for xw in range(start_w + first_w, start_w + end_w):
                            v = np.float64(x[n, c, xd, xh, xw])
                            largest = v if (v > largest) | (v != v) else largest
            total, weighted = 0.0, 0.0
            for xd in range(start_d + first_d, start_d + end_d):
                for xh in range(start_h + first_h, start_h + end_h):
                    for xw in range(start_w + first_w, start_w + end_w):
                        v = np.float64(x[n, c, xd, xh, xw])
                        w = _weight(v, largest, kind)
                        total += w
                        weighted += w * v
            y[n, c, od, oh, ow], norm[n, c, od, oh, ow] = _finish(largest, total, weighted,
                                                                  kind)


@parallel_kernel
def weighted_pool_backward(x, y, norm, dy, kind, cover_ptr, cover_out, dx):
    """``dx[i]`` = sum over the windows ``o`` reading ``i`` of ``dy[o] * dy[o]/dx[i]``
    (the module docstring's formulas); a ``SELF`` window with ``S = 0`` sends 0."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    for row in prange(n_batch * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            value = np.float64(x[n, c, i_d, ih, iw])
            total = 0.0
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        total += _share(value, np.float64(y[n, c, od, oh, ow]),
                                        np.float64(norm[n, c, od, oh, ow]),
                                        np.float64(dy[n, c, od, oh, ow]), kind)
            dx[n, c, i_d, ih, iw] = total


@parallel_kernel
def weighted_rows_forward(x, inner, window, steps, chunks, tasks, kind, y, norm):
    """The forward on rows ``(P, D, H, W * inner)`` (NCHW planes with ``inner`` 1, or
    channels-last images with ``inner`` C; ``window`` and ``steps`` the ``(D, H, W)``
    kernel and stride, no padding): each tap of the windows of an output row gathered
    into a contiguous buffer, then the running maxima and sums taken over it, tap by
    tap in tap order, with :func:`weighted_pool_forward`'s bits."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps, largest = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        total, weighted = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            gather_tap(x[plane, od * steps[0], oh * steps[1]], 0, steps[2], inner, largest)
            total[:] = 0.0
            weighted[:] = 0.0
            # SoftPool takes the maxima first (phase 0), then both kinds the sums
            for phase in range(0 if kind == SOFT else 1, 2):
                for a in range(window[0]):
                    for b in range(window[1]):
                        src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                        for t in range(window[2]):
                            gather_tap(src, t, steps[2], inner, taps)
                            for o in range(out_l):
                                at = uint64(o)
                                v, best = taps[at], largest[at]
                                if phase == 0:
                                    largest[at] = v if (v > best) | (v != v) else best
                                else:
                                    w = _weight(v, best, kind)
                                    total[at] += w
                                    weighted[at] += w * v
            means, norms = y[plane, od, oh], norm[plane, od, oh]
            for o in range(out_l):
                at = uint64(o)
                means[at], norms[at] = _finish(largest[at], total[at], weighted[at], kind)


@parallel_kernel
def weighted_rows_backward(x, y, norm, dy, inner, window, steps, chunks, tasks, kind, dx):
    """``dx`` for windows that do not overlap, rows laid out as
    :func:`weighted_rows_forward`'s: each tap of each window written once, with
    :func:`weighted_pool_backward`'s bits. Inputs no window reads are left as they are
    (the caller zeroes them)."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps = np.empty(out_l, np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            means, norms, grads = y[plane, od, oh], norm[plane, od, oh], dy[plane, od, oh]
            for a in range(window[0]):
                for b in range(window[1]):
                    src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                    for t in range(window[2]):
                        gather_tap(src, t, steps[2], inner, taps)
                        for o in range(out_l):
                            at = uint64(o)
                            taps[at] = 0.0 + _share(taps[at], np.float64(means[at]),
                                                    np.float64(norms[at]),
                                                    np.float64(grads[at]), kind)
                        scatter_tap(taps, t, steps[2], inner,
                                    dx[plane, od * steps[0] + a, oh * steps[1] + b])


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
