"""How the dispatch runs the Triton kernels of :mod:`.triton_pool` on torch tensors.

Each ``*_run(plan)`` returns the ``run`` of one ``(op, direction)`` with the signature
:mod:`.dispatch` documents, on 5-d tensors ``(N, C, D, H, W)`` of any strides: it turns
the plan into the kernels' per-axis integers, the tensors into element strides, and
launches one program per ``BLOCK`` elements of the tensor it writes, on the current
CUDA stream (or, under ``TRITON_INTERPRET=1``, on CPU tensors).
"""

from __future__ import annotations

import functools

import numpy as np
import triton

from . import triton_pool as kernels

BLOCK = 256
_DIVISOR_MODES = {"padded": 0, "real": 1}


def _adaptive(plan) -> bool:
    return any(a.rule[0] == "adaptive" for a in plan.axes)


@functools.lru_cache(maxsize=1024)
def _axes(plan) -> tuple[tuple[int, ...], ...]:
    """Per kernel axis ``(L, O, K, S, P, A, DIL, covers)``: the axis's rule as the
    kernels take it, and the most windows that read one coordinate. An adaptive plan's
    leading unit axes are one-bin adaptive axes (the same single window)."""
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


def _window_args(plan, with_after: bool = False, with_covers: bool = False) -> list[int]:
    args = []
    for length, count, extent, stride, before, after, dilation, covers in _axes(plan):
        args += [length, count, extent, stride, before]
        if with_after:
            args.append(after)
        args.append(dilation)
        if with_covers:
            args.append(covers)
    return args


def _channels_last(t) -> bool:
    """Whether the 5-d tensor ``t`` is stored with C fastest (and C > 1): its programs
    then walk it in that order."""
    return t.shape[1] > 1 and t.stride(1) == 1


def _grid(t):
    return (triton.cdiv(t.numel(), BLOCK),)


def _accumulator(t):
    import torch
    import triton.language as tl
    return tl.float64 if t.dtype == torch.float64 else tl.float32


def max_forward_run(plan, record: bool):
    def run(x, y, pos):
        kernels.max_forward[_grid(y)](
            x, y, pos if record else y, y.numel(), y.shape[1], *_window_args(plan),
            *x.stride(), *y.stride(), ADAPTIVE=_adaptive(plan),
            CHANNELS_LAST=_channels_last(y), RECORD=record, ACC=_accumulator(y), BLOCK=BLOCK)
    return run


def max_backward_run(plan):
    def run(dy, pos, dx):
        kernels.max_backward[_grid(dx)](
            dy, pos, dx, dx.numel(), dx.shape[1], *_window_args(plan, with_covers=True),
            *dy.stride(), *pos.stride(), *dx.stride(), ADAPTIVE=_adaptive(plan),
            CHANNELS_LAST=_channels_last(dx), ACC=_accumulator(dx), BLOCK=BLOCK)
    return run


def max_gather_run(plan):
    """``run(src, pos, out)``: ``src`` (input-shaped) read at each window's winner."""
    def run(src, pos, out):
        kernels.max_gather[_grid(out)](
            src, pos, out, out.numel(), out.shape[1], *_window_args(plan), *src.stride(),
            *pos.stride(), *out.stride(), ADAPTIVE=_adaptive(plan),
            CHANNELS_LAST=_channels_last(out), INDICES=False, BLOCK=BLOCK)
    return run


def max_indices_run(plan):
    def run(pos, indices):
        kernels.max_gather[_grid(indices)](
            pos, pos, indices, indices.numel(), indices.shape[1], *_window_args(plan),
            *pos.stride(), *pos.stride(), *indices.stride(), ADAPTIVE=_adaptive(plan),
            CHANNELS_LAST=_channels_last(indices), INDICES=True, BLOCK=BLOCK)
    return run


def _mode(divisor) -> tuple[int, int]:
    """``(MODE, override)`` of ``divisor = (mode, override)``."""
    mode, override = divisor
    return (2, int(override)) if override is not None else (_DIVISOR_MODES[mode], 1)


