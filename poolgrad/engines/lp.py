"""Lp pooling: the engine (windowed and global) and its pullback, which keeps the
input and the output."""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from ..kernels import dispatch
from .pullback import Pullback, owned


def lp_engine(x, layout, plan, p, *, want_pullback, op):
    """``(y, pullback or None)``: the Lp norms of the windows of the checked ``x``."""
    xk = inputs.compute_view(x, layout)
    with np.errstate(over="ignore", under="ignore"):
        p_typed = xk.dtype.type(p)
    if not (np.isfinite(p_typed) and p_typed > 0 and np.isfinite(1 / p_typed)):
        raise ValueError(f"p = {p!r} is out of range for {xk.dtype} computation; "
                         f"p must be finite and > 0 in {xk.dtype}")
    forward = dispatch.choose("lp", "forward", plan, dispatch.operand(xk))
    yk = np.empty(layout.kernel_shape(plan.out_spatial), dtype=xk.dtype)
    forward(xk, yk, p_typed)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    return y, lp_pullback(owned(xk, x), owned(yk, y), p_typed, plan, layout, x.dtype, op,
                          forward.name)


def lp_pullback(xk, yk, p, plan, layout, x_dtype, op="lp_pool", forward_name="") -> Pullback:
    """The pullback of an Lp pooling from its input and output (kernel views in the
    compute dtype, which the pullback keeps as they are)."""
    kernel = dispatch.choose("lp", "backward", plan, dispatch.Operand(xk.dtype, "nchw"))
    p_typed = xk.dtype.type(p)
    dx_shape = layout.kernel_shape(plan.in_spatial)

    def backward(dy):
        dx = np.empty(dx_shape, dtype=dy.dtype)
        kernel(xk, yk, layout.to_kernel(dy), p_typed, dx)
        return dx
    return Pullback(op, backward, layout.user_shape(plan.out_spatial),
                    layout.user_shape(plan.in_spatial), x_dtype, {"x": xk, "y": yk},
                    (forward_name, kernel.name))
