"""Triton kernels of the anti-aliased kinds (:func:`poolgrad.blur_pool`,
:func:`poolgrad.max_blur_pool`, :func:`poolgrad.avg_blur_pool`): the forward, a
max-blur's winners, and the transposed blur as a gather. The chain and its order are
:mod:`poolgrad.kernels.blur`'s: per axis D, H, W in turn, an average's box (``1 / k``
over ``k`` taps at stride 1) then the binomial blur over the padded map at the stride;
a max-blur starts from the stride-1 maximum over the whole window (the first maximum
in row-major window order, or the first NaN). Nothing of the stride-1 map is stored:
the forward takes each tap's maximum or box where it reads it.

The contract is :mod:`.kernels`', with ``blurs`` in place of ``axes``: one tuple per
axis ``(D, H, W)``, ``(L, M, O, K, F, S, B, A)``: input length, the stride-1 map's
length, output length, the pre-pool's window (1 without one), the filter's taps, its
stride and the padding before and after the map. ``filters`` holds each axis's taps
(a row of ``width``, in ``ACC``), ``boxes`` each axis's ``1 / k``; ``PRE`` is 0 none,
1 max, 2 average, ``MODE`` the padding (0 zeros, 1 reflect, 2 replicate, 3 circular).
Each sum starts from +0 and adds the filter's taps in increasing order, an axis's sum
inside the next axis's (D's innermost, as the chain runs D's pass first); on a GPU the
products may fuse into the sums, so the values agree with the CPU's to rounding.
"""

import triton
import triton.language as tl

from . import walk


@triton.jit
def source(i, length, MODE: tl.constexpr):
    """The map coordinate that padded coordinate ``i`` copies along an axis of
    ``length``, and whether it copies one (zeros: only inside), as
    :func:`poolgrad.kernels.blur.padded_source` maps it. Remainders of non-negative
    operands only: C's and Python's ``%`` differ on negative ones."""
    if MODE == 0 or MODE == 2:  # zeros: any in-range address, masked by ``real``
        j = tl.minimum(tl.maximum(i, 0), length - 1)
    elif MODE == 3:
        j = (i % length + length) % length
    else:  # reflect; a length of 1 has period 1, so every i reads 0
        period = tl.maximum(2 * (length - 1), 1)
        k = (i % period + period) % period
        j = tl.where(k < length, k, period - k)
    if MODE == 0:
        real = (i >= 0) & (i < length)
    else:
        real = i == i
    return j.to(tl.int64), real  # an address's factor: 64-bit


@triton.jit
def _weight(table, width, row, t):
    return tl.load(table + row * width + t)


