"""GeM pooling: the forward and the backward (``dx`` and the terms of ``dp``) on the
fused kernels of :mod:`poolgrad.kernels.power_mean`, over whole planes (``plan`` None)
or a sliding plan. The NumPy operator (:func:`poolgrad.gem_pool`) and poolgrad.torch's
CPU operators run these same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in the compute dtype; results are stored
in the layout of ``x`` (channels-last in, channels-last out)."""

from __future__ import annotations

import numpy as np

from ..kernels import dispatch, power_mean
from .pullback import empty


def _planes(a: np.ndarray) -> np.ndarray:
    """``(N, C, L)``: a view for C-contiguous and channels-last arrays alike."""
    return a.reshape(a.shape[:2] + (-1,))


def _op(plan) -> str:
    return "gem_global" if plan is None else "gem"


def gem_kernels(xk: np.ndarray, plan) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    operand = dispatch.operand(xk)
    return tuple(dispatch.choose(_op(plan), direction, plan, operand).name
                 for direction in ("forward", "backward"))


def gem_forward(xk: np.ndarray, plan, p: float, eps: float) -> np.ndarray:
    """The power means of ``xk``'s windows, or of its whole planes when ``plan`` is
    None (``y`` then ``(N, C, 1, 1, 1)``)."""
    operand = dispatch.operand(xk)
    forward = dispatch.choose(_op(plan), "forward", plan, operand)
    whole = power_mean.whole_power(p)
    if plan is None:
        y = np.empty(xk.shape[:2], xk.dtype)
        forward(_planes(xk), float(eps), float(p), whole, y)
        return y.reshape(xk.shape[:2] + (1, 1, 1))
    y = empty(xk.shape[:2] + (1,) * (3 - len(plan.out_spatial)) + plan.out_spatial,
              xk.dtype, operand.layout == "channels_last")
    forward(xk, float(eps), float(p), whole, y)
    return y


def gem_backward(xk: np.ndarray, yk: np.ndarray, dyk: np.ndarray, plan, p: float, eps: float,
                 with_dp: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``(dx, p_terms or None)``: ``dx`` in ``dyk``'s dtype and
    ``xk``'s layout, and with ``with_dp`` each window's term of ``dp`` (float64,
    ``y``'s shape: their sum is ``dp``)."""
    operand = dispatch.operand(xk)
    whole = power_mean.whole_power(p)
    dx = empty(xk.shape, dyk.dtype, operand.layout == "channels_last")
    terms = np.empty(yk.shape, np.float64)
    if plan is None:
        backward = dispatch.choose("gem_global", "backward", None, operand)
        backward(_planes(xk), _planes(yk)[..., 0], _planes(dyk)[..., 0], float(eps),
                 float(p), whole, with_dp, _planes(dx), _planes(terms)[..., 0])
        return dx, terms if with_dp else None
    backward = dispatch.choose("gem", "backward", plan, operand)
    backward(xk, yk, dyk, float(eps), float(p), whole, dx)
    if not with_dp:
        return dx, None
    dispatch.choose("gem", "p_terms", plan, operand)(xk, yk, dyk, float(eps), float(p),
                                                       whole, terms)
    return dx, terms
