"""Blends of a window's maximum and mean: mixed pooling (a fixed or learned ``alpha``)
and gated pooling (a blend set per window by a learned gate), Lee, Gallagher & Tu,
AISTATS 2016.

Over a window of ``K`` tap positions (padding included), with ``M`` the maximum of its
real taps (the first NaN if any, else the first largest: max pooling's winner),
``A = sum x / K`` (padding adds 0, PyTorch's ``count_include_pad``) and ``s`` the
share of the maximum:

* ``MIXED``: ``s = weights[0]`` (``alpha``, any finite number);
* ``GATED``: ``s = sigmoid(z)``, ``z = sum_t weights[t] x_t`` over the real taps, the
  gate's weights in row-major tap order (padding adds 0);

``y = s M + (1 - s) A``. The backward sends ``s dy`` to the winner, ``(1 - s) dy / K``
to every real tap and, gated, ``dz weights[t]`` to tap ``t``, with
``dz = dy (M - A) s (1 - s)``; the weights' gradient is ``sum dy (M - A)`` (mixed) or
``sum dz x_t`` per tap (gated). The backwards write it as partial sums, one row per
parallel unit of work, that the caller adds in order: the same bits at any thread
count.

The forwards compute in the dtype of ``y`` (the compute dtype: x's, float16's in
float32), as the core's average pooling does: ``M``, the sum, the logit, the gate's
sigmoid ``s`` and ``1 - s`` in it (float32's ``exp`` within an ulp), mixed pooling's
``s`` and ``1 - s`` taken in float64 and each rounded to it once. They take ``M`` by
:func:`~poolgrad.kernels.larger`, with no test for NaN: a NaN tap makes the sum, and
with it ``y``, NaN (``(1 - s) A`` is NaN even where ``s`` is 1, and a NaN logit makes
``s`` NaN), and the plain compare saves two compares and two mask steps per tap. The
backwards run in float64 whatever the dtype, so that the weights' gradient, a sum over
every window, keeps its digits. Sums run in row-major tap order from the first real tap.

``blend_window_*`` take 5-d ``(N, C, D, H, W)`` arrays of any strides and the plan's
window ``table``; the backward walks each ``(n, c)`` plane's windows in increasing
output order and adds into that plane's ``dx`` (no races). ``blend_rows_*`` serve
windows with no padding on NCHW planes or channels-last images as rows (the backward
only windows that do not overlap), and :func:`blend_quads_forward` 2x2 windows with no
padding, all four taps in one loop: the same bits as the window kernels.
"""

import numpy as np
from numba import prange, uint64

from . import elementary, larger, parallel_kernel
from .walk import gather_tap, inlined, quad_rows, row_index, row_windows, rows_task, scatter_tap

MIXED, GATED = 0, 1


@inlined
def _share(logit, weights, kind):
    """``s``, the maximum's share of the blend (float64)."""
    if kind == MIXED:
        return weights[0]
    return 1.0 / (1.0 + elementary.exp(-logit))


@inlined
def _shares(logit, weights, kind, real):
    """``(s, 1 - s)`` in the forward's dtype ``real``: mixed pooling's ``alpha`` and
    ``1 - alpha`` taken in float64 and rounded; the gate's sigmoid computed in ``real``
    (in float32 with :func:`~.elementary.exp32`, within an ulp of the exact ``exp``)."""
    if kind == MIXED:
        share = weights[0]
        return real(share), real(1.0 - share)
    one = real(1.0)
    share = one / (one + elementary.exp_in(-real(logit)))
    return share, one - share


@inlined
def _blend(largest, total, logit, weights, kind, count, out):
    """``s M + (1 - s) A`` in the forward's dtype (that of ``out``, an array)."""
    real = out.dtype.type
    share, rest = _shares(logit, weights, kind, real)
    return share * largest + rest * (total / real(count))


