"""Adaptive polyphase sampling (APS: Chaman & Dokmanic, CVPR 2021): each example's
polyphase components, their norms, the gather of the component chosen and the scatter
of its gradient back.

Arrays are 5-d ``(N, C, D, H, W)`` views of any strides, ``steps`` ``(3,)`` int64 the
stride per axis (1 on an unused axis). The input is taken as padded circularly to
``M = ceil(L / s)`` strides along each axis, and component ``(a, b, e)`` (``0 <= a <
s_d``, ...; numbered ``phase = (a * s_h + b) * s_w + e``, row-major) of example ``n``
is ``x[n, c, (a + i s_d) mod D, (b + j s_h) mod H, (e + k s_w) mod W]`` for ``i < M_d,
j < M_h, k < M_w``. Within one component no two positions wrap onto the same element
(that would need ``L`` to be a multiple of ``s``, where nothing wraps), so the gather is
a permutation of part of x and its transpose a scatter with no sums.

:func:`phase_norms` writes ``partials[n, c, phase]``, plane ``(n, c)``'s share of the
component's norm, in float64 whatever x's dtype: the sum of ``v * v`` (``L2``, the
squared l2 norm, which orders the components as the norm does), of ``|v|`` (``L1``),
or the largest ``|v|`` (``MAX``, a NaN if any ``v`` is). Each plane runs on one
thread, its positions in memory order, so the caller, which adds the planes in
channel order, gets the same bits at any thread count and in either layout.
"""

import numpy as np
from numba import prange

from . import parallel_kernel
from .walk import helper, inlined

L2, L1, MAX = 0, 1, 2  # the norms
LANES = 8  # the partial sums of a row's share


@helper
def phase_axes(phase, steps):
    """``(a, b, e)``: the per-axis offsets of component ``phase``."""
    e = phase % steps[2]
    rest = phase // steps[2]
    return rest // steps[1], rest % steps[1], e


@inlined
def _wrapped(i, length):
    """``i mod length`` for ``i >= 0``: one subtraction in the usual case of one wrap."""
    while i >= length:
        i -= length
    return i


