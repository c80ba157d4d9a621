"""Adaptive polyphase sampling (:func:`poolgrad.aps_pool`, Chaman & Dokmanic 2021) in
PyTorch: functions and modules on the ``aps_pool``, ``aps_gather`` and ``aps_scatter``
operators (the Numba kernels of the NumPy operator on the CPU, Triton kernels on CUDA).
The gradient of each is another: the choice passes none, the gather's is the scatter and
the scatter's the gather, so gradients of gradients work.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from .. import _inputs as inputs
from .. import geometry
from ..engines.polyphase import NORMS
from . import _kind_ops as kind_ops
from ._autograd import call
from .kinds import draw, kind_input, max_blur_pool
from .onnx import refuse_export

__all__ = ["aps_pool", "lps_pool", "max_aps_pool", "APSPool", "LPSPool", "MaxAPSPool"]


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
    split as ``padding="same"`` splits it), :func:`max_blur_pool` at stride 1 (its blur
    of ``filter_size`` taps circular; none without), then :func:`aps_pool`."""
    x, ndim, unbatched = kind_input(x, "max_aps_pool", spatial_dims, kernel_size=kernel_size,
                                  stride=stride, filter_size=filter_size)
    refuse_export("max_aps_pool cannot be exported yet: its choice of phase has no ONNX "
                  "form in poolgrad.torch.onnx")
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    padded = _circular_pad(x, ndim, [((k - 1) // 2, k - 1 - (k - 1) // 2) for k in kernel])
    # max_blur_pool's stride-1 max map, a 1-tap blur without one (the core's max
    # pooling at stride 1 is the slower path for it, as in the NumPy operator)
    mapped = max_blur_pool(padded, kernel, 1, filter_size or 1, "circular")
    if unbatched and isinstance(phase, Tensor) and phase.dim() == 0:
        phase = phase.reshape(1)
    return _unbatch(_aps(mapped, ndim, stride, norm, phase, return_indices), unbatched,
                    return_indices)


def _circular_pad(x: Tensor, ndim: int, pads) -> Tensor:
    """``x`` padded circularly, ``pads[i]`` = (before, after) along spatial dim ``i``,
    stored as ``x`` is: the ``circular_pad`` op, whose gradient ``circular_fold`` is a
    kernel too (the NumPy operators' on the CPU, Triton's on CUDA)."""
    return call(kind_ops.circular_pad, x, [p for pair in pads for p in pair])


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


# ------------------------------------------------------ learnable polyphase sampling


def _components(x: Tensor, steps) -> Tensor:
    """``(N, P, C, *M)``: x padded circularly to a multiple of the stride (by index, so
    any stride works), split into its phases (row-major)."""
    for axis, step in enumerate(steps):
        length = x.shape[2 + axis]
        wrapped = torch.arange(-(-length // step) * step, device=x.device) % length
        x = x.index_select(2 + axis, wrapped)
    parts = [x[(slice(None), slice(None)) + tuple(slice(a, None, s) for a, s in
                                                 zip(offsets, steps, strict=True))]
             for offsets in itertools.product(*(range(s) for s in steps))]
    return torch.stack(parts, 1)


def _scorer(weights, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if not isinstance(weights, (tuple, list)) or len(weights) != 3 or not all(
            isinstance(w, Tensor) for w in weights):
        raise TypeError("lps_pool: weights must be (W1, b1, w2), tensors of shapes "
                        "(hidden, C), (hidden,) and (hidden,)")
    W1, b1, w2 = weights
    hidden = W1.shape[0] if W1.dim() == 2 else -1
    if hidden < 1 or (tuple(W1.shape), tuple(b1.shape), tuple(w2.shape)) != (
            (hidden, x.shape[1]), (hidden,), (hidden,)):
        raise ValueError(f"lps_pool: weights must be W1 (hidden, {x.shape[1]}), b1 (hidden,) "
                         f"and w2 (hidden,), got shapes {[tuple(w.shape) for w in weights]}")
    return tuple(w.to(x.dtype) for w in weights)


def lps_pool(x, weights, stride=2, *, training=False, temperature=1.0, generator=None,
             return_indices=False, spatial_dims=None):
    """:func:`poolgrad.lps_pool` on a tensor: ``weights`` ``(W1, b1, w2)`` tensors (the
    scoring network's, learnable). Training: the Gumbel-softmax mixture of the
    components (torch ops: the components, the per-position scorer, the softmax), its
    noise from ``generator`` (a ``torch.Generator`` or an int seed); evaluation: the
    component of highest score through the ``aps_gather`` operator. Computed in x's
    dtype. ``x`` as :func:`aps_pool` takes it."""
    x, ndim, unbatched = kind_input(x, "lps_pool", spatial_dims, stride=stride)
    refuse_export("lps_pool cannot be exported yet: its choice of phase has no ONNX form "
                  "in poolgrad.torch.onnx")
    inputs.check_real(temperature, "temperature", positive=True)
    if not isinstance(training, bool) or not isinstance(return_indices, bool):
        raise TypeError("lps_pool: training and return_indices must be True or False")
    steps = list(geometry.per_dim(stride, ndim, "stride"))
    W1, b1, w2 = _scorer(weights, x)
    comps = _components(x, steps)  # (N, P, C, *M)
    flat = comps.flatten(3)
    active = torch.relu(torch.einsum("hc,npcl->nphl", W1, flat) + b1[:, None])
    scores = torch.einsum("h,nphl->np", w2, active) / flat.shape[3]
    if training:
        uniform = draw(torch.rand, (scores.shape,), generator, x.device, torch.float64)
        logits = (scores + (-torch.log(-torch.log(uniform))).to(scores.dtype)) / temperature
        phases = logits.argmax(1)
        y = torch.einsum("np,npc...->nc...", torch.softmax(logits, 1), comps)
    else:
        phases = scores.argmax(1)
        y = call(kind_ops.aps_gather, x, phases.detach(), steps)
    result = (y, phases) if return_indices else y
    return _unbatch(result, unbatched, return_indices)


class LPSPool(nn.Module):
    """:func:`lps_pool` as a module, its scoring network's weights learnable parameters
    (``W1`` ``N(0, 1 / channels)``, ``b1`` 0, ``w2`` ``N(0, 1 / hidden)``, drawn from
    torch's generator): the soft mixture in training (noise from its own generator,
    seeded by ``seed``, or torch's default one), the hard choice in evaluation.
    ``phases`` as :class:`APSPool`'s."""

    def __init__(self, channels: int, stride=2, *, hidden: int = 8, temperature=1.0,
                 seed=None, spatial_dims=None):
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"LPSPool: hidden must be an int >= 1, got {hidden!r}")
        self.W1 = nn.Parameter(torch.empty(hidden, channels))
        self.b1 = nn.Parameter(torch.empty(hidden))
        self.w2 = nn.Parameter(torch.empty(hidden))
        self.reset_parameters()
        self.options = {"stride": stride, "temperature": temperature,
                        "spatial_dims": spatial_dims}
        self.seed, self._generator, self.phases = seed, None, None

    def reset_parameters(self, generator=None):
        """``W1`` ``N(0, 1 / channels)``, ``b1`` 0, ``w2`` ``N(0, 1 / hidden)``, from
        ``generator`` (default: torch's)."""
        hidden, channels = self.W1.shape
        with torch.no_grad():
            self.W1.normal_(0.0, 1.0 / math.sqrt(channels), generator=generator)
            self.b1.zero_()
            self.w2.normal_(0.0, 1.0 / math.sqrt(hidden), generator=generator)

    def forward(self, x):
        if self.training and self.seed is not None and self._generator is None:
            self._generator = torch.Generator(device=x.device).manual_seed(self.seed)
        y, self.phases = lps_pool(x, (self.W1, self.b1, self.w2), **self.options,
                                  training=self.training, generator=self._generator,
                                  return_indices=True)
        return y

    def extra_repr(self):
        hidden, channels = self.W1.shape
        return f"{channels}, hidden={hidden}, " + ", ".join(
            f"{k}={v!r}" for k, v in self.options.items())

    def _get_name(self):
        return "poolgrad.LPSPool"
