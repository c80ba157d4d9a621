"""Slow, obvious reference implementations, written from the definitions alone.

Nothing here imports poolgrad: window positions, output sizes, divisors and
gradients are computed again, element by element, so the kernels are checked
against an independent reading of the semantics (PyTorch's and ONNX's).
"""

import itertools
import math

import numpy as np


def output_length(length, kernel, stride, dilation, before, after, ceil_mode):
    span = dilation * (kernel - 1) + 1
    room = length + before + after - span
    count = (math.ceil(room / stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (count - 1) * stride >= length + before:
        count -= 1  # the last window would start in the end padding
    return count


def sliding_windows(spatial, kernel, stride, dilation, pads, ceil_mode):
    """For each output position, the list of taps ``(coords, inside_input, inside_padded)``
    in row-major window order."""
    per_axis = []
    for length, k, s, d, (lo, hi) in zip(spatial, kernel, stride, dilation, pads, strict=False):
        axis = []
        for o in range(output_length(length, k, s, d, lo, hi, ceil_mode)):
            taps = []
            for j in range(k):
                coord = o * s - lo + j * d
                taps.append((coord, 0 <= coord < length, -lo <= coord < length + hi))
            axis.append(taps)
        per_axis.append(axis)
    return _combine(per_axis)


def adaptive_windows(spatial, out_spatial):
    per_axis = []
    for length, count in zip(spatial, out_spatial, strict=False):
        axis = []
        for o in range(count):
            start, stop = (o * length) // count, -((-(o + 1) * length) // count)
            axis.append([(c, True, True) for c in range(start, stop)])
        per_axis.append(axis)
    return _combine(per_axis)


def _combine(per_axis):
    windows = {}
    for out_index in itertools.product(*(range(len(a)) for a in per_axis)):
        taps = []
        for combo in itertools.product(*(a[o] for a, o in zip(per_axis, out_index, strict=False))):
            coords = tuple(t[0] for t in combo)
            taps.append((coords, all(t[1] for t in combo), all(t[2] for t in combo)))
        windows[out_index] = taps
    return windows


def pool(x, windows, kind, dy=None, count_include_pad=True, divisor_override=None,
         p=2.0, ties="first"):
    """Forward (and, given ``dy``, the gradient) of one pooling, in float64.

    ``x`` is ``(N, C, *spatial)``. Returns ``(y, dx, indices)``.
    """
    x = np.asarray(x)
    n_batch, n_chan = x.shape[:2]
    out_spatial = tuple(np.max(list(windows), axis=0) + 1)
    y = np.zeros((n_batch, n_chan) + out_spatial)
    indices = np.zeros(y.shape, dtype=np.int64)
    dx = np.zeros(x.shape)
    for n, c in itertools.product(range(n_batch), range(n_chan)):
        plane = x[n, c].astype(np.float64)
        for out_index, taps in windows.items():
            real = [coords for coords, inside, _ in taps if inside]
            values = [plane[coords] for coords in real]
            g = 0.0 if dy is None else float(dy[(n, c) + out_index])
            if kind == "max":
                nans = [i for i, v in enumerate(values) if np.isnan(v)]
                if nans:
                    winners, best = [nans[0]], np.nan
                else:
                    best = max(values)
                    winners = [i for i, v in enumerate(values) if v == best]
                    if ties == "first":
                        winners = winners[:1]
                y[(n, c) + out_index] = best
                indices[(n, c) + out_index] = np.ravel_multi_index(real[winners[0]], plane.shape)
                for i in winners:
                    dx[(n, c) + real[i]] += g / len(winners)
            elif kind == "avg":
                if divisor_override is not None:
                    divisor = divisor_override
                elif count_include_pad:
                    divisor = sum(1 for _, _, padded in taps if padded)
                else:
                    divisor = len(real)
                y[(n, c) + out_index] = sum(values) / divisor
                for coords in real:
                    dx[(n, c) + coords] += g / divisor
            elif kind == "lp":
                norm = sum(abs(v) ** p for v in values) ** (1 / p)
                y[(n, c) + out_index] = norm
                for coords, v in zip(real, values, strict=False):
                    if norm != 0 and v != 0:
                        dx[(n, c) + coords] += g * np.sign(v) * (abs(v) / norm) ** (p - 1)
            else:
                raise ValueError(kind)
    return y, dx, indices


def unpool(y, indices, out_spatial, dout=None):
    """Serial scatter: later entries overwrite earlier ones; each place's gradient goes to
    the entry that was written last."""
    n_batch, n_chan = y.shape[:2]
    out = np.zeros((n_batch, n_chan, math.prod(out_spatial)))
    dy = np.zeros(y.shape)
    flat_y = y.reshape(n_batch, n_chan, -1)
    flat_i = indices.reshape(n_batch, n_chan, -1)
    for n, c in itertools.product(range(n_batch), range(n_chan)):
        last = {}
        for k in range(flat_y.shape[2]):
            out[n, c, flat_i[n, c, k]] = flat_y[n, c, k]
            last[flat_i[n, c, k]] = k
        if dout is not None:
            flat_dout = dout.reshape(n_batch, n_chan, -1)
            for target, k in last.items():
                dy.reshape(n_batch, n_chan, -1)[n, c, k] = flat_dout[n, c, target]
    return out.reshape((n_batch, n_chan) + tuple(out_spatial)), dy
