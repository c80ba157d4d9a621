"""The blends of a window's maximum and mean (mixed and gated pooling) on the fused
kernels of :mod:`poolgrad.kernels.blend`. The NumPy operators
(:func:`poolgrad.mixed_pool`, :func:`poolgrad.gated_pool`) and poolgrad.torch's CPU
operators run these same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in the compute dtype, pooled along a
sliding plan (no dilation); ``kind`` is :data:`~poolgrad.kernels.blend.MIXED` (the
weights ``[alpha]``) or :data:`~poolgrad.kernels.blend.GATED` (the gate's weights,
flattened in row-major tap order), float64. ``y`` and ``dx`` are stored in the layout
of ``x``."""

from __future__ import annotations

import numpy as np

from ..kernels import dispatch
from .pullback import empty


def blend_kernels(xk: np.ndarray, plan) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    operand = dispatch.operand(xk)
    return tuple(dispatch.choose("blend", direction, plan, operand).name
                 for direction in ("forward", "backward"))


def blend_forward(xk: np.ndarray, plan, kind: int, weights: np.ndarray) -> np.ndarray:
    """Each window's blend ``s max + (1 - s) mean``."""
    operand = dispatch.operand(xk)
    shape = xk.shape[:2] + tuple(a.count for a in plan.kernel_axes)
    y = empty(shape, xk.dtype, operand.layout == "channels_last")
    dispatch.choose("blend", "forward", plan, operand)(xk, kind, weights, y)
    return y


def blend_backward(xk: np.ndarray, dyk: np.ndarray, plan, kind: int,
                   weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dx, dweights)``: ``dx`` in ``dyk``'s dtype, and the weights' gradient summed
    over every window (float64, shaped as ``weights``)."""
    operand = dispatch.operand(xk)
    dx = empty(xk.shape, dyk.dtype, operand.layout == "channels_last")
    dweights = np.empty(weights.shape, np.float64)
    dispatch.choose("blend", "backward", plan, operand)(xk, dyk, kind, weights, dx, dweights)
    return dx, dweights
