"""Triton kernels: every pooling pass of poolgrad.torch on CUDA tensors.

Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors, which is how the
tests check them on machines without a GPU.

Contract: the one of :mod:`poolgrad.kernels` (first maximum or first NaN wins, padding
never wins; sums in a fixed order), with these specifics:

* **Arguments**, in this order: the tensors; the count of elements written and C; a
  kernel's own scalars; ``axes``, one tuple per spatial axis ``(D, H, W)`` of the
  integers of its :attr:`~poolgrad.geometry.AxisWindows.rule`, ``(L, O, K, S, P, A,
  DIL, N)``: input length, window count, tap extent (the kernel, or an adaptive axis's
  largest bin), stride, front padding, end padding, dilation and the most windows that
  read one coordinate; then each 5-d ``(N, C, D, H, W)`` tensor's element strides as a
  tuple, in the tensors' order. Windows are recomputed from these per element, never
  read from tables, so a launch needs no device memory but its tensors (CUDA graph
  capture) and nothing is copied to the device per call. Tuples keep each integer a
  kernel argument of its own, specialised as Triton specialises integers.
* **Parallelism.** A program owns ``BLOCK`` consecutive elements of what it writes, in
  that tensor's memory order (``CHANNELS_LAST``: C fastest), and writes each once.
  Backwards gather: each ``dx`` element visits the windows that read it, in increasing
  window order, so there are no atomics and the bits never depend on the schedule.
* **Arithmetic.** float16 and bfloat16 are loaded and computed in float32 (``ACC``),
  float64 in float64; results are stored in the output's dtype. Max values are
  compared widened (exactly) and stored as loaded: the CPU kernels' values and winners.
  Sums start from +0 and add in the CPU's order (window taps row-major; gathers by
  increasing window), and no product feeds a sum in the average and max passes, so
  they give the CPU's bits too. Lp pooling takes ``pow`` as ``exp2(b * log2(a))`` and
  may differ from the CPU's libm in the last bits.
* **Tap numbers** (the max winners) are row-major over the extents,
  ``(jd * KH + jh) * KW + jw``, as the CPU kernels number them.
"""

import triton
import triton.language as tl

from . import walk


