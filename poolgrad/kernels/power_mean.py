"""Generalized-mean (GeM) pooling, fused: one pass over x forward, one backward.

With ``z = max(x, eps)`` (NaN stays NaN) and a window ``W`` of ``K`` real taps:

* forward: ``y = (sum_W z^p / K)^(1/p)``;
* backward: ``dx_j = sum over the windows reading j of dy * (z_j / y)^(p-1) / K``
  where ``x_j >= eps``, else 0 (the clamp passes no gradient, as PyTorch's);
* the gradient of ``p``, one term per window (their sum is ``dp``):
  ``dy * (y / p) * S1 / S0`` with ``r = z / y``, ``S0 = sum_W r^p`` and
  ``S1 = sum_W r^p log r``. Taken relative to ``y``, it has no cancellation, and the
  normalisation by ``S0`` (``K`` in exact arithmetic) makes it exact for the ``y`` that
  was stored, rounding and all.

Sums run in float64 whatever the dtype, in a fixed order: the same bits at any thread
count. A whole ``p`` up to 8 (3, GeM's usual start) is raised by multiplying, the
number of factors compiled in (:func:`power_form`); any other by ``exp`` and ``log``,
and ``dp``'s terms take ``log``, both from :mod:`.elementary`, so the loops vectorize.

Two families:

* ``gem_global_*`` pool whole planes, on ``(N, C, L)`` views (the spatial dims
  flattened). ``*_planes`` walks each ``(n, c)`` plane (contiguous in NCHW);
  ``*_channels_last`` takes the ``(N, L, C)`` view of a channels-last array (contiguous
  there) and keeps one accumulator per channel. A plane's ``sum z^p`` runs in
  :data:`LANES` partial sums, lane ``k`` adding the taps ``i = k mod LANES`` in
  increasing ``i``, the lanes then added by halving (lane ``k`` += lane ``k + h``, for
  ``h = LANES/2, ..., 1``): one order for both layouts, so they give the same bits.
  Where that sum overflows or falls below :data:`TINY` (terms may have underflowed),
  the plane is summed again as ``m^p sum (z/m)^p``, ``m`` its largest ``z``, so a large
  ``p`` neither overflows nor underflows. The backward multiplies by ``1/y`` rather
  than dividing, and writes ``dx`` and, with ``with_dp``, each plane's ``p`` term in
  the same pass.
* ``gem_window_*`` pool sliding windows on 5-d ``(N, C, D, H, W)`` views of any strides,
  through the plan's window ``table`` (forward, ``p`` terms) and ``cover`` tables (the
  backward gathers each input's windows in increasing output order: no races). They
  sum each window in tap order (row-major), scaled by the window's largest ``z``:
  ``y = m * (sum_W (z / m)^p / K)^(1/p)``.
"""

import numpy as np
from numba import prange, uint64

from . import constant, elementary, parallel_kernel
from .walk import inlined, row_index, window_range

MULTIPLIED_UP_TO = 8  # a whole power up to this is raised by multiplying
LANES = 32  # the partial sums of a whole plane (a power of 2)
TINY = 2.0 ** -960  # a plane's sum below this may have lost terms to underflow


@inlined
def _raised(base, p, whole):
    """``base ** p`` for ``base >= 0`` (or NaN): by ``whole.ndim`` multiplications when
    ``whole`` is a compile-time constant (:func:`power_form`), else (None) by
    :mod:`.elementary`'s ``exp`` and ``log``, which give 0 for 0 and NaN for NaN."""
    if whole is None:
        return elementary.exp(p * elementary.log(base))
    result = 1.0
    for _ in range(whole.ndim):
        result *= base
    return result


@inlined
def _raised_less_one(base, p, whole):
    """``base ** (p - 1)``, as :func:`_raised` raises."""
    if whole is None:
        return elementary.exp((p - 1.0) * elementary.log(base))
    result = 1.0
    for _ in range(whole.ndim - 1):
        result *= base
    return result


@inlined
def _clamped(v, eps):
    return eps if v < eps else v


@inlined
def _mean(largest, total, count, p):
    return largest * (total / count) ** (1.0 / p)


@inlined
def _p_term(dy, y, p, s0, s1):
    return dy * (y / p) * (s1 / s0)


