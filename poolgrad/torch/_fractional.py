"""fractional_max_pool's pieces outside the CPU operators: the random sequence's draw
counts, and the windows built on the draws' device for the CUDA operators
(:mod:`.triton.fractional`). The function is :mod:`.kinds`'."""

from __future__ import annotations

import numpy as np
import torch

from .. import geometry
from ..kinds import fractional as numpy_fractional
from ._kind_ops import fractional_args, fractional_extents

# the window codes of :func:`poolgrad.kernels.fractional.pseudo_random_windows`
_WINDOW_CODES = {"disjoint": 0, "overlapping": -1}


def sequence_steps(kernel, out, sequence) -> list[int]:
    """How many draws the random sequence orders per dim (none for a single window)."""
    if sequence != "random":
        return []
    steps = (o if isinstance(k, str) else o - 1 for k, o in zip(kernel, out, strict=True))
    return [s for s in steps if s > 0]


def extent_bound(fractional, spatial) -> tuple[int, int, int]:
    """:func:`~poolgrad.torch._kind_ops.fractional_extents` over the kernels' (D, H, W)
    axes, 1 on an unused one."""
    bounds = fractional_extents(fractional, spatial)
    return (1,) * (geometry.KERNEL_AXES - len(bounds)) + bounds


def _boundaries(draws, span: int, steps: int, sequence: str, orders):
    """:func:`poolgrad.kinds.fractional.boundaries` in torch ops on the draws' device,
    with the same arithmetic (the pseudo-random sequence in the draws' dtype, truncated
    to int64), so the same draws give the same integers: ``(P, steps + 1)``."""
    planes = draws.shape[0]
    last = torch.full((planes, 1), span, dtype=torch.int64, device=draws.device)
    if steps == 0:
        return last
    if sequence == "pseudo_random":
        alpha, _ = numpy_fractional.pseudo_random_constants(
            np.float64 if draws.dtype == torch.float64 else np.float32, span, steps)
        # 0, 1, ..., steps - 1 exactly (below 2**24) in the draws' dtype, made on the
        # device: no copy from the host, so a CUDA graph can capture the call
        index = torch.arange(steps, dtype=draws.dtype, device=draws.device)
        offset = (draws * float(alpha)).to(torch.int64)
        inner = ((index + draws[:, None]) * float(alpha)).to(torch.int64) - offset[:, None]
    else:
        short, longer = divmod(span, steps)
        rank = torch.argsort(orders, dim=1)
        inner = torch.cat([torch.zeros((planes, 1), dtype=torch.int64, device=draws.device),
                           torch.cumsum(short + (rank[:, :-1] < longer), 1)], 1)
    return torch.cat([inner, last], 1)


def device_windows(fractional, x_size, samples, orders):
    """Every plane's windows as :func:`poolgrad.kinds.fractional.region_tables` builds
    them on the host, built on ``samples``' device in torch ops: ``(starts, lengths)``,
    int64 ``(P, 3, max(out))`` over the kernels' (D, H, W) axes, an unused axis and the
    columns past an axis's windows start 0 and length 1. ``orders`` ``(P, steps)`` holds
    the random sequence's draws, dim after dim."""
    kernel, out, sequence = fractional_args(fractional)
    ndim, spatial = len(out), [int(s) for s in x_size[2:]]
    planes, device = int(x_size[0]) * int(x_size[1]), samples.device
    u = samples.detach().reshape(planes, ndim)
    u = u if u.dtype in (torch.float32, torch.float64) else u.float()
    shape = (planes, geometry.KERNEL_AXES, max(out))
    starts = torch.zeros(shape, dtype=torch.int64, device=device)
    lengths = torch.ones(shape, dtype=torch.int64, device=device)
    taken = 0
    for axis, (length, k, o) in enumerate(zip(spatial, kernel, out, strict=True)):
        row = geometry.KERNEL_AXES - ndim + axis
        window = _WINDOW_CODES[k] if isinstance(k, str) else int(k)
        span, steps = (length, o) if isinstance(k, str) else (length - k, o - 1)
        columns = steps if sequence == "random" else 0
        b = _boundaries(u[:, numpy_fractional.sample_axis(ndim, axis)], span, steps,
                        sequence, orders[:, taken:taken + columns])
        taken += columns
        if window > 0:  # PyTorch's windows of k taps from b[0..steps]
            starts[:, row, :o] = b
            lengths[:, row, :o] = window
        else:  # Graham's regions from each boundary to the next (and one more)
            ends = torch.clamp(b[:, 1:] + 1, max=length) if window < 0 else b[:, 1:]
            starts[:, row, :o] = b[:, :o]
            lengths[:, row, :o] = ends - b[:, :o]
    return starts, lengths


def covering_windows(starts, lengths, fractional, x_size):
    """For each plane, axis and input coordinate ``i``: ``first``, how many of the axis's
    windows end at or before ``i``, and ``last``, how many start at or before it (int64
    ``(P, 3, max(spatial))``): the windows that hold ``i`` are the outputs ``first`` to
    ``last - 1``, the windows' starts and ends being non-decreasing."""
    _, out, _ = fractional_args(fractional)
    ndim, spatial = len(out), [int(s) for s in x_size[2:]]
    counts = [1] * (geometry.KERNEL_AXES - ndim) + list(out)
    sizes = [1] * (geometry.KERNEL_AXES - ndim) + spatial
    planes, device = starts.shape[0], starts.device
    shape = (planes, geometry.KERNEL_AXES, max(sizes))
    first = torch.zeros(shape, dtype=torch.int64, device=device)
    last = torch.zeros(shape, dtype=torch.int64, device=device)
    for row, (o, length) in enumerate(zip(counts, sizes, strict=True)):
        coordinates = torch.arange(length, device=device).expand(planes, length).contiguous()
        begin = starts[:, row, :o].contiguous()
        first[:, row, :length] = torch.searchsorted(begin + lengths[:, row, :o], coordinates,
                                                    right=True)
        last[:, row, :length] = torch.searchsorted(begin, coordinates, right=True)
    return first, last