@inlined
def _row_norm(row, start, step, count, norm, lanes):
    """The norm's share of ``row[(start + k step) mod len(row)]``, ``k < count``: a sum
    in :data:`LANES` lanes (lane ``l`` adds the ``k = l mod LANES`` in increasing ``k``,
    then the lanes by halving), or the largest ``|v|`` (NaN if any ``v`` is)."""
    width = row.shape[0]
    inside = min(count, (width - start + step - 1) // step) if start < width else 0
    if norm == MAX:
        largest = 0.0
        for k in range(count):
            at = start + k * step if k < inside else _wrapped(start + k * step, width)
            size = abs(np.float64(row[at]))
            if size != size or largest != largest:
                largest = np.nan
            elif size > largest:
                largest = size
        return largest
    lanes[:] = 0.0
    full = inside - inside % LANES
    for first in range(0, full, LANES):
        for lane in range(LANES):
            v = np.float64(row[start + (first + lane) * step])
            lanes[lane] += v * v if norm == L2 else abs(v)
    for k in range(full, count):
        v = np.float64(row[start + k * step if k < inside else
                           _wrapped(start + k * step, width)])
        lanes[k - full] += v * v if norm == L2 else abs(v)
    half = LANES // 2
    while half >= 1:
        for lane in range(half):
            lanes[lane] += lanes[lane + half]
        half //= 2
    return lanes[0]


@parallel_kernel
def phase_norms(x, steps, norm, partials):
    """``partials[n, c, phase]``: plane ``(n, c)``'s share of each component's norm (the
    module docstring), its rows in order: the sum (``L2``, ``L1``) adds each row's
    share, itself summed in lanes (:func:`_row_norm`), in increasing row order; ``MAX``
    keeps the largest."""
    n_batch, n_chan, depth, height, width = x.shape
    count_d, count_h = -(-depth // steps[0]), -(-height // steps[1])
    count_w = -(-width // steps[2])
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        acc = partials[n, c]
        acc[:] = 0.0
        lanes = np.empty(LANES, np.float64)
        for pd in range(count_d * steps[0]):
            for ph in range(count_h * steps[1]):
                row = x[n, c, _wrapped(pd, depth), _wrapped(ph, height)]
                first = ((pd % steps[0]) * steps[1] + ph % steps[1]) * steps[2]
                for e in range(steps[2]):
                    share = _row_norm(row, e, steps[2], count_w, norm, lanes)
                    if norm != MAX:
                        acc[first + e] += share
                    elif share != share or acc[first + e] != acc[first + e]:
                        acc[first + e] = np.nan
                    elif share > acc[first + e]:
                        acc[first + e] = share


@parallel_kernel
def phase_gather(x, steps, phases, y):
    """``y[n]``: component ``phases[n]`` of ``x[n]`` (``y`` ``(N, C, M_d, M_h, M_w)``)."""
    n_batch, n_chan, depth, height, width = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(n_batch * n_chan * out_d * out_h):
        plane, i, j = row // (out_d * out_h), (row // out_h) % out_d, row % out_h
        n, c = plane // n_chan, plane % n_chan
        a, b, e = phase_axes(phases[n], steps)
        source = x[n, c, _wrapped(a + i * steps[0], depth), _wrapped(b + j * steps[1], height)]
        target = y[n, c, i, j]
        for k in range(out_w):
            target[k] = source[_wrapped(e + k * steps[2], width)]


@parallel_kernel
def phase_scatter(dy, steps, phases, dx):
    """``dx[n]``: ``dy[n]`` at the positions of component ``phases[n]``, 0 elsewhere
    (the transpose of :func:`phase_gather`); each plane of ``dx`` written by one
    thread."""
    n_batch, n_chan, depth, height, width = dx.shape
    out_d, out_h, out_w = dy.shape[2], dy.shape[3], dy.shape[4]
    zero = np.zeros(1, dx.dtype)[0]
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        target = dx[n, c]
        for d in range(depth):
            for h in range(height):
                for w in range(width):
                    target[d, h, w] = zero
        a, b, e = phase_axes(phases[n], steps)
        for i in range(out_d):
            xd = _wrapped(a + i * steps[0], depth)
            for j in range(out_h):
                row = target[xd, _wrapped(b + j * steps[1], height)]
                source = dy[n, c, i, j]
                for k in range(out_w):
                    row[_wrapped(e + k * steps[2], width)] = source[k]


CHANNEL_BLOCK = 16  # the channels a channels-last task sums at once (one AVX-512 vector)


@parallel_kernel
def phase_norms_channels_last(x, steps, norm, partials):
    """:func:`phase_norms` for a channels-last x (channels contiguous), with its sums in
    its order and so its bits: each task takes one example's block of channels and reads
    a pixel's channels at once, where the planes' kernel would read each plane's row
    with a stride of C (16 times the memory traffic)."""
    n_batch, n_chan, depth, height, width = x.shape
    count_d, count_h = -(-depth // steps[0]), -(-height // steps[1])
    count_w = -(-width // steps[2])
    blocks = -(-n_chan // CHANNEL_BLOCK)
    for task in prange(n_batch * blocks):
        n, first = task // blocks, (task % blocks) * CHANNEL_BLOCK
        size = min(CHANNEL_BLOCK, n_chan - first)
        acc = partials[n, first:first + size]
        acc[:, :] = 0.0
        lanes = np.empty((LANES, CHANNEL_BLOCK), np.float64)
        for pd in range(count_d * steps[0]):
            for ph in range(count_h * steps[1]):
                xd, xh = _wrapped(pd, depth), _wrapped(ph, height)
                row_phase = ((pd % steps[0]) * steps[1] + ph % steps[1]) * steps[2]
                for e in range(steps[2]):
                    lanes[:, :] = 0.0
                    for k in range(count_w):
                        pixel = x[n, first:first + size, xd, xh, _wrapped(e + k * steps[2],
                                                                           width)]
                        lane = lanes[k % LANES]
                        for c in range(size):
                            v = np.float64(pixel[c])
                            if norm == MAX:
                                size_v = abs(v)
                                if size_v != size_v or lane[c] != lane[c]:
                                    lane[c] = np.nan
                                elif size_v > lane[c]:
                                    lane[c] = size_v
                            else:
                                lane[c] += v * v if norm == L2 else abs(v)
                    at = row_phase + e
                    for c in range(size):
                        if norm == MAX:
                            share = lanes[0, c]
                            for lane_index in range(1, LANES):
                                other = lanes[lane_index, c]
                                if other != other or share != share:
                                    share = np.nan
                                elif other > share:
                                    share = other
                            if share != share or acc[c, at] != acc[c, at]:
                                acc[c, at] = np.nan
                            elif share > acc[c, at]:
                                acc[c, at] = share
                            continue
                        half = LANES // 2
                        while half >= 1:
                            for lane_index in range(half):
                                lanes[lane_index, c] += lanes[lane_index + half, c]
                            half //= 2
                        acc[c, at] += lanes[0, c]


@parallel_kernel
def phase_gather_channels_last(x, steps, phases, y):
    """:func:`phase_gather` for channels-last ``x`` and ``y``: a pixel's channels at a
    time."""
    n_batch, n_chan, depth, height, width = x.shape
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(n_batch * out_d * out_h):
        n, i, j = row // (out_d * out_h), (row // out_h) % out_d, row % out_h
        a, b, e = phase_axes(phases[n], steps)
        xd, xh = _wrapped(a + i * steps[0], depth), _wrapped(b + j * steps[1], height)
        for k in range(out_w):
            source = x[n, :, xd, xh, _wrapped(e + k * steps[2], width)]
            target = y[n, :, i, j, k]
            for c in range(n_chan):
                target[c] = source[c]


@parallel_kernel
def phase_scatter_channels_last(dy, steps, phases, dx):
    """:func:`phase_scatter` for channels-last ``dy`` and ``dx``: each example's ``dx``
    zeroed and written by one task, a pixel's channels at a time."""
    n_batch, n_chan, depth, height, width = dx.shape
    out_d, out_h, out_w = dy.shape[2], dy.shape[3], dy.shape[4]
    zero = np.zeros(1, dx.dtype)[0]
    for n in prange(n_batch):
        for d in range(depth):
            for h in range(height):
                for w in range(width):
                    pixel = dx[n, :, d, h, w]
                    for c in range(n_chan):
                        pixel[c] = zero
        a, b, e = phase_axes(phases[n], steps)
        for i in range(out_d):
            xd = _wrapped(a + i * steps[0], depth)
            for j in range(out_h):
                xh = _wrapped(b + j * steps[1], height)
                for k in range(out_w):
                    source = dy[n, :, i, j, k]
                    target = dx[n, :, xd, xh, _wrapped(e + k * steps[2], width)]
                    for c in range(n_chan):
                        target[c] = source[c]