def power_form(p: float):
    """The ``whole`` argument of the kernels for the power ``p``: a compile-time
    constant (:func:`poolgrad.kernels.constant`) of ``p`` when it is a whole number from
    1 to :data:`MULTIPLIED_UP_TO`, else None."""
    p = float(p)
    return constant(int(p)) if p.is_integer() and 1 <= p <= MULTIPLIED_UP_TO else None


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
    ``acc`` (the module docstring's order)."""
    length = row.shape[0]
    acc[:] = 0.0
    full = length - length % LANES
    for start in range(0, full, LANES):
        for k in range(LANES):
            z = _clamped(np.float64(row[uint64(start + k)]), eps) * scale
            acc[uint64(k)] += _raised(z, p, whole)
    for k in range(length - full):
        z = _clamped(np.float64(row[uint64(full + k)]), eps) * scale
        acc[uint64(k)] += _raised(z, p, whole)
    return _halved(acc)


@inlined
def _largest(row, eps):
    largest = eps
    for i in range(row.shape[0]):
        z = np.float64(row[i])
        largest = z if z > largest else largest
    return largest


@inlined
def _in_range(total):
    """Whether a plane's unscaled sum is exact enough to use (NaN passes: it is the
    answer)."""
    return not (total < TINY or total == np.inf)


@parallel_kernel
def gem_global_forward_planes(x, eps, p, whole, y):
    n_batch, n_chan, length = x.shape
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        acc = np.empty(LANES, np.float64)
        total = _plane_sum(x[n, c], eps, 1.0, p, whole, acc)
        if _in_range(total):
            y[n, c] = _mean(1.0, total, length, p)
        else:
            largest = _largest(x[n, c], eps)
            y[n, c] = _mean(largest, _plane_sum(x[n, c], eps, 1.0 / largest, p, whole, acc),
                            length, p)


@parallel_kernel
def gem_global_forward_channels_last(x, eps, p, whole, y):
    """``x`` the ``(N, L, C)`` view of a channels-last array."""
    n_batch, length, n_chan = x.shape
    for n in prange(n_batch):
        acc = np.zeros((LANES, n_chan), np.float64)
        for i in range(length):
            lane, row = acc[i % LANES], x[n, i]
            for c in range(n_chan):
                z = _clamped(np.float64(row[uint64(c)]), eps)
                lane[uint64(c)] += _raised(z, p, whole)
        lanes = np.empty(LANES, np.float64)
        for c in range(n_chan):
            lanes[:] = acc[:, c]
            total = _halved(lanes)
            if _in_range(total):
                y[n, c] = _mean(1.0, total, length, p)
                continue
            column = np.ascontiguousarray(x[n, :, c])
            largest = _largest(column, eps)
            y[n, c] = _mean(largest, _plane_sum(column, eps, 1.0 / largest, p, whole, lanes),
                            length, p)


@inlined
def _tap_backward(v, eps, inverse, scale, p, whole, zero):
    """One tap's ``dx`` and ``r^p`` (the module docstring's)."""
    r = _clamped(v, eps) * inverse
    share = _raised_less_one(r, p, whole)
    return (scale * share if v >= eps else zero), share * r, r


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
            s1[lane] += power * elementary.log(r)
    return _p_term(grad, mean, p, _halved(s0), _halved(s1))


@parallel_kernel
def gem_global_backward_planes(x, y, dy, eps, p, whole, with_dp, dx, terms):
    n_batch, n_chan, length = x.shape
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        terms[n, c] = _plane_backward(x[n, c], dx[n, c], np.float64(dy[n, c]),
                                      np.float64(y[n, c]), length, eps, p, whole, with_dp)


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
        s0 = np.zeros(n_chan, np.float64)
        s1 = np.zeros(n_chan, np.float64)
        for i in range(length):
            row, out = x[n, i], dx[n, i]
            for c in range(n_chan):
                at = uint64(c)
                v = np.float64(row[at])
                r = _clamped(v, eps) * inverse[at]
                share = _raised_less_one(r, p, whole)
                out[at] = scale[at] * share if v >= eps else zero
                if with_dp:
                    power = share * r
                    s0[at] += power
                    s1[at] += power * elementary.log(r)
        for c in range(n_chan):
            terms[n, c] = (_p_term(np.float64(dy[n, c]), np.float64(y[n, c]), p, s0[c],
                                   s1[c]) if with_dp else 0.0)


# ------------------------------------------------------------------- sliding windows


@parallel_kernel
def gem_window_forward(x, table, eps, p, whole, y):
    n_chan = x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(y.shape[0] * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        for ow in range(out_w):
            d0, d1, h0, h1, w0, w1 = window_range(table, od, oh, ow)
            largest = eps
            for xd in range(d0, d1):
                for xh in range(h0, h1):
                    for xw in range(w0, w1):
                        z = np.float64(x[n, c, xd, xh, xw])
                        if z > largest:
                            largest = z
            total = 0.0
            for xd in range(d0, d1):
                for xh in range(h0, h1):
                    for xw in range(w0, w1):
                        z = _clamped(np.float64(x[n, c, xd, xh, xw]), eps)
                        total += _raised(z / largest, p, whole)
            count = (d1 - d0) * (h1 - h0) * (w1 - w0)
            y[n, c, od, oh, ow] = _mean(largest, total, count, p)


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
            s0, s1 = 0.0, 0.0
            for xd in range(d0, d1):
                for xh in range(h0, h1):
                    for xw in range(w0, w1):
                        r = _clamped(np.float64(x[n, c, xd, xh, xw]), eps) / mean
                        power = _raised(r, p, whole)
                        s0 += power
                        s1 += power * elementary.log(r)
            terms[n, c, od, oh, ow] = _p_term(np.float64(dy[n, c, od, oh, ow]), mean, p, s0, s1)


@parallel_kernel
def gem_window_backward(x, y, dy, table, eps, p, whole, cover_ptr, cover_out, dx):
    n_chan = x.shape[1]
    in_d, in_h, in_w = dx.shape[2], dx.shape[3], dx.shape[4]
    zero = np.zeros(1, dx.dtype)[0]
    for row in prange(dx.shape[0] * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            v = np.float64(x[n, c, i_d, ih, iw])
            if not v >= eps:  # NaN too: the clamp's comparison is false
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
                        share = _raised_less_one(v / np.float64(y[n, c, od, oh, ow]), p, whole)
                        total += np.float64(dy[n, c, od, oh, ow]) / count * share
            dx[n, c, i_d, ih, iw] = total
