"""Weighted window averages: SoftPool and stochastic pooling's evaluation mode.

Each window's output is ``y = sum_j w_j x_j`` over its real taps (padding is never
read), with weights that depend on the window's own values:

* ``SOFT`` (SoftPool, Stergiou et al. 2021): ``w_j = exp(x_j - M) / S``, ``M`` the
  window's maximum (so no exponential overflows) and ``S = sum_j exp(x_j - M)``.
  ``norm[o] = M + log(S)``, and ``dy/dx_j = w_j * (1 + x_j - y)``.
* ``SELF`` (stochastic pooling at test time, Zeiler & Fergus 2013): ``w_j = x_j / S``,
  ``S = sum_j x_j`` over non-negative inputs; ``y = 0`` where ``S = 0``.
  ``norm[o] = S``, and ``dy/dx_j = (2 x_j - y) / S``.

The forwards compute in the dtype of ``y`` (the compute dtype: x's, float16's in
float32), as the core's average pooling does, with :mod:`.elementary`'s ``exp`` and
``log`` of that precision. SoftPool's backwards compute in float64 whatever the dtype,
the mean's in the compute dtype (as the forward: float64 there doubled the 2x2
backward's time, which its arithmetic, not memory, bounds).
``weighted_pool_*`` walk output rows (forward) or gather per input row through the
plan's cover tables, adding the windows in increasing output order (backward): no races,
and the same bits at any thread count. Sums run in row-major window order from +0.
``weighted_rows_*`` serve windows with no padding on NCHW planes or channels-last images
as rows (the backward only windows that do not overlap), and
:func:`weighted_quads_forward`, :func:`soft_quads_backward` and
:func:`mean_quads_backward` 2x2 windows with no padding (the backwards at stride 2),
all four taps in one loop: the same bits. The mean's recomputes ``y`` and ``S`` from
``x``, so its caller keeps neither.

Stochastic pooling's draw is :mod:`.stochastic`'s.
"""

import numpy as np
from numba import prange, uint64

from . import elementary, parallel_kernel
from .stochastic import quad_not_weights
from .walk import (
    copy_row,
    gather_tap,
    inlined,
    quad_rows,
    quad_taps,
    row_index,
    row_windows,
    rows_task,
    scatter_tap,
)

SOFT, SELF = 0, 1


@inlined
def _weight(v, largest, kind):
    return elementary.exp_in(v - largest) if kind == SOFT else v


@inlined
def _finish(largest, total, weighted, kind, real):
    """``(y, norm)`` of a window from its sums, in the dtype ``real``."""
    if kind == SOFT:
        return weighted / total, largest + elementary.log_in(total)
    return (weighted / total if total != 0 else real(0.0)), total


@inlined
def _share(value, out, scale, dy, kind, real):
    """``dy * dy/dx`` of a tap of value ``value`` in a window (``out``, ``scale``: its
    ``y`` and ``norm``), all float64: SoftPool's in float64, the mean's in ``real`` (the
    compute dtype, which holds each of them exactly) and returned as float64."""
    if kind == SOFT:
        return dy * (elementary.exp(value - scale) * (1.0 + value - out))
    return np.float64(_mean_share(_mean_gradient(real(dy), real(scale), real), real(value),
                                  real(out)))


@inlined
def _mean_gradient(dy, scale, real):
    """``dy / S`` of a ``SELF`` window in ``real``, 0 where ``S = 0`` (a select: no
    division by 0)."""
    return dy / (scale if scale != 0 else real(1.0)) if scale != 0 else real(0.0)


@inlined
def _mean_share(gradient, value, out):
    """A ``SELF`` tap's share, ``dy / S * (2 x_j - y)``, from the window's ``dy / S``."""
    return gradient * (value + value - out)


