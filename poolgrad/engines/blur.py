"""Anti-aliased pooling (blur, max-blur, avg-blur) on the kernels of
:mod:`poolgrad.kernels.blur`, along a :class:`~poolgrad.geometry.BlurPlan`. The NumPy
operators (:func:`poolgrad.blur_pool` and its two kin) and poolgrad.torch's CPU
operators run these same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in the compute dtype, in any layout;
results are stored as the chosen kernel stores them: channels-last in, channels-last
out, C-contiguous otherwise."""

from __future__ import annotations

import math

import numpy as np

from .. import geometry
from ..kernels import dispatch
from .pullback import empty


def _grid(plan) -> tuple[int, ...]:
    return (1,) * (geometry.KERNEL_AXES - len(plan.in_spatial))


def blur_kernels(xk: np.ndarray, plan) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    operand = dispatch.operand(xk)
    return tuple(dispatch.choose("blur", direction, plan, operand).name
                 for direction in ("forward", "backward"))


def blur_forward(xk: np.ndarray, plan, *,
                 record: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """``(y, winners)``: the output ``(N, C, *out)`` and for a max-blur each stride-1
    window's winning tap ``(N, C, *max map)`` (else an empty array), both 5-d; without
    ``record`` (a forward no backward follows), no winners (None)."""
    kernel = dispatch.choose("blur", "forward", plan, dispatch.operand(xk))
    lead = xk.shape[:2]
    y = empty(lead + _grid(plan) + plan.out_spatial, xk.dtype, kernel.channels_last)
    if not record:
        winners = None
    elif plan.pre == "max":
        winners = empty(lead + _grid(plan) + plan.map_spatial,
                        geometry.position_dtype(math.prod(plan.pre_kernel)),
                        kernel.channels_last)
    else:
        winners = np.empty((0,) * geometry.KERNEL_AXES, np.uint8)
    kernel(xk, y, winners)
    return y, winners


def blur_backward(dyk: np.ndarray, winners: np.ndarray, plan, *,
                  channels_last: bool | None = None) -> np.ndarray:
    """``dx`` ``(N, C, D, H, W)`` in ``dyk``'s dtype from the output's ``dyk`` (5-d)
    and the forward's winners (any layout), stored channels-last if ``channels_last``
    (None: as ``dyk`` is stored) and the kernel chosen for that layout allows."""
    operand = dispatch.operand(dyk)
    if channels_last is not None:
        operand = dispatch.stored_as(channels_last, dyk.dtype)
    kernel = dispatch.choose("blur", "backward", plan, operand)
    dx = empty(dyk.shape[:2] + _grid(plan) + plan.in_spatial, dyk.dtype,
               kernel.channels_last)
    kernel(dyk, winners, dx)
    return dx
