"""Copies between the channels-last layout and planes, for the kernels that run on
``(N * C, D, H, W)`` planes (anti-aliased pooling's chain, fractional max pooling).

A channels-last 5-d array ``(N, C, D, H, W)`` is ``(N, L, C)`` in memory, and its planes
are ``(N, C, L)``: the copy either way is a batch of 2-d transposes.
:func:`transpose_batches` copies them in 32x32 tiles, each read and written within the
cache, on every thread: 2.0-2.7 ms for a 32x64x56x56 float32 array into fresh memory at
2 threads, where NumPy's strided copy (``np.ascontiguousarray``) took 8.5.
"""

import numpy as np
from numba import prange

from . import parallel_kernel

_TILE = 32


@parallel_kernel
def transpose_batches(src, dst):
    """``dst[n, b, a] = src[n, a, b]`` for 3-d C-contiguous arrays of one dtype, tile
    by tile, each tile's writes along ``dst``'s rows."""
    batches, rows, columns = src.shape
    row_tiles, column_tiles = -(-rows // _TILE), -(-columns // _TILE)
    for job in prange(batches * row_tiles * column_tiles):
        n, tile = job // (row_tiles * column_tiles), job % (row_tiles * column_tiles)
        first_row, first_column = (tile // column_tiles) * _TILE, (tile % column_tiles) * _TILE
        end_row = min(first_row + _TILE, rows)
        for b in range(first_column, min(first_column + _TILE, columns)):
            for a in range(first_row, end_row):
                dst[n, b, a] = src[n, a, b]


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
