"""Triton kernels of fractional max pooling (:func:`poolgrad.fractional_max_pool`), whose
windows differ from plane to plane.

Each ``(n, c)`` plane ``p = n * C + c`` has its windows as tables, built on the device
from the draws (:func:`poolgrad.torch._fractional.device_windows`): ``starts[p, a, o]``
and ``lengths[p, a, o]`` for kernel axis ``a`` (D, H, W; an unused axis has one window,
start 0 and length 1) and output ``o``, in int64 tensors of strides ``ws``. ``EXT_D``,
``EXT_H`` and ``EXT_W`` bound every window's length along each axis whatever the draws
(:func:`poolgrad.torch._kind_ops.fractional_extents`), and a winner is its
tap number row-major over them. The CPU numbers taps over the longest window the draws
gave, so the two devices' winners are each their own backward's and indices' input:
the values, the indices and ``dx`` are the same.

The rule is max pooling's (:mod:`.kernels`): the first maximum in row-major window
order, or the first NaN. The backward gathers: each input element adds the ``dy`` of
the windows whose winner it is, in increasing output order from +0 (the CPU adds them
in that order too), so it needs no atomics and gives the CPU's bits. The windows that
cover an element along an axis are the consecutive outputs from ``first[p, a, i]``
(how many of the axis's windows end at or before ``i``) to ``last[p, a, i]`` (how
many start at or before it), tables of strides ``fs`` built with them. ``sizes`` and
``counts`` are the input's and the output's (D, H, W).
"""

import triton
import triton.language as tl

from . import walk


@triton.jit
def _entry(table, ws, p, axis, o):
    """Window ``o`` of plane ``p`` along kernel axis ``axis`` in ``table`` (the starts
    or the lengths)."""
    return tl.load(table + p * ws[0] + axis * ws[1] + o * ws[2])


@triton.jit
def fractional_forward(x, starts, lengths, y, pos, total, C, sizes, counts, xs, ys, ws,
                       EXT_D: tl.constexpr, EXT_H: tl.constexpr, EXT_W: tl.constexpr,
                       CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                       BLOCK: tl.constexpr):
    """``y``: each window's maximum; ``pos``: its winner's tap number (stored as y)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.element(offs, C, counts[0], counts[1], counts[2], CHANNELS_LAST)
    p = tl.where(live, n * C + c, 0)  # (a lane past the end reads plane 0's tables)
    sd, ld = _entry(starts, ws, p, 0, od), _entry(lengths, ws, p, 0, od)
    sh, lh = _entry(starts, ws, p, 1, oh), _entry(lengths, ws, p, 1, oh)
    sw, lw = _entry(starts, ws, p, 2, ow), _entry(lengths, ws, p, 2, ow)
    base = n * xs[0] + c * xs[1]
    largest = tl.zeros([BLOCK], dtype=ACC)
    winner = tl.zeros([BLOCK], dtype=tl.int32)
    found = offs < 0
    for t in range(0, EXT_D * EXT_H * EXT_W):
        jd = t // (EXT_H * EXT_W)
        jh = (t // EXT_W) % EXT_H
        jw = t % EXT_W
        real = live & (jd < ld) & (jh < lh) & (jw < lw)
        offset = (sd + jd) * xs[2] + (sh + jh) * xs[3] + (sw + jw) * xs[4]
        v = tl.load(x + base + offset, mask=real, other=0.0).to(ACC)
        wins = real & (~found | walk.beats(v, largest))
        largest = tl.where(wins, v, largest)
        winner = tl.where(wins, t, winner)
        found = found | real
    out = walk.at(ys, n, c, od, oh, ow)
    tl.store(y + out, walk.narrow(largest, y.dtype.element_ty), mask=live)
    tl.store(pos + out, winner.to(pos.dtype.element_ty), mask=live)


@triton.jit
def _decoded(winner, EXT_H: tl.constexpr, EXT_W: tl.constexpr):
    """A winner's tap along D, H and W."""
    return winner // (EXT_H * EXT_W), (winner // EXT_W) % EXT_H, winner % EXT_W


@triton.jit
def fractional_indices(pos, starts, indices, total, C, sizes, counts, ps, ws,
                       EXT_H: tl.constexpr, EXT_W: tl.constexpr,
                       CHANNELS_LAST: tl.constexpr, BLOCK: tl.constexpr):
    """PyTorch's int64 indices: each winner's flat position in its input plane, stored
    as the winners are."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.element(offs, C, counts[0], counts[1], counts[2], CHANNELS_LAST)
    p = tl.where(live, n * C + c, 0)
    at = walk.at(ps, n, c, od, oh, ow)
    jd, jh, jw = _decoded(tl.load(pos + at, mask=live, other=0).to(tl.int64), EXT_H, EXT_W)
    sd = _entry(starts, ws, p, 0, od)
    sh = _entry(starts, ws, p, 1, oh)
    sw = _entry(starts, ws, p, 2, ow)
    flat = ((sd + jd) * sizes[1] + (sh + jh)) * sizes[2] + (sw + jw)
    tl.store(indices + at, flat, mask=live)


@triton.jit
def _covers(first, last, fs, p, axis, i):
    """The outputs along ``axis`` whose windows hold coordinate ``i``: ``(from, count)``."""
    at = p * fs[0] + axis * fs[1] + i * fs[2]
    start = tl.load(first + at)
    return start, tl.load(last + at) - start


@triton.jit
def fractional_backward(dy, pos, starts, first, last, dx, total, C, sizes, counts,
                        gs, ps, rs, ws, fs, EXT_H: tl.constexpr, EXT_W: tl.constexpr,
                        CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                        BLOCK: tl.constexpr):
    """``dx``: the sum, in increasing output order from +0, of the ``dy`` (strides
    ``gs``) of the windows whose winner (``pos``, strides ``ps``) is the element."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.element(offs, C, sizes[0], sizes[1], sizes[2], CHANNELS_LAST)
    p = tl.where(live, n * C + c, 0)
    fd, nd = _covers(first, last, fs, p, 0, i_d)
    fh, nh = _covers(first, last, fs, p, 1, ih)
    fw, nw = _covers(first, last, fs, p, 2, iw)
    nd, nh, nw = tl.where(live, nd, 0), tl.where(live, nh, 0), tl.where(live, nw, 0)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for kd in range(0, tl.max(nd, 0)):
        od = fd + kd
        sd = _entry(starts, ws, p, 0, tl.where(kd < nd, od, 0))
        for kh in range(0, tl.max(nh, 0)):
            oh = fh + kh
            sh = _entry(starts, ws, p, 1, tl.where(kh < nh, oh, 0))
            for kw in range(0, tl.max(nw, 0)):
                ow = fw + kw
                valid = (kd < nd) & (kh < nh) & (kw < nw)
                sw = _entry(starts, ws, p, 2, tl.where(valid, ow, 0))
                winner = tl.load(pos + walk.at(ps, n, c, od, oh, ow), mask=valid,
                                 other=0).to(tl.int64)
                jd, jh, jw = _decoded(winner, EXT_H, EXT_W)
                hit = valid & (sd + jd == i_d) & (sh + jh == ih) & (sw + jw == iw)
                g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=hit, other=0.0)
                acc = tl.where(hit, acc + g.to(ACC), acc)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty),
             mask=live)
