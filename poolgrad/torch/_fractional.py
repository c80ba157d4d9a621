"""fractional_max_pool's pieces outside the CPU operators: the random sequence's draw
counts, and the CUDA composition (the windows built on the host, gathered by index, their
argmax, a gather). The function is :mod:`.kinds`'."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import geometry
from ..kinds import fractional as numpy_fractional
from . import _ops as ops


class TorchDraws:
    """``.random(shape)`` for :func:`poolgrad.kinds.fractional.boundaries`, from a torch
    generator (CPU draws, float64)."""

    def __init__(self, generator):
        self.generator = generator

    def random(self, shape):
        return torch.rand(shape, generator=self.generator, dtype=torch.float64).numpy()


def sequence_steps(kernel, out, sequence) -> list[int]:
    """How many draws the random sequence orders per dim (none for a single window)."""
    if sequence != "random":
        return []
    steps = (o if isinstance(k, str) else o - 1 for k, o in zip(kernel, out, strict=True))
    return [s for s in steps if s > 0]


def fractional_by_gather(x, ndim, kernel, out, samples, drawn, source, sequence):
    """Fractional max pooling of a batched x as a composition: ``(y, indices)``."""
    n, c = x.shape[:2]
    if drawn and sequence == "random":  # its orders come from the generator alone
        u = np.zeros((n, c, ndim))
    else:
        u = numpy_fractional.in_sample_precision(samples.detach().cpu().numpy())
    starts, lengths, extent = numpy_fractional.region_tables(
        tuple(x.shape[2:]), kernel, out, u.reshape(n * c, ndim), sequence,
        TorchDraws(source))
    axes = geometry.KERNEL_AXES
    index = torch.zeros((), dtype=torch.int64)
    real = torch.ones((), dtype=torch.bool)
    for axis in range(ndim):
        row = axes - ndim + axis
        o, e = out[axis], int(extent[row])
        # (P, *out, *extent) broadcast shapes: this axis's output and tap dims
        at = [1] * (2 * ndim)
        at[axis], at[ndim + axis] = o, e
        start = torch.from_numpy(starts[:, row, :o]).reshape(n * c, *at[:ndim], *[1] * ndim)
        length = torch.from_numpy(lengths[:, row, :o]).reshape(start.shape)
        tap = torch.arange(e).reshape(1, *[1] * ndim, *at[ndim:])
        stride_here = math.prod(x.shape[3 + axis:])
        index = index + (start + tap) * stride_here
        real = real & (tap < length)
    index = torch.where(real, index, torch.zeros((), dtype=torch.int64)).to(x.device)
    real = real.to(x.device)
    planes = x.reshape(n * c, -1)
    flat_index = index.reshape(n * c, -1)
    candidates = planes.detach().gather(1, flat_index).reshape(index.shape)
    candidates = torch.where(real, candidates,
                             torch.full((), -math.inf, dtype=x.dtype, device=x.device))
    flat = candidates.flatten(-ndim)
    nan = torch.isnan(flat)  # the first NaN wins, as in poolgrad's max pooling
    best = torch.where(nan.any(-1), nan.to(torch.uint8).argmax(-1), flat.argmax(-1))
    winners = index.flatten(-ndim).gather(-1, best.unsqueeze(-1)).reshape(n, c, -1)
    y = x.reshape(n, c, -1).gather(2, winners).reshape(n, c, *out)
    stored = ops.memory_format(x)  # as the CPU's kernel stores y and the indices
    return (y.contiguous(memory_format=stored),
            winners.reshape(n, c, *out).contiguous(memory_format=stored))
