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
or the largest ``|v|`` (``MAX``, a NaN if any ``v`` is). A sum has :data:`LANES`
lanes per component: lane ``l`` adds the terms of the component's positions ``k``
along W with ``k mod LANES == l``, row after row in increasing row order, each row's
in increasing ``k``; the lanes are then added by halving, once per plane. Each plane
runs on one thread, so the caller, which adds the planes in channel order, gets the
same bits at any thread count and in either layout.
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
def _row_largest(row, start, step, count):
    """The largest ``|row[(start + k step) mod len(row)]|``, ``k < count`` (NaN if any
    is NaN)."""
    width = row.shape[0]
    largest = 0.0
    for k in range(count):
        size = abs(np.float64(row[_wrapped(start + k * step, width)]))
        if size != size or largest != largest:
            largest = np.nan
        elif size > largest:
            largest = size
    return largest


@inlined
def _inside(width, start, step, count):
    """How many of the positions ``start + k step``, ``k < count``, fall inside a row of
    ``width`` (the rest wrap round)."""
    return min(count, (width - start + step - 1) // step) if start < width else 0


@inlined
def _add_terms(row, start, step, first, count, norm, lanes):
    """Lane ``k mod LANES`` of ``lanes`` adds the term (``v * v`` or ``|v|``) of
    ``v = row[(start + k step) mod len(row)]`` for ``first <= k < count``, in increasing
    ``k``: whole groups of :data:`LANES` in one vector step each, then the rest."""
    width = row.shape[0]
    inside = _inside(width, start, step, count)
    full = inside - inside % LANES
    for group in range(first, full, LANES):
        for lane in range(LANES):
            v = np.float64(row[start + (group + lane) * step])
            lanes[lane] += v * v if norm == L2 else abs(v)
    for k in range(max(first, full), count):
        v = np.float64(row[_wrapped(start + k * step, width)])
        lanes[k % LANES] += v * v if norm == L2 else abs(v)


@inlined
def _add_pair_terms(row, count, both, norm, even, odd):
    """:func:`_add_terms` for both components of a stride-2 row at once (``start`` 0
    into ``even``, 1 into ``odd``): the ``both`` first positions of each (whole groups
    of :data:`LANES`, inside the row for both) read as contiguous runs of 2
    :data:`LANES`, then each component's rest: the same terms in the same order."""
    if norm == L2:
        for group in range(0, both, LANES):
            at = 2 * group
            for lane in range(LANES):
                v = np.float64(row[at + 2 * lane])
                w = np.float64(row[at + 2 * lane + 1])
                even[lane] += v * v
                odd[lane] += w * w
    else:
        for group in range(0, both, LANES):
            at = 2 * group
            for lane in range(LANES):
                even[lane] += abs(np.float64(row[at + 2 * lane]))
                odd[lane] += abs(np.float64(row[at + 2 * lane + 1]))
    _add_terms(row, 0, 2, both, count, norm, even)
    _add_terms(row, 1, 2, both, count, norm, odd)


@inlined
def _halved(lanes):
    """The lanes' sum: ``LANES / 2`` pairs added, then their halves, down to one."""
    half = LANES // 2
    while half >= 1:
        for lane in range(half):
            lanes[lane] += lanes[lane + half]
        half //= 2
    return lanes[0]


@parallel_kernel
def phase_norms(x, steps, norm, partials):
    """``partials[n, c, phase]``: plane ``(n, c)``'s share of each component's norm (the
    module docstring), its rows in order: a sum in lanes per component over the plane's
    rows, halved at the end (a stride-2 row feeds both its components in one pass);
    ``MAX`` keeps the largest."""
    n_batch, n_chan, depth, height, width = x.shape
    count_d, count_h = -(-depth // steps[0]), -(-height // steps[1])
    count_w = -(-width // steps[2])
    phases = steps[0] * steps[1] * steps[2]
    # a stride-2 row's groups that both components have whole, inside the row
    both = min(_inside(width, 0, 2, count_w), _inside(width, 1, 2, count_w))
    both -= both % LANES
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        acc = partials[n, c]
        lanes = np.zeros((phases, LANES), np.float64)
        if norm == MAX:
            acc[:] = 0.0
        for pd in range(count_d * steps[0]):
            for ph in range(count_h * steps[1]):
                row = x[n, c, _wrapped(pd, depth), _wrapped(ph, height)]
                first = ((pd % steps[0]) * steps[1] + ph % steps[1]) * steps[2]
                if norm != MAX and steps[2] == 2:
                    _add_pair_terms(row, count_w, both, norm, lanes[first], lanes[first + 1])
                    continue
                for e in range(steps[2]):
                    if norm != MAX:
                        _add_terms(row, e, steps[2], 0, count_w, norm, lanes[first + e])
                        continue
                    share = _row_largest(row, e, steps[2], count_w)
                    if share != share or acc[first + e] != acc[first + e]:
                        acc[first + e] = np.nan
                    elif share > acc[first + e]:
                        acc[first + e] = share
        if norm != MAX:
            for phase in range(phases):
                acc[phase] = _halved(lanes[phase])


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
        inside = _inside(width, e, steps[2], out_w)
        for k in range(inside):  # no wrap: a strided copy that vectorizes
            target[k] = source[e + k * steps[2]]
        for k in range(inside, out_w):
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
    phases = steps[0] * steps[1] * steps[2]
    blocks = -(-n_chan // CHANNEL_BLOCK)
    for task in prange(n_batch * blocks):
        n, first = task // blocks, (task % blocks) * CHANNEL_BLOCK
        size = min(CHANNEL_BLOCK, n_chan - first)
        acc = partials[n, first:first + size]
        acc[:, :] = 0.0
        # a sum's lanes per component (kept over the rows); MAX's per row
        lanes = np.zeros((phases if norm != MAX else 1, LANES, CHANNEL_BLOCK), np.float64)
        for pd in range(count_d * steps[0]):
            for ph in range(count_h * steps[1]):
                xd, xh = _wrapped(pd, depth), _wrapped(ph, height)
                row_phase = ((pd % steps[0]) * steps[1] + ph % steps[1]) * steps[2]
                for e in range(steps[2]):
                    own = lanes[row_phase + e if norm != MAX else 0]
                    if norm == MAX:
                        own[:, :] = 0.0
                    for k in range(count_w):
                        pixel = x[n, first:first + size, xd, xh, _wrapped(e + k * steps[2],
                                                                           width)]
                        lane = own[k % LANES]
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
                    if norm != MAX:
                        continue
                    at = row_phase + e
                    for c in range(size):
                        share = own[0, c]
                        for lane_index in range(1, LANES):
                            other = own[lane_index, c]
                            if other != other or share != share:
                                share = np.nan
                            elif other > share:
                                share = other
                        if share != share or acc[c, at] != acc[c, at]:
                            acc[c, at] = np.nan
                        elif share > acc[c, at]:
                            acc[c, at] = share
        if norm != MAX:  # the lanes halved, as the planes' kernel halves them
            for phase in range(phases):
                for c in range(size):
                    acc[c, phase] = _halved(lanes[phase, :, c])


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