@parallel_kernel
def weighted_pool_forward(x, table, kind, y, norm):
    real = y.dtype.type
    n_batch, n_chan = x.shape[0], x.shape[1]
    out_d, out_h, out_w = y.shape[2], y.shape[3], y.shape[4]
    for row in prange(n_batch * n_chan * out_d * out_h):
        n, c, od, oh = row_index(row, n_chan, out_d, out_h)
        start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
        for ow in range(out_w):
            start_w, first_w, end_w = table[2, 0, ow], table[2, 1, ow], table[2, 2, ow]
            largest = real(x[n, c, start_d + first_d, start_h + first_h, start_w + first_w])
            if kind == SOFT:
                for xd in range(start_d + first_d, start_d + end_d):
                    for xh in range(start_h + first_h, start_h + end_h):
                        for xw in range(start_w + first_w, start_w + end_w):
                            v = real(x[n, c, xd, xh, xw])
                            largest = v if (v > largest) | (v != v) else largest
            total, weighted = real(0.0), real(0.0)
            for xd in range(start_d + first_d, start_d + end_d):
                for xh in range(start_h + first_h, start_h + end_h):
                    for xw in range(start_w + first_w, start_w + end_w):
                        v = real(x[n, c, xd, xh, xw])
                        w = _weight(v, largest, kind)
                        total += w
                        weighted += w * v
            y[n, c, od, oh, ow], norm[n, c, od, oh, ow] = _finish(largest, total, weighted,
                                                                  kind, real)


@parallel_kernel
def weighted_pool_backward(x, y, norm, dy, kind, cover_ptr, cover_out, dx):
    """``dx[i]`` = sum over the windows ``o`` reading ``i`` of ``dy[o] * dy[o]/dx[i]``
    (the module docstring's formulas); a ``SELF`` window with ``S = 0`` sends 0."""
    n_batch, n_chan, in_d, in_h, in_w = dx.shape
    real = x.dtype.type
    for row in prange(n_batch * n_chan * in_d * in_h):
        n, c, i_d, ih = row_index(row, n_chan, in_d, in_h)
        for iw in range(in_w):
            value = np.float64(x[n, c, i_d, ih, iw])
            total = 0.0
            for a in range(cover_ptr[0, i_d], cover_ptr[0, i_d + 1]):
                od = cover_out[0, a]
                for b in range(cover_ptr[1, ih], cover_ptr[1, ih + 1]):
                    oh = cover_out[1, b]
                    for e in range(cover_ptr[2, iw], cover_ptr[2, iw + 1]):
                        ow = cover_out[2, e]
                        total += _share(value, np.float64(y[n, c, od, oh, ow]),
                                        np.float64(norm[n, c, od, oh, ow]),
                                        np.float64(dy[n, c, od, oh, ow]), kind, real)
            dx[n, c, i_d, ih, iw] = total


@parallel_kernel
def weighted_rows_forward(x, inner, window, steps, chunks, tasks, kind, y, norm):
    """The forward on rows ``(P, D, H, W * inner)`` (NCHW planes with ``inner`` 1, or
    channels-last images with ``inner`` C; ``window`` and ``steps`` the ``(D, H, W)``
    kernel and stride, no padding): each tap of the windows of an output row gathered
    into a contiguous buffer, then the running maxima and sums taken over it, tap by
    tap in tap order, with :func:`weighted_pool_forward`'s bits."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps, largest = np.empty(out_l, y.dtype), np.empty(out_l, y.dtype)
        total, weighted = np.empty(out_l, y.dtype), np.empty(out_l, y.dtype)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            gather_tap(x[plane, od * steps[0], oh * steps[1]], 0, steps[2], inner, largest)
            total[:] = 0
            weighted[:] = 0
            # SoftPool takes the maxima first (phase 0), then both kinds the sums
            for phase in range(0 if kind == SOFT else 1, 2):
                for a in range(window[0]):
                    for b in range(window[1]):
                        src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                        for t in range(window[2]):
                            gather_tap(src, t, steps[2], inner, taps)
                            for o in range(out_l):
                                at = uint64(o)
                                v, best = taps[at], largest[at]
                                if phase == 0:
                                    largest[at] = v if (v > best) | (v != v) else best
                                else:
                                    w = _weight(v, best, kind)
                                    total[at] += w
                                    weighted[at] += w * v
            means, norms = y[plane, od, oh], norm[plane, od, oh]
            for o in range(out_l):
                at = uint64(o)
                means[at], norms[at] = _finish(largest[at], total[at], weighted[at], kind,
                                               y.dtype.type)


@inlined
def _larger(largest, v):
    """SoftPool's running maximum: ``v`` if larger or NaN."""
    return v if (v > largest) | (v != v) else largest


