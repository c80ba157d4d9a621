"""Window maxima: the max engine (max, global max and adaptive max pooling) and the
pullbacks and winner indices built from the winners it records.

With ``ties="first"`` a max pooling keeps only each window's winning tap, in the
smallest unsigned type that numbers the window's taps; ``ties="split"`` keeps ``x``,
``y`` and the count of ties per window.
"""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from .. import geometry
from ..kernels import dispatch
from .pullback import Pullback, empty, owned, routing

TIE_RULES = ("first", "split")


def max_forward(x, layout, plan, *, record: bool):
    """``(xk, yk, pos, kernel)``: the checked ``x`` as a kernel view, its window maxima
    and, when ``record`` (or the chosen kernel records anyway), each window's winning tap
    (None otherwise), as kernel views in the compute dtype, and the kernel that ran. Any
    dtype max pooling takes: integers too, which have no gradient."""
    xk = inputs.compute_view(x, layout)
    return (xk, *maxima_of(xk, plan, layout.kernel_shape(plan.out_spatial), record=record))


def maxima_of(xk, plan, out_shape, *, record: bool):
    """``(yk, pos, kernel)`` of the kernel view ``xk`` along ``plan``, into arrays of
    ``out_shape`` stored as the chosen kernel writes them (:func:`max_forward`'s)."""
    forward = dispatch.choose("max", "forward", plan, dispatch.operand(xk), record=record)
    yk = empty(out_shape, xk.dtype, forward.channels_last)
    pos = empty(out_shape, geometry.position_dtype(plan.window_size),
                forward.channels_last) if forward.records else None
    forward(xk, yk, pos)
    return yk, pos, forward


def max_engine(x, layout, plan, *, return_indices, ties, want_pullback, op):
    """``(y, pullback or None)``: the window maxima of the checked ``x`` along ``plan``,
    ``y`` a ``(values, indices)`` pair with ``return_indices``."""
    return_indices = geometry.flag(return_indices, "return_indices")
    if ties not in TIE_RULES:
        raise ValueError(f"ties must be one of {TIE_RULES}, got {ties!r}")
    if want_pullback:
        inputs.gradient_input(x, op)
    # inference (no pullback, no indices) may fold the values only, as PyTorch's forward
    # without autograd keeps no indices; the general kernel records winners anyway
    xk, yk, pos, forward = max_forward(x, layout, plan,
                                       record=want_pullback or return_indices)
    out_shape = yk.shape
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if return_indices:
        y = (y, winner_indices(pos, plan).reshape(y.shape))
    if not want_pullback:
        return y, None
    if ties == "first":
        return y, max_pullback(pos, plan, layout, x.dtype, op, forward.name)
    xk, yk = owned(xk, x), owned(yk, y[0] if return_indices else y)
    tie_count = np.empty(out_shape, dtype=xk.dtype)
    dispatch.choose("max", "tie_count", plan, dispatch.operand(xk))(xk, yk, tie_count)
    backward_kernel = dispatch.choose("max", "split", plan, dispatch.Operand(xk.dtype, "nchw"))
    dx_shape = layout.kernel_shape(plan.in_spatial)

    def backward(dy):
        dx = np.empty(dx_shape, dtype=dy.dtype)
        backward_kernel(xk, yk, layout.to_kernel(dy), tie_count, pos, dx)
        return dx
    saved = {"x": xk, "y": yk, "tie_count": tie_count, "window_positions": pos}
    y_shape = y[0].shape if return_indices else y.shape
    return y, Pullback(op, backward, y_shape, x.shape, x.dtype, saved,
                       (forward.name, backward_kernel.name))


def max_pullback(window_positions, plan, layout, x_dtype, op="max_pool",
                 forward_name="") -> Pullback:
    """The pullback of a max pooling with ``ties="first"`` from its winners alone:
    ``window_positions`` holds each window's winning tap (a kernel view, as the forward
    stored it; ``dx`` is stored in the same layout)."""
    pos = window_positions
    channels_last = dispatch.is_channels_last(pos)
    compute = inputs.COMPUTE_DTYPE[np.dtype(x_dtype)]
    kernel = dispatch.choose("max", "backward", plan, dispatch.stored_as(channels_last, compute))
    backward = routing(kernel, layout, plan, pos)
    return Pullback(op, backward, layout.user_shape(plan.out_spatial),
                    layout.user_shape(plan.in_spatial), x_dtype,
                    {"window_positions": pos}, (forward_name, kernel.name))


def winner_indices(window_positions, plan) -> np.ndarray:
    """PyTorch's int64 max-pool indices (each winner's flat position in its ``(n, c)``
    input plane) from the winning taps, a kernel view stored as they are."""
    pos = window_positions
    indices = empty(pos.shape, np.int64, dispatch.is_channels_last(pos))
    dispatch.choose("max", "indices", plan, dispatch.operand(pos))(pos, indices)
    return indices


def max_gather(dx, window_positions, plan, layout) -> np.ndarray:
    """``dx`` read at each window's winner: the adjoint of a max pullback (kernel views
    in, the output's user shape out). poolgrad.torch's double backward uses it."""
    pos = window_positions
    indices = winner_indices(pos, plan)
    planes = layout.to_kernel(dx).reshape(pos.shape[:2] + (-1,))
    picked = np.take_along_axis(planes, indices.reshape(pos.shape[:2] + (-1,)), axis=2)
    return picked.reshape(layout.user_shape(plan.out_spatial))
