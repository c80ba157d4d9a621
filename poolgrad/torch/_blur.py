"""What the blur kinds' torch code shares besides their operators: which element a
padded position copies in each mode (the ONNX export's gathers), and the NumPy plan's
checks (the functions and modules are :mod:`.kinds`', the operators
:mod:`._kind_ops`')."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import geometry


def pad_source(length: int, before: int, after: int, mode: str, device) -> Tensor:
    """Which element each padded position copies (zeros: any, masked later)."""
    index = torch.arange(-before, length + after, device=device)
    if mode == "reflect":
        index = index.abs()
        return torch.where(index >= length, 2 * (length - 1) - index, index)
    if mode == "circular":
        return index.remainder(length)
    return index.clamp(0, length - 1)  # replicate, and zeros before masking


@torch.compiler.assume_constant_result
def check_blur(in_spatial, pre, kernel, sizes, stride, pads, padding_mode) -> bool:
    """The NumPy operator's plan, built for its checks (sizes, reflect padding shorter
    than the map). torch.compile runs it while tracing, on the static sizes, and keeps
    none of it in the graph (the plan's NumPy tables are not for Dynamo to trace)."""
    geometry.blur_plan(in_spatial, pre, kernel, sizes, stride, pads, padding_mode)
    return True
