"""The dispatch's rules for the pooling kinds of :mod:`poolgrad.kinds`: anti-aliased
pooling (:mod:`.blur`), the weighted window averages (:mod:`.weighted`), the blends
of maximum and mean (:mod:`.blend`: mixed and gated pooling), attention pooling
(:mod:`.attention`, on ``(N, C, L)`` views, as global GeM), fractional
max pooling (:mod:`.fractional`, whose windows come with each call), GeM
(:mod:`.power_mean`: global on ``(N, C, L)`` views, channels innermost or planes, and
over sliding windows) and adaptive polyphase sampling (:mod:`.polyphase`). Each has one
kernel per pass and layout; the run signatures are in :mod:`.dispatch`."""

from __future__ import annotations

import math

import numba
import numpy as np

from .. import geometry
from . import (
    attention,
    blend,
    blur,
    blur_rows,
    fractional,
    layouts,
    polyphase,
    power_mean,
    power_quads,
    stochastic,
    weighted,
)
from .rule import Rule, always, apart, full_windows, paired_quads, quads, quads_apart


def streams_rows(plan, operand, record) -> bool:
    """A blur of 1-d and 2-d planes (a depth of 1, so no work along D): the rows
    kernels, which read one D slice. A 3-d blur with nothing to do along D still has
    its depth: the chain (the rows kernels took its first slice alone). A read-only
    operand takes the chain too: Numba compiles a kernel again for read-only arrays,
    and the forward rows kernel takes 30 s to compile, for inputs that are rare."""
    return (plan.window[0] == 1 and tuple(plan.axis_blurs[0]) == (1, 1, 0, 0, 0)
            and (len(plan.in_spatial) < 3 or plan.in_spatial[0] == 1)
            and operand.writeable)


def _rows_channels_last(plan, operand, record) -> bool:
    return operand.layout == "channels_last" and streams_rows(plan, operand, record)


