"""Anti-aliased pooling (BlurPool, MaxBlurPool, AvgBlurPool): a chain of separable
line passes over each ``(n, c)`` plane, after an optional stride-1 max.

A plane is ``(D, H, W)``. The chain is the plan's pass table
(:class:`poolgrad.geometry.BlurPlan`), one row per pass::

    passes[i] = (axis, taps, stride, before, mode)
    shapes[i] = the plane's shape before pass i (shapes[-1]: the output's)
    weights[i, :taps] = the pass's filter taps

Pass ``i`` computes, along ``axis`` and for every line of the plane,
``out[o] = sum_t weights[i, t] * src[source(o * stride - before + t)]``, adding taps in
increasing ``t`` from 0. ``source`` maps a coordinate outside ``[0, L)`` by ``mode``:
0 zeros (the tap is skipped), 1 reflect (``-1 -> 1``, no edge repeat), 2 replicate
(``-1 -> 0``), 3 circular (``-1 -> L - 1``).

With ``pre_kernel`` not all ones, the chain starts from the plane's stride-1 max over
``pre_kernel`` windows (no padding): the first maximum in row-major window order, or
the first NaN, with its tap number kept in ``winners``, as :mod:`.max_pool` does.

The backward runs the passes' adjoints in reverse order (each scatters its output's
gradient back onto the taps it read, in increasing ``(o, t)``) and routes the max
map's gradient to its winners, in increasing max-map order. One worker owns a whole
plane, so there are no races and every sum has a fixed order: the same bits at any
thread count.
"""

import numpy as np
from numba import prange

from . import beats, jit, parallel_kernel

ZEROS, REFLECT, REPLICATE, CIRCULAR = 0, 1, 2, 3


@jit(inline="always")
def padded_source(i, length, mode):
    """The coordinate a tap at ``i`` reads along an axis of ``length``; -1: none (zeros)."""
    if 0 <= i < length:
        return i
    if mode == ZEROS:
        return -1
    if mode == REPLICATE:
        return 0 if i < 0 else length - 1
    if mode == CIRCULAR:
        return i % length
    if length == 1:  # reflect: the plan allows it only without padding to reflect
        return 0
    period = 2 * (length - 1)
    i = i % period
    return i if i < length else period - i


@jit(inline="always")
def _lines(shape, axis):
    """``(outer, length, inner)``: a ``shape`` plane as lines along ``axis``."""
    outer = 1
    for a in range(axis):
        outer *= shape[a]
    inner = 1
    for a in range(axis + 1, 3):
        inner *= shape[a]
    return outer, shape[axis], inner


@jit()
def _line_pass(src, shape, axis, weights, taps, stride, before, mode, out_len, out):
    """One pass of the chain on flat C-order planes: ``src`` shaped ``shape``, ``out``
    shaped ``shape`` with ``out_len`` along ``axis``."""
    outer, length, inner = _lines(shape, axis)
    zero = np.zeros(1, out.dtype)[0]
    for p in range(outer):
        for o in range(out_len):
            base = (p * out_len + o) * inner
            if inner == 1:  # a line along W: one running sum
                total = zero
                for t in range(taps):
                    i = padded_source(o * stride - before + t, length, mode)
                    if i >= 0:
                        total += weights[t] * src[p * length + i]
                out[base] = total
                continue
            for r in range(inner):
                out[base + r] = zero
            for t in range(taps):
                i = padded_source(o * stride - before + t, length, mode)
                if i < 0:
                    continue
                w = weights[t]
                read = (p * length + i) * inner
                for r in range(inner):
                    out[base + r] += w * src[read + r]


@jit()
def _line_adjoint(dout, shape, axis, weights, taps, stride, before, mode, out_len, dsrc):
    """The adjoint of :func:`_line_pass`: ``dsrc`` (shaped ``shape``) gets each
    ``weights[t] * dout[o]`` at the coordinate tap ``t`` of output ``o`` read."""
    outer, length, inner = _lines(shape, axis)
    zero = np.zeros(1, dsrc.dtype)[0]
    for k in range(outer * length * inner):
        dsrc[k] = zero
    for p in range(outer):
        for o in range(out_len):
            base = (p * out_len + o) * inner
            for t in range(taps):
                i = padded_source(o * stride - before + t, length, mode)
                if i < 0:
                    continue
                w = weights[t]
                write = (p * length + i) * inner
                for r in range(inner):
                    dsrc[write + r] += w * dout[base + r]