@inlined
def _fold(largest, winner, v, t):
    """One max step with max pooling's rule: the first NaN wins, else the first
    largest."""
    wins = (v > largest) | ((v != v) & (largest == largest))
    return (v if wins else largest), (t if wins else winner)


@inlined
def _coefficients(largest, total, logit, dy, count, weights, kind):
    """``(route, spread, dz, term)``: what the winner gets, what every real tap gets,
    the gate's gradient ``dz`` (0 mixed) and the window's term of ``dalpha`` (0
    gated), all float64."""
    share = _share(logit, weights, kind)
    mean = total / count
    route = share * dy
    spread = (1.0 - share) * dy / count
    if kind == MIXED:
        return route, spread, 0.0, dy * (largest - mean)
    return route, spread, dy * (largest - mean) * share * (1.0 - share), 0.0


@parallel_kernel(any_layout=True)
def blend_window_forward(x, table, extent, count, kind, weights, y):
    """``y``: each window's blend (the module docstring); ``extent`` the window's
    ``(D, H, W)`` extent, ``count`` its ``K``, ``weights`` float64 (``alpha`` alone, or
    the gate's weights in row-major tap order)."""
    real = y.dtype.type
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            largest = real(x[n, c, start_d + first_d, start_h + first_h, start_w + first_w])
            total, logit = real(0.0), real(0.0)
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    for jw in range(first_w, end_w):
                        v = real(x[n, c, start_d + jd, start_h + jh, start_w + jw])
                        largest = larger(v, largest)
                        total += v
                        if kind == GATED:
                            logit += real(weights[(jd * extent[1] + jh) * extent[2] + jw]) * v
            y[n, c, od, oh, ow] = _blend(largest, total, logit, weights, kind, count, y)


@parallel_kernel(any_layout=True)
def blend_window_backward(x, dy, table, extent, count, kind, weights, dx, partials):
    """``dx`` (every element written) and ``partials[n * C + c]``: plane ``(n, c)``'s
    part of the weights' gradient (the module docstring), ``weights.size`` entries
    gated, one mixed."""
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = dy.shape[2], dy.shape[3], dy.shape[4]
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        dx[n, c] = 0
        part = partials[plane]
        part[:] = 0.0
        for od in range(out_d):
            for oh in range(out_h):
                start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
                for ow in range(out_w):
                    start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
                    largest = np.float64(x[n, c, start_d + first_d, start_h + first_h,
                                           start_w + first_w])
                    winner = (first_d * extent[1] + first_h) * extent[2] + first_w
                    total, logit = 0.0, 0.0
                    for jd in range(first_d, end_d):
                        for jh in range(first_h, end_h):
                            for jw in range(first_w, end_w):
                                v = np.float64(x[n, c, start_d + jd, start_h + jh,
                                                 start_w + jw])
                                t = (jd * extent[1] + jh) * extent[2] + jw
                                largest, winner = _fold(largest, winner, v, t)
                                total += v
                                if kind == GATED:
                                    logit += weights[t] * v
                    route, spread, dz, term = _coefficients(
                        largest, total, logit, np.float64(dy[n, c, od, oh, ow]), count,
                        weights, kind)
                    part[0] += term
                    for jd in range(first_d, end_d):
                        for jh in range(first_h, end_h):
                            for jw in range(first_w, end_w):
                                t = (jd * extent[1] + jh) * extent[2] + jw
                                share = spread + (route if t == winner else 0.0)
                                at = (n, c, start_d + jd, start_h + jh, start_w + jw)
                                if kind == GATED:
                                    share += dz * weights[t]
                                    part[t] += dz * np.float64(x[at])
                                dx[at] += share