def _row_reads(plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which ``(output row, H tap)`` read each map row, in increasing order, as a CSR
    ``(ptr, rows, taps)`` over the map rows (a zero pad reads none)."""
    taps, stride, before, _, mode = (int(v) for v in plan.axis_blurs[1])
    map_h = ((1,) * (3 - len(plan.map_spatial)) + plan.map_spatial)[1]
    out_h = int(plan.shapes[-1][1])  # the (D, H, W) output plane's
    reads = sorted((j, o, t) for o in range(out_h) for t in range(taps)
                   if (j := blur.padded_source(o * stride - before + t, map_h, mode)) >= 0)
    read = np.array(reads, np.int64).reshape(-1, 3)
    ptr = np.searchsorted(read[:, 0], np.arange(map_h + 1)).astype(np.int64)
    return ptr, np.ascontiguousarray(read[:, 1]), np.ascontiguousarray(read[:, 2])


def _row_tasks(planes: int, rows: int) -> tuple[int, int]:
    """Tasks per plane (whole planes when there are enough for every thread) and the
    parallel runs they are grouped into."""
    if planes == 0:  # an empty batch or no channels: nothing to run
        return 1, 0
    threads = numba.get_num_threads()
    chunks = 1 if planes >= 4 * threads else max(1, min(rows, -(-4 * threads // planes)))
    return chunks, min(planes * chunks, 4 * threads)


_NO_WINNERS = np.empty((0, 0, 0), np.uint8)
_MAX_VALUES = 3  # blur_rows_forward's pre-pool code for a max whose winners are not kept


def _rows_arguments(plan, dtype):
    """The rows kernels' tables of ``plan`` in ``dtype``, kept on the plan (immutable,
    one object per geometry) as :meth:`~poolgrad.geometry.BlurPlan.weights` keeps its
    filters."""
    kept = plan.__dict__.setdefault("_rows_arguments", {})  # frozen: no setattr
    key = np.dtype(dtype)
    if key not in kept:
        kh, kw = plan.window[1], plan.window[2]
        kept[key] = (geometry.BLUR_PRE.index(plan.pre), np.array(plan.window, np.int64),
                     plan.axis_blurs, plan.weights(dtype, "axis_filters"),
                     np.array([1 / kh, 1 / kw, 0.0], dtype))  # the mean's, a loaded +0
    return kept[key]


def _as_rows(a: np.ndarray, channels_last: bool) -> np.ndarray:
    """A 5-d ``(N, C, 1, H, W)`` kernel view as rows: ``(N * C, H, W)`` planes, or
    channels-last ``(N, H, W * C)`` images (a view when ``a`` is stored so, which
    the outputs always are)."""
    return _window_rows(a, channels_last)[0][:, 0]  # D is 1


def _blur_rows(channels_last: bool):
    def bind(plan):
        def run(x, y, winners):  # winners None: a max's values alone
            pre, *tables = _rows_arguments(plan, x.dtype)
            rows, out = _as_rows(x, channels_last), _as_rows(y, channels_last)
            if pre == 1 and winners is None:
                pre = _MAX_VALUES
            taps = _as_rows(winners, channels_last) if pre == 1 else _NO_WINNERS
            blur_rows.blur_rows_forward(rows, x.shape[1] if channels_last else 1, pre,
                                        *tables, *_row_tasks(rows.shape[0], out.shape[1]),
                                        out, taps)
        return run
    return bind


def _blur_rows_back(channels_last: bool):
    def bind(plan):
        reads = _row_reads(plan)

        def run(dy, winners, dx):
            pre, *tables = _rows_arguments(plan, dy.dtype)
            rows = _as_rows(dx, channels_last)
            taps = _as_rows(winners, channels_last) if pre == 1 else _NO_WINNERS
            blur_rows.blur_rows_backward(_as_rows(dy, channels_last),
                                         dy.shape[1] if channels_last else 1, pre, *tables,
                                         *reads, *_row_tasks(rows.shape[0], rows.shape[1]),
                                         taps, rows)
        return run
    return bind


def _planes(a: np.ndarray) -> np.ndarray:
    """A 5-d kernel array as C-contiguous ``(N * C, D, H, W)`` planes (a view when it
    is C-contiguous, else a copy)."""
    return layouts.planes_of(a)


def _on_planes(out: np.ndarray):
    """Planes to write ``out`` through, and the call that stores them in ``out``: the
    chain writes planes, and ``out`` is channels-last when the input was."""
    if out.flags.c_contiguous:
        return out.reshape((-1,) + out.shape[2:]), lambda: None
    planes = np.empty((math.prod(out.shape[:2]),) + out.shape[2:], out.dtype)
    return planes, lambda: layouts.store_planes(out, planes)


def _blur(plan):
    def run(x, y, winners):  # winners None: a max's values alone (written here, unread)
        if winners is None and plan.pre == "max":
            grid = (1,) * (geometry.KERNEL_AXES - len(plan.map_spatial))
            winners = np.empty(x.shape[:2] + grid + plan.map_spatial,
                               geometry.position_dtype(math.prod(plan.pre_kernel)))
        y_planes, store_y = _on_planes(y)
        w_planes, store_w = (_on_planes(winners) if plan.pre == "max"
                             else (_NO_WINNERS[None], lambda: None))
        blur.blur_pool_forward(_planes(x), plan.pre_kernel, plan.passes, plan.shapes,
                               plan.weights(x.dtype), y_planes, w_planes)
        store_y()
        store_w()
    return run


def _blur_back(plan):
    def run(dy, winners, dx):
        dx_planes, store = _on_planes(dx)
        taps = _planes(winners) if plan.pre == "max" else _NO_WINNERS[None]
        blur.blur_pool_backward(_planes(dy), plan.pre_kernel, plan.passes, plan.shapes,
                                plan.weights(dy.dtype), taps, dx_planes)
        store()
    return run


def _weighted(plan):
    return lambda x, y, norm, kind: weighted.weighted_pool_forward(
        x, plan.table, kind, y, np.empty_like(y) if norm is None else norm)


def _weighted_back(plan):
    ptr, outs, _ = plan.cover
    return lambda x, y, norm, dy, kind, dx: weighted.weighted_pool_backward(
        x, y, norm, dy, kind, ptr, outs, dx)


def _sample(plan):
    """Bind ``stochastic_pool_sample``, which checks nothing (the run returns None)."""
    return lambda x, draws, seed, y, pos: stochastic.stochastic_pool_sample(
        x, plan.table, plan.extent, draws, seed, y, pos)


def _sample_quads(plan):
    """Bind ``stochastic_quads_sample``, which checks the taps it reads: the run returns
    what it found where the windows cover x, else None."""
    window, steps, covered = _rows_geometry(plan)

    def run(x, draws, seed, y, pos):
        inner, x_rows, y_rows, pos_rows = _rows_like(x, y, pos)
        chunks, tasks = _tasks(y_rows)
        invalid = np.zeros(tasks, np.bool_)
        stochastic.stochastic_quads_sample(x_rows, inner, steps, chunks, tasks, draws, seed,
                                         y_rows, pos_rows, invalid)
        return bool(invalid.any()) if covered else None
    return run


def _gem(plan):
    return lambda x, eps, p, whole, y: power_mean.gem_window_forward(
        x, plan.table, eps, p, whole, y)


def _then_copied(bind):
    """``bind`` for a forward that does not copy x as it reads it: its run takes the
    ``copy`` keyword of the forwards that do (an array for a pullback's own x, or None)
    and makes that copy after the kernel."""
    def wrapped(plan):
        run = bind(plan)

        def with_copy(x, *args, copy=None):
            result = run(x, *args)
            if copy is not None:
                np.copyto(copy, x)
            return result
        return with_copy
    return wrapped


def _gem_back(plan):
    ptr, outs, _ = plan.cover
    return lambda x, y, dy, eps, p, whole, dx: power_mean.gem_window_backward(
        x, y, dy, plan.table, eps, p, whole, ptr, outs, dx)


def _gem_p_terms(plan):
    return lambda x, y, dy, eps, p, whole, terms: power_mean.gem_window_p_terms(
        x, y, dy, plan.table, eps, p, whole, terms)


def _window_rows(a: np.ndarray, channels_last: bool) -> tuple[np.ndarray, int]:
    """``(rows, inner)``: a 5-d view as ``(P, D, H, W * inner)`` rows, laid out as x is
    (a view for the outputs, which the engines allocate so; a copy for a ``dy`` stored
    otherwise): NCHW planes (``inner`` 1) or channels-last images (``inner`` C)."""
    n, c, d, h, w = a.shape
    if channels_last:
        return a.transpose(0, 2, 3, 4, 1).reshape(n, d, h, w * c), c
    return a.reshape(n * c, d, h, w), 1


def _rows_geometry(plan):
    """``(window, steps, covered)``: the kernel and stride per axis, and whether the
    windows read every input (so a backward that writes each tap once writes all)."""
    axes = plan.kernel_axes
    return (np.array([a.extent for a in axes], np.int64),
            np.array([a.rule[1] for a in axes], np.int64),
            all(a.rule[1] == a.extent and a.count * a.extent == a.length for a in axes))


def _tasks(y_rows: np.ndarray) -> tuple[int, int]:
    """``(chunks per plane, tasks)`` for the rows kernels."""
    chunks = _row_tasks(y_rows.shape[0], y_rows.shape[1] * y_rows.shape[2])[0]
    return chunks, y_rows.shape[0] * chunks


def _rows_like(x: np.ndarray, *arrays: np.ndarray) -> tuple:
    """``(inner, rows of x, rows of each array)``, every array laid out as x is (the
    rules that bind the rows kernels admit NCHW and channels-last x only)."""
    channels_last = not x.flags.c_contiguous
    x_rows, inner = _window_rows(x, channels_last)
    return (inner, x_rows, *(_window_rows(a, channels_last)[0] for a in arrays))


def gem_rows(kernel, pass_name):
    """Bind a ``gem_rows_*`` kernel."""
    def bind(plan):
        window, steps, covered = _rows_geometry(plan)
        if pass_name == "forward":
            def run(x, eps, p, whole, y):
                inner, xr, yr = _rows_like(x, y)
                kernel(xr, inner, window, steps, *_tasks(yr), eps, p, whole, yr)
            return run

        def run(x, y, dy, eps, p, whole, out, terms=None):  # out: dx, or dp's terms
            if pass_name == "backward" and not covered:  # inputs no window reads get 0
                out.fill(0)
            inner, xr, yr, dyr, outr = _rows_like(x, y, dy, out)
            extra = () if pass_name != "backward" else (  # dp's terms too, if given
                None if terms is None else _rows_like(x, terms)[2],)
            kernel(xr, yr, dyr, inner, window, steps, *_tasks(yr), eps, p, whole, outr, *extra)
        return run
    return bind


def _no_copy(like: np.ndarray) -> np.ndarray:
    """An empty array of ``like``'s dtype and dims: no copy (or no ``norm``), for the
    forwards that take one, typed as one is (None would compile each kernel again)."""
    return np.empty((0,) * like.ndim, like.dtype)


def gem_quads(plan):
    """Bind ``gem_quads_forward``, which copies the rows it reads into ``copy`` where
    the windows cover x."""
    window, steps, covered = _rows_geometry(plan)

    def run(x, eps, p, whole, y, copy=None):
        inner, xr, yr = _rows_like(x, y)
        copy_rows = (_rows_like(x, copy)[2] if copy is not None and covered
                     else _no_copy(xr))
        power_quads.gem_quads_forward(xr, inner, window, steps, *_tasks(yr), eps, p, whole,
                                      yr, copy_rows)
        if copy is not None and not covered:
            np.copyto(copy, x)
    return run


def _weighted_quads(plan):
    """Bind ``weighted_quads_forward``, which takes no ``norm`` (None), checks the taps
    it reads (for ``SELF``: the run returns what it found where the windows cover x,
    else None) and copies them into ``copy`` where the windows cover x."""
    window, steps, covered = _rows_geometry(plan)

    def run(x, y, norm, kind, copy=None):
        inner, xr, yr = _rows_like(x, y)
        norm_rows = _no_copy(yr) if norm is None else _rows_like(x, norm)[2]
        copy_rows = (_rows_like(x, copy)[2] if copy is not None and covered
                     else _no_copy(xr))
        chunks, tasks = _tasks(yr)
        invalid = np.zeros(tasks, np.bool_)
        weighted.weighted_quads_forward(xr, inner, window, steps, chunks, tasks, kind, yr,
                                        norm_rows, invalid, copy_rows)
        if copy is not None and not covered:
            np.copyto(copy, x)
        return bool(invalid.any()) if covered else None
    return run


def _mean_quads_back(plan):
    """Bind ``mean_quads_backward``, which reads neither ``y`` nor ``norm`` (None)."""
    window, steps, covered = _rows_geometry(plan)

    def run(x, y, norm, dy, kind, dx):
        if not covered:  # inputs no window reads get 0
            dx.fill(0)
        inner, xr, dyr, dxr = _rows_like(x, dy, dx)
        weighted.mean_quads_backward(xr, dyr, inner, window, steps, *_tasks(dyr), dxr)
    return run


def _weighted_rows(kernel, forward: bool, takes_kind: bool = True):
    """Bind a ``weighted_rows_*`` kernel (or, without ``takes_kind``,
    ``soft_quads_backward``, which takes the same arguments but the kind)."""
    def bind(plan):
        window, steps, covered = _rows_geometry(plan)
        if forward:
            def run(x, y, norm, kind):
                norm = np.empty_like(y) if norm is None else norm
                inner, xr, yr, norm_rows = _rows_like(x, y, norm)
                kernel(xr, inner, window, steps, *_tasks(yr), kind, yr, norm_rows)
            return run

        def run(x, y, norm, dy, kind, dx):
            if not covered:  # inputs no window reads get 0
                dx.fill(0)
            inner, xr, yr, norm_rows, dyr, dxr = _rows_like(x, y, norm, dy, dx)
            kernel(xr, yr, norm_rows, dyr, inner, window, steps, *_tasks(yr),
                   *((kind,) if takes_kind else ()), dxr)
        return run
    return bind


def _blend_window(forward: bool):
    """Bind a ``blend_window_*`` kernel; the backward adds its partials into ``dweights``."""
    def bind(plan):
        extent, count = plan.extent, plan.window_size
        if forward:
            return lambda x, kind, weights, y: blend.blend_window_forward(
                x, plan.table, extent, count, kind, weights, y)

        def run(x, dy, kind, weights, dx, dweights):
            partials = np.empty((x.shape[0] * x.shape[1], weights.size), np.float64)
            blend.blend_window_backward(x, dy, plan.table, extent, count, kind, weights, dx,
                                        partials)
            dweights[:] = partials.sum(axis=0)
        return run
    return bind


def _blend_rows(forward: bool, kernel=blend.blend_rows_forward):
    """Bind a ``blend_rows_*`` kernel (``kernel``: the forward, or a forward with its
    arguments, :func:`~.blend.blend_quads_forward`)."""
    def bind(plan):
        window, steps, covered = _rows_geometry(plan)
        count = plan.window_size
        if forward:
            def run(x, kind, weights, y):
                inner, xr, yr = _rows_like(x, y)
                kernel(xr, inner, window, steps, *_tasks(yr), count, kind, weights, yr)
            return run

        def run(x, dy, kind, weights, dx, dweights):
            if not covered:  # inputs no window reads get 0
                dx.fill(0)
            inner, xr, dyr, dxr = _rows_like(x, dy, dx)
            partials = np.empty((dyr.shape[0] * dyr.shape[1] * dyr.shape[2], weights.size),
                                np.float64)
            blend.blend_rows_backward(xr, dyr, inner, window, steps, *_tasks(dyr), count,
                                      kind, weights, dxr, partials)
            dweights[:] = partials.sum(axis=0)
        return run
    return bind


def _channels_innermost(plan, operand, record):
    return operand.layout == "channels_last"


def _fractional_channels_last(plan):
    """Bind ``fractional_max_forward_channels_last``: 5-d channels-last arrays, run on
    their ``(N, L, C)`` memory (views: the engine allocates ``y`` and ``pos`` so)."""
    def run(x, starts, lengths, extent, y, pos):
        n, c = x.shape[:2]
        shape = np.array(x.shape[2:] + y.shape[2:], np.int64)
        x_flat, y_flat, pos_flat = (a.transpose(0, 2, 3, 4, 1).reshape(n, -1, c)
                                    for a in (x, y, pos))
        fractional.fractional_max_forward_channels_last(x_flat, starts, lengths, extent,
                                                        shape, y_flat, pos_flat)
    return run


def _fractional_on_planes(plan):
    """Bind ``fractional_max_forward`` to 5-d ``(N, C, D, H, W)`` arrays of any layout,
    as the channels-last rule's (planes ``(P, 1, D, H, W)`` among them): it runs on their
    planes (views where they are C-contiguous, else copies, the results stored back)."""
    def run(x, starts, lengths, extent, y, pos):
        planes = layouts.planes_of(x)[:, None]
        (y_planes, store_y), (pos_planes, store_pos) = _on_planes(y), _on_planes(pos)
        fractional.fractional_max_forward(planes, starts, lengths, extent, y_planes[:, None],
                                          pos_planes[:, None])
        store_y()
        store_pos()
    return run


def _bound(kernel):
    return lambda plan: kernel


def _attention(kernel, forward: bool, pixels: bool):
    """Bind an attention kernel: the channels-last ones run on the ``(N, L, C)`` views
    of their ``(N, C, L)`` arrays (contiguous there); the backward adds its partials
    into ``dprojected``."""
    def view(a):
        return a.transpose(0, 2, 1) if pixels else a

    if forward:
        return lambda plan: lambda x, projected, heads, y, attn: kernel(
            view(x), projected, heads, y, attn)

    def bind(plan):
        def run(x, dy, projected, attn, heads, dx, dprojected):
            partials = np.empty((x.shape[0],) + projected.shape, np.float64)
            kernel(view(x), dy, projected, attn, heads, view(dx), partials)
            dprojected[:] = partials.sum(axis=0)
        return run
    return bind


def _positions_outer(kernel, forward: bool):
    """A global GeM kernel for channels-last arrays, run on the ``(N, L, C)`` views of
    its ``(N, C, L)`` ones (contiguous there)."""
    if forward:
        return lambda plan: lambda x, eps, p, whole, y, copy=None: kernel(
            x.transpose(0, 2, 1), eps, p, whole, y,
            _no_copy(x) if copy is None else copy.transpose(0, 2, 1))
    return lambda plan: lambda x, y, dy, eps, p, whole, with_dp, dx, terms: kernel(
        x.transpose(0, 2, 1), y, dy, eps, p, whole, with_dp, dx.transpose(0, 2, 1), terms)


# the backwards of both weighted kinds where no 2x2 kernel serves
_WEIGHTED_BACKWARDS = (
    Rule("weighted.weighted_rows_backward", apart,
         _weighted_rows(weighted.weighted_rows_backward, False)),
    Rule("weighted.weighted_pool_backward", always, _weighted_back))

RULES = {
    ("gem_global", "forward"): [
        Rule("power_mean.gem_global_forward_channels_last", _channels_innermost,
             _positions_outer(power_mean.gem_global_forward_channels_last, True)),
        Rule("power_mean.gem_global_forward_planes", always,
             lambda plan: lambda x, eps, p, whole, y, copy=None:
             power_mean.gem_global_forward_planes(x, eps, p, whole, y,
                                                  _no_copy(x) if copy is None else copy))],
    ("gem_global", "backward"): [
        Rule("power_mean.gem_global_backward_channels_last", _channels_innermost,
             _positions_outer(power_mean.gem_global_backward_channels_last, False)),
        Rule("power_mean.gem_global_backward_planes", always,
             _bound(power_mean.gem_global_backward_planes))],
    ("gem", "forward"): [
        Rule("power_quads.gem_quads_forward", paired_quads, gem_quads),
        Rule("power_mean.gem_rows_forward", full_windows,
             _then_copied(gem_rows(power_mean.gem_rows_forward, "forward"))),
        Rule("power_mean.gem_window_forward", always, _then_copied(_gem))],
    ("gem", "backward"): [
        Rule("power_mean.gem_rows_backward", apart,
             gem_rows(power_mean.gem_rows_backward, "backward"), records=True),
        Rule("power_mean.gem_window_backward", always, _gem_back)],
    ("gem", "p_terms"): [
        Rule("power_mean.gem_rows_p_terms", full_windows,
             gem_rows(power_mean.gem_rows_p_terms, "p_terms")),
        Rule("power_mean.gem_window_p_terms", always, _gem_p_terms)],
    ("gem", "p_total"): [
        Rule("power_mean.plane_totals", always, _bound(power_mean.plane_totals))],
    ("blur", "forward"): [
        Rule("blur_rows.blur_rows_forward", _rows_channels_last, _blur_rows(True),
             records=True),
        Rule("blur_rows.blur_rows_forward", streams_rows, _blur_rows(False), records=True),
        Rule("blur.blur_pool_forward", always, _blur, records=True)],
    ("blur", "backward"): [
        Rule("blur_rows.blur_rows_backward", _rows_channels_last, _blur_rows_back(True)),
        Rule("blur_rows.blur_rows_backward", streams_rows, _blur_rows_back(False)),
        Rule("blur.blur_pool_backward", always, _blur_back)],
    ("weighted", "forward"): [
        Rule("weighted.weighted_quads_forward", paired_quads, _weighted_quads),
        Rule("weighted.weighted_rows_forward", full_windows,
             _then_copied(_weighted_rows(weighted.weighted_rows_forward, True))),
        Rule("weighted.weighted_pool_forward", always, _then_copied(_weighted))],
    ("weighted", "backward"): [
        Rule("weighted.soft_quads_backward", quads_apart,
             _weighted_rows(weighted.soft_quads_backward, False, takes_kind=False)),
        *_WEIGHTED_BACKWARDS],
    ("weighted", "mean_backward"): [
        Rule("weighted.mean_quads_backward", quads_apart, _mean_quads_back,
             needs_outputs=False),
        *_WEIGHTED_BACKWARDS],
    ("blend", "forward"): [
        Rule("blend.blend_quads_forward", paired_quads,
             _blend_rows(True, blend.blend_quads_forward)),
        Rule("blend.blend_rows_forward", full_windows, _blend_rows(True)),
        Rule("blend.blend_window_forward", always, _blend_window(True))],
    ("blend", "backward"): [
        Rule("blend.blend_rows_backward", apart, _blend_rows(False)),
        Rule("blend.blend_window_backward", always, _blend_window(False))],
    ("attention", "forward"): [
        Rule("attention.attention_pixels_forward", _channels_innermost,
             _attention(attention.attention_pixels_forward, True, True)),
        Rule("attention.attention_planes_forward", always,
             _attention(attention.attention_planes_forward, True, False))],
    ("attention", "backward"): [
        Rule("attention.attention_pixels_backward", _channels_innermost,
             _attention(attention.attention_pixels_backward, False, True)),
        Rule("attention.attention_planes_backward", always,
             _attention(attention.attention_planes_backward, False, False))],
    ("stochastic", "check"): [
        Rule("stochastic.not_weights", always, lambda plan: stochastic.not_weights)],
    ("stochastic", "sample"): [
        Rule("stochastic.stochastic_quads_sample", quads, _sample_quads, records=True),
        Rule("stochastic.stochastic_pool_sample", always, _sample, records=True)],
    ("fractional", "forward"): [
        Rule("fractional.fractional_max_forward_channels_last", _channels_innermost,
             _fractional_channels_last, records=True),
        Rule("fractional.fractional_max_forward", always, _fractional_on_planes,
             records=True)],
    ("fractional", "backward"): [Rule("fractional.fractional_max_backward", always,
                                      _bound(fractional.fractional_max_backward))],
    ("fractional", "indices"): [Rule("fractional.fractional_max_indices", always,
                                     _bound(fractional.fractional_max_indices))],
    ("polyphase", "norms"): [
        Rule("polyphase.phase_norms_channels_last", _channels_innermost,
             lambda plan: polyphase.phase_norms_pixels),
        Rule("polyphase.phase_norms", always, _bound(polyphase.phase_norms))],
    ("polyphase", "gather"): [
        Rule("polyphase.phase_gather_channels_last", _channels_innermost,
             _bound(polyphase.phase_gather_channels_last)),
        Rule("polyphase.phase_gather", always, _bound(polyphase.phase_gather))],
    ("polyphase", "scatter"): [
        Rule("polyphase.phase_scatter_channels_last", _channels_innermost,
             _bound(polyphase.phase_scatter_channels_last)),
        Rule("polyphase.phase_scatter", always, _bound(polyphase.phase_scatter))],
}
