"""GeM and Lp over 2x2 windows with no padding, fused: each window's four taps loaded,
raised and summed, and its root taken, along an output row, in one pass over x. NCHW
rows take stride 2 along W alone (:func:`.rule.paired_quads`).

The rows are :func:`.power_mean.gem_rows_forward`'s (``x`` ``(P, D, H, W * inner)``:
NCHW planes with ``inner`` 1, or channels-last images with ``inner`` C), and so are the
sums and the bits: each window summed in float64 from +0 in tap order (row-major), its
root :func:`.powers.root`'s, and a window whose sum left the range redone relative to
its largest tap (:func:`.powers.rows_rescaled`). With ``eps`` None the windows pool
Lp norms (:mod:`.powers`).
"""

import numpy as np
from numba import prange, uint64

from . import parallel_kernel
from .powers import (
    divisor,
    in_range,
    may_leave_range,
    raised_row,
    raised_tap,
    real_power,
    root,
    rows_rescaled,
)
from .walk import copy_row, inlined, quad_rows, quad_taps, rows_task


@inlined
def _window_sum(first, second, third, fourth):
    """A 2x2 window's ``sum z^p`` from its four taps' powers in tap order (row-major),
    from +0 in float64: :func:`.power_mean.gem_rows_forward`'s sum, with its bits."""
    return (((0.0 + first) + second) + third) + fourth


@inlined
def _quad_sum(top, bottom, i, j, eps, p, whole):
    """:func:`_window_sum` of the 2x2 window ``top[i], top[j], bottom[i], bottom[j]``,
    each tap raised here."""
    return _window_sum(raised_tap(np.float64(top[i]), p, whole, eps),
                       raised_tap(np.float64(top[j]), p, whole, eps),
                       raised_tap(np.float64(bottom[i]), p, whole, eps),
                       raised_tap(np.float64(bottom[j]), p, whole, eps))


@inlined
def _quad_roots(sums, out, eps, p, whole, precise):
    """``out[o]``, the power mean of the 2x2 window whose sum is ``sums[o]``."""
    for o in range(out.shape[0]):
        at = uint64(o)
        out[at] = root(sums[at] / divisor(4, eps), p, whole, precise)


@inlined
def _quads_row(top, bottom, out, inner, steps, eps, p, whole, precise, top_powers,
               bottom_powers, sums):
    """``out[o]``, the power mean of output ``o``'s window along a row of 2x2 windows;
    returns how many sums left the range, counted in the loop that sums.

    An NCHW row (at stride 2, the rule's) raises its two rows' taps into
    ``top_powers`` and ``bottom_powers`` first: raised in the loop that sums, each
    window's neighbours took interleaved loads, and a real ``p`` ran 1.5x as long. A
    channels-last row raises in the loop that sums. Where ``p`` is real, the roots
    (an exp and a log each) then run over the stored ``sums``: with the count of the
    sums that left the range in their loop, it took a tenth longer. A whole ``p``
    takes each root in the loop that sums, on channels-last rows: a second pass over
    stored sums cost a channels-last Lp forward a third of its time
    (docs/performance.md)."""
    outside = 0
    checked = may_leave_range(top, whole, eps)
    if inner == 1:
        raised_row(top, eps, p, whole, top_powers)
        raised_row(bottom, eps, p, whole, bottom_powers)
        for ow in range(out.shape[0]):
            at, i = uint64(ow), uint64(2 * ow)
            total = _window_sum(top_powers[i], top_powers[i + uint64(1)], bottom_powers[i],
                                bottom_powers[i + uint64(1)])
            sums[at] = total
            if checked:
                outside += 0 if in_range(total) else 1
        _quad_roots(sums, out, eps, p, whole, precise)
        return outside
    step, across = uint64(steps[2] * inner), uint64(inner)
    real = real_power(whole)
    for ow in range(out.shape[0] // inner):
        base, first = uint64(ow) * step, uint64(ow) * across
        for c in range(inner):
            i, at = base + uint64(c), first + uint64(c)
            total = _quad_sum(top, bottom, i, i + across, eps, p, whole)
            if real:
                sums[at] = total
            else:
                out[at] = root(total / divisor(4, eps), p, whole, precise)
            if checked:
                outside += 0 if in_range(total) else 1
    if real:
        _quad_roots(sums, out, eps, p, whole, precise)
    return outside


@parallel_kernel
def gem_quads_forward(x, inner, window, steps, chunks, tasks, eps, p, whole, y, copy):
    """GeM over 2x2 windows (``window`` ``(1, 2, 2)``, no padding; NCHW ones at stride
    2 along W), with :func:`.power_mean.gem_rows_forward`'s arguments, rows and
    bits: each window's four taps raised and summed, and its root taken, along the row
    (:func:`_quads_row`), vectorized (NCHW: over the taps, then over pairs of
    neighbours; channels-last: along C).
    ``copy`` (or an empty array) gets each pair of rows the windows read, copied while
    they are in cache (a copy of x for a pullback, where the windows cover x)."""
    out_d, out_h, out_l = y.shape[1], y.shape[2], y.shape[3]
    precise = y.itemsize == 8
    taps = x.shape[3] if inner == 1 else 0  # an NCHW row's taps, raised before summing
    for task in prange(tasks):
        top_powers, bottom_powers, sums = np.empty(taps), np.empty(taps), np.empty(out_l)
        plane, first, end = rows_task(task, chunks, out_d * out_h)
        for row in range(first, end):
            od, oh, top, bottom = quad_rows(x, plane, row, out_h, steps)
            out = y[plane, od, oh]
            outside = _quads_row(top, bottom, out, inner, steps, eps, p, whole, precise,
                                 top_powers, bottom_powers, sums)
            for o in range(out_l if outside else 0):
                i, j = quad_taps(o, inner, steps)
                # rare: redo the window relative to its maximum
                if not in_range(_quad_sum(top, bottom, i, j, eps, p, whole)):
                    out[o] = rows_rescaled(x, plane, o % inner, inner, od, oh, o // inner,
                                           window, steps, 4, eps, p, whole, precise)
            if copy.size != 0:
                copy_top, copy_bottom = quad_rows(copy, plane, row, out_h, steps)[2:]
                copy_row(top, copy_top)
                copy_row(bottom, copy_bottom)
