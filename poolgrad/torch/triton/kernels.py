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


@triton.jit
def _lanes(total, BLOCK: tl.constexpr):
    """This program's ``BLOCK`` flat positions, and which of them are below ``total``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < total


@triton.jit
def _split(offs, size):
    return offs % size, offs // size


@triton.jit
def _element(offs, C, D, H, W, CHANNELS_LAST: tl.constexpr):
    """``(n, c, d, h, w)`` of the flat positions ``offs`` in memory order."""
    if CHANNELS_LAST:
        c, rest = _split(offs, C)
        w, rest = _split(rest, W)
        h, rest = _split(rest, H)
        d, n = _split(rest, D)
    else:
        w, rest = _split(offs, W)
        h, rest = _split(rest, H)
        d, rest = _split(rest, D)
        c, n = _split(rest, C)
    return n, c, d, h, w


@triton.jit
def _inputs(offs, C, axes, CHANNELS_LAST: tl.constexpr):
    """:func:`_element` over the input's extents (a backward's lanes)."""
    d, h, w = axes
    return _element(offs, C, d[0], h[0], w[0], CHANNELS_LAST)


@triton.jit
def _outputs(offs, C, axes, CHANNELS_LAST: tl.constexpr):
    """:func:`_element` over the windows' extents (a forward's lanes)."""
    d, h, w = axes
    return _element(offs, C, d[1], h[1], w[1], CHANNELS_LAST)


@triton.jit
def _at(strides, n, c, d, h, w):
    """The element offset of ``(n, c, d, h, w)`` in a tensor of ``strides``."""
    return n * strides[0] + c * strides[1] + d * strides[2] + h * strides[3] + w * strides[4]


@triton.jit
def _narrow(v, dtype: tl.constexpr):
    """``v`` in ``dtype``; float32 to bfloat16 rounded to nearest even in integer
    arithmetic, as torch converts on the CPU (Triton's interpreter truncates)."""
    if (dtype == tl.bfloat16) and (v.dtype == tl.float32):
        bits = v.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(v != v, 0x7FC0, rounded)  # any NaN: the quiet NaN
        out = rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        out = v.to(dtype)
    return out


@triton.jit
def _window(o, axis, ADAPTIVE: tl.constexpr):
    """Window ``o`` of an axis: ``(start, first, end, padded)``. Tap ``j`` reads
    ``start + j * dilation``; taps ``[first, end)`` are inside the input; ``padded``
    counts the taps from 0 inside the padded input (count_include_pad's divisor)."""
    length, count, extent, stride, before, after, dilation, _ = axis
    if ADAPTIVE:
        start = o * length // count
        end = ((o + 1) * length + count - 1) // count - start
        first = o * 0
        padded = end
    else:
        start = o * stride - before
        # ceil(-start / dilation) taps lie in the front padding (none when start >= 0)
        first = tl.maximum(before - o * stride + dilation - 1, 0) // dilation
        end = tl.minimum(extent, (length - 1 - start) // dilation + 1)
        padded = tl.minimum(extent, (length + after - 1 - start) // dilation + 1)
    return start, first, end, padded


@triton.jit
def _windows(od, oh, ow, axes, ADAPTIVE: tl.constexpr):
    """:func:`_window` of each lane's window along D, H and W."""
    d, h, w = axes
    return _window(od, d, ADAPTIVE), _window(oh, h, ADAPTIVE), _window(ow, w, ADAPTIVE)


@triton.jit
def _taps(axes):
    """How many taps a window has: the product of the extents."""
    d, h, w = axes
    return d[2] * h[2] * w[2]


@triton.jit
def _cover(i, t, axis, ADAPTIVE: tl.constexpr):
    """The ``t``-th candidate window that reads coordinate ``i``, in increasing window
    order: ``(o, tap, valid)``. Sliding axes try the taps from the last to the first
    (``t`` runs to ``extent``); adaptive ones the bins from the first that holds ``i``
    (``t`` runs to the axis's largest cover count)."""
    length, count, extent, stride, before, _, dilation, _ = axis
    if ADAPTIVE:
        o = i * count // length + t
        start = o * length // count
        valid = (o < count) & (start <= i)
        j = i - start
    else:
        j = extent - 1 - t
        reach = i + before - j * dilation
        clamped = tl.maximum(reach, 0)
        o = clamped // stride
        valid = (reach >= 0) & (clamped % stride == 0) & (o < count)
    return o, j, valid


@triton.jit
def _tap(t, axes, windows, strides, live):
    """Tap ``t`` (its number: row-major over the extents) of each lane's window: its
    offset from the lane's ``(n, c)`` plane in a tensor of ``strides``, and whether it
    is a real tap."""
    d, h, w = axes
    (sd, fd, ed, _), (sh, fh, eh, _), (sw, fw, ew, _) = windows
    jd = t // (h[2] * w[2])
    jh = (t // w[2]) % h[2]
    jw = t % w[2]
    real = live & (jd >= fd) & (jd < ed) & (jh >= fh) & (jh < eh) & (jw >= fw) & (jw < ew)
    offset = (sd + jd * d[6]) * strides[2] + (sh + jh * h[6]) * strides[3] + (
        sw + jw * w[6]) * strides[4]
    return offset, real


@triton.jit
def _candidates(axes):
    """How many candidate windows a backward visits per input element."""
    d, h, w = axes
    return d[7] * h[7] * w[7]


@triton.jit
def _covering(t, i_d, ih, iw, axes, ADAPTIVE: tl.constexpr):
    """The ``t``-th candidate window over each lane's input element, in increasing
    window order (row-major over the axes' candidates, :func:`_cover`): ``(od, oh, ow,
    the tap number that reads the element, valid)``."""
    d, h, w = axes
    od, jd, vd = _cover(i_d, t // (h[7] * w[7]), d, ADAPTIVE)
    oh, jh, vh = _cover(ih, (t // w[7]) % h[7], h, ADAPTIVE)
    ow, jw, vw = _cover(iw, t % w[7], w, ADAPTIVE)
    return od, oh, ow, (jd * h[2] + jh) * w[2] + jw, vd & vh & vw


@triton.jit
def max_forward(x, y, pos, total, C, axes, xs, ys,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, RECORD: tl.constexpr,
                ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y`` = each window's maximum over its real taps; with ``RECORD``, ``pos`` = its
    tap number (``pos`` has ``y``'s strides)."""
    offs, live = _lanes(total, BLOCK)
    n, c, od, oh, ow = _outputs(offs, C, axes, CHANNELS_LAST)
    windows = _windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    best = tl.zeros([BLOCK], dtype=x.dtype.element_ty)
    top = tl.zeros([BLOCK], dtype=ACC)
    tap = tl.zeros([BLOCK], dtype=tl.int32)
    found = offs < 0  # no tap folded yet
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
        v = tl.load(x + base + offset, mask=real, other=0.0)
        # compared widened (exact; the interpreter has no 16-bit float compare), kept
        # as loaded
        wide = v.to(ACC)
        # the first real tap, a larger one, or the first NaN (best stays NaN)
        wins = real & (~found | ((top == top) & ((wide > top) | (wide != wide))))
        best = tl.where(wins, v, best)
        top = tl.where(wins, wide, top)
        # as int32 whatever type the loop counter has (int64 with large arguments)
        tap = tl.where(wins, (tl.zeros_like(tap) + t).to(tl.int32), tap)
        found = found | real
    out = _at(ys, n, c, od, oh, ow)
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
    offs, live = _lanes(total, BLOCK)
    n, c, i_d, ih, iw = _inputs(offs, C, axes, CHANNELS_LAST)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _candidates(axes)):
        od, oh, ow, tap, valid = _covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        winner = tl.load(pos + _at(ps, n, c, od, oh, ow), mask=valid, other=0)
        hit = valid & (winner.to(tl.int32) == tap)
        g = tl.load(dy + _at(gs, n, c, od, oh, ow), mask=hit, other=0.0)
        acc = tl.where(hit, acc + g.to(ACC), acc)
    tl.store(dx + _at(xs, n, c, i_d, ih, iw), _narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def max_gather(src, pos, out, total, C, axes, ss, ps, outs,
               ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, INDICES: tl.constexpr,
               BLOCK: tl.constexpr):
    """Per window, from its winning tap: ``src`` read at the winner (``out`` has the
    windows' shape), or with ``INDICES`` the winner's flat position in its ``(n, c)``
    input plane (PyTorch's max-pool indices; ``src`` unused)."""
    offs, live = _lanes(total, BLOCK)
    n, c, o_d, o_h, o_w = _outputs(offs, C, axes, CHANNELS_LAST)
    d, h, w = axes
    tap = tl.load(pos + _at(ps, n, c, o_d, o_h, o_w), mask=live, other=0).to(tl.int64)
    jw = tap % w[2]
    jh = (tap // w[2]) % h[2]
    jd = tap // (w[2] * h[2])
    (start_d, _, _, _), (start_h, _, _, _), (start_w, _, _, _) = _windows(o_d, o_h, o_w,
                                                                          axes, ADAPTIVE)
    cd, ch, cw = start_d + jd * d[6], start_h + jh * h[6], start_w + jw * w[6]
    target = out + _at(outs, n, c, o_d, o_h, o_w)
    if INDICES:
        tl.store(target, (cd * h[0] + ch) * w[0] + cw, mask=live)
    else:
        v = tl.load(src + _at(ss, n, c, cd, ch, cw), mask=live, other=0)
        tl.store(target, v, mask=live)


@triton.jit
def _divide(a, b):
    """``a / b`` correctly rounded (IEEE), as the CPU divides: Triton's plain ``/`` may
    lower float32 to a faster, less exact division on a GPU (float64's is exact)."""
    if a.dtype == tl.float64:
        quotient = a / b
    else:
        quotient = tl.math.fdiv(a, b, ieee_rounding=True)
    return quotient


@triton.jit
def _divisor(windows, override, MODE: tl.constexpr, ACC: tl.constexpr):
    """A window's divisor: 0 ``padded`` (count_include_pad), 1 ``real`` taps only,
    2 ``override``; the product of per-axis factors in the CPU's order."""
    (_, fd, ed, pdd), (_, fh, eh, pdh), (_, fw, ew, pdw) = windows
    if MODE == 0:
        return (pdd.to(ACC) * pdh.to(ACC)) * pdw.to(ACC)
    elif MODE == 1:
        return ((ed - fd).to(ACC) * (eh - fh).to(ACC)) * (ew - fw).to(ACC)
    else:
        return (fd * 0 + override).to(ACC)


@triton.jit
def avg_forward(x, y, total, C, override, axes, xs, ys,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, MODE: tl.constexpr,
                ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y`` = the sum of each window's real taps, row-major from +0, over its divisor
    (:func:`_divisor`)."""
    offs, live = _lanes(total, BLOCK)
    n, c, od, oh, ow = _outputs(offs, C, axes, CHANNELS_LAST)
    windows = _windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
        v = tl.load(x + base + offset, mask=real, other=0.0)
        acc = tl.where(real, acc + v.to(ACC), acc)
    divisor = _divisor(windows, override, MODE, ACC)
    tl.store(y + _at(ys, n, c, od, oh, ow), _narrow(_divide(acc, divisor), y.dtype.element_ty),
             mask=live)


@triton.jit
def avg_backward(dy, dx, total, C, override, axes, gs, xs,
                 ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, MODE: tl.constexpr,
                 ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``dx[i]`` = the sum of ``dy[o] / divisor[o]`` over the windows that read ``i``,
    in increasing window order from +0."""
    offs, live = _lanes(total, BLOCK)
    n, c, i_d, ih, iw = _inputs(offs, C, axes, CHANNELS_LAST)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _candidates(axes)):
        od, oh, ow, _, valid = _covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        g = tl.load(dy + _at(gs, n, c, od, oh, ow), mask=valid, other=0.0)
        divisor = _divisor(_windows(od, oh, ow, axes, ADAPTIVE), override, MODE, ACC)
        acc = tl.where(valid, acc + _divide(g.to(ACC), divisor), acc)
    tl.store(dx + _at(xs, n, c, i_d, ih, iw), _narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def _power(a, b):
    """``a ** b`` for ``a >= 0`` and ``b > 0`` (``0 ** b`` is 0)."""
    return tl.exp2(b * tl.log2(a))


@triton.jit
def lp_forward(x, y, total, C, exponents, axes, xs, ys,
               ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, P_KIND: tl.constexpr,
               ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``y = (sum over the real taps of |x|^p) ^ (1/p)``, as ``m * (sum (|x|/m)^p)^(1/p)``
    with ``m`` the window's largest ``|x|`` (no overflow or underflow for large ``p``).
    ``P_KIND``: 1 or 2 for those ``p``, 0 for any other. ``exponents``: ``[p, 1/p, p-1]``
    in ``ACC`` (a float argument would reach the kernel as float32)."""
    offs, live = _lanes(total, BLOCK)
    n, c, od, oh, ow = _outputs(offs, C, axes, CHANNELS_LAST)
    windows = _windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    scale = tl.full([BLOCK], 1.0, dtype=ACC)
    if P_KIND != 1:
        largest = tl.zeros([BLOCK], dtype=ACC)
        for t in range(0, _taps(axes)):
            offset, real = _tap(t, axes, windows, xs, live)
            v = tl.abs(tl.load(x + base + offset, mask=real, other=0.0).to(ACC))
            largest = tl.where(real & (v > largest), v, largest)
        # all zeros, or an infinity: no scaling (the sum gives 0, inf or NaN)
        scale = tl.where((largest > 0) & (largest < float("inf")), largest, scale)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
        v = tl.abs(tl.load(x + base + offset, mask=real, other=0.0).to(ACC)) / scale
        if P_KIND == 2:
            term = v * v
        elif P_KIND == 1:
            term = v
        else:
            term = _power(v, tl.load(exponents))
        acc = tl.where(real, acc + term, acc)
    if P_KIND == 2:
        result = scale * tl.sqrt(acc)
    elif P_KIND == 1:
        result = acc
    else:
        result = scale * _power(acc, tl.load(exponents + 1))
    tl.store(y + _at(ys, n, c, od, oh, ow), _narrow(result, y.dtype.element_ty), mask=live)


@triton.jit
def lp_backward(x, y, dy, dx, total, C, exponents, axes, xs, ys, gs, rs,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, P_KIND: tl.constexpr,
                ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``dx[i]`` = the sum over the windows ``o`` that read ``i`` of
    ``dy[o] * sign(x[i]) * (|x[i]| / y[o])^(p-1)``; a window with ``y = 0`` sends 0 (the
    subgradient at 0). ``dy`` has the strides ``gs``, ``dx`` the strides ``rs``."""
    offs, live = _lanes(total, BLOCK)
    n, c, i_d, ih, iw = _inputs(offs, C, axes, CHANNELS_LAST)
    value = tl.load(x + _at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    magnitude = tl.abs(value)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _candidates(axes)):
        od, oh, ow, _, valid = _covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid & (value != 0)
        norm = tl.load(y + _at(ys, n, c, od, oh, ow), mask=valid, other=1.0).to(ACC)
        g = tl.load(dy + _at(gs, n, c, od, oh, ow), mask=valid, other=0.0).to(ACC)
        if P_KIND == 2:
            share = magnitude / norm
        elif P_KIND == 1:
            share = tl.full([BLOCK], 1.0, dtype=ACC)
        else:
            share = _power(magnitude / norm, tl.load(exponents + 2))
        acc = tl.where(valid & (norm != 0), acc + g * share, acc)
    acc = tl.where(value < 0, -acc, acc)
    tl.store(dx + _at(rs, n, c, i_d, ih, iw), _narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def max_tie_count(x, y, ties, total, C, axes, xs, ys,
                  ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                  BLOCK: tl.constexpr):
    """``ties`` = how many real taps of each window equal its maximum ``y`` (1 for a
    NaN window), in ``ACC`` (``ties`` has ``y``'s strides)."""
    offs, live = _lanes(total, BLOCK)
    n, c, od, oh, ow = _outputs(offs, C, axes, CHANNELS_LAST)
    windows = _windows(od, oh, ow, axes, ADAPTIVE)
    out = _at(ys, n, c, od, oh, ow)
    best = tl.load(y + out, mask=live, other=0.0).to(ACC)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
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
    offs, live = _lanes(total, BLOCK)
    n, c, i_d, ih, iw = _inputs(offs, C, axes, CHANNELS_LAST)
    value = tl.load(x + _at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _candidates(axes)):
        od, oh, ow, tap, valid = _covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = live & valid
        out = _at(ys, n, c, od, oh, ow)
        best = tl.load(y + out, mask=valid, other=0.0).to(ACC)
        winner = tl.load(pos + out, mask=valid, other=0).to(tl.int32)
        hit = valid & ((value == best) | (winner == tap))
        g = tl.load(dy + _at(gs, n, c, od, oh, ow), mask=hit, other=0.0).to(ACC)
        share = tl.load(ties + out, mask=hit, other=1.0)
        acc = tl.where(hit, acc + _divide(g, share), acc)
    tl.store(dx + _at(rs, n, c, i_d, ih, iw), _narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def unpool_claim(indices, owner, total, count, plane, BLOCK: tl.constexpr):
    """Each entry ``k`` of ``(planes, count)`` ``indices`` claims its place in ``owner``
    (``(planes, plane)`` int32, -1 before) with an atomic maximum: the last entry that
    names a place owns it whatever the order of the claims, so the result is
    deterministic. Out-of-range indices claim nothing."""
    offs, live = _lanes(total, BLOCK)
    k, p = _split(offs, count)
    target = tl.load(indices + offs, mask=live, other=-1)
    ok = live & (target >= 0) & (target < plane)
    tl.atomic_max(owner + p * plane + target, k.to(tl.int32), mask=ok)


@triton.jit
def unpool_place(values, indices, owner, out, written, total, count, plane,
                 WRITE_VALUES: tl.constexpr, BLOCK: tl.constexpr):
    """``written[k]`` = whether entry ``k`` owns its place; with ``WRITE_VALUES`` the
    owners also write ``out[p, indices[k]] = values[k]`` (``out`` zeroed before)."""
    offs, live = _lanes(total, BLOCK)
    k, p = _split(offs, count)
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
    offs, live = _lanes(total, BLOCK)
    _, p = _split(offs, count)
    won = live & (tl.load(written + offs, mask=live, other=0) != 0)
    target = tl.load(indices + offs, mask=won, other=0)
    g = tl.load(dout + p * plane + target, mask=won, other=0.0)
    tl.store(dy + offs, tl.where(won, g, tl.zeros_like(g)), mask=live)


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
    offs, live = _lanes(total, BLOCK)
    n, c, od, oh, ow = _outputs(offs, C, axes, CHANNELS_LAST)
    windows = _windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    p, eps = _gem_constants(power, clamp, ACC)
    largest = tl.zeros([BLOCK], dtype=ACC) + eps
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
        z = _clamped(tl.load(x + base + offset, mask=real, other=0.0).to(ACC), eps)
        largest = tl.where(real & (z > largest), z, largest)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
        z = _clamped(tl.load(x + base + offset, mask=real, other=0.0).to(ACC), eps)
        acc = tl.where(real, acc + _power(z / largest, p), acc)
    count = _divisor(windows, 0, 1, ACC)
    result = largest * _power(acc / count, 1.0 / p)
    tl.store(y + _at(ys, n, c, od, oh, ow), _narrow(result, y.dtype.element_ty), mask=live)


@triton.jit
def gem_backward(x, y, dy, power, clamp, dx, total, C, axes, xs, ys, gs, rs,
                 ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                 BLOCK: tl.constexpr):
    """``dx[i]`` = the sum over the windows ``o`` that read ``i`` of
    ``dy[o] / K[o] * (x[i] / y[o])^(p-1)``, in increasing window order, where
    ``x[i] >= eps``; else 0. ``dy`` has the strides ``gs``, ``dx`` the strides ``rs``."""
    offs, live = _lanes(total, BLOCK)
    n, c, i_d, ih, iw = _inputs(offs, C, axes, CHANNELS_LAST)
    p, eps = _gem_constants(power, clamp, ACC)
    value = tl.load(x + _at(xs, n, c, i_d, ih, iw), mask=live, other=0.0).to(ACC)
    passes = live & (value >= eps)
    acc = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _candidates(axes)):
        od, oh, ow, _, valid = _covering(t, i_d, ih, iw, axes, ADAPTIVE)
        valid = passes & valid
        mean = tl.load(y + _at(ys, n, c, od, oh, ow), mask=valid, other=1.0).to(ACC)
        g = tl.load(dy + _at(gs, n, c, od, oh, ow), mask=valid, other=0.0).to(ACC)
        count = _divisor(_windows(od, oh, ow, axes, ADAPTIVE), 0, 1, ACC)
        acc = tl.where(valid, acc + g / count * _power(value / mean, p - 1.0), acc)
    tl.store(dx + _at(rs, n, c, i_d, ih, iw), _narrow(acc, dx.dtype.element_ty), mask=live)


@triton.jit
def gem_p_terms(x, y, dy, power, clamp, terms, total, C, axes, xs, ys, gs, ts,
                ADAPTIVE: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACC: tl.constexpr,
                BLOCK: tl.constexpr):
    """Each window's term of ``dp``: ``dy * (y / p) * S1 / S0``, ``r = z / y``,
    ``S0 = sum r^p`` and ``S1 = sum r^p log r`` over its real taps (``terms`` has ``y``'s
    shape and the strides ``ts``; their sum, a separate reduction, is ``dp``)."""
    offs, live = _lanes(total, BLOCK)
    n, c, od, oh, ow = _outputs(offs, C, axes, CHANNELS_LAST)
    windows = _windows(od, oh, ow, axes, ADAPTIVE)
    base = n * xs[0] + c * xs[1]
    p, eps = _gem_constants(power, clamp, ACC)
    mean = tl.load(y + _at(ys, n, c, od, oh, ow), mask=live, other=1.0).to(ACC)
    g = tl.load(dy + _at(gs, n, c, od, oh, ow), mask=live, other=0.0).to(ACC)
    s0 = tl.zeros([BLOCK], dtype=ACC)
    s1 = tl.zeros([BLOCK], dtype=ACC)
    for t in range(0, _taps(axes)):
        offset, real = _tap(t, axes, windows, xs, live)
        z = _clamped(tl.load(x + base + offset, mask=real, other=1.0).to(ACC), eps)
        r = z / mean
        raised = _power(r, p)
        s0 = tl.where(real, s0 + raised, s0)
        s1 = tl.where(real, s1 + raised * tl.log(r), s1)
    tl.store(terms + _at(ts, n, c, od, oh, ow), g * (mean / p) * s1 / s0, mask=live)
