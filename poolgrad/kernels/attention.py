"""Attention pooling over all positions (:func:`poolgrad.attention_pool`), one example
per parallel step.

Each example's features are ``x`` ``(C, L)``: ``C`` channels in ``heads`` blocks of
``d = C / heads``, over ``L`` positions. The queries come folded into the key
projection and the scale: ``projected`` ``(R, C)``, ``R = M * heads`` rows, row
``r = m * heads + h`` holding ``(q_m W_k)`` over head ``h``'s rows of ``W_k``, divided
by ``sqrt(d)``. Then

* ``scores[r, l] = sum_c projected[r, c] x[c, l]``;
* ``attn[r, :] = softmax(scores[r, :])``: ``e = exp(s - max s)``, ``e / sum e`` (a NaN
  score makes its row NaN, as PyTorch's softmax does);
* ``y[m, c] = sum_l attn[m * heads + c // d, l] x[c, l]``.

The backward, given ``dy`` ``(M, C)`` and the forward's ``attn``:

* ``da[r, l] = sum_{c in head h} dy[m, c] x[c, l]`` and
  ``ds[r, l] = attn[r, l] (da[r, l] - sum_l attn[r, l] da[r, l])``;
* ``dx[c, l] = sum_m dy[m, c] attn[m * heads + c // d, l] + sum_r projected[r, c]
  ds[r, l]``, the terms added in that order from 0;
* ``dprojected[r, c] = sum_l ds[r, l] x[c, l]``, written per example (``partials``
  ``(N, R, C)``), which the caller adds in order: the same bits at any thread count.

Arithmetic runs in float64; ``attn`` is float64, ``y`` and ``dx`` take their arrays'
dtypes. Every sum over positions, and over channels (the scores and ``da``), runs in
:data:`LANES` lanes: lane ``k`` adds the terms ``k (mod LANES)`` in increasing order
from +0, and the lanes are then added by halving (lane ``k`` += lane ``k + h`` for
``h = LANES/2, ..., 1``), the order of :func:`~.lanes.lane_dot`. ``attention_planes_*``
take ``(N, C, L)`` arrays, positions contiguous (NCHW; any strides work), and sum
channels for blocks of :data:`BLOCK` positions at once, the lanes as rows;
``attention_pixels_*`` take ``(N, L, C)`` ones, channels contiguous (channels-last),
and sum a pixel's channels as one vector of lanes. Both give the same bits.

Each pass reads an example's features twice (the scores, then the readout; the
scores' gradient, then ``dx``), the second time from cache while they fit in it.
"""

import numpy as np
from numba import prange, uint64

from . import elementary, parallel_kernel
from .lanes import lane_dot
from .simd import prefetch
from .walk import inlined

LANES = 16  # the partial sums over positions (a power of 2)
BLOCK = 128  # positions whose channel sums the NCHW kernels take at a time
AHEAD = 2 * BLOCK  # positions ahead of the block in use whose rows the kernels ask for
_LANES_WITNESS = np.empty((0,) * LANES, np.uint8)  # LANES as lane_dot takes it


@inlined
def _halved(acc):
    """The lanes' total: lane ``k`` += lane ``k + h`` for ``h = LANES/2, ..., 1``."""
    half = LANES // 2
    while half >= 1:
        for k in range(half):
            acc[uint64(k)] += acc[uint64(k + half)]
        half //= 2
    return acc[0]


@inlined
def _halved_rows(terms, count):
    """:func:`_halved` down the rows of ``terms`` ``(LANES, BLOCK)``, for each of the
    first ``count`` columns: row 0 then holds the sums."""
    half = LANES // 2
    while half >= 1:
        for k in range(half):
            low, high = terms[k], terms[k + half]
            for j in range(count):
                low[uint64(j)] += high[uint64(j)]
        half //= 2


@inlined
def _lane_dot(a, b):
    """``sum_l a[l] b[l]`` in the module docstring's lanes, as one vector of lanes
    (:func:`~.lanes.lane_dot`: a loop over an array of lanes stayed scalar)."""
    return lane_dot(a, np.ascontiguousarray(b), _LANES_WITNESS)


