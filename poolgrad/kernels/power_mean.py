"""Global generalized-mean (GeM) pooling in one pass each way.

Both kernels take ``(N, C, L)`` views, the spatial dims flattened (a view for NCHW and
for channels-last alike), and compute the sums in float64. With ``z = max(x, eps)``
(NaN stays NaN) and ``m`` a plane's largest ``z``:

* forward: ``y[n, c] = m * (sum (z / m)^p / L)^(1/p)`` (scaled by ``m`` so that large
  ``p`` neither overflows nor underflows) and, with ``with_ratio``, ``ratio[n, c] =
  sum z^p log z / sum z^p``, which the gradient of ``p`` needs:
  ``dy * (y / p) * (ratio - log y)``.
* backward: ``dx = dy / L * (z / y)^(p-1)`` where ``x >= eps``, else 0.

A whole ``p`` up to 16 (3, GeM's usual start) is raised by multiplying, any other by
``exp`` and ``log``. ``*_planes`` walks each ``(n, c)`` plane (NCHW: contiguous);
``*_channels_last`` walks each example's positions with the channels innermost
(contiguous there), one accumulator per channel. Both add in position order: the same
bits at any thread count and in either layout.
"""

import numpy as np
from numba import prange

from . import parallel_kernel
from .walk import inlined

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


def whole_power(p: float) -> int:
    """The ``whole`` argument of the kernels for the power ``p``: ``p`` when it is a
    whole number from 1 to :data:`MULTIPLIED_UP_TO`, else 0."""
    return int(p) if float(p).is_integer() and 1 <= p <= MULTIPLIED_UP_TO else 0


@parallel_kernel
def gem_global_forward_planes(x, eps, p, whole, with_ratio, y, ratio):
    n_batch, n_chan, length = x.shape
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        largest = eps
        for i in range(length):
            z = np.float64(x[n, c, i])
            if z > largest:
                largest = z
        total, weighted = 0.0, 0.0
        for i in range(length):
            v = np.float64(x[n, c, i])
            z = eps if v < eps else v
            w = _raised(z / largest, p, whole)
            total += w
            if with_ratio:
                weighted += w * np.log(z)
        y[n, c] = largest * (total / length) ** (1.0 / p)
        ratio[n, c] = weighted / total


@parallel_kernel
def gem_global_forward_channels_last(x, eps, p, whole, with_ratio, y, ratio):
    n_batch, n_chan, length = x.shape
    for n in prange(n_batch):
        largest = np.full(n_chan, eps, np.float64)
        for i in range(length):
            for c in range(n_chan):
                z = np.float64(x[n, c, i])
                if z > largest[c]:
                    largest[c] = z
        total = np.zeros(n_chan, np.float64)
        weighted = np.zeros(n_chan, np.float64)
        for i in range(length):
            for c in range(n_chan):
                v = np.float64(x[n, c, i])
                z = eps if v < eps else v
                w = _raised(z / largest[c], p, whole)
                total[c] += w
                if with_ratio:
                    weighted[c] += w * np.log(z)
        for c in range(n_chan):
            y[n, c] = largest[c] * (total[c] / length) ** (1.0 / p)
            ratio[n, c] = weighted[c] / total[c]


@parallel_kernel
def gem_global_backward_planes(x, y, dy, eps, p, whole, dx):
    n_batch, n_chan, length = x.shape
    zero = np.zeros(1, dx.dtype)[0]
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        scale = np.float64(dy[n, c]) / length
        mean = np.float64(y[n, c])
        for i in range(length):
            v = np.float64(x[n, c, i])
            if v >= eps:
                dx[n, c, i] = scale * _raised(v / mean, p - 1, whole - 1)
            else:
                dx[n, c, i] = zero


@parallel_kernel
def gem_global_backward_channels_last(x, y, dy, eps, p, whole, dx):
    n_batch, n_chan, length = x.shape
    zero = np.zeros(1, dx.dtype)[0]
    for n in prange(n_batch):
        for i in range(length):
            for c in range(n_chan):
                v = np.float64(x[n, c, i])
                if v >= eps:
                    dx[n, c, i] = (np.float64(dy[n, c]) / length
                                   * _raised(v / np.float64(y[n, c]), p - 1, whole - 1))
                else:
                    dx[n, c, i] = zero
