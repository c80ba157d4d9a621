"""Generalized-mean (GeM) pooling, fused: one pass over x forward, one backward.

With ``z = max(x, eps)`` (NaN stays NaN) and a window ``W`` of ``K`` real taps:

* forward: ``y = (sum_W z^p / K)^(1/p)``;
* backward: ``dx_j = sum over the windows reading j of dy * (z_j / y)^(p-1) / K``
  where ``x_j >= eps``, else 0 (the clamp passes no gradient, as PyTorch's);
* the gradient of ``p``, one term per window (their sum is ``dp``):
  ``dy * (y / p) * S1 / S0`` with ``r = z / y``, ``S0 = sum_W r^p`` and
  ``S1 = sum_W r^p log r``. Taken relative to ``y``, it has no cancellation, and the
  normalisation by ``S0`` (``K`` in exact arithmetic) makes it exact for the ``y`` that
  was stored, rounding and all. :func:`plane_totals` adds each plane's terms in one
  order whatever their layout.

Sums run in float64 whatever the dtype, in a fixed order: the same bits at any thread
count. A whole ``p`` up to 8 (3, GeM's usual start) is raised by multiplying, the
number of factors compiled in (:func:`.powers.power_form`); any other by ``exp`` and ``log``,
and ``dp``'s terms take ``log``, both from :mod:`.elementary`, so the loops vectorize
(for float32 results, its base-2 ones within ``2**-35``: :mod:`.powers`).

Three families:

* ``gem_global_*`` pool whole planes, on ``(N, C, L)`` views (the spatial dims
  flattened). ``*_planes`` walks each ``(n, c)`` plane (contiguous in NCHW);
  ``*_channels_last`` takes the ``(N, L, C)`` view of a channels-last array (contiguous
  there) and keeps one accumulator per channel. A plane's ``sum z^p`` runs in
  :data:`LANES` partial sums, lane ``k`` adding the taps ``i = k mod LANES`` in
  increasing ``i``, the lanes then added by halving (lane ``k`` += lane ``k + h``, for
  ``h = LANES/2, ..., 1``): one order for both layouts, so they give the same bits.
  Where that sum overflows or falls below :data:`.powers.TINY` (terms may have underflowed),
  the plane is summed again as ``m^p sum (z/m)^p``, ``m`` its largest ``z``, so a large
  ``p`` neither overflows nor underflows. The backward multiplies by ``1/y`` rather
  than dividing (a plane whose ``1/y`` may overflow is redone lifted,
  :func:`.powers.lifts`), and writes ``dx`` and, with ``with_dp``, each plane's ``p`` term in
  the same pass.
* ``gem_window_*`` pool sliding windows on 5-d ``(N, C, D, H, W)`` views of any strides,
  through the plan's window ``table`` (forward, ``p`` terms) and ``cover`` tables (the
  backward gathers each input's windows in increasing output order: no races).
* ``gem_rows_*`` pool windows with no padding on NCHW planes or channels-last images
  as rows (their docstrings), and the backward only windows that do not overlap, with
  the ``gem_window_*`` kernels' bits; 2x2 windows take :mod:`.power_quads`'s forward,
  with the same bits.

With ``eps`` None, the window and rows kernels pool Lp norms instead (:mod:`.powers`).
They sum each window in tap order (row-major), unscaled, and again relative to its
largest ``z`` only where that sum left the range, as the planes do. The root
``mean^(1/p)`` is :func:`.powers.root`'s.
"""

import numpy as np
from numba import prange, uint64

from . import jit, parallel_kernel
from .powers import (
    UNSCALED,
    add_terms,
    clamped,
    divisor,
    in_range,
    lifts,
    natural_log,
    p_term,
    passes,
    plane_relifted,
    raised,
    raised_less_one,
    raised_row,
    real_power,
    relative_mean,
    relative_scale,
    root,
    rows_relifted,
    rows_rescaled,
    scaled,
    sign_of,
    tap_dx,
    write_terms,
)
from .walk import (
    copy_row,
    gather_tap,
    inlined,
    row_index,
    rows_task,
    scatter_tap,
    window_range,
)

LANES = 32  # the partial sums of a whole plane (a power of 2)
# ----------------------------------------------------------------------- whole planes


@inlined
def _halved(acc):
    """The lanes' total: lane ``k`` += lane ``k + h`` for ``h = LANES/2, ..., 1``."""
    half = LANES // 2
    while half >= 1:
        for k in range(half):
            acc[uint64(k)] += acc[uint64(k + half)]
        half //= 2
    return acc[0]


