"""Anti-aliased pooling (blur, max-blur, avg-blur) on the plane kernels of
:mod:`poolgrad.kernels.blur`, along a :class:`~poolgrad.geometry.BlurPlan`. The NumPy
operators (:func:`poolgrad.blur_pool` and its two kin) and poolgrad.torch's CPU
operators run these same functions.

Arrays are planes ``(P, D, H, W)``: every ``(n, c)`` plane of the input as a 3-d block
(leading unit axes for 1-d and 2-d), C-contiguous in the compute dtype."""

from __future__ import annotations

import math

import numpy as np

from .. import geometry
from ..kernels import dispatch


def _operand(dtype) -> dispatch.Operand:
    return dispatch.Operand(np.dtype(dtype), "nchw")


def blur_kernels(dtype, plan) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward."""
    return tuple(dispatch.choose("blur", direction, plan, _operand(dtype)).name
                 for direction in ("forward", "backward"))


def _grid(plan) -> tuple[int, ...]:
    return (1,) * (geometry.KERNEL_AXES - len(plan.in_spatial))


def blur_forward(planes: np.ndarray, plan) -> tuple[np.ndarray, np.ndarray]:
    """``(y, winners)``: the output planes ``(P, *out)`` (3-d), and for a max-blur each
    stride-1 window's winning tap ``(P, *max map)`` (else an empty array)."""
    grid = _grid(plan)
    y = np.empty((planes.shape[0],) + grid + plan.out_spatial, planes.dtype)
    if plan.pre == "max":
        winners = np.empty((planes.shape[0],) + grid + plan.map_spatial,
                           geometry.position_dtype(math.prod(plan.pre_kernel)))
    else:
        winners = np.empty((0, 0, 0, 0), np.uint8)
    dispatch.choose("blur", "forward", plan, _operand(planes.dtype))(planes, y, winners)
    return y, winners


def blur_backward(dy: np.ndarray, winners: np.ndarray, plan) -> np.ndarray:
    """``dx`` planes ``(P, D, H, W)`` in ``dy``'s dtype from the output planes' ``dy``
    (3-d, C-contiguous) and the forward's winners."""
    dx = np.empty((dy.shape[0],) + _grid(plan) + plan.in_spatial, dy.dtype)
    dispatch.choose("blur", "backward", plan, _operand(dy.dtype))(dy, winners, dx)
    return dx