@inlined
def _quad(top, bottom, i, j, soft, real):
    """``(y, S, M)`` of the window whose taps are ``top[i], top[j], bottom[i],
    bottom[j]`` (row-major order), as the rows kernel takes them; for ``SELF``, ``M`` is
    the window's check word (:func:`_check_word`); ``soft`` a literal."""
    v0, v1, v2, v3 = real(top[i]), real(top[j]), real(bottom[i]), real(bottom[j])
    zero = real(0.0)
    if soft:
        largest = _larger(_larger(_larger(v0, v1), v2), v3)
        w0, w1 = elementary.exp_in(v0 - largest), elementary.exp_in(v1 - largest)
        w2, w3 = elementary.exp_in(v2 - largest), elementary.exp_in(v3 - largest)
        total = (((zero + w0) + w1) + w2) + w3
        weighted = (((zero + w0 * v0) + w1 * v1) + w2 * v2) + w3 * v3
        return weighted / total, total, largest
    total = (((zero + v0) + v1) + v2) + v3
    weighted = (((zero + v0 * v0) + v1 * v1) + v2 * v2) + v3 * v3
    return _finish(zero, total, weighted, SELF, real) + (
        _check_word(v0, v1, v2, v3, weighted),)


@inlined
def _check_word(v0, v1, v2, v3, weighted):
    """A ``SELF`` window's check: below the bits of +inf (:func:`.elementary.
    unsigned_bits`) exactly where every tap is a weight (>= 0, not NaN) and the sums
    are finite in x's dtype (x^2 overflows first, and an infinite tap makes inf / inf),
    but for -0.0, a false alarm that :func:`_row_not_weights` settles. Integer maxima: the
    float compares and masks of the exact test cost the channels-last 2x2 forward two
    fifths of its time. (An OR of the taps' bits would be cheaper and wrong: 1.0 and
    2.0 OR to the bits of +inf.)"""
    taps = max(max(elementary.unsigned_bits(v0), elementary.unsigned_bits(v1)),
               max(elementary.unsigned_bits(v2), elementary.unsigned_bits(v3)))
    return max(taps, elementary.unsigned_bits(weighted))


@inlined
def _row_not_weights(top, bottom, windows, inner, steps, real):
    """Whether a window of the row (:func:`_quads_row`'s) is not weights: the exact
    test, where the check words raised an alarm."""
    zero, found = real(0.0), False
    for o in range(windows):
        i, j = quad_taps(o, inner, steps)
        v0, v1, v2, v3 = real(top[i]), real(top[j]), real(bottom[i]), real(bottom[j])
        weighted = (((zero + v0 * v0) + v1 * v1) + v2 * v2) + v3 * v3
        found |= quad_not_weights(v0, v1, v2, v3, weighted, zero)
    return found


@inlined
def _quad_out(top, bottom, i, j, soft, real, means, sums, largest, at, keep):
    """:func:`_quad`'s window written at ``at``: its mean to ``means``, and with
    ``keep`` what ``norm`` is made of, its ``S`` to ``sums`` (and SoftPool's ``M`` to
    ``largest``); returns the mean's check word (:func:`_check_word`; 0 for
    SoftPool)."""
    mean, total, tag = _quad(top, bottom, i, j, soft, real)
    means[at] = mean
    if keep:
        sums[at] = total
        if soft:
            largest[at] = tag
    return elementary.unsigned_bits(real(0.0)) if soft else tag