def avg_forward_run(plan):
    def run(x, y, divisor):
        mode, override = _mode(divisor)
        kernels.avg_forward[_grid(y)](
            x, y, y.numel(), y.shape[1], *_window_args(plan, with_after=True), override,
            *x.stride(), *y.stride(), ADAPTIVE=_adaptive(plan),
            CHANNELS_LAST=_channels_last(y), MODE=mode, ACC=_accumulator(y), BLOCK=BLOCK)
    return run


def avg_backward_run(plan):
    def run(dy, divisor, dx):
        mode, override = _mode(divisor)
        kernels.avg_backward[_grid(dx)](
            dy, dx, dx.numel(), dx.shape[1],
            *_window_args(plan, with_after=True, with_covers=True), override,
            *dy.stride(), *dx.stride(), ADAPTIVE=_adaptive(plan),
            CHANNELS_LAST=_channels_last(dx), MODE=mode, ACC=_accumulator(dx), BLOCK=BLOCK)
    return run


def _p_kind(p: float) -> int:
    return int(p) if p in (1.0, 2.0) else 0


@functools.lru_cache(maxsize=64)
def _exponents(p: float, dtype, device):
    """``[p, 1/p, p-1]`` on the device in ``dtype``, computed in double: Triton passes a
    Python float as float32, too coarse for float64 data. Kept per arguments, so that a
    call under CUDA graph capture copies nothing (after a first call outside it)."""
    import torch
    return torch.tensor([p, 1.0 / p, p - 1.0], dtype=dtype, device=device)


def _exponents_for(p, t):
    import torch
    return _exponents(float(p), torch.float64 if t.dtype == torch.float64 else torch.float32,
                      t.device)


def lp_forward_run(plan):
    def run(x, y, p):
        kernels.lp_forward[_grid(y)](
            x, y, y.numel(), y.shape[1], _exponents_for(p, y), *_window_args(plan), *x.stride(),
            *y.stride(), ADAPTIVE=_adaptive(plan), CHANNELS_LAST=_channels_last(y),
            P_KIND=_p_kind(p), ACC=_accumulator(y), BLOCK=BLOCK)
    return run


def lp_backward_run(plan):
    def run(x, y, dy, p, dx):
        kernels.lp_backward[_grid(dx)](
            x, y, dy, dx, dx.numel(), dx.shape[1], _exponents_for(p, dx),
            *_window_args(plan, with_covers=True), *x.stride(), *y.stride(), *dy.stride(),
            *dx.stride(), ADAPTIVE=_adaptive(plan), CHANNELS_LAST=_channels_last(dx),
            P_KIND=_p_kind(p), ACC=_accumulator(dx), BLOCK=BLOCK)
    return run


def tie_count_run(plan):
    def run(x, y, ties):
        kernels.max_tie_count[_grid(y)](
            x, y, ties, y.numel(), y.shape[1], *_window_args(plan), *x.stride(),
            *y.stride(), ADAPTIVE=_adaptive(plan), CHANNELS_LAST=_channels_last(y),
            ACC=_accumulator(y), BLOCK=BLOCK)
    return run


def split_backward_run(plan):
    """``run(x, y, dy, ties, pos, dx)``; ``ties`` and ``pos`` stored as ``y``."""
    def run(x, y, dy, ties, pos, dx):
        kernels.max_split_backward[_grid(dx)](
            x, y, dy, ties, pos, dx, dx.numel(), dx.shape[1],
            *_window_args(plan, with_covers=True), *x.stride(), *y.stride(), *dy.stride(),
            *dx.stride(), ADAPTIVE=_adaptive(plan), CHANNELS_LAST=_channels_last(dx),
            ACC=_accumulator(dx), BLOCK=BLOCK)
    return run


def unpool_forward_run(plan):
    """``run(y, indices, out, written)`` on C-contiguous ``(N, C, L)`` tensors, ``out``
    zeroed. With ``y`` None only ``written`` is found (the backward's need) and ``out``
    gives the plane size alone: nothing is written to it."""
    def run(y, indices, out, written):
        import torch
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
        kernels.unpool_gather[_grid(dy)](dout, indices, written, dy, dy.numel(), dy.shape[2],
                                         dout.shape[2], BLOCK=BLOCK)
    return run
