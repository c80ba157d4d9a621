"""Triton kernels of the blends of a window's maximum and mean (mixed and gated
pooling, :func:`poolgrad.mixed_pool`, :func:`poolgrad.gated_pool`): the forward, the
backward's ``dx`` (a gather: each input recomputes the windows that read it, no
atomics) and each window's terms of the weights' gradient. Formulas and rules are
those of :mod:`poolgrad.kernels.blend` (``KIND`` 0 ``MIXED``, 1 ``GATED``), the
contract that of :mod:`.kernels`; ``weights`` is ``[alpha]`` or the gate's weights in
row-major tap order, any float dtype."""

import triton
import triton.language as tl

from . import walk


@triton.jit
def _stats(x, base, windows, axes, xs, live, weights, KIND: tl.constexpr,
           ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``(M, its tap, sum, s)`` of each lane's window: the first NaN or else the first
    largest of the real taps, their sum in tap order, and the maximum's share."""
    largest = tl.zeros([BLOCK], dtype=ACC)
    winner = tl.zeros([BLOCK], dtype=tl.int32)
    found = winner < 0
    acc = tl.zeros([BLOCK], dtype=ACC)
    logit = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        v = tl.load(x + base + offset, mask=real, other=0.0).to(ACC)
        wins = real & (~found | walk.beats(v, largest))
        largest = tl.where(wins, v, largest)
        winner = tl.where(wins, (tl.zeros_like(winner) + t).to(tl.int32), winner)
        found = found | real
        acc = tl.where(real, acc + v, acc)
        if KIND == 1:
            logit = tl.where(real, logit + tl.load(weights + t).to(ACC) * v, logit)
    if KIND == 0:
        share = tl.zeros([BLOCK], dtype=ACC) + tl.load(weights).to(ACC)
    else:
        share = walk.divide(tl.zeros([BLOCK], dtype=ACC) + 1.0, 1.0 + tl.exp(-logit))
    return largest, winner, acc, share


@triton.jit
def blend_forward(x, weights, y, total, C, axes, xs, ys,
                  ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, KIND: tl.constexpr,
                  ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y = s M + (1 - s) sum / K``, ``K`` the window's taps, padding included."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    largest, _, acc, share = _stats(x, n * xs[0] + c * xs[1], windows, axes, xs, live,
                                    weights, KIND, ACC, BLOCK)
    mean = walk.divide(acc, walk.divisor(windows, 1, 0, ACC))
    result = share * largest + (1.0 - share) * mean
    tl.store(y + walk.at(ys, n, c, od, oh, ow), walk.narrow(result, y.dtype.element_ty),
             mask=live)


@triton.jit
def blend_backward(x, dy, weights, dx, total, C, axes, xs, gs, rs,
                   ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, KIND: tl.constexpr,
                   ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``dx[i]`` = the sum over the windows ``o`` that read ``i`` (tap ``j``), in
    increasing window order, of ``(1 - s) dy / K``, plus ``s dy`` where ``j`` won, plus
    (gated) ``dy (M - A) s (1 - s) weights[j]``. ``dy`` has the strides ``gs``, ``dx``
    the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    base = n * xs[0] + c * xs[1]
    result = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, j, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
        largest, winner, acc, share = _stats(x, base, windows, axes, xs, valid, weights,
                                             KIND, ACC, BLOCK)
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=valid, other=0.0).to(ACC)
        count = walk.divisor(windows, 1, 0, ACC)
        part = walk.divide((1.0 - share) * g, count)
        part = tl.where(winner == j, part + share * g, part)
        if KIND == 1:
            mean = walk.divide(acc, count)
            gate = tl.load(weights + j).to(ACC)  # j < the taps: in range for every lane
            part += g * (largest - mean) * share * (1.0 - share) * gate
        result = tl.where(valid, result + part, result)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(result, dx.dtype.element_ty),
             mask=live)


@triton.jit
def blend_weight_terms(x, dy, weights, terms, total, C, axes, xs, gs,
                       ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr,
                       KIND: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Each window's terms of the weights' gradient, float64, at ``terms[t * total +
    lane]`` (lanes in ``dy``'s memory order): mixed, ``dy (M - A)`` at ``t = 0``;
    gated, ``dy (M - A) s (1 - s) x_t`` per tap (0 for a padded one)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    largest, _, acc, share = _stats(x, base, windows, axes, xs, live, weights, KIND, ACC,
                                    BLOCK)
    g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=live, other=0.0).to(ACC)
    spread = g * (largest - walk.divide(acc, walk.divisor(windows, 1, 0, ACC)))
    if KIND == 0:
        tl.store(terms + offs, spread.to(tl.float64), mask=live)
    else:
        dz = spread * share * (1.0 - share)
        for t in range(0, walk.taps(axes)):
            offset, real = walk.tap(t, axes, windows, xs, live)
            v = tl.load(x + base + offset, mask=real, other=0.0).to(ACC)
            tl.store(terms + t * total + offs, tl.where(real, dz * v, 0.0).to(tl.float64),
                     mask=live)
