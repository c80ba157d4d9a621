"""Copies between the channels-last layout and planes, for the kernels that run on
``(N * C, D, H, W)`` planes (anti-aliased pooling's chain, fractional max pooling), and
circular padding in either layout (:func:`circular_pad`).

A channels-last 5-d array ``(N, C, D, H, W)`` is ``(N, L, C)`` in memory, and its planes
are ``(N, C, L)``: the copy either way is a batch of 2-d transposes.
:func:`transpose_batches` copies them in 64x64 tiles, each read and written within the
cache, on every thread: several times faster than NumPy's strided copy
(``np.ascontiguousarray``; docs/performance.md has the figures).
"""

import numpy as np
from numba import prange, uint64

from . import parallel_kernel

_TILE = 64


@parallel_kernel
def transpose_batches(src, dst):
    """``dst[n, b, a] = src[n, a, b]`` for 3-d C-contiguous arrays of one dtype, tile
    by tile, each tile's writes along ``dst``'s rows. A whole tile runs loops of
    :data:`_TILE` taps, a constant, which LLVM unrolls and vectorizes (with runtime
    bounds every tap was a scalar load and store, about 2.5 times slower); edge tiles
    take the plain loop."""
    batches, rows, columns = src.shape
    row_tiles, column_tiles = -(-rows // _TILE), -(-columns // _TILE)
    for job in prange(batches * row_tiles * column_tiles):
        n, tile = job // (row_tiles * column_tiles), job % (row_tiles * column_tiles)
        first_row, first_column = (tile // column_tiles) * _TILE, (tile % column_tiles) * _TILE
        source, target = src[n], dst[n]
        if first_row + _TILE <= rows and first_column + _TILE <= columns:
            for b in range(_TILE):
                out = target[first_column + b]
                column = uint64(first_column + b)
                for a in range(_TILE):
                    out[uint64(first_row + a)] = source[uint64(first_row + a), column]
        else:
            for b in range(first_column, min(first_column + _TILE, columns)):
                for a in range(first_row, min(first_row + _TILE, rows)):
                    target[b, a] = source[a, b]


def _channels_last(a: np.ndarray) -> bool:
    """Whether the 5-d ``a`` is stored with C fastest and is not C-contiguous, in a
    dtype the kernel takes (Numba has no float16: NumPy copies those)."""
    return (a.dtype != np.float16 and not a.flags.c_contiguous
            and a.transpose(0, 2, 3, 4, 1).flags.c_contiguous)


def _as_batches(a: np.ndarray) -> np.ndarray:
    """A channels-last 5-d array as ``(N, L, C)``, a view of its memory."""
    n, c = a.shape[:2]
    return a.transpose(0, 2, 3, 4, 1).reshape(n, -1, c)


def planes_of(a: np.ndarray) -> np.ndarray:
    """A 5-d array as C-contiguous ``(N * C, D, H, W)`` planes: a view when it is
    C-contiguous, the tiled copy when it is channels-last, else NumPy's copy."""
    if a.flags.c_contiguous:
        return a.reshape((-1,) + a.shape[2:])
    if a.size and _channels_last(a):
        planes = np.empty(a.shape, a.dtype)
        transpose_batches(_as_batches(a), planes.reshape(a.shape[0], a.shape[1], -1))
        return planes.reshape((-1,) + a.shape[2:])
    return np.ascontiguousarray(a).reshape((-1,) + a.shape[2:])


def store_planes(out: np.ndarray, planes: np.ndarray) -> None:
    """Copy C-contiguous ``planes`` (``out``'s ``(N * C, D, H, W)``) into the 5-d
    ``out``, which :func:`planes_of` reads (the tiled copy when it is channels-last)."""
    if out.size and _channels_last(out):
        transpose_batches(planes.reshape(out.shape[0], out.shape[1], -1), _as_batches(out))
    else:
        np.copyto(out, planes.reshape(out.shape))


@parallel_kernel
def circular_pad_rows(x, rows_from, runs, padded):
    """``padded`` := ``x`` padded circularly, both as 2-d C-contiguous arrays of rows
    (the NCHW planes' rows, or a channels-last array's rows of pixels): output row
    ``i`` is copied from row ``rows_from[i]`` of ``x`` in ``runs`` ``(K, 3)``, each
    ``(at, start, length)``: ``padded[i, at:at + length] = x[rows_from[i],
    start:start + length]``. The runs along W are the same for every row."""
    for row in prange(padded.shape[0]):
        target, source = padded[row], x[rows_from[row]]
        for run in range(runs.shape[0]):
            at, start, length = runs[run, 0], runs[run, 1], runs[run, 2]
            # a loop over views from 0: indexed from at and start, the copy ran at half
            # the speed (2.34 against 1.08 ms for 32x64 planes of 56x56 padded to 57x57)
            into, read = target[at:at + length], source[start:start + length]
            for k in range(length):
                into[k] = read[k]


def pads_by_rows(plan, operand, record) -> bool:
    """Whether :func:`circular_pad` serves: an NCHW or channels-last float32/64 array."""
    return operand.layout in ("nchw", "channels_last") and operand.dtype.kind == "f" and (
        operand.dtype.itemsize >= 4)


def circular_runs(length: int, before: int, padded_length: int) -> list[tuple[int, int, int]]:
    """``(at, start, count)``: the padded positions ``at:at + count`` copy the source's
    ``start:start + count``, in order (a band may wrap more than once); the padding
    ``before`` comes ahead of the source's ``length``. The middle is one run."""
    runs, position = [], 0
    while position < padded_length:
        start = (position - before) % length
        count = min(length - start, padded_length - position)
        runs.append((position, start, count))
        position += count
    return runs


def circular_pad(x, before, padded):
    """``padded`` := the 5-d ``x`` padded circularly along D, H and W (``before`` of
    each ahead of it), both stored alike: :func:`circular_pad_rows` on the NCHW planes'
    rows of W, or a channels-last array's rows of W pixels of C, with the tables of
    which row and which runs of it each output row copies."""
    if x.size == 0:  # nothing to copy
        return
    if x.flags.c_contiguous:
        outer, inner = x.shape[0] * x.shape[1], 1
        (depth, height, width), (out_d, out_h, out_w) = x.shape[2:], padded.shape[2:]
    else:  # channels-last: its (N, D, H, W, C) views
        x, padded = x.transpose(0, 2, 3, 4, 1), padded.transpose(0, 2, 3, 4, 1)
        outer, inner = x.shape[0], x.shape[4]
        (depth, height, width), (out_d, out_h, out_w) = x.shape[1:4], padded.shape[1:4]
    d_from = (np.arange(out_d) - before[0]) % depth
    h_from = (np.arange(out_h) - before[1]) % height
    rows_from = ((np.arange(outer)[:, None, None] * depth + d_from[:, None]) * height
                 + h_from).ravel()
    runs = np.array(circular_runs(width, before[2], out_w), np.int64) * inner
    circular_pad_rows(x.reshape(-1, width * inner), rows_from, runs,
                      padded.reshape(-1, out_w * inner))


def circular_pad_by_slices(x, before, padded):
    """:func:`circular_pad` for any other array: x copied into the middle, then each
    axis's bands from the middle, in the runs of :func:`circular_runs`."""
    sizes = x.shape[2:]
    padded[(slice(None),) * 2 + tuple(slice(b, b + n) for b, n in zip(before, sizes,
                                                                     strict=True))] = x
    for axis, (b, n) in enumerate(zip(before, sizes, strict=True), start=2):
        lead = (slice(None),) * axis
        for at, start, count in circular_runs(n, b, padded.shape[axis]):
            if not b <= at < b + n:  # the middle is x already
                padded[lead + (slice(at, at + count),)] = padded[
                    lead + (slice(b + start, b + start + count),)]