@inlined
def _plane_sum(row, eps, scale, p, whole, acc):
    """``sum (max(row, eps) * scale)^p`` over a contiguous plane, in the lanes of
    ``acc`` (the module docstring's order); ``scale`` as :func:`.powers.scaled`
    takes it."""
    length = row.shape[0]
    for k in range(LANES):  # a loop: a slice assignment is slower outside a prange
        acc[k] = 0.0
    full = length - length % LANES
    for start in range(0, full, LANES):
        for k in range(LANES):
            z = scaled(clamped(np.float64(row[uint64(start + k)]), eps), scale)
            acc[uint64(k)] += raised(z, p, whole)
    for k in range(length - full):
        z = scaled(clamped(np.float64(row[uint64(full + k)]), eps), scale)
        acc[uint64(k)] += raised(z, p, whole)
    return _halved(acc)


@inlined
def _largest(row, eps):
    largest = eps
    for i in range(row.shape[0]):
        z = np.float64(row[i])
        largest = z if z > largest else largest
    return largest


@parallel_kernel
def gem_global_forward_planes(x, eps, p, whole, y, copy):
    """``copy`` (or an empty array: no copy) gets each plane once it is summed, still in
    cache (a copy of x for a pullback). Empty, not None: one compiled kernel serves
    both calls."""
    n_batch, n_chan, length = x.shape
    for plane in prange(n_batch * n_chan):
        # the body as a call (index cast: one signature): Numba's parallel passes copy
        # a body over and over, and inlined, this one doubled the compile time
        _gem_global_forward_planes_plane(x, eps, p, whole, y, copy, n_chan, length,
                                         np.int64(plane))


@jit()
def _gem_global_forward_planes_plane(x, eps, p, whole, y, copy, n_chan, length, plane):
    """One ``plane`` of :func:`gem_global_forward_planes` (its parallel loop's body)."""
    n, c = plane // n_chan, plane % n_chan
    acc = np.empty(LANES, np.float64)
    total = _plane_sum(x[n, c], eps, UNSCALED, p, whole, acc)
    if copy.size != 0:
        copy_row(x[n, c], copy[n, c])
    if in_range(total):
        y[n, c] = root(total / length, p, whole, y.itemsize == 8)
    else:
        largest = _largest(x[n, c], eps)
        total = _plane_sum(x[n, c], eps, relative_scale(largest), p, whole, acc)
        y[n, c] = relative_mean(largest, total, length, p, whole, y.itemsize == 8)


@parallel_kernel
def gem_global_forward_channels_last(x, eps, p, whole, y, copy):
    """``x`` the ``(N, L, C)`` view of a channels-last array; ``copy`` (stored as
    ``x``, or an empty array: no copy, one compiled kernel for both calls) gets each
    position's channels once they are summed."""
    n_batch, length, n_chan = x.shape
    for n in prange(n_batch):  # the body as a call, as in gem_global_forward_planes
        _gem_global_forward_channels_last_n(x, eps, p, whole, y, copy, length, n_chan,
                                            np.int64(n))


@jit()
def _gem_global_forward_channels_last_n(x, eps, p, whole, y, copy, length, n_chan, n):
    """One ``n`` of :func:`gem_global_forward_channels_last` (its parallel loop's body)."""
    acc = np.zeros((LANES, n_chan), np.float64)
    for i in range(length):
        lane, row = acc[i % LANES], x[n, i]
        for c in range(n_chan):
            z = clamped(np.float64(row[uint64(c)]), eps)
            lane[uint64(c)] += raised(z, p, whole)
        if copy.size != 0:
            copy_row(row, copy[n, i])
    lanes = np.empty(LANES, np.float64)
    for c in range(n_chan):
        for k in range(LANES):
            lanes[k] = acc[k, c]
        total = _halved(lanes)
        if in_range(total):
            y[n, c] = root(total / length, p, whole, y.itemsize == 8)
            continue
        column = np.ascontiguousarray(x[n, :, c])
        largest = _largest(column, eps)
        total = _plane_sum(column, eps, relative_scale(largest), p, whole, lanes)
        y[n, c] = relative_mean(largest, total, length, p, whole, y.itemsize == 8)


@inlined
def _tap_backward(v, eps, inverse, scale, p, whole, zero):
    """One tap's ``dx`` and ``r^p`` (the module docstring's)."""
    r = clamped(v, eps) * inverse
    share = raised_less_one(r, p, whole)
    return _plane_dx(v, eps, scale, share, zero), share * r, r


