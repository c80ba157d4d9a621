"""Triton kernels of adaptive polyphase sampling (:func:`poolgrad.aps_pool`): each
plane's share of each component's norm, the gather of the chosen components and its
transpose; and the circular padding of :func:`poolgrad.max_aps_pool` with its transpose
(:mod:`poolgrad.kernels.layouts`' and :func:`poolgrad.engines.pullback.fold_circular`'s
copies and sums). Components, phases and norms are :mod:`poolgrad.kernels.polyphase`'s.

Tensors are 5-d ``(N, C, D, H, W)`` of any strides (``xs``, ``ys``: a tuple each);
``sizes`` is x's ``(D, H, W)``, ``steps`` the stride per axis, ``comps`` a component's
``(M_d, M_h, M_w)``, ``M = ceil(L / s)``. No kernel uses atomics: each output element
is written by one lane, and the norms are summed by the caller in a fixed order.
"""

import triton
import triton.language as tl

from . import walk


@triton.jit
def _offsets(phase, steps):
    """``(a, b, e)``: component ``phase``'s offset per axis (row-major phases)."""
    sd, sh, sw = steps
    return phase // (sh * sw), (phase // sw) % sh, phase % sw


@triton.jit
def phase_norm_partials(x, partials, C, sizes, steps, comps, xs, NORM: tl.constexpr,
                        BLOCK: tl.constexpr):
    """Program ``(n * C + c) * P + phase`` (``P = prod(steps)``) writes plane ``(n,
    c)``'s share of component ``phase``'s norm into ``partials`` at that index, in
    float64: the sum of ``v * v`` (``NORM`` 0) or of ``|v|`` (1), or the largest
    ``|v|`` (2, NaN if any ``v`` is), over the component's positions in blocks."""
    pid = tl.program_id(0).to(tl.int64)
    sd, sh, sw = steps
    count = sd * sh * sw
    phase, plane = pid % count, pid // count
    n, c = plane // C, plane % C
    a, b, e = _offsets(phase, steps)
    depth, height, width = sizes
    out_d, out_h, out_w = comps
    total = out_d * out_h * out_w
    base = n * xs[0] + c * xs[1]
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    nan = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, total, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < total
        k, rest = walk.split(offs, out_w)
        j, i = walk.split(rest, out_h)
        d = (a + i * sd) % depth
        h = (b + j * sh) % height
        w = (e + k * sw) % width
        v = tl.load(x + base + d * xs[2] + h * xs[3] + w * xs[4], mask=live,
                    other=0.0).to(tl.float64)
        if NORM == 0:
            acc += v * v
        elif NORM == 1:
            acc += tl.abs(v)
        else:
            acc = tl.maximum(acc, tl.abs(v))
            nan = nan | (v != v).to(tl.int32)
    if NORM == 2:
        result = tl.max(acc, axis=0)
        result = tl.where(tl.max(nan, axis=0) > 0, float("nan"), result)
    else:
        result = tl.sum(acc, axis=0)
    tl.store(partials + pid, result)


@triton.jit
def phase_move(src, phases, dst, total, C, sizes, steps, comps, ss, ds,
               SCATTER: tl.constexpr, BLOCK: tl.constexpr):
    """One lane per element of a component-shaped tensor ``(N, C, M_d, M_h, M_w)``: the
    gather (``SCATTER`` False) copies x's element at the chosen phase's position into
    it; the scatter copies it to that position of ``dst`` (already zero, x-shaped).
    Within one component no two positions wrap onto the same element: no lane writes
    where another does."""
    offs, live = walk.lanes(total, BLOCK)
    out_d, out_h, out_w = comps
    k, rest = walk.split(offs, out_w)
    j, rest = walk.split(rest, out_h)
    i, rest = walk.split(rest, out_d)
    c, n = walk.split(rest, C)
    phase = tl.load(phases + n, mask=live, other=0)
    a, b, e = _offsets(phase, steps)
    sd, sh, sw = steps
    depth, height, width = sizes
    d = (a + i * sd) % depth
    h = (b + j * sh) % height
    w = (e + k * sw) % width
    if SCATTER:
        value = tl.load(src + walk.at(ss, n, c, i, j, k), mask=live)
        tl.store(dst + walk.at(ds, n, c, d, h, w), value, mask=live)
    else:
        value = tl.load(src + walk.at(ss, n, c, d, h, w), mask=live)
        tl.store(dst + walk.at(ds, n, c, i, j, k), value, mask=live)