@inlined
def _lane_dot(a, b):
    """``sum a * b`` in a fixed order that vectorizes: eight running sums, sum ``k``
    taking the terms ``i = k (mod 8)`` in increasing ``i``, then added in order, then
    the tail."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n = a.shape[0]
    full = n - n % 8
    for i in range(0, full, 8):
        at = uint64(i)
        s0 += a[at] * b[at]
        s1 += a[at + 1] * b[at + 1]
        s2 += a[at + 2] * b[at + 2]
        s3 += a[at + 3] * b[at + 3]
        s4 += a[at + 4] * b[at + 4]
        s5 += a[at + 5] * b[at + 5]
        s6 += a[at + 6] * b[at + 6]
        s7 += a[at + 7] * b[at + 7]
    total = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    for i in range(full, n):
        total += a[i] * b[i]
    return total


@inlined
def _window_stats(x, plane, od, oh, inner, window, steps, weights, kind, record, taps,
                  largest, winner, total, logit):
    """The running maximum, the sum, the gate's logit (gated) and, with ``record``, the
    maximum's tap of every window of output row ``(od, oh)``, tap by tap in tap order
    over contiguous buffers."""
    t = 0
    for a in range(window[0]):
        for b in range(window[1]):
            src = x[plane, od * steps[0] + a, oh * steps[1] + b]
            for e in range(window[2]):
                gather_tap(src, e, steps[2], inner, taps)
                g = taps.dtype.type(weights[t] if kind == GATED else 0.0)
                if t == 0:
                    for o in range(taps.shape[0]):
                        at = uint64(o)
                        v = taps[at]
                        largest[at], winner[at], total[at], logit[at] = v, 0.0, v, g * v
                else:
                    here = np.float64(t)
                    for o in range(taps.shape[0]):
                        at = uint64(o)
                        v = taps[at]
                        if record:
                            largest[at], winner[at] = _fold(largest[at], winner[at], v, here)
                        else:
                            largest[at] = larger(v, largest[at])
                        total[at] += v
                        if kind == GATED:
                            logit[at] += g * v
                t += 1


@parallel_kernel
def blend_rows_forward(x, inner, window, steps, chunks, tasks, count, kind, weights, y):
    """The forward on rows ``(P, D, H, W * inner)`` (NCHW planes with ``inner`` 1, or
    channels-last images with ``inner`` C; ``window`` and ``steps`` the ``(D, H, W)``
    kernel and stride, no padding), with :func:`blend_window_forward`'s bits."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps, largest = np.empty(out_l, y.dtype), np.empty(out_l, y.dtype)
        winner, total = np.empty(out_l, np.float64), np.empty(out_l, y.dtype)
        logit = np.empty(out_l, y.dtype)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            _window_stats(x, plane, od, oh, inner, window, steps, weights, kind, False, taps,
                          largest, winner, total, logit)
            out = y[plane, od, oh]
            for o in range(out_l):
                at = uint64(o)
                out[at] = _blend(largest[at], total[at], logit[at], weights, kind, count, y)


@inlined
def _quad(top, bottom, i, j, gate, mixed, divisor, gated, real):
    """The blend of the window whose taps are ``top[i], top[j], bottom[i], bottom[j]``
    (row-major order) in the dtype ``real``, as :func:`_blend` gives it: ``gate`` the
    gate's weights and ``mixed`` ``(s, 1 - s)`` of mixed pooling, both in it."""
    v0, v1, v2, v3 = real(top[i]), real(top[j]), real(bottom[i]), real(bottom[j])
    largest = larger(v3, larger(v2, larger(v1, v0)))
    share, rest = mixed
    if gated:
        logit = ((gate[0] * v0 + gate[1] * v1) + gate[2] * v2) + gate[3] * v3
        share, rest = _shares(logit, gate, GATED, real)
    return share * largest + rest * ((((v0 + v1) + v2) + v3) / divisor)


