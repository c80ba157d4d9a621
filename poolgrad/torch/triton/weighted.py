"""Triton kernels of the weighted window averages (:func:`poolgrad.soft_pool` and
:func:`poolgrad.stochastic_pool`): the forward and its gather backward for SoftPool
(``KIND`` 0, the CPU's ``SOFT``) and stochastic pooling's evaluation (``KIND`` 1,
``SELF``), and stochastic pooling's
draw. Formulas and rules are those of :mod:`poolgrad.kernels.weighted`, the contract
that of :mod:`.kernels`; ``norm`` and ``pos`` are stored as ``y`` is."""

import triton
import triton.language as tl

from . import walk


@triton.jit
def weighted_forward(x, y, norm, total, C, axes, xs, ys,
                     ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, KIND: tl.constexpr,
                     ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y = sum w x / sum w`` over each window's real taps, row-major from +0: SOFT
    weighs by ``exp(x - M)`` (``M`` the window's maximum, the first NaN if any) and
    stores ``norm = M + log(S)``; SELF weighs by ``x`` itself, stores ``norm = S`` and
    ``y = 0`` where ``S = 0``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    largest = tl.zeros([BLOCK], dtype=ACC)
    if KIND == 0:
        found = offs < 0
        for t in range(0, walk.taps(axes)):
            offset, real = walk.tap(t, axes, windows, xs, live)
            v = tl.load(x + base + offset, mask=real, other=0.0).to(ACC)
            wins = real & (~found | walk.beats(v, largest))
            largest = tl.where(wins, v, largest)
            found = found | real
    weights = tl.zeros([BLOCK], dtype=ACC)
    weighted = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        v = tl.load(x + base + offset, mask=real, other=0.0).to(ACC)
        if KIND == 0:
            w = tl.exp(v - largest)
        else:
            w = v
        weights = tl.where(real, weights + w, weights)
        weighted = tl.where(real, weighted + w * v, weighted)
    out = walk.at(ys, n, c, od, oh, ow)
    if KIND == 0:
        mean = walk.divide(weighted, weights)
        scale = largest + tl.log(weights)
    else:
        some = weights != 0
        mean = tl.where(some, walk.divide(weighted, tl.where(some, weights, 1.0)), 0.0)
        scale = weights
    tl.store(y + out, walk.narrow(mean, y.dtype.element_ty), mask=live)
    tl.store(norm + out, walk.narrow(scale, norm.dtype.element_ty), mask=live)


@triton.jit
def weighted_backward(x, y, norm, dy, dx, total, C, axes, xs, ys, gs, rs,
                      ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, KIND: tl.constexpr,
                      ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``dx[i]`` = the sum over the windows ``o`` that read ``i``, in increasing window
    order, of ``dy[o]`` times SOFT ``exp(x[i] - norm[o]) (1 + x[i] - y[o])``, SELF
    ``(2 x[i] - y[o]) / norm[o]`` (0 where ``norm[o] = 0``). ``dy`` has the strides
    ``gs``, ``dx`` the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    value = tl.load(x + walk.at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, _, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        out = walk.at(ys, n, c, od, oh, ow)
        mean = tl.load(y + out, mask=valid, other=0.0).to(ACC)
        scale = tl.load(norm + out, mask=valid, other=1.0).to(ACC)
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=valid, other=0.0).to(ACC)
        if KIND == 0:
            share = tl.exp(value - scale) * (1.0 + value - mean)
        else:
            valid = valid & (scale != 0)
            share = walk.divide(value + value - mean, tl.where(valid, scale, 1.0))
        acc = tl.where(valid, acc + g * share, acc)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty),
             mask=live)


@triton.jit
def counted_uniform(seed, index):
    """Draw ``index`` (int64) of the stream ``seed`` (int64), as
    :func:`poolgrad.kernels.stochastic.counted_uniform` counts it: SplitMix64 in uint64
    arithmetic, its top 53 bits over ``2**53``."""
    z = seed.to(tl.uint64, bitcast=True) + (index.to(tl.uint64, bitcast=True) + 1) * (
        0x9E3779B97F4A7C15)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 11).to(tl.float64) * (1.0 / 9007199254740992.0)


@triton.jit
def stochastic_sample(x, seed, y, pos, total, C, axes, xs, ys,
                      ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                      BLOCK: tl.constexpr):
    """One tap per window, drawn with probability ``x / S``: the first real tap
    (row-major) whose running sum exceeds ``u * S`` for the window's float64 draw ``u``
    (counted from ``seed``, one int64, by the window's row-major number over ``y``'s
    ``(N, C, D, H, W)``); else the last positive tap; else the first real one. Its value
    (as loaded) into ``y``, its tap number into ``pos``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    whole = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        whole = tl.where(real, whole + tl.load(x + base + offset, mask=real,
                                                other=0.0).to(ACC), whole)
    d, h, w = axes
    number = (((n.to(tl.int64) * C + c) * d[1] + od) * h[1] + oh) * w[1] + ow
    u = counted_uniform(tl.load(seed), number)
    threshold = u * whole.to(tl.float64)
    # (one level of unpacking at a time: Triton 3.6 cannot walk nested targets)
    first_d, first_h, first_w = windows[0][1], windows[1][1], windows[2][1]
    chosen = ((first_d * h[2] + first_h) * w[2] + first_w).to(tl.int32)
    running = tl.zeros([BLOCK], dtype=ACC)
    found = offs < 0
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        open_ = real & ~found
        v = tl.load(x + base + offset, mask=open_, other=0.0).to(ACC)
        running = tl.where(open_, running + v, running)
        # as int32 whatever type the loop counter has (int64 with large arguments)
        chosen = tl.where(open_ & (v > 0), (tl.zeros_like(chosen) + t).to(tl.int32), chosen)
        found = found | (open_ & (v > 0) & (running.to(tl.float64) > threshold))
    jd = chosen // (h[2] * w[2])
    jh = (chosen // w[2]) % h[2]
    jw = chosen % w[2]
    start_d, start_h, start_w = windows[0][0], windows[1][0], windows[2][0]
    at = base + (start_d + jd * d[6]) * xs[2] + (start_h + jh * h[6]) * xs[3] + (
        start_w + jw * w[6]) * xs[4]
    out = walk.at(ys, n, c, od, oh, ow)
    tl.store(y + out, tl.load(x + at, mask=live, other=0.0), mask=live)
    tl.store(pos + out, chosen.to(pos.dtype.element_ty), mask=live)
