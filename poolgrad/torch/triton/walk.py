"""How a Triton kernel walks its tensors: lanes, elements, windows and the windows that
cover an input element, recomputed per lane from the axes' tuples (the contract is in
:mod:`.kernels`), and the arithmetic every family shares (a correctly rounded division,
an average's divisor, ``pow`` for non-negative bases, the CPU's bfloat16 rounding).
Kernels of every family call these as ``walk.<name>``."""

import triton
import triton.language as tl


@triton.jit
def lanes(total, BLOCK: tl.constexpr):
    """This program's ``BLOCK`` flat positions, and which of them are below ``total``."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < total


@triton.jit
def split(offs, size):
    return offs % size, offs // size


@triton.jit
def element(offs, C, D, H, W, CHANNELS_LAST: tl.constexpr):
    """``(n, c, d, h, w)`` of the flat positions ``offs`` in memory order."""
    if CHANNELS_LAST:
        c, rest = split(offs, C)
        w, rest = split(rest, W)
        h, rest = split(rest, H)
        d, n = split(rest, D)
    else:
        w, rest = split(offs, W)
        h, rest = split(rest, H)
        d, rest = split(rest, D)
        c, n = split(rest, C)
    return n, c, d, h, w


@triton.jit
def inputs(offs, C, axes, CHANNELS_LAST: tl.constexpr):
    """:func:`element` over the input's extents (a backward's lanes)."""
    d, h, w = axes
    return element(offs, C, d[0], h[0], w[0], CHANNELS_LAST)


@triton.jit
def outputs(offs, C, axes, CHANNELS_LAST: tl.constexpr):
    """:func:`element` over the windows' extents (a forward's lanes)."""
    d, h, w = axes
    return element(offs, C, d[1], h[1], w[1], CHANNELS_LAST)


@triton.jit
def at(strides, n, c, d, h, w):
    """The element offset of ``(n, c, d, h, w)`` in a tensor of ``strides``."""
    return n * strides[0] + c * strides[1] + d * strides[2] + h * strides[3] + w * strides[4]


@triton.jit
def narrow(v, dtype: tl.constexpr):
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
def beats(v, best):
    """Whether a later tap ``v`` replaces the running maximum ``best`` (both widened):
    it is larger, or it is the first NaN (once ``best`` is NaN nothing replaces it), the
    CPU's rule (:func:`poolgrad.kernels.beats`)."""
    return (best == best) & ((v > best) | (v != v))


@triton.jit
def window(o, axis, ADAPTIVE: tl.constexpr):
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
def windows(od, oh, ow, axes, ADAPTIVE: tl.constexpr):
    """:func:`window` of each lane's window along D, H and W."""
    d, h, w = axes
    return window(od, d, ADAPTIVE), window(oh, h, ADAPTIVE), window(ow, w, ADAPTIVE)


@triton.jit
def taps(axes):
    """How many taps a window has: the product of the extents."""
    d, h, w = axes
    return d[2] * h[2] * w[2]


@triton.jit
def cover(i, t, axis, ADAPTIVE: tl.constexpr):
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
def tap(t, axes, windows, strides, live):
    """Tap ``t`` (its number: row-major over the extents) of each lane's window: its
    offset from the lane's ``(n, c)`` plane in a tensor of ``strides``, and whether it
    is a real tap."""
    d, h, w = axes
    # (one level of unpacking at a time: Triton 3.6 cannot walk nested targets)
    window_d, window_h, window_w = windows
    sd, fd, ed, _ = window_d
    sh, fh, eh, _ = window_h
    sw, fw, ew, _ = window_w
    jd = t // (h[2] * w[2])
    jh = (t // w[2]) % h[2]
    jw = t % w[2]
    real = live & (jd >= fd) & (jd < ed) & (jh >= fh) & (jh < eh) & (jw >= fw) & (jw < ew)
    offset = (sd + jd * d[6]) * strides[2] + (sh + jh * h[6]) * strides[3] + (
        sw + jw * w[6]) * strides[4]
    return offset, real


@triton.jit
def candidates(axes):
    """How many candidate windows a backward visits per input element."""
    d, h, w = axes
    return d[7] * h[7] * w[7]


@triton.jit
def covering(t, i_d, ih, iw, axes, ADAPTIVE: tl.constexpr):
    """The ``t``-th candidate window over each lane's input element, in increasing
    window order (row-major over the axes' candidates, :func:`cover`): ``(od, oh, ow,
    the tap number that reads the element, valid)``."""
    d, h, w = axes
    od, jd, vd = cover(i_d, t // (h[7] * w[7]), d, ADAPTIVE)
    oh, jh, vh = cover(ih, (t // w[7]) % h[7], h, ADAPTIVE)
    ow, jw, vw = cover(iw, t % w[7], w, ADAPTIVE)
    return od, oh, ow, (jd * h[2] + jh) * w[2] + jw, vd & vh & vw


@triton.jit
def divide(a, b):
    """``a / b`` correctly rounded (IEEE), as the CPU divides: Triton's plain ``/`` may
    lower float32 to a faster, less exact division on a GPU (float64's is exact).
    ``div_rn``, not ``fdiv(..., ieee_rounding=True)``: Triton 3.6's ``fdiv`` ignores
    that flag and gives the approximate division (seen in its sm_90 PTX)."""
    if a.dtype == tl.float64:
        quotient = a / b
    else:
        quotient = tl.math.div_rn(a, b)
    return quotient


@triton.jit
def divisor(windows, override, MODE: tl.constexpr, ACC: tl.constexpr):
    """A window's divisor: 0 ``padded`` (count_include_pad), 1 ``real`` taps only,
    2 ``override``; the product of per-axis factors in the CPU's order."""
    window_d, window_h, window_w = windows
    _, fd, ed, pdd = window_d
    _, fh, eh, pdh = window_h
    _, fw, ew, pdw = window_w
    if MODE == 0:
        return (pdd.to(ACC) * pdh.to(ACC)) * pdw.to(ACC)
    elif MODE == 1:
        return ((ed - fd).to(ACC) * (eh - fh).to(ACC)) * (ew - fw).to(ACC)
    else:
        return (fd * 0 + override).to(ACC)


@triton.jit
def power(a, b):
    """``a ** b`` for ``a >= 0`` and ``b > 0`` (``0 ** b`` is 0)."""
    return tl.exp2(b * tl.log2(a))