@inlined
def _plane_dx(v, eps, scale, share, zero):
    """A plane's tap's ``dx`` from ``dy / L`` and ``r^(p-1)``; ``zero`` under the clamp."""
    return scale * share if v >= eps else zero


@inlined
def _plane_backward(row, dx, grad, mean, length, eps, p, whole, with_dp):
    """``dx`` of one contiguous plane, and its ``p`` term (0 without ``with_dp``), whose
    sums run in lanes as the forward's do."""
    scale, inverse = grad / length, 1.0 / mean
    zero = np.zeros(1, dx.dtype)[0]
    if not with_dp:
        for i in range(length):
            at = uint64(i)
            dx[at] = _tap_backward(np.float64(row[at]), eps, inverse, scale, p, whole,
                                   zero)[0]
        return 0.0
    s0, s1 = np.zeros(LANES, np.float64), np.zeros(LANES, np.float64)
    full = length - length % LANES
    for start in range(0, length, LANES):  # blocks of LANES taps, then the rest
        for k in range(LANES if start < full else length - full):
            at, lane = uint64(start + k), uint64(k)
            dx[at], power, r = _tap_backward(np.float64(row[at]), eps, inverse, scale, p,
                                             whole, zero)
            s0[lane] += power
            s1[lane] += power * natural_log(r, whole)
    return p_term(grad, mean, p, _halved(s0), _halved(s1))


@parallel_kernel
def gem_global_backward_planes(x, y, dy, eps, p, whole, with_dp, dx, terms):
    n_batch, n_chan, length = x.shape
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        mean, grad = np.float64(y[n, c]), np.float64(dy[n, c])
        terms[n, c] = (plane_relifted(x[n, c], dx[n, c], grad, mean, eps, p, whole, with_dp)
                       if lifts(y[n, c]) else _plane_backward(x[n, c], dx[n, c], grad, mean,
                                                           length, eps, p, whole, with_dp))


@parallel_kernel
def gem_global_backward_channels_last(x, y, dy, eps, p, whole, with_dp, dx, terms):
    """``x`` and ``dx`` the ``(N, L, C)`` views of channels-last arrays."""
    n_batch, length, n_chan = x.shape
    zero = np.zeros(1, dx.dtype)[0]
    for n in prange(n_batch):
        # each channel's 1/y and dy / L, read and divided once, not at every position
        inverse = np.empty(n_chan, np.float64)
        scale = np.empty(n_chan, np.float64)
        for c in range(n_chan):
            inverse[c] = 1.0 / np.float64(y[n, c])
            scale[c] = np.float64(dy[n, c]) / length
        s0, s1 = np.zeros(n_chan, np.float64), np.zeros(n_chan, np.float64)
        shares, real = np.empty(n_chan, np.float64), real_power(whole)  # as _tap_gradients
        for i in range(length):
            row, out = x[n, i], dx[n, i]
            for c in range(n_chan):
                at = uint64(c)
                v = np.float64(row[at])
                r = clamped(v, eps) * inverse[at]
                share = raised_less_one(r, p, whole)
                if real:
                    shares[at] = share
                else:
                    out[at] = _plane_dx(v, eps, scale[at], share, zero)
                if with_dp:
                    power = share * r
                    s0[at] += power
                    s1[at] += power * natural_log(r, whole)
            for c in range(n_chan if real else 0):
                at = uint64(c)
                out[at] = _plane_dx(np.float64(row[at]), eps, scale[at], shares[at], zero)
        for c in range(n_chan):
            mean, grad = np.float64(y[n, c]), np.float64(dy[n, c])
            terms[n, c] = (plane_relifted(x[n, :, c], dx[n, :, c], grad, mean, eps, p, whole,
                                          with_dp) if lifts(y[n, c])
                           else p_term(grad, mean, p, s0[c], s1[c]) if with_dp else 0.0)


# ------------------------------------------------------------------- sliding windows