@triton.jit
def _wrapped(p, before, length):
    """The coordinate padded position ``p`` copies along an axis of ``length``
    (remainders of non-negative operands only: C's and Python's ``%`` differ on
    negative ones)."""
    return ((p - before) % length + length) % length


@triton.jit
def circular_pad(x, out, total, C, sizes, padded, befores, xs, outs,
                 CHANNELS_LAST: tl.constexpr, BLOCK: tl.constexpr):
    """``out`` (``padded`` its (D, H, W)) := ``x`` (``sizes``) padded circularly,
    ``befores`` ahead of each axis, a pad longer than its axis wrapping round again:
    one lane per element of ``out``, a copy."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, pd, ph, pw = walk.element(offs, C, padded[0], padded[1], padded[2], CHANNELS_LAST)
    at = walk.at(xs, n, c, _wrapped(pd, befores[0], sizes[0]),
                 _wrapped(ph, befores[1], sizes[1]), _wrapped(pw, befores[2], sizes[2]))
    tl.store(out + walk.at(outs, n, c, pd, ph, pw), tl.load(x + at, mask=live), mask=live)


@triton.jit
def _copy(i, k, before, length, padded):
    """Padded position ``k`` of those that copy coordinate ``i``: 0 the first full
    period's (``i + before % length``), then the others in increasing order; and
    whether it lies in the padded axis."""
    first = (i + before) % length
    whole = i + before % length
    skip = (whole - first) // length  # the whole period's place among the others
    k = tl.where(k == 0, skip, tl.where(k - 1 < skip, k - 1, k)) + i * 0
    p = first + k * length
    return p, p < padded


@triton.jit
def circular_fold(dy, dx, total, C, sizes, padded, befores, copies, gs, rs,
                  CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The transpose of :func:`circular_pad`: each ``dx`` element (``sizes``) sums the
    ``dy`` of the padded positions that copy it, ``copies`` the most per axis. As the
    CPU folds: D, then H, then W, each axis's sum starting from its first full period's
    position, then the others in increasing order. ``dy`` has the strides ``gs``,
    ``dx`` the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.element(offs, C, sizes[0], sizes[1], sizes[2], CHANNELS_LAST)
    acc_w = tl.zeros([BLOCK], dtype=ACC)
    for kw in range(0, copies[2]):
        pw, real_w = _copy(iw, kw, befores[2], sizes[2], padded[2])
        acc_h = tl.zeros([BLOCK], dtype=ACC)
        for kh in range(0, copies[1]):
            ph, real_h = _copy(ih, kh, befores[1], sizes[1], padded[1])
            acc_d = tl.zeros([BLOCK], dtype=ACC)
            for kd in range(0, copies[0]):
                pd, real_d = _copy(i_d, kd, befores[0], sizes[0], padded[0])
                valid = live & real_d & real_h & real_w
                g = tl.load(dy + walk.at(gs, n, c, pd, ph, pw), mask=valid, other=0.0).to(ACC)
                acc_d = tl.where(real_d, tl.where(kd == 0, g, acc_d + g), acc_d)
            acc_h = tl.where(real_h, tl.where(kh == 0, acc_d, acc_h + acc_d), acc_h)
        acc_w = tl.where(real_w, tl.where(kw == 0, acc_h, acc_w + acc_h), acc_w)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc_w, dx.dtype.element_ty),
             mask=live)