@triton.jit
def max_forward(x, y, pos, total, C, axes, xs, ys,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, RECORD: tl.constexpr,
                ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y`` = each window's maximum over its real taps; with ``RECORD``, ``pos`` = its
    tap number (``pos`` has ``y``'s strides)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    best = tl.zeros([BLOCK], dtype=x.dtype.element_ty)
    top = tl.zeros([BLOCK], dtype=ACC)
    tap = tl.zeros([BLOCK], dtype=tl.int32)
    found = offs < 0  # no tap folded yet
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        v = tl.load(x + base + offset, mask=real, other=0.0)
        # compared widened (exact; the interpreter has no 16-bit float compare), kept
        # as loaded
        wide = v.to(ACC)
        # the first real tap, a larger one, or the first NaN (best stays NaN)
        wins = real & (~found | walk.beats(wide, top))
        best = tl.where(wins, v, best)
        top = tl.where(wins, wide, top)
        # as int32 whatever type the loop counter has (int64 with large arguments)
        tap = tl.where(wins, (tl.zeros_like(tap) + t).to(tl.int32), tap)
        found = found | real
    out = walk.at(ys, n, c, od, oh, ow)
    tl.store(y + out, best, mask=live)
    if RECORD:
        tl.store(pos + out, tap.to(pos.dtype.element_ty), mask=live)


@triton.jit
def max_backward(dy, pos, dx, total, C, axes, gs, ps, xs,
                 ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                 BLOCK: tl.constexpr):
    """``dx[i]`` = the sum of ``dy[o]`` over the windows ``o`` whose winning tap reads
    ``i``, in increasing window order from +0 (``dy``, ``pos`` and ``dx`` have the
    strides ``gs``, ``ps`` and ``xs``)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, tap, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        winner = tl.load(pos + walk.at(ps, n, c, od, oh, ow), mask=valid, other=0)
        hit = valid & (winner.to(tl.int32) == tap)
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=hit, other=0.0)
        acc = tl.where(hit, acc + g.to(ACC), acc)
    tl.store(dx + walk.at(xs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def max_gather(src, pos, out, total, C, axes, ss, ps, outs,
               ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, INDICES: tl.constexpr,
               BLOCK: tl.constexpr):
    """Per window, from its winning tap: ``src`` read at the winner (``out`` has the
    windows' shape), or with ``INDICES`` the winner's flat position in its ``(n, c)``
    input plane (PyTorch's max-pool indices; ``src`` unused)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, o_d, o_h, o_w = walk.outputs(offs, C, axes, CHANNELS_LAST)
    d, h, w = axes
    tap = tl.load(pos + walk.at(ps, n, c, o_d, o_h, o_w), mask=live, other=0).to(tl.int64)
    jw = tap % w[2]
    jh = (tap // w[2]) % h[2]
    jd = tap // (w[2] * h[2])
    # (one level of unpacking at a time: Triton 3.6 cannot walk nested targets)
    window_d, window_h, window_w = walk.windows(o_d, o_h, o_w, axes, ADAPTIVE)
    start_d, start_h, start_w = window_d[0], window_h[0], window_w[0]
    cd, ch, cw = start_d + jd * d[6], start_h + jh * h[6], start_w + jw * w[6]
    target = out + walk.at(outs, n, c, o_d, o_h, o_w)
    if INDICES:
        tl.store(target, (cd * h[0] + ch) * w[0] + cw, mask=live)
    else:
        v = tl.load(src + walk.at(ss, n, c, cd, ch, cw), mask=live, other=0)
        tl.store(target, v, mask=live)


@triton.jit
def avg_forward(x, y, total, C, override, axes, xs, ys,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, MODE: tl.constexpr,
                ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y`` = the sum of each window's real taps, row-major from +0, over its divisor
    (:func:`walk.divisor`)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        v = tl.load(x + base + offset, mask=real, other=0.0)
        acc = tl.where(real, acc + v.to(ACC), acc)
    divisor = walk.divisor(windows, override, MODE, ACC)
    tl.store(y + walk.at(ys, n, c, od, oh, ow),
             walk.narrow(walk.divide(acc, divisor), y.dtype.element_ty), mask=live)


@triton.jit
def avg_backward(dy, dx, total, C, override, axes, gs, xs,
                 ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, MODE: tl.constexpr,
                 ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``dx[i]`` = the sum of ``dy[o] / divisor[o]`` over the windows that read ``i``,
    in increasing window order from +0."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, _, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=valid, other=0.0)
        divisor = walk.divisor(walk.windows(od, oh, ow, axes, ADAPTIVE), override, MODE, ACC)
        acc = tl.where(valid, acc + walk.divide(g.to(ACC), divisor), acc)
    tl.store(dx + walk.at(xs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def lp_forward(x, y, total, C, exponents, axes, xs, ys,
               ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, P_KIND: tl.constexpr,
               ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y = (sum over the real taps of |x|^p) ^ (1/p)``, as ``m * (sum (|x|/m)^p)^(1/p)``
    with ``m`` the window's largest ``|x|`` (no overflow or underflow for large ``p``).
    ``P_KIND``: 1 or 2 for those ``p``, 0 for any other. ``exponents``: ``[p, 1/p, p-1]``
    in ``ACC`` (a float argument would reach the kernel as float32)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    scale = tl.full([BLOCK], 1.0, dtype=ACC)
    if P_KIND != 1:
        largest = tl.zeros([BLOCK], dtype=ACC)
        for t in range(0, walk.taps(axes)):
            offset, real = walk.tap(t, axes, windows, xs, live)
            v = tl.abs(tl.load(x + base + offset, mask=real, other=0.0).to(ACC))
            largest = tl.where(real & (v > largest), v, largest)
        # all zeros, or an infinity: no scaling (the sum gives 0, inf or NaN)
        scale = tl.where((largest > 0) & (largest < float("inf")), largest, scale)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        v = tl.abs(tl.load(x + base + offset, mask=real, other=0.0).to(ACC)) / scale
        if P_KIND == 2:
            term = v * v
        elif P_KIND == 1:
            term = v
        else:
            term = walk.power(v, tl.load(exponents))
        acc = tl.where(real, acc + term, acc)
    if P_KIND == 2:
        result = scale * tl.sqrt(acc)
    elif P_KIND == 1:
        result = acc
    else:
        result = scale * walk.power(acc, tl.load(exponents + 1))
    tl.store(y + walk.at(ys, n, c, od, oh, ow), walk.narrow(result, y.dtype.element_ty), mask=live)


@triton.jit
def lp_backward(x, y, dy, dx, total, C, exponents, axes, xs, ys, gs, rs,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, P_KIND: tl.constexpr,
                ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``dx[i]`` = the sum over the windows ``o`` that read ``i`` of
    ``dy[o] * sign(x[i]) * (|x[i]| / y[o])^(p-1)``; a window with ``y = 0`` sends 0 (the
    subgradient at 0). ``dy`` has the strides ``gs``, ``dx`` the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    value = tl.load(x + walk.at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    magnitude = tl.abs(value)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, _, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid & (value != 0)
        norm = tl.load(y + walk.at(ys, n, c, od, oh, ow), mask=valid, other=1.0).to(ACC)
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=valid, other=0.0).to(ACC)
        if P_KIND == 2:
            share = magnitude / norm
        elif P_KIND == 1:
            share = tl.full([BLOCK], 1.0, dtype=ACC)
        else:
            share = walk.power(magnitude / norm, tl.load(exponents + 2))
        acc = tl.where(valid & (norm != 0), acc + g * share, acc)
    acc = tl.where(value < 0, -acc, acc)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def max_tie_count(x, y, ties, total, C, axes, xs, ys,
                  ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                  BLOCK: tl.constexpr):
    """``ties`` = how many real taps of each window equal its maximum ``y`` (1 for a
    NaN window), in ``ACC`` (``ties`` has ``y``'s strides)."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, od, oh, ow = walk.outputs(offs, C, axes, CHANNELS_LAST)
    windows = walk.windows(od, oh, ow, axes, ADAPTIVE)
    out = walk.at(ys, n, c, od, oh, ow)
    best = tl.load(y + out, mask=live, other=0.0).to(ACC)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    for t in range(0, walk.taps(axes)):
        offset, real = walk.tap(t, axes, windows, xs, live)
        v = tl.load(x + n * xs[0] + c * xs[1] + offset, mask=real, other=0.0).to(ACC)
        count += (real & (v == best)).to(tl.int32)
    tl.store(ties + out, tl.maximum(count, 1).to(ACC), mask=live)


@triton.jit
def max_split_backward(x, y, dy, ties, pos, dx, total, C, axes, xs, ys, gs, rs,
                       ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                       BLOCK: tl.constexpr):
    """``ties="split"``: ``dx[i]`` = the sum of ``dy[o] / ties[o]`` over the windows ``o``
    that read ``i`` where ``x[i]`` equals their maximum or is their winner (a NaN
    window routes to its winner alone). ``ties`` and ``pos`` have ``y``'s strides,
    ``dy`` the strides ``gs``, ``dx`` the strides ``rs``."""
    offs, live = walk.lanes(total, BLOCK)
    n, c, i_d, ih, iw = walk.inputs(offs, C, axes, CHANNELS_LAST)
    value = tl.load(x + walk.at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, walk.candidates(axes)):
        od, oh, ow, tap, valid = walk.covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        out = walk.at(ys, n, c, od, oh, ow)
        best = tl.load(y + out, mask=valid, other=0.0).to(ACC)
        winner = tl.load(pos + out, mask=valid, other=0).to(tl.int32)
        hit = valid & ((value == best) | (winner == tap))
        g = tl.load(dy + walk.at(gs, n, c, od, oh, ow), mask=hit, other=0.0).to(ACC)
        share = tl.load(ties + out, mask=hit, other=1.0)
        acc = tl.where(hit, acc + walk.divide(g, share), acc)
    tl.store(dx + walk.at(rs, n, c, i_d, ih, iw), walk.narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def unpool_claim(indices, owner, total, count, plane, BLOCK: tl.constexpr):
    """Each entry ``k`` of ``(planes, count)`` ``indices`` claims its place in ``owner``
    (``(planes, plane)`` int32, -1 before) with an atomic maximum: the last entry that
    names a place owns it whatever the order of the claims, so the result is
    deterministic. Out-of-range indices claim nothing."""
    offs, live = walk.lanes(total, BLOCK)
    k, p = walk.split(offs, count)
    target = tl.load(indices + offs, mask=live, other=-1)
    ok = live & (target >= 0) & (target < plane)
    tl.atomic_max(owner + p * plane + target, k.to(tl.int32), mask=ok)


@triton.jit
def unpool_place(values, indices, owner, out, written, total, count, plane,
                 WRITE_VALUES: tl.constexpr, BLOCK: tl.constexpr):
    """``written[k]`` = whether entry ``k`` owns its place; with ``WRITE_VALUES`` the
    owners also write ``out[p, indices[k]] = values[k]`` (``out`` zeroed before)."""
    offs, live = walk.lanes(total, BLOCK)
    k, p = walk.split(offs, count)
    target = tl.load(indices + offs, mask=live, other=-1)
    ok = live & (target >= 0) & (target < plane)
    won = ok & (tl.load(owner + p * plane + target, mask=ok, other=-1) == k.to(tl.int32))
    tl.store(written + offs, won.to(tl.uint8), mask=live)
    if WRITE_VALUES:
        v = tl.load(values + offs, mask=won, other=0.0)
        tl.store(out + p * plane + target, v, mask=won)


@triton.jit
def unpool_gather(dout, indices, written, dy, total, count, plane, BLOCK: tl.constexpr):
    """``dy[k] = dout[p, indices[k]]`` for the entries written, else 0."""
    offs, live = walk.lanes(total, BLOCK)
    _, p = walk.split(offs, count)
    won = live & (tl.load(written + offs, mask=live, other=0) != 0)
    target = tl.load(indices + offs, mask=won, other=0)
    g = tl.load(dout + p * plane + target, mask=won, other=0.0)
    tl.store(dy + offs, tl.where(won, g, tl.zeros_like(g)), mask=live)