@inlined
def _window_mean(total, count, p, whole, precise, x, n, c, d0, d1, h0, h1, w0, w1, eps):
    """A window's power mean from its unscaled sum, or, where that sum left the range,
    summed again relative to the window's largest ``z`` (tap order, from x)."""
    if in_range(total):
        return root(total / divisor(count, eps), p, whole, precise)
    largest = 0.0
    for xd in range(d0, d1):
        for xh in range(h0, h1):
            for xw in range(w0, w1):
                z = clamped(np.float64(x[n, c, xd, xh, xw]), eps)
                largest = z if z > largest else largest
    scale = relative_scale(largest)
    total = 0.0
    for xd in range(d0, d1):
        for xh in range(h0, h1):
            for xw in range(w0, w1):
                total += raised(scaled(clamped(np.float64(x[n, c, xd, xh, xw]), eps), scale),
                                p, whole)
    return relative_mean(largest, total, divisor(count, eps), p, whole, precise)


@parallel_kernel
def gem_window_forward(x, table, eps, p, whole, y):
    n_chan = x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(y.shape[0] * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        for ow in range(out_w):
            d0, d1, h0, h1, w0, w1 = window_range(table, od, oh, ow)
            total = 0.0
            for xd in range(d0, d1):
                for xh in range(h0, h1):
                    for xw in range(w0, w1):
                        total += raised(clamped(np.float64(x[n, c, xd, xh, xw]), eps), p,
                                         whole)
            count = (d1 - d0) * (h1 - h0) * (w1 - w0)
            y[n, c, od, oh, ow] = _window_mean(total, count, p, whole, y.itemsize == 8, x, n,
                                               c, d0, d1, h0, h1, w0, w1, eps)


@parallel_kernel
def gem_window_p_terms(x, y, dy, table, eps, p, whole, terms):
    """Each window's term of ``dp`` (the module docstring), into ``terms`` (``y``'s
    shape)."""
    n_chan = x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(y.shape[0] * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        for ow in range(out_w):
            d0, d1, h0, h1, w0, w1 = window_range(table, od, oh, ow)
            mean = np.float64(y[n, c, od, oh, ow])
            relative = relative_scale(mean)
            s0, s1 = 0.0, 0.0
            for xd in range(d0, d1):
                for xh in range(h0, h1):
                    for xw in range(w0, w1):
                        r = scaled(clamped(np.float64(x[n, c, xd, xh, xw]), eps), relative)
                        power = raised_less_one(r, p, whole) * r  # add_terms' r^p
                        s0 += power
                        s1 += power * natural_log(r, whole)
            terms[n, c, od, oh, ow] = p_term(np.float64(dy[n, c, od, oh, ow]), mean, p, s0, s1)


@parallel_kernel
def gem_window_backward(x, y, dy, table, eps, p, whole, cover_ptr, cover_out, dx):
    n_chan = x.shape[1]
    in_d, in_h, in_w = dx.shape[2], dx.shape[3], dx.shape[4]
    zero = np.zeros(1, dx.dtype)[0]
    for row in prange(dx.shape[0] * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            v = np.float64(x[n, c, i_d, ih, iw])
            if not passes(v, eps):  # GeM's NaN too: the clamp's comparison is false
                dx[n, c, i_d, ih, iw] = zero
                continue
            total = 0.0
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                count_d = table[0, 2, od] - table[0, 1, od]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    count_h = count_d * (table[1, 2, oh] - table[1, 1, oh])
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        count = count_h * (table[2, 2, ow] - table[2, 1, ow])
                        r = scaled(clamped(v, eps),
                                   relative_scale(np.float64(y[n, c, od, oh, ow])))
                        total += np.float64(dy[n, c, od, oh, ow]) / divisor(
                            count, eps) * raised_less_one(r, p, whole)
            dx[n, c, i_d, ih, iw] = total * sign_of(v, eps)


# ------------------------------------------------------------- sliding windows, rows


@inlined
def _add_tap(powered, start, step, inner, acc):
    """``acc[o] += powered[(start + ow * step) * inner + c]``, the tap at ``start`` of
    every window ``ow`` of a row, for ``o = ow * inner + c``."""
    if inner == 1:
        for ow in range(acc.shape[0]):
            acc[uint64(ow)] += powered[uint64(start + ow * step)]
        return
    for ow in range(acc.shape[0] // inner):
        base, out = (start + ow * step) * inner, ow * inner
        for c in range(inner):
            acc[uint64(out + c)] += powered[uint64(base + c)]


@inlined
def _roots(sums, out, count, eps, p, whole, precise):
    """``out[o]``, the power mean of the window whose sum is ``sums[o]``; returns how
    many sums left the range: a count, which the loop vectorizes (a branch per window
    kept it scalar)."""
    outside = 0
    for o in range(out.shape[0]):
        at = uint64(o)
        out[at] = root(sums[at] / divisor(count, eps), p, whole, precise)
        outside += 0 if in_range(sums[at]) else 1
    return outside


@parallel_kernel
def gem_rows_forward(x, inner, window, steps, chunks, tasks, eps, p, whole, y):
    """GeM over windows with no padding on contiguous rows: ``x`` ``(P, D, H, W * inner)``
    (NCHW planes with ``inner`` 1, or channels-last images with ``inner`` C), ``y``
    likewise; ``window`` and ``steps`` the ``(D, H, W)`` kernel and stride. Each tap
    row is raised to ``p`` once, contiguously, and the windows of an output row are
    summed together from it, tap by tap in tap order, so each window's sum is
    :func:`gem_window_forward`'s, with its bits."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    count, precise = window[0] * window[1] * window[2], y.itemsize == 8
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        acc = np.empty(out_l, np.float64)
        powered = np.empty(x.shape[3], np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            acc[:] = 0.0
            for a in range(window[0]):
                for b in range(window[1]):
                    raised_row(x[plane, od * steps[0] + a, oh * steps[1] + b], eps, p,
                               whole, powered)
                    for t in range(window[2]):
                        _add_tap(powered, t, steps[2], inner, acc)
            out = y[plane, od, oh]
            for o in range(out_l if _roots(acc, out, count, eps, p, whole, precise) else 0):
                if not in_range(acc[o]):  # rare: redo the window relative to its maximum
                    ow, c = o // inner, o % inner
                    out[o] = rows_rescaled(x, plane, c, inner, od, oh, ow, window, steps,
                                           count, eps, p, whole, precise)


@inlined
def _row_factors(y, dy, count, inverse, scale):
    """Per window of an output row: ``1/y`` and, unless ``scale`` is None, ``dy /
    count``; whether any window :func:`.powers.lifts` (:func:`_relift_row`)."""
    lifted = False
    for o in range(y.shape[0]):
        at = uint64(o)
        inverse[at] = 1.0 / np.float64(y[at])
        if scale is not None:
            scale[at] = np.float64(dy[at]) / count
        lifted |= lifts(y[at])
    return lifted


@inlined
def _relift_row(x, y, dy, dx, plane, od, oh, inner, window, steps, count, eps, p, whole,
                s0, s1):
    """The windows of a row whose ``y`` lifts, redone (:func:`.powers.rows_relifted`)."""
    means, grads = y[plane, od, oh], dy[plane, od, oh]
    for o in range(means.shape[0]):
        if lifts(means[o]):
            s0[o], s1[o] = rows_relifted(x, dx, plane, o % inner, inner, od, oh, o // inner,
                                         window, steps, np.float64(means[o]),
                                         np.float64(grads[o]), count, eps, p, whole)


@inlined
def _tap_gradients(src, out, start, step, inner, eps, p, whole, inverse, scale, gathered,
                   shares, s0, s1, terms):
    """``dx`` at the tap ``start + ow * step`` of every window of a row (laid out as in
    :func:`_add_tap`) from each window's ``1/y`` and ``dy / count``, and unless ``terms``
    is None the tap's share of ``S0`` and ``S1``, as :func:`_tap_terms` adds it.

    A real ``p`` raises every tap into ``shares``, then makes the clamp's choice in a
    second loop: in one, the compiler raised only the taps that pass, a branch per tap
    that random data mispredicts (2.8x as long, CHANGELOG). A whole ``p`` keeps one."""
    real = real_power(whole)
    if inner == 1:  # gathered and scattered apart from the arithmetic, which vectorizes
        gather_tap(src, start, step, inner, gathered)
        for o in range(gathered.shape[0]):
            at = uint64(o)
            v = gathered[at]
            r = clamped(v, eps) * inverse[at]
            share = raised_less_one(r, p, whole)
            if terms is not None:
                add_terms(r, share, whole, s0, s1, at)
            if real:
                shares[at] = share
            else:
                gathered[at] = tap_dx(v, eps, scale[at], share)
        for o in range(gathered.shape[0] if real else 0):
            at = uint64(o)
            gathered[at] = tap_dx(gathered[at], eps, scale[at], shares[at])
        scatter_tap(gathered, start, step, inner, out)
        return
    for ow in range(inverse.shape[0] // inner):  # channels innermost: contiguous already
        base, first = (start + ow * step) * inner, ow * inner
        for c in range(inner):
            at, o = uint64(base + c), uint64(first + c)
            v = np.float64(src[at])
            r = clamped(v, eps) * inverse[o]
            share = raised_less_one(r, p, whole)
            if terms is not None:
                add_terms(r, share, whole, s0, s1, o)
            if real:
                shares[o] = share
            else:
                out[at] = tap_dx(v, eps, scale[o], share)
        for c in range(inner if real else 0):
            at, o = uint64(base + c), uint64(first + c)
            out[at] = tap_dx(np.float64(src[at]), eps, scale[o], shares[o])


@inlined
def _tap_terms(src, start, step, inner, eps, p, whole, inverse, s0, s1, gathered):
    """``S0`` and ``S1`` of ``dp``'s terms, the tap ``start + ow * step`` of every window
    of a row added (laid out as in :func:`_add_tap`)."""
    gather_tap(src, start, step, inner, gathered)  # so the logarithms run contiguously
    for o in range(gathered.shape[0]):
        at = uint64(o)
        r = clamped(gathered[at], eps) * inverse[at]
        add_terms(r, raised_less_one(r, p, whole), whole, s0, s1, at)


@parallel_kernel
def gem_rows_backward(x, y, dy, inner, window, steps, chunks, tasks, eps, p, whole, dx,
                      terms):
    """``dx`` for windows that do not overlap (stride >= kernel), as
    :func:`gem_rows_forward` lays out rows: each tap of each window written once, with
    :func:`gem_window_backward`'s bits. Inputs no window reads are left as they are (the
    caller zeroes them). Unless ``terms`` is None, each window's term of ``dp`` too, in
    the same pass, with :func:`gem_rows_p_terms`' bits (a tap's log taken once)."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    count = window[0] * window[1] * window[2]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        inverse, scale = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        gathered, shares = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        s0, s1 = np.zeros(out_l, np.float64), np.zeros(out_l, np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            lifted = _row_factors(y[plane, od, oh], dy[plane, od, oh], divisor(count, eps),
                                  inverse, scale)
            for a in range(window[0]):
                for b in range(window[1]):
                    src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                    out = dx[plane, od * steps[0] + a, oh * steps[1] + b]
                    for t in range(window[2]):
                        _tap_gradients(src, out, t, steps[2], inner, eps, p, whole, inverse,
                                       scale, gathered, shares, s0, s1, terms)
            if lifted:
                _relift_row(x, y, dy, dx, plane, od, oh, inner, window, steps, count, eps, p,
                            whole, s0, s1)
            if terms is not None:
                write_terms(y[plane, od, oh], dy[plane, od, oh], p, s0, s1,
                            terms[plane, od, oh])


@parallel_kernel
def gem_rows_p_terms(x, y, dy, inner, window, steps, chunks, tasks, eps, p, whole, terms):
    """Each window's term of ``dp``, with :func:`gem_window_p_terms`' bits, rows laid out
    as :func:`gem_rows_forward`'s."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    count = window[0] * window[1] * window[2]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        inverse, gathered = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        s0, s1 = np.zeros(out_l, np.float64), np.zeros(out_l, np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            means, grads = y[plane, od, oh], dy[plane, od, oh]
            lifted = _row_factors(means, grads, 1.0, inverse, None)
            for a in range(window[0]):
                for b in range(window[1]):
                    src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                    for t in range(window[2]):
                        _tap_terms(src, t, steps[2], inner, eps, p, whole, inverse, s0, s1,
                                   gathered)
            if lifted:
                _relift_row(x, y, dy, None, plane, od, oh, inner, window, steps, count, eps,
                            p, whole, s0, s1)
            write_terms(means, grads, p, s0, s1, terms[plane, od, oh])


@parallel_kernel
def plane_totals(terms, totals):
    """Each ``(n, c)`` plane's sum of ``terms`` (5-d ``(N, C, D, H, W)``, any strides:
    the windows' ``dp`` terms, stored as ``y`` is) into ``totals`` ``(N, C)``, from +0
    in ``(d, h, w)`` order: the same bits in either layout and at any thread count, with
    no C-ordered copy of the terms (a channels-last layer's copy cost 6 ms)."""
    n_chan = terms.shape[1]
    for plane in prange(terms.shape[0] * n_chan):
        n, c = plane // n_chan, plane % n_chan
        total = 0.0
        for d in range(terms.shape[2]):
            for h in range(terms.shape[3]):
                for w in range(terms.shape[4]):
                    total += terms[n, c, d, h, w]
        totals[n, c] = total