@inlined
def _channel_sums(coefficients, features, start, count, terms):
    """Row 0 of ``terms`` ``(LANES, BLOCK)`` := for each of ``count`` positions from
    ``start``, the sum over channels ``k`` of ``coefficients[k] features[k, position]``
    in :func:`_lane_dot`'s order: lane ``k mod LANES`` (a row of ``terms``) adds them in
    increasing ``k`` from +0, then the rows are added by halving."""
    terms[:, :count] = 0.0
    for k in range(coefficients.shape[0]):
        prefetch(features[k], start + AHEAD, BLOCK)
        weight, row, lane = np.float64(coefficients[k]), features[k, start:], terms[k % LANES]
        for j in range(count):
            lane[uint64(j)] += weight * np.float64(row[uint64(j)])
    _halved_rows(terms, count)


@inlined
def _lane_sum(terms, length, acc):
    """``sum terms[:length]`` in the lanes of ``acc`` (the module docstring's order)."""
    acc[:] = 0.0
    full = length - length % LANES
    for start in range(0, full, LANES):
        for k in range(LANES):
            acc[uint64(k)] += terms[uint64(start + k)]
    for k in range(length - full):
        acc[uint64(k)] += terms[uint64(full + k)]
    return _halved(acc)


@inlined
def _softmax(row, acc):
    """``row`` (float64) replaced by its softmax: the largest score by lanes (the same
    value in any order), the exponentials, their sum in the lanes' order. (Each loop
    on its own: a loop that also sums stays scalar.)"""
    length = row.shape[0]
    acc[:] = -np.inf
    full = length - length % LANES
    for start in range(0, full, LANES):
        for k in range(LANES):
            v = row[uint64(start + k)]
            acc[uint64(k)] = v if v > acc[uint64(k)] else acc[uint64(k)]
    for k in range(length - full):
        v = row[uint64(full + k)]
        acc[uint64(k)] = v if v > acc[uint64(k)] else acc[uint64(k)]
    largest = acc[0]
    for k in range(1, LANES):
        largest = acc[k] if acc[k] > largest else largest
    for i in range(length):
        row[uint64(i)] = elementary.exp(row[uint64(i)] - largest)
    total = _lane_sum(row, length, acc)
    for i in range(length):
        row[uint64(i)] /= total


@inlined
def _scores_gradient(attn, grad):
    """``grad`` (``da``) replaced by ``ds = attn (da - sum attn da)``, row by row."""
    for r in range(attn.shape[0]):
        centre = _lane_dot(attn[r], grad[r])
        for i in range(attn.shape[1]):
            grad[r, uint64(i)] = attn[r, uint64(i)] * (grad[r, uint64(i)] - centre)