@triton.jit
def _window_max(x, base, md, mh, mw, blurs, xs, valid, ACC: tl.constexpr):
    """The stride-1 maximum of the window whose first tap is map position ``(md, mh,
    mw)``, as loaded, and its winning tap number (row-major)."""
    d, h, w = blurs
    best = tl.load(x + base + md * xs[2] + mh * xs[3] + mw * xs[4], mask=valid,
                   other=0.0).to(ACC)
    chosen = (md * 0).to(tl.int32)
    for t in range(1, d[3] * h[3] * w[3]):
        jd = t // (h[3] * w[3])
        jh = (t // w[3]) % h[3]
        jw = t % w[3]
        v = tl.load(x + base + (md + jd) * xs[2] + (mh + jh) * xs[3] + (mw + jw) * xs[4],
                    mask=valid, other=0.0).to(ACC)
        wins = walk.beats(v, best)
        best = tl.where(wins, v, best)
        chosen = tl.where(wins, (tl.zeros_like(chosen) + t).to(tl.int32), chosen)
    return best, chosen


@triton.jit
def _box(k, PRE: tl.constexpr):
    """How many box taps an axis's sum takes: its window's with an average, else 1."""
    if PRE == 2:
        count = k
    else:
        count = k * 0 + 1
    return count


@triton.jit
def _boxed(total, inner, boxes, axis: tl.constexpr, PRE: tl.constexpr):
    """``total`` plus a box tap's ``inner`` (an average's), or ``inner`` itself."""
    if PRE == 2:
        total = total + _weight(boxes, 1, axis, 0) * inner
    else:
        total = inner
    return total


@triton.jit
def _tapped(total, inner, real, weight):
    """``total`` plus a filter tap's ``weight`` times ``inner``, where the tap is ``real``."""
    return tl.where(real, total + weight * inner, total)


@triton.jit
def blur_forward(x, filters, boxes, y, total, C, width, blurs, xs, ys,
                 PRE: tl.constexpr, MODE: tl.constexpr, CHANNELS_LAST: tl.constexpr,
                 ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y``: the chain's output, one lane per output element (the module docstring)."""
    offs, live = walk.lanes(total, BLOCK)
    d, h, w = blurs
    n, c, od, oh, ow = walk.element(offs, C, d[2], h[2], w[2], CHANNELS_LAST)
    base = n * xs[0] + c * xs[1]
    # the padding's remainders in 32 bits, as the backward's (:func:`blur_backward`)
    at_d, at_h, at_w = od.to(tl.int32), oh.to(tl.int32), ow.to(tl.int32)
    acc_w = tl.zeros([BLOCK], dtype=ACC)
    for tw in range(0, w[4]):
        mw, real_w = source(at_w * w[5] - w[6] + tw, w[1], MODE)
        box_w = tl.zeros([BLOCK], dtype=ACC)
        for jw in range(0, _box(w[3], PRE)):
            acc_h = tl.zeros([BLOCK], dtype=ACC)
            for th in range(0, h[4]):
                mh, real_h = source(at_h * h[5] - h[6] + th, h[1], MODE)
                box_h = tl.zeros([BLOCK], dtype=ACC)
                for jh in range(0, _box(h[3], PRE)):
                    acc_d = tl.zeros([BLOCK], dtype=ACC)
                    for td in range(0, d[4]):
                        md, real_d = source(at_d * d[5] - d[6] + td, d[1], MODE)
                        box_d = tl.zeros([BLOCK], dtype=ACC)
                        for jd in range(0, _box(d[3], PRE)):
                            valid = live & real_d & real_h & real_w
                            if PRE == 1:
                                v, _ = _window_max(x, base, md, mh, mw, blurs, xs, valid, ACC)
                            else:
                                v = tl.load(x + base + (md + jd) * xs[2] + (mh + jh) * xs[3]
                                            + (mw + jw) * xs[4], mask=valid, other=0.0).to(ACC)
                            box_d = _boxed(box_d, v, boxes, 0, PRE)
                        acc_d = _tapped(acc_d, box_d, real_d, _weight(filters, width, 0, td))
                    box_h = _boxed(box_h, acc_d, boxes, 1, PRE)
                acc_h = _tapped(acc_h, box_h, real_h, _weight(filters, width, 1, th))
            box_w = _boxed(box_w, acc_h, boxes, 2, PRE)
        acc_w = _tapped(acc_w, box_w, real_w, _weight(filters, width, 2, tw))
    tl.store(y + walk.at(ys, n, c, od, oh, ow), walk.narrow(acc_w, y.dtype.element_ty),
             mask=live)


@triton.jit
def blur_winners(x, pos, total, C, blurs, xs, ps, CHANNELS_LAST: tl.constexpr,
                 ACC: tl.constexpr, BLOCK: tl.constexpr):
    """A max-blur's winners: one lane per stride-1 window, its winning tap number."""
    offs, live = walk.lanes(total, BLOCK)
    d, h, w = blurs
    n, c, md, mh, mw = walk.element(offs, C, d[1], h[1], w[1], CHANNELS_LAST)
    _, chosen = _window_max(x, n * xs[0] + c * xs[1], md, mh, mw, blurs, xs, live, ACC)
    tl.store(pos + walk.at(ps, n, c, md, mh, mw), chosen.to(pos.dtype.element_ty), mask=live)


@triton.jit
def _reader(m, candidate, axis, MODE: tl.constexpr):
    """The ``candidate``-th padded coordinate that copies map coordinate ``m``: 0 the
    coordinate itself, then the padding's ``B + A`` positions (front, then back), each
    where it copies ``m``. ``(padded coordinate, whether it reads m)``."""
    _, length, _, _, _, _, before, _ = axis
    inside = (m >= 0) & (m < length)
    # the padding position and what it copies are the same for every lane: scalars
    padding = tl.where(candidate <= before, -candidate, length - 1 + candidate - before)
    copied, real = source(padding, length, MODE)
    first = candidate == 0
    return tl.where(first, m, padding), inside & (first | (real & (copied == m)))


@triton.jit
def _readers(axis, MODE: tl.constexpr):
    """How many candidates :func:`_reader` tries: with zeros padding, only the coordinate."""
    _, _, _, _, _, _, before, after = axis
    if MODE == 0:
        count = before * 0 + 1
    else:
        count = 1 + before + after
    return count


@triton.jit
def _steps(axis):
    """How many of an axis's filter taps can read one padded coordinate: those of one
    remainder modulo the stride."""
    return (axis[4] + axis[5] - 1) // axis[5]


@triton.jit
def _path(i, j, r, k, axis, MODE: tl.constexpr):
    """Through box tap ``j`` and reader ``r`` (:func:`_reader`) of coordinate ``i``, the
    ``k``-th filter tap that can read it (the taps ``t`` with ``o * stride + t`` at the
    padded coordinate, in increasing order): ``(o, t, whether there is such an
    output)``."""
    _, _, count, _, taps, stride, before, _ = axis
    p, hit = _reader(i - j, r, axis, MODE)
    reach = p + before  # >= 0: a reader lies inside the padded axis
    t = reach % stride + k * stride
    o = (reach - t) // stride
    return o.to(tl.int64), t, hit & (t < taps) & (t <= reach) & (o < count)


@triton.jit
def _weight_at(table, width, row, t, real):
    """:func:`_weight` for a tap number per lane (a gather from the row)."""
    return tl.load(table + row * width + t, mask=real, other=0.0)


@triton.jit
def blur_backward(dy, filters, boxes, g, total, C, width, blurs, gs, rs,
                  PRE: tl.constexpr, MODE: tl.constexpr, CHANNELS_LAST: tl.constexpr,
                  ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The transposed chain as a gather: one lane per element of ``g``, which sums, over
    the outputs whose taps read it, ``dy`` times the taps' weights: W's sum innermost
    (the adjoint runs W's passes first), each axis's box outside its blur, candidates
    and taps in increasing order (only the taps of the stride's remainder are visited).
    ``g`` is the input's gradient, or (``PRE`` 1) a max-blur's stride-1 map's, which
    the max's routing then takes to the winners. ``dy`` has the strides ``gs``, ``g``
    the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    d, h, w = blurs
    if PRE == 1:
        n, c, i_d, ih, iw = walk.element(offs, C, d[1], h[1], w[1], CHANNELS_LAST)
    else:
        n, c, i_d, ih, iw = walk.element(offs, C, d[0], h[0], w[0], CHANNELS_LAST)
    # the paths' divisions and remainders in 32 bits (coordinates fit; 64-bit ones are
    # long instruction sequences on a GPU); the addresses stay 64-bit
    i_d, ih, iw = i_d.to(tl.int32), ih.to(tl.int32), iw.to(tl.int32)
    acc_d = tl.zeros([BLOCK], dtype=ACC)
    for jd in range(0, _box(d[3], PRE)):
        sum_d = tl.zeros([BLOCK], dtype=ACC)
        for rd in range(0, _readers(d, MODE)):
            for kd in range(0, _steps(d)):
                od, td, on_d = _path(i_d, jd, rd, kd, d, MODE)
                acc_h = tl.zeros([BLOCK], dtype=ACC)
                for jh in range(0, _box(h[3], PRE)):
                    sum_h = tl.zeros([BLOCK], dtype=ACC)
                    for rh in range(0, _readers(h, MODE)):
                        for kh in range(0, _steps(h)):
                            oh, th, on_h = _path(ih, jh, rh, kh, h, MODE)
                            acc_w = tl.zeros([BLOCK], dtype=ACC)
                            for jw in range(0, _box(w[3], PRE)):
                                sum_w = tl.zeros([BLOCK], dtype=ACC)
                                for rw in range(0, _readers(w, MODE)):
                                    for kw in range(0, _steps(w)):
                                        ow, tw, on_w = _path(iw, jw, rw, kw, w, MODE)
                                        valid = live & on_d & on_h & on_w
                                        grad = tl.load(dy + walk.at(gs, n, c, od, oh, ow),
                                                       mask=valid, other=0.0).to(ACC)
                                        sum_w = _tapped(sum_w, grad, valid, _weight_at(
                                            filters, width, 2, tw, valid))
                                acc_w = _boxed(acc_w, sum_w, boxes, 2, PRE)
                            sum_h = _tapped(sum_h, acc_w, on_h,
                                            _weight_at(filters, width, 1, th, on_h))
                    acc_h = _boxed(acc_h, sum_h, boxes, 1, PRE)
                sum_d = _tapped(sum_d, acc_h, on_d, _weight_at(filters, width, 0, td, on_d))
        acc_d = _boxed(acc_d, sum_d, boxes, 0, PRE)
    tl.store(g + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc_d, g.dtype.element_ty),
             mask=live)
