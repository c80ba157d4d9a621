"""Stochastic pooling's draw (Zeiler & Fergus 2013), whose gradient max pooling's
backward routes.

:func:`stochastic_pool_sample` picks one real tap per window with probability ``x_j /
S``: the first tap whose running sum exceeds ``u * S``, for a uniform draw ``u`` in
``[0, 1)`` per window (the first real tap where ``S = 0``; a tap of weight 0 is never
drawn otherwise), and writes its tap number like a max pooling's winner, so the max
pooling's backward routes it; :func:`stochastic_quads_sample` does so for 2x2 windows
with no padding, with the same draws and bits. The draws are given (an array shaped as
``y``) or, where that array is empty, counted from a 64-bit ``seed``: window ``i``
(row-major over ``y``'s ``(N, C, D, H, W)``) draws :func:`counted_uniform` ``(seed,
i)``, the SplitMix64 output of ``seed + (i + 1) * 0x9E3779B97F4A7C15`` (Steele, Lea and
Flood 2014), its top 53 bits over ``2**53``. Counted in the kernel, a draw costs a few
integer operations where a generator's array of them cost more than the sampling.
:func:`not_weights` checks the inputs: a draw needs weights ``x >= 0`` that are finite,
and the 2x2 kernel also checks that each window's sum ``S`` is finite in x's dtype.
"""

import numpy as np
from numba import prange, uint64

from . import parallel_kernel
from .walk import inlined, quad_rows, row_index, row_windows, rows_task

# SplitMix64's increment and multipliers (the counted draws)
GOLDEN_GAMMA, MIX_1, MIX_2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


