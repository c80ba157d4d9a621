"""How the Triton kernels of :mod:`.kernels` are launched on torch tensors.

Each ``*_run(plan)`` returns the ``run`` of one ``(op, direction)`` with the signature
:mod:`.dispatch` documents, on 5-d tensors ``(N, C, D, H, W)`` of any strides: it turns
the plan into the kernels' per-axis tuples, the tensors into tuples of element strides,
and launches one program per ``BLOCK`` elements of the tensor it writes, on the current
CUDA stream (or, under ``TRITON_INTERPRET=1``, on CPU tensors).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from ... import geometry
from .. import _ops
from . import blend, blur, fractional, kernels, polyphase, power_mean, weighted

BLOCK = 256
_DIVISOR_MODES = {"padded": 0, "real": 1}


def _adaptive(plan) -> bool:
    return any(a.rule[0] == "adaptive" for a in plan.axes)


@functools.lru_cache(maxsize=1024)
def _axes(plan) -> tuple[tuple[int, ...], ...]:
    """Per kernel axis ``(L, O, K, S, P, A, DIL, N)``: the axis's rule as the kernels
    take it, and the most windows that read one coordinate. An adaptive plan's leading
    unit axes are one-bin adaptive axes (the same single window)."""
    adaptive = _adaptive(plan)
    axes = []
    for a in plan.kernel_axes:
        if adaptive:
            ptr = a.cover[0]
            axes.append((a.length, a.count, a.extent, 1, 0, 0, 1, int(np.diff(ptr).max())))
        else:
            _, stride, before, after = a.rule
            axes.append((a.length, a.count, a.extent, stride, before, after, a.dilation,
                         a.extent))
    return tuple(axes)


def _accumulator(dtype: torch.dtype):
    """What a kernel compares and sums in: float64 for float64, int64 for integers (max
    pooling's; float32 is exact only up to 2**24), float32 for the rest."""
    if dtype == torch.float64:
        return tl.float64
    return tl.float32 if dtype.is_floating_point else tl.int64


def _power_dtype(t: torch.Tensor) -> torch.dtype:
    """What Lp and GeM raise and sum ``t``'s values in: float64 for float32 too, as the
    CPU's kernels raise float32 (on a GPU Triton's float32 ``exp2`` and division are
    ``ex2.approx.ftz.f32`` and ``div.full.f32``: 2 ulps off, and subnormals flushed);
    float32 for the half types, whose rounding is far coarser than those errors."""
    return torch.float64 if t.dtype in (torch.float32, torch.float64) else torch.float32


def _launch(kernel, plan, out, tensors, strided, scalars=(), *, accumulate=True,
            **constants):
    """Launch ``kernel`` with one lane per element of ``out``, the tensor it writes, in
    the argument order of :mod:`.kernels`: ``tensors``, ``out``'s size and C, the
    kernel's own ``scalars``, the axes' tuples, then the strides of the ``strided``
    tensors, a tuple each; the compile-time constants every kernel takes (and ``ACC``
    if ``accumulate``) besides ``constants``. Lanes walk ``out`` in its memory order."""
    if accumulate:
        constants.setdefault("ACC", _accumulator(out.dtype))
    kernel[(triton.cdiv(out.numel(), BLOCK),)](
        *tensors, out.numel(), out.shape[1], *scalars, _axes(plan),
        *(tuple(t.stride()) for t in strided), ADAPTIVE=_adaptive(plan),
        CHANNELS_LAST=_ops.is_channels_last(out), BLOCK=BLOCK, **constants)


def max_forward_run(plan, record: bool):
    # without winners the kernel is given y for pos and stores nothing there
    return lambda x, y, pos: _launch(kernels.max_forward, plan, y,
                                     (x, y, pos if record else y), (x, y), RECORD=record)


def max_backward_run(plan):
    return lambda dy, pos, dx: _launch(kernels.max_backward, plan, dx, (dy, pos, dx),
                                       (dy, pos, dx))


def max_gather_run(plan):
    """``run(src, pos, out)``: ``src`` (input-shaped) read at each window's winner."""
    return lambda src, pos, out: _launch(kernels.max_gather, plan, out, (src, pos, out),
                                         (src, pos, out), accumulate=False, INDICES=False)


def max_indices_run(plan):
    return lambda pos, indices: _launch(kernels.max_gather, plan, indices,
                                        (pos, pos, indices), (pos, pos, indices),
                                        accumulate=False, INDICES=True)


def _mode(divisor) -> tuple[int, int]:
    """``(MODE, override)`` of ``divisor = (mode, override)``."""
    mode, override = divisor
    return (2, int(override)) if override is not None else (_DIVISOR_MODES[mode], 1)


def avg_forward_run(plan):
    def run(x, y, divisor):
        mode, override = _mode(divisor)
        _launch(kernels.avg_forward, plan, y, (x, y), (x, y), (override,), MODE=mode)
    return run


def avg_backward_run(plan):
    def run(dy, divisor, dx):
        mode, override = _mode(divisor)
        _launch(kernels.avg_backward, plan, dx, (dy, dx), (dy, dx), (override,), MODE=mode)
    return run


def _p_kind(p: float) -> int:
    return int(p) if p in (1.0, 2.0) else 0


def _exponents_for(p, t):
    """``[p, 1/p, p-1]`` in ``t``'s power dtype, computed in double."""
    p = float(p)
    return _ops.constant((p, 1.0 / p, p - 1.0), _power_dtype(t), t.device)


def lp_forward_run(plan):
    return lambda x, y, p: _launch(kernels.lp_forward, plan, y, (x, y), (x, y),
                                   (_exponents_for(p, y),), P_KIND=_p_kind(p),
                                   ACC=_accumulator(_power_dtype(y)))


def lp_backward_run(plan):
    return lambda x, y, dy, p, dx: _launch(kernels.lp_backward, plan, dx, (x, y, dy, dx),
                                           (x, y, dy, dx), (_exponents_for(p, dx),),
                                           P_KIND=_p_kind(p), ACC=_accumulator(_power_dtype(dx)))


def tie_count_run(plan):
    return lambda x, y, ties: _launch(kernels.max_tie_count, plan, y, (x, y, ties), (x, y))


def split_backward_run(plan):
    """``run(x, y, dy, ties, pos, dx)``; ``ties`` and ``pos`` stored as ``y``."""
    return lambda x, y, dy, ties, pos, dx: _launch(
        kernels.max_split_backward, plan, dx, (x, y, dy, ties, pos, dx), (x, y, dy, dx))


def unpool_forward_run(plan):
    """``run(y, indices, out, written)`` on C-contiguous ``(N, C, L)`` tensors, ``out``
    zeroed. With ``y`` None only ``written`` is found (the backward's need) and ``out``
    gives the plane size alone: nothing is written to it."""
    def run(y, indices, out, written):
        planes, count, plane = out.shape[0] * out.shape[1], written.shape[2], out.shape[2]
        owner = torch.full((planes, plane), -1, dtype=torch.int32, device=written.device)
        grid = (triton.cdiv(written.numel(), BLOCK),)
        kernels.unpool_claim[grid](indices, owner, written.numel(), count, plane, BLOCK=BLOCK)
        kernels.unpool_place[grid](indices if y is None else y, indices, owner, out, written,
                                   written.numel(), count, plane, WRITE_VALUES=y is not None,
                                   BLOCK=BLOCK)
    return run


def unpool_backward_run(plan):
    def run(dout, indices, written, dy):
        kernels.unpool_gather[(triton.cdiv(dy.numel(), BLOCK),)](
            dout, indices, written, dy, dy.numel(), dy.shape[2], dout.shape[2], BLOCK=BLOCK)
    return run


def _gem(p, eps, t):
    return p, _ops.constant((float(eps),), _power_dtype(t), t.device)


def gem_forward_run(plan):
    return lambda x, y, p, eps: _launch(power_mean.gem_forward, plan, y,
                                        (x, y, *_gem(p, eps, x)), (x, y),
                                        ACC=_accumulator(_power_dtype(x)))


def gem_backward_run(plan):
    return lambda x, y, dy, p, eps, dx: _launch(
        power_mean.gem_backward, plan, dx, (x, y, dy, *_gem(p, eps, x), dx), (x, y, dy, dx),
        ACC=_accumulator(_power_dtype(x)))


def gem_p_terms_run(plan):
    """``run(x, y, dy, p, eps, terms)``: ``terms`` (``y``'s shape) in the compute dtype."""
    return lambda x, y, dy, p, eps, terms: _launch(
        power_mean.gem_p_terms, plan, terms, (x, y, dy, *_gem(p, eps, x), terms),
        (x, y, dy, terms), ACC=_accumulator(_power_dtype(x)))


def weighted_forward_run(plan):
    """``run(x, y, norm, kind)``: ``norm`` stored as ``y``."""
    return lambda x, y, norm, kind: _launch(weighted.weighted_forward, plan, y, (x, y, norm),
                                            (x, y), KIND=kind)


def weighted_backward_run(plan):
    return lambda x, y, norm, dy, kind, dx: _launch(
        weighted.weighted_backward, plan, dx, (x, y, norm, dy, dx), (x, y, dy, dx), KIND=kind)


def stochastic_sample_run(plan):
    """``run(x, seed, y, pos)``: ``pos`` stored as ``y``, ``seed`` one int64."""
    return lambda x, seed, y, pos: _launch(weighted.stochastic_sample, plan, y,
                                           (x, seed, y, pos), (x, y))


def blend_forward_run(plan):
    """``run(x, kind, weights, y)``."""
    return lambda x, kind, weights, y: _launch(blend.blend_forward, plan, y, (x, weights, y),
                                               (x, y), KIND=kind)


def blend_backward_run(plan):
    """``run(x, dy, kind, weights, dx, dweights)``: ``dweights`` (float64, ``weights``'
    size) the sum of every window's terms."""
    def run(x, dy, kind, weights, dx, dweights):
        _launch(blend.blend_backward, plan, dx, (x, dy, weights, dx), (x, dy, dx), KIND=kind)
        terms = torch.empty((weights.numel(), dy.numel()), dtype=torch.float64,
                            device=dy.device)
        _launch(blend.blend_weight_terms, plan, dy, (x, dy, weights, terms), (x, dy),
                KIND=kind)
        dweights.copy_(terms.sum(dim=1).reshape(dweights.shape))
    return run


def _components(sizes, steps) -> tuple[int, ...]:
    return tuple(-(-int(n) // int(s)) for n, s in zip(sizes, steps, strict=True))


def polyphase_norms_run(plan):
    """``run(x, steps, norm, partials)``: one program per plane and phase, ``partials``
    ``(N, C, P)`` float64, contiguous."""
    def run(x, steps, norm, partials):
        steps = tuple(int(s) for s in steps)
        polyphase.phase_norm_partials[(partials.numel(),)](
            x, partials, x.shape[1], tuple(x.shape[2:]), steps,
            _components(x.shape[2:], steps), tuple(x.stride()), NORM=int(norm), BLOCK=BLOCK)
    return run


def _move(src, phases, dst, steps, component, scatter: bool):
    steps = tuple(int(s) for s in steps)
    sizes = tuple((dst if scatter else src).shape[2:])
    polyphase.phase_move[(triton.cdiv(component.numel(), BLOCK),)](
        src, phases, dst, component.numel(), component.shape[1], sizes, steps,
        _components(sizes, steps), tuple(src.stride()), tuple(dst.stride()),
        SCATTER=scatter, BLOCK=BLOCK)


def polyphase_gather_run(plan):
    """``run(x, steps, phases, y)``."""
    return lambda x, steps, phases, y: _move(x, phases, y, steps, y, False)


def polyphase_scatter_run(plan):
    """``run(dy, steps, phases, dx)``: ``dx`` zeroed, then ``dy`` at the positions."""
    def run(dy, steps, phases, dx):
        dx.zero_()
        _move(dy, phases, dx, steps, dy, True)
    return run


def circular_pad_run(plan):
    """``run(x, before, out)``: ``out`` := ``x`` padded circularly, ``before`` ahead of
    each axis ``(D, H, W)``."""
    def run(x, before, out):
        polyphase.circular_pad[(triton.cdiv(out.numel(), BLOCK),)](
            x, out, out.numel(), out.shape[1], tuple(x.shape[2:]), tuple(out.shape[2:]),
            before, tuple(x.stride()), tuple(out.stride()),
            CHANNELS_LAST=_ops.is_channels_last(out), BLOCK=BLOCK)
    return run


def circular_fold_run(plan):
    """``run(dy, before, dx)``: each padded position's ``dy`` added onto what it copies."""
    def run(dy, before, dx):
        sizes, padded = tuple(dx.shape[2:]), tuple(dy.shape[2:])
        copies = tuple(-(-p // n) for p, n in zip(padded, sizes, strict=True))
        polyphase.circular_fold[(triton.cdiv(dx.numel(), BLOCK),)](
            dy, dx, dx.numel(), dx.shape[1], sizes, padded, before, copies,
            tuple(dy.stride()), tuple(dx.stride()), CHANNELS_LAST=_ops.is_channels_last(dx),
            ACC=_accumulator(dx.dtype), BLOCK=BLOCK)
    return run


def _fractional_launch(kernel, out, tensors, scalars, strided, extent, **constants):
    """One lane per element of ``out`` (in its memory order): ``tensors``, ``out``'s
    size and C, ``scalars``, the strides of the ``strided`` tensors (a tuple each), the
    extent bound's constants besides ``constants``."""
    kernel[(triton.cdiv(out.numel(), BLOCK),)](
        *tensors, out.numel(), out.shape[1], *scalars,
        *(tuple(t.stride()) for t in strided), EXT_H=extent[1], EXT_W=extent[2],
        CHANNELS_LAST=_ops.is_channels_last(out), BLOCK=BLOCK, **constants)


def fractional_forward_run(plan):
    """``run(x, starts, lengths, extent, y, pos)``: ``pos`` stored as ``y``."""
    def run(x, starts, lengths, extent, y, pos):
        _fractional_launch(fractional.fractional_forward, y, (x, starts, lengths, y, pos),
                           (tuple(x.shape[2:]), tuple(y.shape[2:])), (x, y, starts), extent,
                           EXT_D=extent[0], ACC=_accumulator(x.dtype))
    return run


def fractional_backward_run(plan):
    """``run(dy, pos, starts, first, last, extent, dx)``."""
    def run(dy, pos, starts, first, last, extent, dx):
        _fractional_launch(fractional.fractional_backward, dx,
                           (dy, pos, starts, first, last, dx),
                           (tuple(dx.shape[2:]), tuple(dy.shape[2:])),
                           (dy, pos, dx, starts, first), extent, ACC=_accumulator(dx.dtype))
    return run


def fractional_indices_run(plan):
    """``run(pos, starts, extent, sizes, indices)``: ``sizes`` the input's (D, H, W)."""
    def run(pos, starts, extent, sizes, indices):
        _fractional_launch(fractional.fractional_indices, indices, (pos, starts, indices),
                           (tuple(sizes), tuple(pos.shape[2:])), (pos, starts), extent)
    return run


@functools.lru_cache(maxsize=256)
def _blurs(plan) -> tuple[tuple[int, ...], ...]:
    """Per kernel axis ``(L, M, O, K, F, S, B, A)`` of a
    :class:`~poolgrad.geometry.BlurPlan` (:mod:`.blur`), leading axes of length 1."""
    lead = (1,) * (3 - len(plan.in_spatial))
    return tuple((int(length), int(mapped), int(out), int(k), *(int(v) for v in blurs[:4]))
                 for length, mapped, out, k, blurs in zip(
                     lead + plan.in_spatial, lead + plan.map_spatial, lead + plan.out_spatial,
                     plan.window, plan.axis_blurs.tolist(), strict=True))


@functools.lru_cache(maxsize=256)
def _blur_tables(plan, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each axis's filter taps and ``1 / k`` in ``dtype`` on ``device``, built once."""
    return (_ops.constant(tuple(plan.axis_filters.ravel().tolist()), dtype, device),
            _ops.constant(tuple(1.0 / k for k in plan.window), dtype, device))


def _blur_constants(plan, like: torch.Tensor):
    """``(filters, boxes, width, constants)``: each axis's taps and ``1 / k`` in the
    kernels' arithmetic dtype, and the compile-time constants (the padding mode is
    every blurred axis's; an axis without a blur has mode 0 and never pads)."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    filters, boxes = _blur_tables(plan, dtype, like.device)
    constants = dict(PRE=geometry.BLUR_PRE.index(plan.pre),
                     MODE=int(plan.axis_blurs[:, 4].max()), ACC=_accumulator(dtype),
                     BLOCK=BLOCK)
    return filters, boxes, plan.axis_filters.shape[1], constants


def _blur_launch(kernel, plan, src, out, arithmetic):
    """One lane per element of ``out``, which ``kernel`` computes from ``src``:
    ``(src, filters, boxes, out)``, ``out``'s size and C, the filters' width, the
    blurs, both strides (the arithmetic's dtype follows ``arithmetic``)."""
    filters, boxes, width, constants = _blur_constants(plan, arithmetic)
    kernel[(triton.cdiv(out.numel(), BLOCK),)](
        src, filters, boxes, out, out.numel(), out.shape[1], width, _blurs(plan),
        tuple(src.stride()), tuple(out.stride()), CHANNELS_LAST=_ops.is_channels_last(out),
        **constants)


def blur_forward_run(plan):
    """``run(x, y)``: the chain's output, no stride-1 map stored."""
    return lambda x, y: _blur_launch(blur.blur_forward, plan, x, y, x)


def blur_winners_run(plan):
    """``run(x, pos)``: a max-blur's winner per stride-1 window (``pos`` map-shaped)."""
    def run(x, pos):
        blur.blur_winners[(triton.cdiv(pos.numel(), BLOCK),)](
            x, pos, pos.numel(), pos.shape[1], _blurs(plan), tuple(x.stride()),
            tuple(pos.stride()), CHANNELS_LAST=_ops.is_channels_last(pos),
            ACC=_accumulator(x.dtype), BLOCK=BLOCK)
    return run


def blur_backward_run(plan):
    """``run(dy, g)``: the transposed blur, into the input's gradient or (a max-blur)
    the stride-1 map's."""
    return lambda dy, g: _blur_launch(blur.blur_backward, plan, dy, g, g)
