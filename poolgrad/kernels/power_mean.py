"""Generalized-mean (GeM) pooling, fused: one pass over x forward, one backward.

With ``z = max(x, eps)`` (NaN stays NaN), a window ``W`` of ``K`` real taps and ``m``
its largest ``z`` (at least ``eps``, so never 0):

* forward: ``y = m * (sum_W (z / m)^p / K)^(1/p)``, scaled by ``m`` so that a large
  ``p`` neither overflows nor underflows;
* backward: ``dx_j = sum over the windows reading j of dy * (z_j / y)^(p-1) / K``
  where ``x_j >= eps``, else 0 (the clamp passes no gradient, as PyTorch's);
* the gradient of ``p``, one term per window (their sum is ``dp``):
  ``dy * (y / p) * S1 / S0`` with ``r = z / y``, ``S0 = sum_W r^p`` and
  ``S1 = sum_W r^p log r``. Taken relative to ``y``, it has no cancellation, and the
  normalisation by ``S0`` (``K`` in exact arithmetic) makes it exact for the ``y`` that
  was stored, rounding and all.

Sums run in float64 in tap order (row-major over the window) whatever the dtype, the
same bits at any thread count. A whole ``p`` up to 16 (3, GeM's usual start) is raised
by multiplying, any other by ``exp`` and ``log`` (``whole``, :func:`whole_power`).

Two families:

* ``gem_global_*`` pool whole planes, on ``(N, C, L)`` views (the spatial dims
  flattened, a view for NCHW and channels-last alike). ``*_planes`` walks each ``(n, c)``
  plane (contiguous in NCHW), ``*_channels_last`` each example's positions with one
  accumulator per channel (contiguous there). The backward writes ``dx`` and, with
  ``with_dp``, each plane's ``p`` term in the same pass.
* ``gem_window_*`` pool sliding windows on 5-d ``(N, C, D, H, W)`` views of any strides,
  through the plan's window ``table`` (forward, ``p`` terms) and ``cover`` tables (the
  backward gathers each input's windows in increasing output order: no races).
"""

import numpy as np
from numba import prange

from . import parallel_kernel
from .walk import inlined, row_index, window_range

MULTIPLIED_UP_TO = 16  # a whole power up to this is raised by multiplying


@inlined
def _raised(base, p, whole):
    """``base ** p`` for ``base >= 0`` (or NaN): by ``whole`` multiplications when
    ``whole > 0``, else by ``exp`` and ``log``."""
    if whole > 0:
        result = base
        for _ in range(whole - 1):
            result *= base
        return result
    if base > 0:
        return np.exp(p * np.log(base))
    return base ** p


@inlined
def _clamped(v, eps):
    return eps if v < eps else v


@inlined
def _mean(largest, total, count, p):
    return largest * (total / count) ** (1.0 / p)


@inlined
def _p_term(dy, y, p, s0, s1):
    return dy * (y / p) * (s1 / s0)


def whole_power(p: float) -> int:
    """The ``whole`` argument of the kernels for the power ``p``: ``p`` when it is a
    whole number from 1 to :data:`MULTIPLIED_UP_TO`, else 0."""
    return int(p) if float(p).is_integer() and 1 <= p <= MULTIPLIED_UP_TO else 0


# ----------------------------------------------------------------------- whole planes


@parallel_kernel
def gem_global_forward_planes(x, eps, p, whole, y):
    n_batch, n_chan, length = x.shape
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        largest = eps
        for i in range(length):
            z = np.float64(x[n, c, i])
            if z > largest:
                largest = z
        total = 0.0
        for i in range(length):
            total += _raised(_clamped(np.float64(x[n, c, i]), eps) / largest, p, whole)
        y[n, c] = _mean(largest, total, length, p)


@parallel_kernel
def gem_global_forward_channels_last(x, eps, p, whole, y):
    n_batch, n_chan, length = x.shape
    for n in prange(n_batch):
        largest = np.full(n_chan, eps, np.float64)
        for i in range(length):
            for c in range(n_chan):
                z = np.float64(x[n, c, i])
                if z > largest[c]:
                    largest[c] = z
        total = np.zeros(n_chan, np.float64)
        for i in range(length):
            for c in range(n_chan):
                total[c] += _raised(_clamped(np.float64(x[n, c, i]), eps) / largest[c], p,
                                    whole)
        for c in range(n_chan):
            y[n, c] = _mean(largest[c], total[c], length, p)


@parallel_kernel
def gem_global_backward_planes(x, y, dy, eps, p, whole, with_dp, dx, terms):
    n_batch, n_chan, length = x.shape
    zero = np.zeros(1, dx.dtype)[0]
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        grad = np.float64(dy[n, c])
        scale = grad / length
        mean = np.float64(y[n, c])
        s0, s1 = 0.0, 0.0
        for i in range(length):
            v = np.float64(x[n, c, i])
            r = _clamped(v, eps) / mean
            share = _raised(r, p - 1, whole - 1)
            dx[n, c, i] = scale * share if v >= eps else zero
            if with_dp:
                power = share * r
                s0 += power
                s1 += power * np.log(r)
        terms[n, c] = _p_term(grad, mean, p, s0, s1) if with_dp else 0.0


@parallel_kernel
def gem_global_backward_channels_last(x, y, dy, eps, p, whole, with_dp, dx, terms):
    n_batch, n_chan, length = x.shape
    zero = np.zeros(1, dx.dtype)[0]
    for n in prange(n_batch):
        # each channel's mean and dy / L, read and divided once, not at every position
        mean = np.empty(n_chan, np.float64)
        scale = np.empty(n_chan, np.float64)
        for c in range(n_chan):
            mean[c] = np.float64(y[n, c])
            scale[c] = np.float64(dy[n, c]) / length
        s0 = np.zeros(n_chan, np.float64)
        s1 = np.zeros(n_chan, np.float64)
        for i in range(length):
            for c in range(n_chan):
                v = np.float64(x[n, c, i])
                r = _clamped(v, eps) / mean[c]
                share = _raised(r, p - 1, whole - 1)
                dx[n, c, i] = scale[c] * share if v >= eps else zero
                if with_dp:
                    power = share * r
                    s0[c] += power
                    s1[c] += power * np.log(r)
        for c in range(n_chan):
            terms[n, c] = (_p_term(np.float64(dy[n, c]), mean[c], p, s0[c], s1[c])
                           if with_dp else 0.0)


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
                        s1 += power * np.log(r)
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
                        share = _raised(v / np.float64(y[n, c, od, oh, ow]), p - 1, whole - 1)
                        total += np.float64(dy[n, c, od, oh, ow]) / count * share
            dx[n, c, i_d, ih, iw] = total
