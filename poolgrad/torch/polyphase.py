"""Adaptive polyphase sampling (:func:`poolgrad.aps_pool`, Chaman & Dokmanic 2021) in
PyTorch: functions and modules on the ``aps_pool``, ``aps_gather`` and ``aps_scatter``
operators (the Numba kernels of the NumPy operator on the CPU, Triton kernels on CUDA).
The gradient of each is another: the choice passes none, the gather's is the scatter and
the scatter's the gather, so gradients of gradients work.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import geometry
from ..engines.polyphase import NORMS
from . import _kind_ops as kind_ops
from . import functional
from ._autograd import call
from .kinds import kind_input, max_blur_pool
from .onnx import refuse_export

__all__ = ["aps_pool", "max_aps_pool", "APSPool", "MaxAPSPool"]


def _phases(phase, x: Tensor, count: int) -> Tensor:
    """A given ``phase`` (an int, or an integer tensor of one per example) as int64
    ``(N,)`` on x's device, checked in eager calls."""
    n = x.shape[0]
    if isinstance(phase, Tensor):
        if phase.dtype.is_floating_point or phase.dtype.is_complex or phase.dtype == torch.bool:
            raise TypeError(f"aps_pool: phase must be None, an int or an integer tensor, got "
                            f"a {phase.dtype} tensor")
        if phase.dim() and tuple(phase.shape) != (n,):
            raise ValueError(f"aps_pool: phase must be one int or one per example, shape "
                             f"({n},), got shape {tuple(phase.shape)}")
        phases = phase.to(device=x.device, dtype=torch.int64).expand(n).contiguous()
        if not torch.compiler.is_compiling() and phases.numel():
            bad = phases[(phases < 0) | (phases >= count)]
            if bad.numel():
                raise ValueError(f"aps_pool: phase must be in [0, {count}) (the stride's "
                                 f"components), got {int(bad[0])}")
        return phases
    if isinstance(phase, bool) or not geometry.is_int(phase):
        raise TypeError(f"aps_pool: phase must be None, an int or an integer tensor, got "
                        f"{type(phase).__name__}")
    if not 0 <= int(phase) < count:
        raise ValueError(f"aps_pool: phase must be in [0, {count}) (the stride's "
                         f"components), got {int(phase)}")
    return torch.full((n,), int(phase), dtype=torch.int64, device=x.device)


def _aps(x: Tensor, ndim: int, stride, norm, phase, return_indices: bool):
    """APS of a batched x: ``y`` or ``(y, phases)``."""
    if norm not in NORMS:
        raise ValueError(f"aps_pool: norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if not isinstance(return_indices, bool):
        raise TypeError(f"aps_pool: return_indices must be True or False, got "
                        f"{return_indices!r}")
    steps = list(geometry.per_dim(stride, ndim, "stride"))
    if phase is None:
        y, phases = call(kind_ops.aps_pool, x, steps, NORMS[norm])
    else:
        phases = _phases(phase, x, math.prod(steps))
        y = call(kind_ops.aps_gather, x, phases, steps)
    return (y, phases) if return_indices else y


def _unbatch(result, unbatched: bool, return_indices: bool):
    if not unbatched:
        return result
    return (result[0][0], result[1][0]) if return_indices else result[0]


def aps_pool(x, stride=2, *, norm="l2", phase=None, return_indices=False, spatial_dims=None):
    """:func:`poolgrad.aps_pool` on a tensor: each example's polyphase component of
    largest norm (``phase`` given: that one, one int or an int64 tensor of one per
    example), with ``return_indices`` also the phases (int64 ``(N,)``). ``x`` as
    :func:`blur_pool` takes it."""
    x, ndim, unbatched = kind_input(x, "aps_pool", spatial_dims, stride=stride)
    refuse_export("aps_pool cannot be exported yet: its choice of phase has no ONNX "
                  "form in poolgrad.torch.onnx")
    if unbatched and isinstance(phase, Tensor) and phase.dim() == 0:
        phase = phase.reshape(1)
    return _unbatch(_aps(x, ndim, stride, norm, phase, return_indices), unbatched,
                    return_indices)


def max_aps_pool(x, kernel_size=2, stride=2, filter_size=None, *, norm="l2", phase=None,
                 return_indices=False, spatial_dims=None):
    """:func:`poolgrad.max_aps_pool` on a tensor: circular padding (``kernel_size - 1``,
    split as ``padding="same"`` splits it), poolgrad's stride-1 max pooling (or
    :func:`max_blur_pool` at stride 1 with circular padding, with ``filter_size``),
    then :func:`aps_pool`."""
    x, ndim, unbatched = kind_input(x, "max_aps_pool", spatial_dims, kernel_size=kernel_size,
                                  stride=stride, filter_size=filter_size)
    refuse_export("max_aps_pool cannot be exported yet: its choice of phase has no ONNX "
                  "form in poolgrad.torch.onnx")
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    pads = []
    for k in reversed(kernel):  # F.pad lists the last dim first
        pads += [(k - 1) // 2, k - 1 - (k - 1) // 2]
    padded = torch.nn.functional.pad(x, pads, mode="circular")
    if filter_size is None:
        mapped = getattr(functional, f"max_pool{ndim}d")(padded, kernel, 1)
    else:
        mapped = max_blur_pool(padded, kernel, 1, filter_size, "circular")
    if unbatched and isinstance(phase, Tensor) and phase.dim() == 0:
        phase = phase.reshape(1)
    return _unbatch(_aps(mapped, ndim, stride, norm, phase, return_indices), unbatched,
                    return_indices)


class APSPool(nn.Module):
    """:func:`aps_pool` as a module. ``phases`` holds the phases of the last forward, for
    a residual shortcut to follow (``aps_pool(shortcut, stride, phase=module.phases)``)."""

    def __init__(self, stride=2, *, norm="l2", spatial_dims=None):
        super().__init__()
        self.options = {"stride": stride, "norm": norm, "spatial_dims": spatial_dims}
        self.phases = None

    def forward(self, x):
        y, self.phases = aps_pool(x, **self.options, return_indices=True)
        return y

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())

    def _get_name(self):  # prints as poolgrad's modules do, after replace_pooling too
        return f"poolgrad.{type(self).__name__}"


class MaxAPSPool(APSPool):
    """:func:`max_aps_pool` as a module (APS's replacement for ``MaxPool2d``);
    ``phases`` as :class:`APSPool`'s."""

    def __init__(self, kernel_size=2, stride=2, filter_size=None, *, norm="l2",
                 spatial_dims=None):
        nn.Module.__init__(self)
        self.options = {"kernel_size": kernel_size, "stride": stride,
                        "filter_size": filter_size, "norm": norm, "spatial_dims": spatial_dims}
        self.phases = None

    def forward(self, x):
        y, self.phases = max_aps_pool(x, **self.options, return_indices=True)
        return y
