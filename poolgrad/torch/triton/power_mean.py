"""Triton kernels of GeM pooling (:func:`poolgrad.gem_pool`): the forward, the
backward's ``dx`` (a gather, no atomics) and each window's term of ``dp``, with the
formulas of :mod:`poolgrad.kernels.power_mean` and the contract of :mod:`.kernels`."""

import triton
import triton.language as tl

from . import walk


@triton.jit
def _gem_constants(power, clamp, ACC: tl.constexpr):
    """``(p, eps)`` in ``ACC``: ``power`` is the op's ``p`` tensor (one element, any float
    dtype), ``clamp`` a one-element tensor of ``eps`` in ``ACC``."""
    return tl.load(power).to(ACC), tl.load(clamp)


@triton.jit
def _clamped(v, eps):
    """``max(v, eps)``, NaN kept."""
    return tl.where(v < eps, eps, v)


@triton.jit
def gem_forward(x, y, power, clamp, total, C, axes, xs, ys,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                BLOCK: tl.constexpr):
    """GeM: ``y = m * (sum (z / m)^p / K)^(1/p)`` over each window's ``K`` real taps,
    ``z = max(x, eps)`` and ``m`` its largest ``z`` (at least ``eps``, never 0), as
    :mod:`poolgrad.kernels.power_mean` computes it (sums in ``ACC``)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    p, eps = _gem_constants(power, clamp, ACC)
    largest = tl.zeros([BLOCK], dtype=ACC) + eps
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        z = _clamped(tl.load(x + base + offset, mask=real, other=0.0).to(ACC), eps)
        largest = tl.where(real & (z > largest), z, largest)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        z = _clamped(tl.load(x + base + offset, mask=real, other=0.0).to(ACC), eps)
        acc = tl.where(real, acc + walk.power(z / largest, p), acc)
    count = walk.divisor(windows, 0, 1, ACC)
    result = largest * walk.power(acc / count, 1.0 / p)
    result = tl.where(largest == float("inf"), largest, result)  # relative to inf: NaN
    tl.store(y + walk.at(ys, n, c, od, oh, ow), walk.narrow(result, y.dtype.element_ty), mask=live)


@triton.jit
def gem_backward(x, y, dy, power, clamp, dx, total, C, axes, xs, ys, gs, rs,
                 ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                 BLOCK: tl.constexpr):
    """``dx[i]`` = the sum over the windows ``o`` that read ``i`` of
    ``dy[o] / K[o] * (x[i] / y[o])^(p-1)``, in increasing window order, where
    ``x[i] >= eps``; else 0. ``dy`` has the strides ``gs``, ``dx`` the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    p, eps = _gem_constants(power, clamp, ACC)
    value = tl.load(x + walk.at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    passes = live & (value >= eps)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, _, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = passes & valid
        mean = tl.load(y + walk.at(ys, n, c, od, oh, ow), mask=valid, other=1.0).to(ACC)
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=valid, other=0.0).to(ACC)
        count = walk.divisor(walk.windows(od, oh, ow, axes, ADAPTIVE), 0, 1, ACC)
        acc = tl.where(valid, acc + g / count * walk.power(value / mean, p - 1.0), acc)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def gem_p_terms(x, y, dy, power, clamp, terms, total, C, axes, xs, ys, gs, ts,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                BLOCK: tl.constexpr):
    """Each window's term of ``dp``: ``dy * (y / p) * S1 / S0``, ``r = z / y``,
    ``S0 = sum r^p`` and ``S1 = sum r^p log r`` over its real taps (``terms`` has ``y``'s
    shape and the strides ``ts``; their sum, a separate reduction, is ``dp``)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    p, eps = _gem_constants(power, clamp, ACC)
    mean = tl.load(y + walk.at(ys, n, c, od, oh, ow), mask=live, other=1.0).to(ACC)
    g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=live, other=0.0).to(ACC)
    s0 = tl.zeros([BLOCK], dtype=ACC)
    s1 = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        z = _clamped(tl.load(x + base + offset, mask=real, other=1.0).to(ACC), eps)
        r = z / mean
        raised = walk.power(r, p)
        s0 = tl.where(real, s0 + raised, s0)
        s1 = tl.where(real, s1 + raised * tl.log(r), s1)
    tl.store(terms + walk.at(ts, n, c, od, oh, ow), g * (mean / p) * s1 / s0, mask=live)