@parallel_kernel
def not_weights(values, flags):
    """``flags[k]``: whether part ``k`` of ``flags.size`` equal parts of the 1-d
    ``values`` holds a negative number, a NaN or +inf (stochastic pooling's inputs must
    be probabilities' weights); one pass, vectorized, without stopping early."""
    parts = flags.size
    for part in prange(parts):
        bad = False
        for i in range(part * values.size // parts, (part + 1) * values.size // parts):
            v = values[uint64(i)]
            bad |= not ((v >= 0) & (v < np.inf))
        flags[part] = bad


@inlined
def counted_uniform(seed, index):
    """Draw ``index`` (uint64) of the stream ``seed`` (uint64): a float64 in ``[0, 1)``
    with 53 random bits (the module docstring)."""
    z = seed + (index + uint64(1)) * uint64(GOLDEN_GAMMA)
    z = (z ^ (z >> uint64(30))) * uint64(MIX_1)
    z = (z ^ (z >> uint64(27))) * uint64(MIX_2)
    z = z ^ (z >> uint64(31))
    return np.float64(z >> uint64(11)) * (1.0 / 9007199254740992.0)


@inlined
def _window_number(n, c, od, oh, ow, channels, out_d, out_h, out_w):
    """Window ``(n, c, od, oh, ow)``'s row-major place among ``y``'s windows."""
    return uint64((((n * channels + c) * out_d + od) * out_h + oh) * out_w + ow)


@parallel_kernel(any_layout=True)
def stochastic_pool_sample(x, table, extent, draws, seed, y, pos):
    """One tap per window, drawn with probability ``x_j / S`` by ``draws`` or, where
    that is empty, by ``seed``'s counted draws (the module docstring): its value into
    ``y``, its tap number (row-major over ``extent``) into ``pos``."""
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    ext_h, ext_w = extent[1], extent[2]
    zero = np.zeros(1, x.dtype)[0]
    given = draws.size != 0
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            total = zero
            for xd in range(start_d + first_d, start_d + end_d):
                for xh in range(start_h + first_h, start_h + end_h):
                    for xw in range(start_w + first_w, start_w + end_w):
                        total += x[n, c, xd, xh, xw]
            draw = (draws[n, c, od, oh, ow] if given else counted_uniform(
                seed, _window_number(n, c, od, oh, ow, n_chan, out_d, out_h, out_w)))
            threshold = draw * total
            # the fallbacks: the first tap where S = 0, the last positive one where
            # rounding leaves the running sum at or below u * S
            chosen_d, chosen_h, chosen_w = first_d, first_h, first_w
            running = zero
            found = False
            for jd in range(first_d, end_d):
                for jh in range(first_h, end_h):
                    for jw in range(first_w, end_w):
                        if not found:
                            v = x[n, c, start_d + jd, start_h + jh, start_w + jw]
                            running += v
                            if v > 0:
                                chosen_d, chosen_h, chosen_w = jd, jh, jw
                                found = running > threshold
            y[n, c, od, oh, ow] = x[n, c, start_d + chosen_d, start_h + chosen_h,
                                    start_w + chosen_w]
            pos[n, c, od, oh, ow] = (chosen_d * ext_h + chosen_h) * ext_w + chosen_w


@inlined
def _drawn(v0, v1, v2, v3, draw, zero):
    """``(value, tap, S)`` drawn from the 2x2 window ``v0 .. v3`` (row-major) by
    ``draw``, as :func:`stochastic_pool_sample` draws it (running sums in x's dtype from
    +0, ``u * S`` in float64), with selects where it branches, so that a loop
    vectorizes; ``S`` the window's sum, for :func:`quad_not_weights`."""
    r0 = zero + v0
    r1 = r0 + v1
    r2 = r1 + v2
    total = r2 + v3
    threshold = draw * total
    done = (v0 > zero) & (r0 > threshold)
    take = (v1 > zero) & (not done)
    value, tap = (v1, 1) if take else (v0, 0)
    done |= take & (r1 > threshold)
    take = (v2 > zero) & (not done)
    value, tap = (v2, 2) if take else (value, tap)
    done |= take & (r2 > threshold)
    take = (v3 > zero) & (not done)
    value, tap = (v3, 3) if take else (value, tap)
    return value, tap, total


@inlined
def quad_not_weights(v0, v1, v2, v3, total, zero):
    """Whether the 2x2 window ``v0 .. v3`` is not weights: a tap negative or NaN, or
    ``total`` +inf, from an infinite tap or an overflow in x's dtype (a draw's sum
    ``S``, :func:`_drawn`'s; the stochastic mean's sum of squares, which overflows
    first). One check of the sum, not one per tap."""
    return not ((v0 >= zero) & (v1 >= zero) & (v2 >= zero) & (v3 >= zero) & (total < np.inf))


@inlined
def _sample_quad(top, bottom, i, j, draws, given, seed, first, at, values, taps, zero):
    """Window ``at`` of :func:`_sample_row`, its taps ``top[i], top[j], bottom[i],
    bottom[j]``; whether they are not weights (:func:`quad_not_weights`)."""
    v0, v1, v2, v3 = top[i], top[j], bottom[i], bottom[j]
    draw = draws[at] if given else counted_uniform(seed, first + at)
    values[at], taps[at], total = _drawn(v0, v1, v2, v3, draw, zero)
    return quad_not_weights(v0, v1, v2, v3, total, zero)


@inlined
def _sample_row(top, bottom, draws, given, seed, first, values, taps, step, zero):
    """One NCHW output row of :func:`stochastic_quads_sample` (W stride ``step``), its
    draws ``draws`` if ``given``, else counted from ``seed`` for windows ``first,
    first + 1, ...``; whether a window it read was not weights."""
    bad = False
    if step == 2:  # a constant stride: interleaved loads
        for ow in range(values.shape[0]):
            at, i = uint64(ow), uint64(2 * ow)
            bad |= _sample_quad(top, bottom, i, i + 1, draws, given, seed, first, at,
                                values, taps, zero)
        return bad
    for ow in range(values.shape[0]):
        at = uint64(ow)
        i = at * uint64(step)
        bad |= _sample_quad(top, bottom, i, i + 1, draws, given, seed, first, at, values,
                            taps, zero)
    return bad


@parallel_kernel
def stochastic_quads_sample(x, inner, steps, chunks, tasks, draws, seed, y, pos, invalid):
    """:func:`stochastic_pool_sample` for 2x2 windows with no padding (window ``(1, 2,
    2)``, ``steps`` the stride per axis), with its draws and bits: ``x``, ``y`` and
    ``pos`` as rows ``(P, D, H, W * inner)`` (NCHW planes, ``inner`` 1, or channels-last
    images, ``inner`` C), ``draws`` (or an empty array: ``seed``'s) indexed ``(N, C, D,
    H, W)`` as the general kernel's; ``chunks`` parallel tasks per plane, ``tasks`` in
    all. ``invalid[task]`` says whether a window that task read was not weights (the
    whole check where the windows cover x)."""
    out_d, out_h, out_w = y.shape[1], y.shape[2], y.shape[3] // inner
    channels = draws.shape[1]  # NCHW planes' channels, where draws are given
    zero = np.zeros(1, x.dtype)[0]
    given = draws.size != 0
    window_plane = uint64(out_d * out_h * out_w)
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        bad = False
        for row in range(first, end):
            od, oh, top, bottom = quad_rows(x, plane, row, out_h, steps)
            values, taps = y[plane, od, oh], pos[plane, od, oh]
            # window (n, c, od, oh, 0)'s number, row-major over (N, C, D, H, W)
            number = uint64((plane * inner * out_d + od) * out_h + oh) * uint64(out_w)
            if inner == 1:
                row_draws = draws[plane // channels, plane % channels, od, oh] if given else (
                    draws[0, 0, 0, 0])
                bad |= _sample_row(top, bottom, row_draws, given, seed, number, values,
                                   taps, steps[2], zero)
                continue
            across = uint64(inner)
            for ow in range(out_w):  # along C: the taps' loads are contiguous
                base, out = uint64(ow) * uint64(steps[2]) * across, uint64(ow) * across
                for c in range(inner):
                    i, at = base + uint64(c), out + uint64(c)
                    v0, v1 = top[i], top[i + across]
                    v2, v3 = bottom[i], bottom[i + across]
                    draw = (draws[plane, c, od, oh, ow] if given else counted_uniform(
                        seed, number + uint64(c) * window_plane + uint64(ow)))
                    values[at], taps[at], total = _drawn(v0, v1, v2, v3, draw, zero)
                    bad |= quad_not_weights(v0, v1, v2, v3, total, zero)
        invalid[task] = bad
