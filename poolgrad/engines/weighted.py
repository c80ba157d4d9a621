"""The weighted window averages (SoftPool, stochastic pooling's evaluation) and
stochastic pooling's draw, on the fused kernels of :mod:`poolgrad.kernels.weighted`.
The NumPy operators (:func:`poolgrad.soft_pool`, :func:`poolgrad.stochastic_pool`) and
poolgrad.torch's CPU operators run these same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in the compute dtype, pooled along a
sliding plan; ``kind`` is :data:`~poolgrad.kernels.weighted.SOFT` or
:data:`~poolgrad.kernels.weighted.SELF`. The averages and ``dx`` are stored in the
layout of ``x`` (channels-last in, channels-last out); the draws C-contiguous."""

from __future__ import annotations

import numpy as np

from .. import geometry
from ..kernels import dispatch
from .pullback import empty


def _out_shape(xk: np.ndarray, plan) -> tuple[int, ...]:
    return xk.shape[:2] + tuple(a.count for a in plan.kernel_axes)


def weighted_kernels(xk: np.ndarray, plan) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    operand = dispatch.operand(xk)
    return tuple(dispatch.choose("weighted", direction, plan, operand).name
                 for direction in ("forward", "backward"))


def weighted_forward(xk: np.ndarray, plan, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """``(y, norm)``: each window's weighted average and what its backward needs (the
    log of SoftPool's normaliser, stochastic pooling's window sum)."""
    operand = dispatch.operand(xk)
    forward = dispatch.choose("weighted", "forward", plan, operand)
    shape, stored = _out_shape(xk, plan), operand.layout == "channels_last"
    y, norm = empty(shape, xk.dtype, stored), empty(shape, xk.dtype, stored)
    forward(xk, y, norm, kind)
    return y, norm


def weighted_backward(xk: np.ndarray, yk: np.ndarray, norm: np.ndarray, dyk: np.ndarray,
                      plan, kind: int) -> np.ndarray:
    """``dx`` in ``dyk``'s dtype: each input's share of the windows that read it."""
    operand = dispatch.operand(xk)
    backward = dispatch.choose("weighted", "backward", plan, operand)
    dx = empty(xk.shape, dyk.dtype, operand.layout == "channels_last")
    backward(xk, yk, norm, dyk, kind, dx)
    return dx


def negative_or_nan(xk: np.ndarray, plan) -> bool:
    """Whether ``xk`` holds a negative number or a NaN, read in memory order."""
    values = xk.ravel(order="K")  # a view for the layouts the kernels take
    flags = np.empty(max(1, min(64, values.size // 65536)), np.bool_)
    dispatch.choose("stochastic", "check", plan, dispatch.operand(xk))(values, flags)
    return bool(flags.any())


def sample_kernel(xk: np.ndarray, plan) -> str:
    """The name of the kernel that draws ``xk``'s taps."""
    return dispatch.choose("stochastic", "sample", plan, dispatch.operand(xk)).name


def stochastic_sample(xk: np.ndarray, draws: np.ndarray, plan) -> tuple[np.ndarray, np.ndarray]:
    """``(y, winners)``: one tap per window drawn with probability ``x / sum(x)`` by
    the float64 ``draws`` (``y``'s shape), numbered as max pooling's winners, so that
    max pooling's backward routes its gradient."""
    sample = dispatch.choose("stochastic", "sample", plan, dispatch.operand(xk))
    shape = _out_shape(xk, plan)
    y = np.empty(shape, xk.dtype)
    winners = np.empty(shape, geometry.position_dtype(plan.window_size))
    sample(xk, draws, y, winners)
    return y, winners