@jit()
def _max_map(src, shape, window, out, winners):
    """The stride-1, unpadded max over ``window`` of the flat plane ``src`` (shaped
    ``shape``) into ``out``, each window's winning tap number into ``winners``."""
    in_h, in_w = shape[1], shape[2]
    k_d, k_h, k_w = window[0], window[1], window[2]
    out_d, out_h, out_w = shape[0] - k_d + 1, in_h - k_h + 1, in_w - k_w + 1
    m = 0
    for od in range(out_d):
        for oh in range(out_h):
            for ow in range(out_w):
                best = src[(od * in_h + oh) * in_w + ow]
                best_tap = 0
                for jd in range(k_d):
                    for jh in range(k_h):
                        row = ((od + jd) * in_h + oh + jh) * in_w + ow
                        tap = (jd * k_h + jh) * k_w
                        for jw in range(k_w):
                            v = src[row + jw]
                            wins = beats(v, best)
                            best = v if wins else best
                            best_tap = tap + jw if wins else best_tap
                out[m] = best
                winners[m] = best_tap
                m += 1


@jit()
def _route_max_map(dmap, shape, window, winners, dsrc):
    """The adjoint of :func:`_max_map`: ``dsrc`` (shaped ``shape``, zeroed here) gets
    each max-map gradient at its window's winner, in increasing max-map order."""
    in_h, in_w = shape[1], shape[2]
    k_h, k_w = window[1], window[2]
    out_d, out_h, out_w = shape[0] - window[0] + 1, in_h - k_h + 1, in_w - k_w + 1
    zero = np.zeros(1, dsrc.dtype)[0]
    for k in range(shape[0] * in_h * in_w):
        dsrc[k] = zero
    m = 0
    for od in range(out_d):
        for oh in range(out_h):
            for ow in range(out_w):
                tap = winners[m]
                jw = tap % k_w
                jh = (tap // k_w) % k_h
                jd = tap // (k_w * k_h)
                dsrc[((od + jd) * in_h + oh + jh) * in_w + ow + jw] += dmap[m]
                m += 1


@jit()
def _size(shape):
    return shape[0] * shape[1] * shape[2]


@parallel_kernel
def blur_pool_forward(x, pre_kernel, passes, shapes, weights, y, winners):
    """``y`` from ``x``, planes ``(P, D, H, W)`` C-contiguous in the compute dtype;
    ``winners`` ``(P, *max map)`` when there is a max (else any array, unused)."""
    with_max = pre_kernel[0] * pre_kernel[1] * pre_kernel[2] > 1
    n_passes = passes.shape[0]
    for plane in prange(x.shape[0]):
        cur = x[plane].reshape(-1)
        if with_max:
            mapped = np.empty(_size(shapes[0]), x.dtype)
            _max_map(cur, x.shape[1:], pre_kernel, mapped, winners[plane].reshape(-1))
            cur = mapped
        out_plane = y[plane].reshape(-1)
        if n_passes == 0:
            out_plane[:] = cur
        for i in range(n_passes):
            axis, taps, stride, before, mode = (passes[i, 0], passes[i, 1], passes[i, 2],
                                                passes[i, 3], passes[i, 4])
            nxt = out_plane if i == n_passes - 1 else np.empty(_size(shapes[i + 1]), x.dtype)
            _line_pass(cur, shapes[i], axis, weights[i], taps, stride, before, mode,
                       shapes[i + 1, axis], nxt)
            cur = nxt


@parallel_kernel
def blur_pool_backward(dy, pre_kernel, passes, shapes, weights, winners, dx):
    """The adjoint of :func:`blur_pool_forward`: ``dx`` ``(P, D, H, W)`` from ``dy``."""
    with_max = pre_kernel[0] * pre_kernel[1] * pre_kernel[2] > 1
    n_passes = passes.shape[0]
    for plane in prange(dy.shape[0]):
        cur = dy[plane].reshape(-1)
        dx_plane = dx[plane].reshape(-1)
        if n_passes == 0 and not with_max:
            dx_plane[:] = cur
        for i in range(n_passes - 1, -1, -1):
            axis, taps, stride, before, mode = (passes[i, 0], passes[i, 1], passes[i, 2],
                                                passes[i, 3], passes[i, 4])
            last = i == 0 and not with_max
            prev = dx_plane if last else np.empty(_size(shapes[i]), dy.dtype)
            _line_adjoint(cur, shapes[i], axis, weights[i], taps, stride, before, mode,
                          shapes[i + 1, axis], prev)
            cur = prev
        if with_max:
            _route_max_map(cur, dx.shape[1:], pre_kernel, winners[plane].reshape(-1),
                           dx_plane)
