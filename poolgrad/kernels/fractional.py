"""Fractional max pooling (Graham 2014): max pooling over windows that differ from plane
to plane.

Every ``(n, c)`` plane has its own windows, given per axis as ``starts[p, axis, o]`` and
``lengths[p, axis, o]`` for plane ``p`` (``n * C + c``) and output index ``o``; the kernels'
5-d ``(P, 1, D, H, W)`` form gives unused axes one window, start 0 and length 1. Windows
lie inside the input (no padding). The winner rule is the core's
(:func:`~poolgrad.kernels.beats`): the first maximum in row-major window order, or the
first NaN. ``pos`` holds each winner's tap number, row-major over ``extent`` (the
longest window per axis), as a max pooling's winners.

The forward owns output rows; the backward owns whole input planes and adds each
window's ``dy`` at its winner in increasing output order: no races, and the same bits
at any thread count.
"""

import numpy as np
from numba import prange

from . import beats, parallel_kernel
from .walk import helper


@helper
def _plane_row(row, out_d, out_h):
    """``(p, od, oh)`` of output row ``row``."""
    return row // (out_d * out_h), (row // out_h) % out_d, row % out_h


@helper
def _tap_offsets(tap, ext_h, ext_w):
    """``(jd, jh, jw)`` of tap number ``tap``, row-major over the extent."""
    tap = np.int64(tap)
    return tap // (ext_w * ext_h), (tap // ext_w) % ext_h, tap % ext_w


@parallel_kernel
def fractional_max_forward(x, starts, lengths, extent, y, pos):
    n_planes, out_d, out_h, out_w = y.shape[0], y.shape[2], y.shape[3], y.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    for row in prange(n_planes * out_d * out_h):
        p, od, oh = _plane_row(row, out_d, out_h)
        start_d, len_d = starts[p, 0, od], lengths[p, 0, od]
        start_h, len_h = starts[p, 1, oh], lengths[p, 1, oh]
        for ow in range(out_w):
            start_w, len_w = starts[p, 2, ow], lengths[p, 2, ow]
            best = x[p, 0, start_d, start_h, start_w]
            chosen = 0
            for jd in range(len_d):
                for jh in range(len_h):
                    for jw in range(len_w):
                        v = x[p, 0, start_d + jd, start_h + jh, start_w + jw]
                        if beats(v, best):
                            best = v
                            chosen = (jd * ext_h + jh) * ext_w + jw
            y[p, 0, od, oh, ow] = best
            pos[p, 0, od, oh, ow] = chosen


@parallel_kernel
def fractional_max_backward(dy, starts, extent, pos, dx):
    """``dx`` = zeros, plus each window's ``dy`` at its winner."""
    n_planes, out_d, out_h, out_w = dy.shape[0], dy.shape[2], dy.shape[3], dy.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    zero = np.zeros(1, dx.dtype)[0]
    for p in prange(n_planes):
        dx[p] = zero
        for od in range(out_d):
            for oh in range(out_h):
                for ow in range(out_w):
                    jd, jh, jw = _tap_offsets(pos[p, 0, od, oh, ow], ext_h, ext_w)
                    dx[p, 0, starts[p, 0, od] + jd, starts[p, 1, oh] + jh,
                       starts[p, 2, ow] + jw] += dy[p, 0, od, oh, ow]


@parallel_kernel
def fractional_max_indices(starts, extent, pos, in_h, in_w, indices):
    """Each winner's flat position in its input plane (PyTorch's indices)."""
    n_planes, out_d, out_h, out_w = pos.shape[0], pos.shape[2], pos.shape[3], pos.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    for row in prange(n_planes * out_d * out_h):
        p, od, oh = _plane_row(row, out_d, out_h)
        for ow in range(out_w):
            jd, jh, jw = _tap_offsets(pos[p, 0, od, oh, ow], ext_h, ext_w)
            indices[p, 0, od, oh, ow] = (((starts[p, 0, od] + jd) * in_h + starts[p, 1, oh]
                                          + jh) * in_w + starts[p, 2, ow] + jw)