@inlined
def _quads_row(top, bottom, out, inner, steps, gate, mixed, divisor, gated, real):
    """One output row of :func:`blend_quads_forward`; ``gated`` a literal, so that each
    call compiles a loop with no branch on the kind."""
    if inner == 1:  # NCHW, at stride 2 (the rule's): interleaved loads
        for ow in range(out.shape[0]):
            i = uint64(2 * ow)
            out[uint64(ow)] = _quad(top, bottom, i, i + 1, gate, mixed, divisor, gated, real)
        return
    step, across = uint64(steps[2] * inner), uint64(inner)
    for ow in range(out.shape[0] // inner):
        base, at = uint64(ow) * step, uint64(ow) * across
        for c in range(inner):
            i = base + uint64(c)
            out[at + uint64(c)] = _quad(top, bottom, i, i + across, gate, mixed, divisor,
                                        gated, real)


@parallel_kernel
def blend_quads_forward(x, inner, window, steps, chunks, tasks, count, kind, weights, y):
    """The forward of 2x2 windows (``window`` ``(1, 2, 2)``, no padding; NCHW ones at
    stride 2 along W), with :func:`blend_rows_forward`'s arguments, rows and bits: each
    output's four taps loaded and folded in one loop over the row, vectorized along it
    (NCHW: pairs of neighbours; channels-last: along C), with no buffer."""
    real = y.dtype.type
    out_d, out_h = y.shape[1], y.shape[2]
    # copies held in registers: loads from the arguments inside the loops could alias
    # the stores to y, and kept them scalar
    g0, g1, g2, g3 = real(0.0), real(0.0), real(0.0), real(0.0)
    if kind == GATED:
        g0, g1, g2, g3 = real(weights[0]), real(weights[1]), real(weights[2]), real(weights[3])
    gate = (g0, g1, g2, g3)
    mixed = _shares(0.0, weights, MIXED, real)
    divisor = real(count)
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        for row in range(first, end):
            od, oh, top, bottom = quad_rows(x, plane, row, out_h, steps)
            if kind == GATED:
                _quads_row(top, bottom, y[plane, od, oh], inner, steps, gate, mixed, divisor,
                           True, real)
            else:
                _quads_row(top, bottom, y[plane, od, oh], inner, steps, gate, mixed, divisor,
                           False, real)


@parallel_kernel
def blend_rows_backward(x, dy, inner, window, steps, chunks, tasks, count, kind, weights,
                        dx, partials):
    """``dx`` for windows that do not overlap, rows laid out as
    :func:`blend_rows_forward`'s (inputs no window reads are left as they are: the
    caller zeroes them), and ``partials[plane * out_d * out_h + row]``: each output
    row's part of the weights' gradient, with :func:`blend_window_backward`'s values."""
    out_d, out_h, out_l = dy.shape[1], dy.shape[2], dy.shape[3]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps, largest = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        winner, total = np.empty(out_l, np.float64), np.empty(out_l, np.float64)
        logit, ones = np.empty(out_l, np.float64), np.ones(out_l, np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            _window_stats(x, plane, od, oh, inner, window, steps, weights, kind, True, taps,
                          largest, winner, total, logit)
            part = partials[(plane * out_d + od) * out_h + oh]
            grads = dy[plane, od, oh]
            # the buffers now hold each window's route, spread, dz and term of dalpha
            for o in range(out_l):
                at = uint64(o)
                largest[at], total[at], logit[at], taps[at] = _coefficients(
                    largest[at], total[at], logit[at], np.float64(grads[at]), count, weights,
                    kind)
            if kind == MIXED:
                part[0] = _lane_dot(taps, ones)
            t = 0
            for a in range(window[0]):
                for b in range(window[1]):
                    src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                    dst = dx[plane, od * steps[0] + a, oh * steps[1] + b]
                    for e in range(window[2]):
                        g = weights[t] if kind == GATED else 0.0
                        if kind == GATED:
                            gather_tap(src, e, steps[2], inner, taps)
                            part[t] = _lane_dot(logit, taps)
                        here = np.float64(t)
                        for o in range(out_l):
                            at = uint64(o)
                            taps[at] = total[at] + (largest[at] if winner[at] == here
                                                    else 0.0) + logit[at] * g
                        scatter_tap(taps, e, steps[2], inner, dst)
                        t += 1
