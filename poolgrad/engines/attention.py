"""Attention pooling over all positions on the fused kernels of
:mod:`poolgrad.kernels.attention`. The NumPy operator (:func:`poolgrad.attention_pool`)
and poolgrad.torch's CPU operators run these same functions.

``xk`` is a 5-d kernel view ``(N, C, D, H, W)`` in the compute dtype; ``projected`` is
``(R, C)`` float64, ``R = M * heads``: each query's row of ``q W_k`` over each head's
rows of ``W_k``, divided by ``sqrt(d)`` (row ``m * heads + h``). ``dx`` is stored in
the layout of ``x``."""

from __future__ import annotations

import numpy as np

from ..kernels import dispatch
from .pullback import empty, planes


def attention_kernels(xk: np.ndarray) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    operand = dispatch.operand(xk)
    return tuple(dispatch.choose("attention", direction, None, operand).name
                 for direction in ("forward", "backward"))


def attention_forward(xk: np.ndarray, projected: np.ndarray,
                      heads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(y, attn)``: the readouts ``(N, M, C)`` in ``xk``'s dtype and the attention
    weights ``(N, R, L)``, float64, which the backward takes."""
    n, channels = xk.shape[:2]
    features = planes(xk)
    y = np.empty((n, projected.shape[0] // heads, channels), xk.dtype)
    attn = np.empty((n, projected.shape[0], features.shape[2]), np.float64)
    dispatch.choose("attention", "forward", None, dispatch.operand(xk))(
        features, projected, heads, y, attn)
    return y, attn


def attention_backward(xk: np.ndarray, dy: np.ndarray, projected: np.ndarray,
                       attn: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dx, dprojected)``: ``dx`` in ``dy``'s dtype and ``xk``'s layout, and the
    gradient of ``projected`` summed over the batch (float64)."""
    operand = dispatch.operand(xk)
    dx = empty(xk.shape, dy.dtype, operand.layout == "channels_last")
    dprojected = np.empty(projected.shape, np.float64)
    dispatch.choose("attention", "backward", None, operand)(
        planes(xk), dy, projected, attn, heads, planes(dx), dprojected)
    return dx, dprojected
