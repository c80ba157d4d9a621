"""Fractional max pooling (Graham 2014): max pooling over windows that differ from plane
to plane.

Every ``(n, c)`` plane has its own windows, given per axis as ``starts[p, axis, o]`` and
``lengths[p, axis, o]`` for plane ``p`` (``n * C + c``) and output index ``o``; the kernels'
5-d ``(P, 1, D, H, W)`` form gives unused axes one window, start 0 and length 1. Windows
lie inside the input (no padding). The winner rule is the core's
(:func:`~poolgrad.kernels.beats`): the first maximum in row-major window order, or the
first NaN. ``pos`` holds each winner's tap number, row-major over ``extent`` (the
longest window per axis), as a max pooling's winners.

The forward owns whole planes (a plane's windows along W serve all its rows; a batch
of one plane runs on one thread); the backward owns whole input planes and adds each
window's ``dy`` at its winner in increasing output order: no races, and the same bits
at any thread count.
"""

import numpy as np
from numba import prange, uint64

from . import beats, jit, parallel_kernel
from .walk import helper, inlined


@jit()
def pseudo_random_windows(draws, alpha, index, span, window, length, starts, lengths):
    """One axis of every plane's windows, placed by the pseudo-random sequence ``b[i] =
    int((index[i] + u) * alpha) - int(u * alpha)`` for ``i < steps`` (``index`` holds ``0,
    1, ..., steps - 1`` in the draws' dtype, in which the sequence is computed) and
    ``b[steps] = span``, ``u`` the plane's draw (:func:`poolgrad.kinds.fractional.boundaries`).

    ``window > 0``: PyTorch's ``steps + 1`` windows of ``window`` taps, starting at
    ``b[0..steps]``. ``window == 0``: Graham's ``steps`` disjoint regions ``[b[i], b[i +
    1])``; ``window == -1``: overlapping ones, ``[b[i], min(b[i + 1] + 1, length))``.

    Writes plane ``p``'s starts and lengths to ``starts[p]`` and ``lengths[p]`` (``(P,
    O)``, ``O`` at least the window count), the columns after its windows start 0 and
    length 1 (one tap, as an unused axis); returns the longest window (1 if none)."""
    steps = index.shape[0]
    count = steps + 1 if window > 0 else steps
    longest = 1
    for p in range(draws.shape[0]):
        u = draws[p]
        offset = np.int64(u * alpha)
        for i in range(count):
            start = span if i == steps else np.int64((index[i] + u) * alpha) - offset
            size = window
            if window <= 0:
                end = span if i + 1 == steps else np.int64((index[i + 1] + u) * alpha) - offset
                size = min(end + 1, length) - start if window < 0 else end - start
            starts[p, i] = start
            lengths[p, i] = size
            longest = max(longest, size)
        for i in range(count, starts.shape[1]):
            starts[p, i] = 0
            lengths[p, i] = 1
    return longest


@jit()
def pseudo_random_on_grid(draws, alpha, index, step):
    """Whether :func:`pseudo_random_windows` would start every plane's window ``i`` at
    ``i * step`` (``alpha`` a whole number, ``step`` its value, and the last window at
    ``span = steps * step``), checked without writing the windows: one pass, ending at
    the first start off that grid."""
    for p in range(draws.shape[0]):
        u = draws[p]
        offset = np.int64(u * alpha)
        for i in range(index.shape[0]):
            if np.int64((index[i] + u) * alpha) - offset != i * step:
                return False
    return True


@jit()
def on_one_grid(starts, lengths, count, step, window):
    """Whether every plane's first ``count`` windows (``starts`` and ``lengths`` ``(P,
    O)``) start at ``i * step`` and are ``window`` long: one pass, ending at the first
    window off that grid."""
    for p in range(starts.shape[0]):
        for i in range(count):
            if starts[p, i] != i * step or lengths[p, i] != window:
                return False
    return True


@helper
def _plane_row(row, out_d, out_h):
    """``(p, od, oh)`` of output row ``row``."""
    return row // (out_d * out_h), (row // out_h) % out_d, row % out_h


