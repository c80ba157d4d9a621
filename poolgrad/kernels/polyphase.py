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
or the largest ``|v|`` (``MAX``, a NaN if any ``v`` is). A sum runs in two stages, in a
fixed order. First each column of each row phase (the rows of one offset ``(a, b)``)
adds its terms down the rows, in increasing row order: loops along W (NCHW) or C
(channels-last) over contiguous memory with no reduction, so they vectorize. Then
the component's columns, position ``k`` at column ``(e + k s_w) mod W``, go into
:data:`LANES` lanes, lane ``k mod LANES`` adding in increasing ``k``, and the lanes are
added by halving (lane ``l`` += lane ``l + h`` for ``h = LANES/2, ..., 1``). Each plane
runs on one thread, so the caller, which adds the planes in channel order, gets the
same bits at any thread count and in either layout.
"""

import numba
import numpy as np
from numba import prange

from . import parallel_kernel
from .walk import helper, inlined

L2, L1, MAX = 0, 1, 2  # the norms
LANES = 8  # the partial sums of a component's columns


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
def _inside(width, start, step, count):
    """How many of the positions ``start + k step``, ``k < count``, fall inside a row of
    ``width`` (the rest wrap round)."""
    return min(count, (width - start + step - 1) // step) if start < width else 0


@inlined
def _larger(size, largest):
    """The larger of a term ``|v|`` and the largest so far; a NaN, once in, stays."""
    return size if (size > largest) | (size != size) else largest


@inlined
def _add_row(row, norm, into):
    """``into[w]`` folds in the term of ``row[w]``: one loop per norm, so that each
    vectorizes."""
    if norm == L2:
        for w in range(row.shape[0]):
            v = np.float64(row[w])
            into[w] += v * v
    elif norm == L1:
        for w in range(row.shape[0]):
            into[w] += abs(np.float64(row[w]))
    else:
        for w in range(row.shape[0]):
            into[w] = _larger(abs(np.float64(row[w])), into[w])


@inlined
def _add_four_rows(a, b, c, d, norm, into):
    """:func:`_add_row` of ``a``, ``b``, ``c`` then ``d`` (rows of one row phase, in
    increasing row order) in one loop: the same adds in the same order, so the same
    bits, with ``into`` loaded and stored once for four rows: a channels-last
    example's columns, loaded and stored row by row, cost more than reading x."""
    if norm == L2:
        for w in range(into.shape[0]):
            va, vb = np.float64(a[w]), np.float64(b[w])
            vc, vd = np.float64(c[w]), np.float64(d[w])
            into[w] = (((into[w] + va * va) + vb * vb) + vc * vc) + vd * vd
    elif norm == L1:
        for w in range(into.shape[0]):
            into[w] = (((into[w] + abs(np.float64(a[w]))) + abs(np.float64(b[w])))
                       + abs(np.float64(c[w]))) + abs(np.float64(d[w]))
    else:
        for w in range(into.shape[0]):
            into[w] = _larger(abs(np.float64(d[w])), _larger(abs(np.float64(c[w])), _larger(
                abs(np.float64(b[w])), _larger(abs(np.float64(a[w])), into[w]))))


@inlined
def _add_pixel_row(row, first, size, norm, into):
    """:func:`_add_row` for a channels-last row ``(W, C)``: ``into[w, c]`` folds in
    ``row[w, first + c]``, ``c < size``; a block of all the channels as one flat
    loop, else a pixel at a time."""
    if size == row.shape[1]:
        _add_row(row.reshape(row.size), norm, into.reshape(into.size))
        return
    for w in range(row.shape[0]):
        _add_row(row[w, first:first + size], norm, into[w])


@inlined
def _add_four_pixel_rows(a, b, c, d, first, size, norm, into):
    """:func:`_add_four_rows` for channels-last rows, as :func:`_add_pixel_row`."""
    if size == a.shape[1]:
        _add_four_rows(a.reshape(a.size), b.reshape(b.size), c.reshape(c.size),
                       d.reshape(d.size), norm, into.reshape(into.size))
        return
    end = first + size
    for w in range(a.shape[0]):
        _add_four_rows(a[w, first:end], b[w, first:end], c[w, first:end], d[w, first:end],
                       norm, into[w])


@inlined
def _halved(lanes):
    """The lanes' sum: ``LANES / 2`` pairs added, then their halves, down to one."""
    half = LANES // 2
    while half >= 1:
        for lane in range(half):
            lanes[lane] += lanes[lane + half]
        half //= 2
    return lanes[0]