@parallel_kernel
def attention_planes_forward(x, projected, heads, y, attn):
    """``x`` ``(N, C, L)``: ``y`` ``(N, M, C)`` and ``attn`` ``(N, R, L)``."""
    n_batch, n_chan, length = x.shape
    rows, d = projected.shape[0], n_chan // heads
    for n in prange(n_batch):
        scores = attn[n]
        terms = np.empty((LANES, BLOCK), np.float64)
        for start in range(0, length, BLOCK):
            count = min(BLOCK, length - start)
            for r in range(rows):
                _channel_sums(projected[r], x[n], start, count, terms)
                scores[r, start:start + count] = terms[0, :count]
        acc = np.empty(LANES, np.float64)
        for r in range(rows):
            _softmax(scores[r], acc)
        for c in range(n_chan):
            for m in range(rows // heads):
                y[n, m, c] = _lane_dot(scores[m * heads + c // d], x[n, c])


@parallel_kernel
def attention_pixels_forward(x, projected, heads, y, attn):
    """``x`` ``(N, L, C)``: ``y`` ``(N, M, C)`` and ``attn`` ``(N, R, L)``."""
    n_batch, length, n_chan = x.shape
    rows, d = projected.shape[0], n_chan // heads
    queries = rows // heads
    for n in prange(n_batch):
        scores = attn[n]
        for i in range(length):
            features = x[n, i]
            for r in range(rows):
                scores[r, i] = _lane_dot(projected[r], features)
        acc = np.empty(LANES, np.float64)
        for r in range(rows):
            _softmax(scores[r], acc)
        sums = np.zeros((LANES, queries, n_chan), np.float64)
        for i in range(length):
            lane, features = sums[i % LANES], x[n, i]
            for m in range(queries):
                for h in range(heads):
                    share = scores[m * heads + h, i]
                    for c in range(h * d, (h + 1) * d):
                        lane[m, uint64(c)] += share * np.float64(features[uint64(c)])
        for m in range(queries):
            for c in range(n_chan):
                acc[:] = sums[:, m, c]
                y[n, m, c] = _halved(acc)


@parallel_kernel
def attention_planes_backward(x, dy, projected, attn, heads, dx, partials):
    """``x`` and ``dx`` ``(N, C, L)``; ``partials`` ``(N, R, C)``."""
    n_batch, n_chan, length = x.shape
    rows, d = projected.shape[0], n_chan // heads
    queries = rows // heads
    for n in prange(n_batch):
        weights = attn[n]
        grad = np.empty((rows, length), np.float64)
        terms = np.empty((LANES, BLOCK), np.float64)
        for start in range(0, length, BLOCK):
            count = min(BLOCK, length - start)
            for m in range(queries):
                for h in range(heads):
                    block = slice(h * d, (h + 1) * d)
                    _channel_sums(dy[n, m, block], x[n, block], start, count, terms)
                    grad[m * heads + h, start:start + count] = terms[0, :count]
        _scores_gradient(weights, grad)
        total = np.empty(length, np.float64)
        for c in range(n_chan):
            total[:] = 0.0
            for m in range(queries):
                g, share = np.float64(dy[n, m, c]), weights[m * heads + c // d]
                for i in range(length):
                    total[uint64(i)] += g * share[uint64(i)]
            for r in range(rows):
                weight, back = projected[r, c], grad[r]
                for i in range(length):
                    total[uint64(i)] += weight * back[uint64(i)]
            out = dx[n, c]
            for i in range(length):
                out[uint64(i)] = total[uint64(i)]
            for r in range(rows):
                partials[n, r, c] = _lane_dot(grad[r], x[n, c])


@parallel_kernel
def attention_pixels_backward(x, dy, projected, attn, heads, dx, partials):
    """``x`` and ``dx`` ``(N, L, C)``; ``partials`` ``(N, R, C)``."""
    n_batch, length, n_chan = x.shape
    rows, d = projected.shape[0], n_chan // heads
    queries = rows // heads
    for n in prange(n_batch):
        weights = attn[n]
        grad = np.empty((rows, length), np.float64)
        upstream = dy[n].astype(np.float64)  # (M, C): lane_dot's float64 operand
        for i in range(length):
            features = x[n, i]
            for m in range(queries):
                for h in range(heads):
                    grad[m * heads + h, i] = _lane_dot(upstream[m, h * d:(h + 1) * d],
                                                       features[h * d:(h + 1) * d])
        _scores_gradient(weights, grad)
        acc = np.empty(LANES, np.float64)
        total = np.empty(n_chan, np.float64)
        sums = np.zeros((LANES, rows, n_chan), np.float64)
        for i in range(length):
            features, out, lane = x[n, i], dx[n, i], sums[i % LANES]
            total[:] = 0.0
            for m in range(queries):
                for h in range(heads):
                    share = weights[m * heads + h, i]
                    for c in range(h * d, (h + 1) * d):
                        total[uint64(c)] += np.float64(dy[n, m, c]) * share
            for r in range(rows):
                back = grad[r, i]
                for c in range(n_chan):
                    total[uint64(c)] += projected[r, c] * back
            for c in range(n_chan):
                out[uint64(c)] = total[uint64(c)]
            for r in range(rows):
                back = grad[r, i]
                for c in range(n_chan):
                    lane[r, uint64(c)] += back * np.float64(features[uint64(c)])
        for r in range(rows):
            for c in range(n_chan):
                acc[:] = sums[:, r, c]
                partials[n, r, c] = _halved(acc)