@inlined
def _pairs(src, pairs, taps, count):
    """``pairs[w]``: the larger of ``src[w]`` and ``src[w + 1]`` (the later only if it
    beats the earlier), ``taps[w]`` which (0 or 1), for ``count`` starts. Three arrays
    only: from five (a general step from ``k - 1`` taps to ``k``), LLVM's alias checks
    gave up and the loop stayed scalar (4.7 ms against 3.2 for a 32x64x56x56 layer's
    forward)."""
    for w in range(count):
        at = uint64(w)
        v, m = src[at + uint64(1)], src[at]
        take = beats(v, m)
        pairs[at] = v if take else m
        taps[at] = np.int32(take)


@inlined
def _triples(src, pairs, pair_taps, triples, taps, count):
    """``triples[w]``: the maximum of ``src[w : w + 3]`` (``taps[w]`` its offset) from
    :func:`_pairs`' results, for ``count`` starts: the third tap taken only where it
    beats the pair's maximum. Contiguous, so it vectorizes."""
    for w in range(count):
        at = uint64(w)
        v, m = src[at + uint64(2)], pairs[at]
        take = beats(v, m)
        triples[at] = v if take else m
        taps[at] = np.int32(2) if take else pair_taps[at]


@parallel_kernel
def fractional_max_forward(x, starts, lengths, extent, y, pos):
    """Each plane in two steps. Along W: for every input row, every output column's
    window maximum, from the running maxima of 1, 2 and 3 consecutive taps (contiguous
    loops) picked by each window's start and length (longer windows: a scalar loop).
    Then along D and H: each output row merges its window's rows in row-major order,
    vectorized along W, an earlier row keeping a tie. Taking W first keeps row-major
    order's first maximum (and first NaN)."""
    n_planes, out_w = y.shape[0], y.shape[4]
    in_d, in_h, in_w = x.shape[2], x.shape[3], x.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    tasks = min(n_planes, 64)  # the buffers allocated once per task, not per plane
    for task in prange(tasks):
        column = np.empty((in_d, in_h, out_w), y.dtype)  # each row's window maxima
        column_tap = np.empty((in_d, in_h, out_w), np.int32)
        pairs, triples = np.empty(in_w, y.dtype), np.empty(in_w, y.dtype)
        pair_taps, triple_taps = np.empty(in_w, np.int32), np.empty(in_w, np.int32)
        best, best_tap = np.empty(out_w, y.dtype), np.empty(out_w, np.int32)
        for p in range(task * n_planes // tasks, (task + 1) * n_planes // tasks):
            _plane_forward(x[p, 0], starts[p], lengths[p], ext_h, ext_w, y[p, 0], pos[p, 0],
                           column, column_tap, pairs, triples, pair_taps,
                           triple_taps, best, best_tap)


_CHANNEL_BLOCK = 16  # a channels-last job's planes (a 56x56 float32 block: 200 KB)


@parallel_kernel
def fractional_max_forward_channels_last(x, starts, lengths, extent, shape, y, pos):
    """:func:`fractional_max_forward` of a channels-last input, with its bits: ``x``
    ``(N, L, C)``, ``y`` and ``pos`` ``(N, OL, C)`` (the memory of channels-last 5-d
    arrays, positions flattened), ``shape`` the ``(D, H, W, OD, OH, OW)`` those
    flatten, plane ``n * C + c``'s windows at ``starts[n * C + c]``. Each job takes one
    example's block of channels: it copies them into planes in buffers of its own (in
    cache), pools each plane as :func:`fractional_max_forward` does, and copies the
    block's results out, so the input is read once from memory and no array of planes
    is written."""
    n_batch, length, n_chan = x.shape
    out_length = y.shape[1]
    in_d, in_h, in_w = shape[0], shape[1], shape[2]
    out_d, out_h, out_w = shape[3], shape[4], shape[5]
    ext_h, ext_w = extent[1], extent[2]
    blocks = -(-n_chan // _CHANNEL_BLOCK)
    jobs = n_batch * blocks
    tasks = min(jobs, 64)  # the buffers allocated once per task, not per job
    for task in prange(tasks):
        planes = np.empty((_CHANNEL_BLOCK, in_d, in_h, in_w), x.dtype)
        values = np.empty((_CHANNEL_BLOCK, out_d, out_h, out_w), y.dtype)
        taps = np.empty((_CHANNEL_BLOCK, out_d, out_h, out_w), pos.dtype)
        flat_planes = planes.reshape(_CHANNEL_BLOCK, length)
        flat_values = values.reshape(_CHANNEL_BLOCK, out_length)
        flat_taps = taps.reshape(_CHANNEL_BLOCK, out_length)
        column = np.empty((in_d, in_h, out_w), y.dtype)
        column_tap = np.empty((in_d, in_h, out_w), np.int32)
        pairs, triples = np.empty(in_w, y.dtype), np.empty(in_w, y.dtype)
        pair_taps, triple_taps = np.empty(in_w, np.int32), np.empty(in_w, np.int32)
        best, best_tap = np.empty(out_w, y.dtype), np.empty(out_w, np.int32)
        for job in range(task * jobs // tasks, (task + 1) * jobs // tasks):
            n, first = job // blocks, (job % blocks) * _CHANNEL_BLOCK
            count = min(_CHANNEL_BLOCK, n_chan - first)
            # a whole block passes the block size, a constant, as its count: LLVM unrolls
            # those copies (a runtime count kept every element a scalar load and store)
            if count == _CHANNEL_BLOCK:
                _block_into_planes(x[n], first, _CHANNEL_BLOCK, flat_planes)
            else:
                _block_into_planes(x[n], first, count, flat_planes)
            for b in range(count):
                p = n * n_chan + first + b
                _plane_forward(planes[b], starts[p], lengths[p], ext_h, ext_w, values[b],
                               taps[b], column, column_tap, pairs, triples, pair_taps,
                               triple_taps, best, best_tap)
            if count == _CHANNEL_BLOCK:
                _planes_into_block(flat_values, flat_taps, first, _CHANNEL_BLOCK, y[n], pos[n])
            else:
                _planes_into_block(flat_values, flat_taps, first, count, y[n], pos[n])


@inlined
def _block_into_planes(source, first, count, planes):
    """``planes[b, i] = source[i, first + b]`` for ``b < count``: a block of channels of
    an ``(L, C)`` image as rows."""
    for i in range(source.shape[0]):
        at = uint64(i)
        row = source[at, first:first + count]
        for b in range(count):
            planes[uint64(b), at] = row[uint64(b)]


@inlined
def _planes_into_block(values, taps, first, count, out, out_taps):
    """``out[i, first + b] = values[b, i]`` for ``b < count``, and ``out_taps`` from
    ``taps`` likewise: rows back into a block of channels of ``(L, C)`` images."""
    for i in range(out.shape[0]):
        at = uint64(i)
        values_row = out[at, first:first + count]
        taps_row = out_taps[at, first:first + count]
        for b in range(count):
            values_row[uint64(b)] = values[uint64(b), at]
            taps_row[uint64(b)] = taps[uint64(b), at]

@inlined
def _plane_forward(x, starts, lengths, ext_h, ext_w, y, pos, column, column_tap, pairs,
                   triples, pair_taps, triple_taps, best, best_tap):
    """One plane of :func:`fractional_max_forward` (``x``, ``y``, ``pos`` 3-d), with
    its buffers."""
    in_d, in_h, in_w = x.shape
    out_d, out_h, out_w = y.shape
    firsts, spans = starts[2], lengths[2]
    for d in range(in_d):
        for h in range(in_h):
            src, maxima, offsets = x[d, h], column[d, h], column_tap[d, h]
            if ext_w <= 3:
                if ext_w >= 2:
                    _pairs(src, pairs, pair_taps, in_w - 1)
                if ext_w == 3:
                    _triples(src, pairs, pair_taps, triples, triple_taps, in_w - 2)
                # each window's run by its length, as selects (the runs a window
                # does not take may be stale, but lie inside the buffers)
                for o in range(out_w):
                    at = uint64(o)
                    start, span = uint64(firsts[at]), spans[at]
                    m = src[start] if span == 1 else (
                        pairs[start] if span == 2 else triples[start])
                    c = np.int32(0) if span == 1 else (
                        pair_taps[start] if span == 2 else triple_taps[start])
                    maxima[at], offsets[at] = m, c
            else:
                for o in range(out_w):
                    start, span = firsts[o], spans[o]
                    m, c = src[start], 0
                    for jw in range(1, span):
                        if beats(src[start + jw], m):
                            m, c = src[start + jw], jw
                    maxima[o], offsets[o] = m, c
    for od in range(out_d):
        start_d, len_d = starts[0, od], lengths[0, od]
        for oh in range(out_h):
            start_h, len_h = starts[1, oh], lengths[1, oh]
            best[:] = column[start_d, start_h]
            best_tap[:] = column_tap[start_d, start_h]
            for jd in range(len_d):
                for jh in range(len_h):
                    if jd == 0 and jh == 0:
                        continue
                    row_tap = np.int32((jd * ext_h + jh) * ext_w)
                    maxima = column[start_d + jd, start_h + jh]
                    offsets = column_tap[start_d + jd, start_h + jh]
                    for o in range(out_w):
                        at = uint64(o)
                        take = beats(maxima[at], best[at])
                        best[at] = maxima[at] if take else best[at]
                        best_tap[at] = row_tap + offsets[at] if take else best_tap[at]
            values, taps = y[od, oh], pos[od, oh]
            for o in range(out_w):
                at = uint64(o)
                values[at], taps[at] = best[at], best_tap[at]


@helper
def _tap_strides(extent, in_h, in_w):
    """Each tap number's offset in a C-contiguous ``(D, in_h, in_w)`` plane from its
    window's first element: a table, so that the kernels need no integer division per
    output (three of them took most of the backward's 7 ms on a 32x64x56x56 layer)."""
    ext_d, ext_h, ext_w = extent[0], extent[1], extent[2]
    offsets = np.empty(ext_d * ext_h * ext_w, np.int64)
    for jd in range(ext_d):
        for jh in range(ext_h):
            for jw in range(ext_w):
                offsets[(jd * ext_h + jh) * ext_w + jw] = (jd * in_h + jh) * in_w + jw
    return offsets


@parallel_kernel
def fractional_max_backward(dy, starts, extent, pos, dx):
    """``dx`` = zeros, plus each window's ``dy`` at its winner, in output order."""
    n_planes, out_d, out_h, out_w = dy.shape[0], dy.shape[2], dy.shape[3], dy.shape[4]
    in_h, in_w = dx.shape[3], dx.shape[4]
    offsets = _tap_strides(extent, in_h, in_w)
    zero = np.zeros(1, dx.dtype)[0]
    for p in prange(n_planes):
        plane = dx[p, 0].reshape(-1)
        plane[:] = zero
        columns = starts[p, 2]
        for od in range(out_d):
            for oh in range(out_h):
                row = (starts[p, 0, od] * in_h + starts[p, 1, oh]) * in_w
                grads, taps = dy[p, 0, od, oh], pos[p, 0, od, oh]
                for ow in range(out_w):
                    plane[row + columns[ow] + offsets[taps[ow]]] += grads[ow]


@parallel_kernel
def fractional_max_indices(starts, extent, pos, in_h, in_w, indices):
    """Each winner's flat position in its input plane (PyTorch's indices)."""
    n_planes, out_d, out_h, out_w = pos.shape[0], pos.shape[2], pos.shape[3], pos.shape[4]
    offsets = _tap_strides(extent, in_h, in_w)
    for row in prange(n_planes * out_d * out_h):
        p, od, oh = _plane_row(row, out_d, out_h)
        first = (starts[p, 0, od] * in_h + starts[p, 1, oh]) * in_w
        for ow in range(out_w):
            indices[p, 0, od, oh, ow] = first + starts[p, 2, ow] + offsets[pos[p, 0, od, oh, ow]]
