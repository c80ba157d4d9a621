"""Lp pooling: the engine (windowed and global) and its pullback, which keeps the
input and the output. Outputs and gradients take the layout of the kernel that writes
them: x's, for GeM's rows kernels (:mod:`poolgrad.kernels.power_mean`)."""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from ..kernels import dispatch
from .pullback import Pullback, empty, owned


def lp_engine(x, layout, plan, p, *, want_pullback, op):
    """``(y, pullback or None)``: the Lp norms of the windows of the checked ``x``."""
    xk = inputs.compute_view(x, layout)
    with np.errstate(over="ignore", under="ignore"):
        p_typed = xk.dtype.type(p)
    if not (np.isfinite(p_typed) and p_typed > 0 and np.isfinite(1 / p_typed)):
        raise ValueError(f"p = {p!r} is out of range for {xk.dtype} computation; "
                         f"p must be finite and > 0 in {xk.dtype}")
    forward = dispatch.choose("lp", "forward", plan, dispatch.operand(xk))
    yk = empty(layout.kernel_shape(plan.out_spatial), xk.dtype, forward.channels_last)
    forward(xk, yk, p_typed)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    return y, lp_pullback(owned(xk, x, keep_layout=True), owned(yk, y, keep_layout=True),
                          p_typed, plan, layout, x.dtype, op,
                          forward.name)


def lp_pullback(xk, yk, p, plan, layout, x_dtype, op="lp_pool", forward_name="") -> Pullback:
    """The pullback of an Lp pooling from its input and output (kernel views in the
    compute dtype, which the pullback keeps as they are)."""
    kernel = dispatch.choose("lp", "backward", plan, dispatch.operand(xk))
    p_typed = xk.dtype.type(p)
    dx_shape = layout.kernel_shape(plan.in_spatial)

    def backward(dy):
        dx = empty(dx_shape, dy.dtype, kernel.channels_last)
        kernel(xk, yk, layout.to_kernel(dy), p_typed, dx)
        return dx
    return Pullback(op, backward, layout.user_shape(plan.out_spatial),
                    layout.user_shape(plan.in_spatial), x_dtype, {"x": xk, "y": yk},
                    (forward_name, kernel.name))
