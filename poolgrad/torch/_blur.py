"""The blur kinds' torch composition: padding in each mode, then a depthwise
convolution with the binomial filter at the stride, and the NumPy plan's checks (the
functions and modules are :mod:`.kinds`')."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import geometry
from ._ops import memory_format


def pad_source(length: int, before: int, after: int, mode: str, device) -> Tensor:
    """Which element each padded position copies (zeros: any, masked later)."""
    index = torch.arange(-before, length + after, device=device)
    if mode == "reflect":
        index = index.abs()
        return torch.where(index >= length, 2 * (length - 1) - index, index)
    if mode == "circular":
        return index.remainder(length)
    return index.clamp(0, length - 1)  # replicate, and zeros before masking


_TORCH_PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate",
                    "circular": "circular"}


def padded(x: Tensor, pads, mode, by_index: bool | None = None) -> Tensor:
    """``x`` padded by ``pads`` in ``mode``. On the CPU, ``F.pad``, wherever it takes the
    pads: torch 2.13's Inductor corrupts the heap in the backward of the index_select
    form (two padded axes and a grouped convolution). On CUDA (or ``by_index``), the
    index_select form, whose backward is deterministic (``F.pad``'s reflect and
    replicate backwards are not)."""
    lengths = x.shape[2:]
    largest = max(max(lo, hi) - length for (lo, hi), length in zip(pads, lengths, strict=True))
    fits = {"reflect": largest < 0, "circular": largest <= 0}.get(mode, True)
    if by_index is None:
        by_index = x.device.type != "cpu" or not fits
    if not by_index:
        flat = [p for lo, hi in reversed(pads) for p in (lo, hi)]
        return torch.nn.functional.pad(x, flat, mode=_TORCH_PAD_MODES[mode])
    for axis, ((lo, hi), length) in enumerate(zip(pads, lengths, strict=True)):
        dim = 2 + axis
        source = pad_source(length, lo, hi, mode, x.device)
        x = x.index_select(dim, source)
        if mode == "zeros":
            inside = torch.arange(-lo, length + hi, device=x.device)
            inside = ((inside >= 0) & (inside < length)).reshape(
                [-1 if d == dim else 1 for d in range(x.dim())])
            x = torch.where(inside, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x


def blur(x: Tensor, ndim, stride, sizes, pads, mode) -> Tensor:
    """The blur of ``x``, stored as ``x`` is, as the CPU's kernels store it:
    ``index_select`` writes its result contiguously, so a channels-last x is padded
    and then restored to its format, for the convolution to keep it."""
    stored = memory_format(x)
    x = padded(x, pads, mode).contiguous(memory_format=stored)
    weight = torch.ones((), dtype=torch.float64)
    for axis, size in enumerate(sizes):
        taps = torch.tensor(geometry.binomial_filter(size), dtype=torch.float64)
        weight = weight.unsqueeze(-1) * taps.reshape((1,) * axis + (-1,))
    channels = x.shape[1]
    weight = weight.to(x.dtype).to(x.device).expand(channels, 1, *sizes)
    conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d,
            torch.nn.functional.conv3d)[ndim - 1]
    return conv(x, weight, stride=stride, groups=channels).contiguous(memory_format=stored)


@torch.compiler.assume_constant_result
def check_blur(in_spatial, pre, kernel, sizes, stride, pads, padding_mode) -> bool:
    """The NumPy operator's plan, built for its checks (sizes, reflect padding shorter
    than the map). torch.compile runs it while tracing, on the static sizes, and keeps
    none of it in the graph (the plan's NumPy tables are not for Dynamo to trace)."""
    geometry.blur_plan(in_spatial, pre, kernel, sizes, stride, pads, padding_mode)
    return True