@inlined
def _quads_row(top, bottom, means, sums, largest, norms, inner, steps, soft, real, keep):
    """One output row of :func:`weighted_quads_forward`; ``soft`` a literal, so that
    each call compiles loops with no branch on the kind. The first loop writes each
    window's mean and counts the mean's check; with ``keep``, it also writes the ``S``
    (and SoftPool's ``M``) a backward needs into the task's own buffers ``sums`` and
    ``largest``, and a second loop over them (in L1) writes ``norms``: SoftPool's
    ``log`` in the first kept that loop scalar (6.5 ms against 3.8 on a channels-last
    layer), and a fifth array of the caller's did the same for NCHW (the stochastic
    mean's forward, 3.0 ms against 1.3). Returns whether a ``SELF`` window may not be
    weights: the largest check word reached the bits of +inf (False for SoftPool)."""
    # the check words' maximum, in their own width: Numba's arithmetic would widen
    # them to 64 bits, whose lanes halve the float32 loop's vectors (ymm, not zmm)
    highest = elementary.unsigned_bits(real(0.0))
    if inner == 1:  # NCHW, at stride 2 (the rule's): interleaved loads
        for ow in range(means.shape[0]):
            at, i = uint64(ow), uint64(2 * ow)
            word = _quad_out(top, bottom, i, i + 1, soft, real, means, sums, largest, at,
                             keep)
            highest = word if word > highest else highest
    else:
        step, across = uint64(steps[2] * inner), uint64(inner)
        for ow in range(means.shape[0] // inner):
            base, first = uint64(ow) * step, uint64(ow) * across
            for c in range(inner):
                i, at = base + uint64(c), first + uint64(c)
                word = _quad_out(top, bottom, i, i + across, soft, real, means, sums,
                                 largest, at, keep)
                highest = word if word > highest else highest
    if keep:
        for o in range(norms.shape[0]):
            at = uint64(o)
            norms[at] = largest[at] + elementary.log_in(sums[at]) if soft else sums[at]
    return highest >= elementary.unsigned_bits(real(np.inf))


@parallel_kernel
def weighted_quads_forward(x, inner, window, steps, chunks, tasks, kind, y, norm, invalid,
                           copy):
    """The forward of 2x2 windows (``window`` ``(1, 2, 2)``, no padding; NCHW ones at
    stride 2 along W), with :func:`weighted_rows_forward`'s arguments, rows and bits:
    each output's four taps loaded, weighted and summed in one loop along the row,
    vectorized (NCHW: pairs of neighbours; channels-last: along C).

    ``norm`` may be empty (a forward that no backward follows): it is then not written.
    For ``SELF``, ``invalid[task]`` says whether a window that task read was not weights
    (a negative or NaN tap, or an infinite sum), so that stochastic pooling checks its
    input in the same pass; SoftPool leaves ``invalid`` as it is. ``invalid`` has
    ``tasks`` entries.

    ``copy`` (or an empty array) gets each pair of rows the windows read, copied while
    they are in cache (a copy of x for a pullback, where the windows cover x). Empty,
    not None: one compiled kernel serves every call (None compiled one per pattern)."""
    real = y.dtype.type
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    keep, copies = norm.size != 0, copy.size != 0
    # each task's buffers, only where the rows' second loop reads them (an NCHW layer
    # has thousands of tasks)
    summed = out_l if keep else 0
    largest_of = out_l if kind == SOFT and keep else 0
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        largest, sums = np.empty(largest_of, y.dtype), np.empty(summed, y.dtype)
        bad = False
        for row in range(first, end):
            od, oh, top, bottom = quad_rows(x, plane, row, out_h, steps)
            means = y[plane, od, oh]
            alarm = False
            # four call sites, each with literal flags: a runtime `keep` in the row's
            # loops kept the stochastic mean's check loop scalar (0.90 ms against 0.66
            # for a channels-last 32x64x56x56 forward at 2 threads)
            if kind == SOFT and keep:
                _quads_row(top, bottom, means, sums, largest, norm[plane, od, oh], inner,
                           steps, True, real, True)
            elif kind == SOFT:
                _quads_row(top, bottom, means, sums, largest, sums, inner, steps, True, real,
                           False)
            elif keep:
                alarm = _quads_row(top, bottom, means, sums, largest, norm[plane, od, oh],
                                   inner, steps, False, real, True)
            else:
                alarm = _quads_row(top, bottom, means, sums, largest, sums, inner, steps,
                                   False, real, False)
            if alarm:  # SoftPool's rows raise none
                bad |= _row_not_weights(top, bottom, out_l, inner, steps, real)
            if copies:
                copy_top, copy_bottom = quad_rows(copy, plane, row, out_h, steps)[2:]
                copy_row(top, copy_top)
                copy_row(bottom, copy_bottom)
        if kind != SOFT:
            invalid[task] = bad


@inlined
def _quad_back(top, bottom, dtop, dbottom, i, j, dy, real):
    """Write the four taps' ``dx`` of the ``SELF`` window ``top[i], top[j], bottom[i],
    bottom[j]`` (``dy`` its upstream gradient), with :func:`_share`'s bits: the
    window's ``y`` and ``S`` recomputed as :func:`_quad` computed them (the same
    operations in the dtype of ``top``), ``dy / S`` once per window."""
    compute = top.dtype.type
    out, total = _quad(top, bottom, i, j, False, compute)[:2]
    gradient = _mean_gradient(compute(dy), total, compute)
    dtop[i] = real(0.0 + _mean_share(gradient, top[i], out))
    dtop[j] = real(0.0 + _mean_share(gradient, top[j], out))
    dbottom[i] = real(0.0 + _mean_share(gradient, bottom[i], out))
    dbottom[j] = real(0.0 + _mean_share(gradient, bottom[j], out))


@inlined
def _mean_back_row(top, bottom, dtop, dbottom, grads, inner, steps, real):
    """One output row of :func:`mean_quads_backward`."""
    if inner == 1 and steps[2] == 2:  # a constant stride: interleaved
        for ow in range(grads.shape[0]):
            at, i = uint64(ow), uint64(2 * ow)
            _quad_back(top, bottom, dtop, dbottom, i, i + 1, grads[at], real)
    elif inner == 1:
        step = uint64(steps[2])
        for ow in range(grads.shape[0]):
            at = uint64(ow)
            i = at * step
            _quad_back(top, bottom, dtop, dbottom, i, i + 1, grads[at], real)
    else:
        step, across = uint64(steps[2] * inner), uint64(inner)
        for ow in range(grads.shape[0] // inner):
            base, first = uint64(ow) * step, uint64(ow) * across
            for c in range(inner):
                i, at = base + uint64(c), first + uint64(c)
                _quad_back(top, bottom, dtop, dbottom, i, i + across, grads[at], real)


@parallel_kernel
def mean_quads_backward(x, dy, inner, window, steps, chunks, tasks, dx):
    """``dx`` of stochastic pooling's mean (``SELF``) over 2x2 windows that do not
    overlap, from ``x`` and ``dy`` alone (no ``y``, no ``norm``: a pullback need keep
    only ``x``), with :func:`weighted_rows_backward`'s other arguments, rows and bits:
    each window's four taps read, its sums recomputed, and its ``dx`` written in one
    loop along the row, vectorized. Inputs no window reads are left as they are (the
    caller zeroes them)."""
    real = dx.dtype.type
    out_d, out_h = dy.shape[1], dy.shape[2]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        for row in range(first, end):
            od, oh, top, bottom = quad_rows(x, plane, row, out_h, steps)
            dtop, dbottom = quad_rows(dx, plane, row, out_h, steps)[2:]
            _mean_back_row(top, bottom, dtop, dbottom, dy[plane, od, oh], inner, steps, real)


@inlined
def _soft_back(src, dst, i, out, scale, dy, real):
    """``dx`` of one SoftPool tap ``src[i]`` into ``dst[i]``, with :func:`_share`'s bits."""
    dst[i] = real(0.0 + _share(np.float64(src[i]), out, scale, dy, SOFT, real))


@inlined
def _soft_back_row(top, bottom, dtop, dbottom, means, norms, grads, taps, inner, steps, real):
    """One output row of :func:`soft_quads_backward`, one pass along the row per tap
    (each pass one ``exp`` per step: with four, LLVM no longer inlines them and the
    loop stays scalar, 34 ms against 21 on a channels-last layer); ``taps`` a float64
    buffer of the row's length."""
    if inner == 1:  # gathered into a contiguous float64 buffer: strided exps stay scalar
        for tap in range(4):
            src, dst = (top, dtop) if tap < 2 else (bottom, dbottom)
            gather_tap(src, tap % 2, steps[2], 1, taps)
            for ow in range(means.shape[0]):
                at = uint64(ow)
                taps[at] = 0.0 + _share(taps[at], np.float64(means[at]),
                                        np.float64(norms[at]), np.float64(grads[at]), SOFT,
                                        real)
            scatter_tap(taps, tap % 2, steps[2], 1, dst)
        return
    step, across = uint64(steps[2] * inner), uint64(inner)
    for tap in range(4):
        src, dst = (top, dtop) if tap < 2 else (bottom, dbottom)
        for ow in range(means.shape[0] // inner):
            base, first = uint64(ow) * step + uint64(tap % 2) * across, uint64(ow) * across
            for c in range(inner):
                i, at = base + uint64(c), first + uint64(c)
                _soft_back(src, dst, i, np.float64(means[at]), np.float64(norms[at]),
                           np.float64(grads[at]), real)


@parallel_kernel
def soft_quads_backward(x, y, norm, dy, inner, window, steps, chunks, tasks, dx):
    """``dx`` of SoftPool over 2x2 windows that do not overlap (stride >= 2, no
    padding), with :func:`weighted_rows_backward`'s arguments (but the kind), rows and
    bits. Inputs no window reads are left as they are (the caller zeroes them)."""
    real = dx.dtype.type
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps = np.empty(out_l, np.float64)
        for row in range(first, end):
            od, oh, top, bottom = quad_rows(x, plane, row, out_h, steps)
            dtop, dbottom = quad_rows(dx, plane, row, out_h, steps)[2:]
            _soft_back_row(top, bottom, dtop, dbottom, y[plane, od, oh], norm[plane, od, oh],
                           dy[plane, od, oh], taps, inner, steps, real)


@parallel_kernel
def weighted_rows_backward(x, y, norm, dy, inner, window, steps, chunks, tasks, kind, dx):
    """``dx`` for windows that do not overlap, rows laid out as
    :func:`weighted_rows_forward`'s: each tap of each window written once, with
    :func:`weighted_pool_backward`'s bits. Inputs no window reads are left as they are
    (the caller zeroes them)."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    real = x.dtype.type
    for task in prange(tasks):
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        taps = np.empty(out_l, np.float64)
        for row in range(first, end):
            od, oh = row // out_h, row % out_h
            means, norms, grads = y[plane, od, oh], norm[plane, od, oh], dy[plane, od, oh]
            for a in range(window[0]):
                for b in range(window[1]):
                    src = x[plane, od * steps[0] + a, oh * steps[1] + b]
                    for t in range(window[2]):
                        gather_tap(src, t, steps[2], inner, taps)
                        for o in range(out_l):
                            at = uint64(o)
                            taps[at] = 0.0 + _share(taps[at], np.float64(means[at]),
                                                    np.float64(norms[at]),
                                                    np.float64(grads[at]), kind, real)
                        scatter_tap(taps, t, steps[2], inner,
                                    dx[plane, od * steps[0] + a, oh * steps[1] + b])