@inlined
def _component_share(columns, start, step, count, norm, lanes):
    """A component's share from its row phase's ``columns``: position ``k`` at column
    ``(start + k step) mod W``, summed in lanes and halved, or (MAX) the largest."""
    width = columns.shape[0]
    if norm == MAX:
        largest = 0.0
        for k in range(count):
            largest = _larger(columns[_wrapped(start + k * step, width)], largest)
        return largest
    lanes[:] = 0.0
    for k in range(count):
        lanes[k % LANES] += columns[_wrapped(start + k * step, width)]
    return _halved(lanes)


@parallel_kernel
def phase_norms(x, steps, norm, partials):
    """``partials[n, c, phase]``: plane ``(n, c)``'s share of each component's norm, in
    the module docstring's order: the rows folded into their row phase's columns, then
    each component's columns."""
    n_batch, n_chan, depth, height, width = x.shape
    count_d, count_h = -(-depth // steps[0]), -(-height // steps[1])
    count_w = -(-width // steps[2])
    row_phases = steps[0] * steps[1]
    for plane in prange(n_batch * n_chan):
        n, c = plane // n_chan, plane % n_chan
        columns = np.zeros((row_phases, width), np.float64)
        for pd in range(count_d * steps[0]):
            for ph in range(count_h * steps[1]):
                _add_row(x[n, c, _wrapped(pd, depth), _wrapped(ph, height)], norm,
                         columns[(pd % steps[0]) * steps[1] + ph % steps[1]])
        lanes = np.empty(LANES, np.float64)
        for row_phase in range(row_phases):
            for e in range(steps[2]):
                partials[n, c, row_phase * steps[2] + e] = _component_share(
                    columns[row_phase], e, steps[2], count_w, norm, lanes)


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


# a channels-last task's channels where there are too few examples to share out whole,
# and the most columns (W x channels) a whole example's task keeps
CHANNEL_BLOCK = 64
MOST_COLUMNS = 2**16


def channels_per_task(n_batch: int, n_chan: int, width: int, threads: int) -> int:
    """The ``block`` of :func:`phase_norms_channels_last`: a whole example (its rows
    each one flat loop) where there are examples enough for every thread twice and
    their columns are at most :data:`MOST_COLUMNS`, else :data:`CHANNEL_BLOCK`. The
    bits are the same either way."""
    whole = n_batch >= 2 * threads and width * n_chan <= MOST_COLUMNS
    return n_chan if whole else CHANNEL_BLOCK


def phase_norms_pixels(x, steps, norm, partials):
    """:func:`phase_norms_channels_last` on the ``(N, D, H, W, C)`` view of the 5-d
    channels-last ``x``, its tasks' channels from :func:`channels_per_task`."""
    phase_norms_channels_last(x.transpose(0, 2, 3, 4, 1), steps, norm, channels_per_task(
        x.shape[0], x.shape[1], x.shape[4], numba.get_num_threads()), partials)


@parallel_kernel
def phase_norms_channels_last(x, steps, norm, block, partials):
    """:func:`phase_norms` for ``x`` the ``(N, D, H, W, C)`` view of a channels-last
    array (C-contiguous), with the same sums in the same order, so its bits: each task
    takes one example's ``block`` of channels and folds a row's pixels into its columns
    along C (a row of all the channels as one flat loop), where the planes' kernel would
    read each plane's row with a stride of C."""
    n_batch, depth, height, width, n_chan = x.shape
    count_d, count_h = -(-depth // steps[0]), -(-height // steps[1])
    count_w = -(-width // steps[2])
    row_phases, rows_h = steps[0] * steps[1], count_h * steps[1]  # rows_h: with the wrap
    blocks = -(-n_chan // block)
    for task in prange(n_batch * blocks):
        n, first = task // blocks, (task % blocks) * block
        size = min(block, n_chan - first)
        columns = np.zeros((row_phases, width, size), np.float64)
        for pd in range(count_d * steps[0]):
            rows = x[n, _wrapped(pd, depth)]
            for phase in range(steps[1]):  # its rows in increasing order, four at a time
                into, ph = columns[(pd % steps[0]) * steps[1] + phase], phase
                while ph + 3 * steps[1] < rows_h:
                    _add_four_pixel_rows(rows[_wrapped(ph, height)],
                                         rows[_wrapped(ph + steps[1], height)],
                                         rows[_wrapped(ph + 2 * steps[1], height)],
                                         rows[_wrapped(ph + 3 * steps[1], height)], first,
                                         size, norm, into)
                    ph += 4 * steps[1]
                while ph < rows_h:
                    _add_pixel_row(rows[_wrapped(ph, height)], first, size, norm, into)
                    ph += steps[1]
        lanes = np.empty(LANES, np.float64)
        column = np.empty(width, np.float64)
        for row_phase in range(row_phases):
            for c in range(size):
                column[:] = columns[row_phase, :, c]
                for e in range(steps[2]):
                    partials[n, first + c, row_phase * steps[2] + e] = _component_share(
                        column, e, steps[2], count_w, norm, lanes)


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
