"""Public pooling operators on NumPy arrays, and :func:`vjp` for their gradients.

Every operator takes ``x`` shaped ``(N, C, *spatial)`` with 1, 2 or 3 spatial dims,
or unbatched ``(C, *spatial)``. How many spatial dims there are comes from the
per-dim arguments: a sequence (``kernel_size=(3, 3)``) names them; when every such
argument is a single int the input is taken as batched, ``x.ndim - 2`` spatial dims.
So an unbatched input needs at least one per-dim tuple.

Each public operator validates its arguments and plans the windows
(:mod:`poolgrad._inputs`, :mod:`poolgrad.geometry`), runs the kernel that
:mod:`poolgrad.kernels.dispatch` chooses and reshapes the result. Gradients
come only from :func:`vjp`, which returns the output and a :class:`Pullback`.
"""

from __future__ import annotations

import math

import numpy as np

from . import _inputs as inputs
from . import geometry
from .kernels import dispatch

__all__ = [
    "Pullback",
    "adaptive_avg_pool",
    "adaptive_max_pool",
    "avg_pool",
    "global_avg_pool",
    "global_lp_pool",
    "global_max_pool",
    "lp_pool",
    "max_pool",
    "max_unpool",
    "vjp",
]

TIE_RULES = ("first", "split")


class Pullback:
    """The vector-Jacobian product of one operator call: ``dx = pullback(dy)``.

    ``dy`` must have the output's shape; ``dx`` has the input's shape and dtype. A
    pullback is pure: it may be called any number of times. ``saved`` holds the arrays
    it keeps (for max pooling with ``ties="first"``, only the winning tap of each
    window, in the smallest unsigned type that numbers the window's taps). ``kernels``
    names the kernels that ran the forward and that run the backward (``{"forward":
    "tiled.max_pool_forward_tiled", "backward": ...}``; see ``docs/kernels.md``).
    """

    def __init__(self, op: str, backward, y_shape, x_shape, x_dtype, saved: dict,
                 kernels: tuple[str, str]):
        self.op = op
        self.kernels = dict(zip(("forward", "backward"), kernels, strict=True))
        self._backward = backward
        self.y_shape = tuple(y_shape)
        self.x_shape = tuple(x_shape)
        self.x_dtype = np.dtype(x_dtype)
        self.saved = saved

    @property
    def saved_bytes(self) -> int:
        return sum(a.nbytes for a in self.saved.values())

    @property
    def state_bytes_per_output(self) -> float:
        """Bytes this pullback keeps per output element (PyTorch's max pool keeps 8)."""
        return self.saved_bytes / max(math.prod(self.y_shape), 1)

    def __call__(self, dy) -> np.ndarray:
        dy = inputs.check_array(dy, "dy", floating=False)
        if dy.shape != self.y_shape:
            raise ValueError(
                f"{self.op} pullback: dy has shape {dy.shape} but the output has shape "
                f"{self.y_shape}"
            )
        compute = inputs.COMPUTE_DTYPE[self.x_dtype]
        dx = self._backward(np.asarray(dy, dtype=compute))
        return dx.astype(self.x_dtype, copy=False).reshape(self.x_shape)

    def __repr__(self):
        return (f"Pullback({self.op}, x{self.x_shape} <- dy{self.y_shape}, "
                f"saves {self.saved_bytes} bytes)")


# Channels-last: an ``(N, C, *spatial)`` array stored with C fastest (PyTorch's
# channels_last memory format) is pooled by kernels that run along C, and its output and
# gradient keep that memory format, as in PyTorch (the dispatch decides; see
# :func:`poolgrad.kernels.dispatch.operand`).


def _empty(shape: tuple[int, ...], dtype, channels_last: bool) -> np.ndarray:
    """An uninitialised 5-d ``(N, C, D, H, W)`` array, stored channels-last if asked."""
    if not channels_last:
        return np.empty(shape, dtype=dtype)
    n, c, d, h, w = shape
    return np.empty((n, d, h, w, c), dtype=dtype).transpose(0, 4, 1, 2, 3)


def _owned(view: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``view`` as an array the pullback owns: later changes to ``x`` (the caller's
    input or output) cannot reach it."""
    return view.copy() if np.shares_memory(view, x) else view


# --------------------------------------------------------------------------------------
# Engines: one for window maxima, one for window sums (avg), one for Lp. They take a
# checked input and its plan; the operators below and poolgrad.torch call them.


def max_engine(x, layout, plan, return_indices, ties, want_pullback, op):
    return_indices = geometry.flag(return_indices, "return_indices")
    if ties not in TIE_RULES:
        raise ValueError(f"ties must be one of {TIE_RULES}, got {ties!r}")
    if want_pullback:
        inputs.gradient_input(x, op)
    xk = inputs.compute_view(x, layout)
    out_shape = layout.kernel_shape(plan.out_spatial)
    # inference (no pullback, no indices) may fold the values only, as PyTorch's forward
    # without autograd keeps no indices; the general kernel records winners anyway
    forward = dispatch.choose("max", "forward", plan, dispatch.operand(xk),
                              record=want_pullback or return_indices)
    yk = _empty(out_shape, xk.dtype, forward.channels_last)
    pos = _empty(out_shape, geometry.position_dtype(plan.window_size),
                 forward.channels_last) if forward.records else None
    forward(xk, yk, pos)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if return_indices:
        y = (y, winner_indices(pos, plan).reshape(y.shape))
    if not want_pullback:
        return y, None
    if ties == "first":
        return y, max_pullback(pos, plan, layout, x.dtype, op, forward.name)
    xk, yk = _owned(xk, x), _owned(yk, y[0] if return_indices else y)
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


def avg_engine(x, layout, plan, divisor_mode, divisor_override, want_pullback, op,
                kind="avg"):
    xk = inputs.compute_view(x, layout)
    divisor = plan.divisor_table(divisor_mode, divisor_override, xk.dtype)
    forward = dispatch.choose(kind, "forward", plan, dispatch.operand(xk))
    yk = _empty(layout.kernel_shape(plan.out_spatial), xk.dtype, forward.channels_last)
    forward(xk, yk, divisor)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    return y, avg_pullback(plan, layout, x.dtype, forward.channels_last, divisor_mode,
                           divisor_override, op, forward.name, kind)


def lp_engine(x, layout, plan, p, want_pullback, op):
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
    return y, lp_pullback(_owned(xk, x), _owned(yk, y), p_typed, plan, layout, x.dtype, op,
                          forward.name)


# --------------------------------------------------------------------------------------
# Pullbacks from what a forward keeps. The engines above build theirs with these, and
# poolgrad.torch's backward ops call them with the tensors autograd saved (kernel views:
# see :class:`poolgrad._inputs.Layout`).


def _stored_as(channels_last: bool, dtype) -> dispatch.Operand:
    return dispatch.Operand(np.dtype(dtype), "channels_last" if channels_last else "nchw")


def _routing(kernel, layout, plan, state):
    """``dy -> dx`` through a backward kernel that takes ``(dy, state, dx)``, with ``dx``
    stored as the kernel stores its outputs (the max and average backwards)."""
    dx_shape = layout.kernel_shape(plan.in_spatial)

    def backward(dy):
        dx = _empty(dx_shape, dy.dtype, kernel.channels_last)
        kernel(layout.to_kernel(dy), state, dx)
        return dx
    return backward


def max_pullback(window_positions, plan, layout, x_dtype, op="max_pool",
                 forward_name="") -> Pullback:
    """The pullback of a max pooling with ``ties="first"`` from its winners alone:
    ``window_positions`` holds each window's winning tap (a kernel view, as the forward
    stored it; ``dx`` is stored in the same layout)."""
    pos = window_positions
    channels_last = dispatch.is_channels_last(pos)
    compute = inputs.COMPUTE_DTYPE[np.dtype(x_dtype)]
    kernel = dispatch.choose("max", "backward", plan, _stored_as(channels_last, compute))
    backward = _routing(kernel, layout, plan, pos)
    return Pullback(op, backward, layout.user_shape(plan.out_spatial),
                    layout.user_shape(plan.in_spatial), x_dtype,
                    {"window_positions": pos}, (forward_name, kernel.name))


def winner_indices(window_positions, plan) -> np.ndarray:
    """PyTorch's int64 max-pool indices (each winner's flat position in its ``(n, c)``
    input plane) from the winning taps, a kernel view stored as they are."""
    pos = window_positions
    indices = _empty(pos.shape, np.int64, dispatch.is_channels_last(pos))
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


def avg_pullback(plan, layout, x_dtype, channels_last, divisor_mode, divisor_override,
                 op="avg_pool", forward_name="", kind="avg") -> Pullback:
    """The pullback of an average pooling (``kind`` "avg" or "global_avg"), which keeps
    nothing: ``dx`` is stored channels-last or C-contiguous as asked."""
    compute = inputs.COMPUTE_DTYPE[np.dtype(x_dtype)]
    divisor = plan.divisor_table(divisor_mode, divisor_override, compute)
    kernel = dispatch.choose(kind, "backward", plan, _stored_as(channels_last, compute))
    backward = _routing(kernel, layout, plan, divisor)
    return Pullback(op, backward, layout.user_shape(plan.out_spatial),
                    layout.user_shape(plan.in_spatial), x_dtype, {},
                    (forward_name, kernel.name))


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


# --------------------------------------------------------------------------------------
# Operators. Each private ``_op(..., want_pullback)`` returns ``(y, pullback or None)``;
# the public operator returns ``y`` and :func:`vjp` returns both.


def _max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              return_indices=False, ties="first", *, want_pullback=False):
    x = inputs.check_array(x, "x", floating=False)
    ndim = inputs.count_spatial_dims(x, "x", kernel_size=kernel_size, stride=stride,
                                     padding=padding, dilation=dilation)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim)
    return max_engine(x, inputs.Layout(x.shape, ndim), plan, return_indices, ties, want_pullback,
                       "max_pool")


def max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
             return_indices=False, ties="first"):
    r"""Max pooling over 1, 2 or 3 spatial dims.

    .. math::
        y[n, c, o] = \max_{j \in \text{window}(o)} x[n, c, o \cdot s - p_{\text{before}}
        + j \cdot d]

    Padding is never a candidate (it acts as -inf), so every output is an input
    element. NaN propagates: a window holding NaN outputs NaN and routes its gradient
    to its first NaN. Integer dtypes work in the forward.

    Args:
        x: ``(N, C, *spatial)`` or ``(C, *spatial)``; float16/32/64 or integer. Any
            memory layout; a float32/64 array stored channels-last (C fastest, as
            PyTorch's ``channels_last``) gets kernels that run along C, and ``y`` and the
            gradient are stored channels-last too.
        kernel_size: int, or one int per spatial dim.
        stride: int or per dim; defaults to ``kernel_size``.
        padding: int; one int per dim; one ``(before, after)`` pair per dim; ``"valid"``;
            or ``"same"`` (output ``ceil(L / stride)``, odd totals pad one more at the
            end, ONNX SAME_UPPER). Any padding is allowed while every window holds at
            least one input element (ONNX's rule; PyTorch caps padding at kernel/2).
        dilation: int or per dim, the step between taps.
        ceil_mode: round the output length up. Windows that would start in the end
            padding are dropped.
        return_indices: also return PyTorch-style int64 indices, the flat position of
            each winner in its ``(n, c)`` input plane (what :func:`max_unpool` takes).
        ties: which tied maxima get the gradient. ``"first"``: the first in row-major
            window order (PyTorch, Caffe, ONNX). ``"split"``: each gets an equal share.

    Shape:
        ``L_out = floor((L + before + after - dilation * (kernel - 1) - 1) / stride) + 1``
        (ceil with ``ceil_mode``), per spatial dim.

    Returns:
        ``y`` with x's dtype, or ``(y, indices)`` with ``return_indices``.

    Example:
        >>> x = np.array([[[[1.0, 3.0], [2.0, 0.5]]]])
        >>> max_pool(x, 2)
        array([[[[3.]]]])
    """
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
                     ties)[0]


def _avg_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              count_include_pad=True, divisor_override=None, *, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.count_spatial_dims(x, "x", kernel_size=kernel_size, stride=stride,
                                     padding=padding, dilation=dilation)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim)
    if divisor_override is not None:
        if not geometry._is_int(divisor_override) or divisor_override < 1:
            raise ValueError(f"divisor_override must be None or an int >= 1, got "
                             f"{divisor_override!r}")
        divisor_override = int(divisor_override)
    mode = "padded" if geometry.flag(count_include_pad, "count_include_pad") else "real"
    return avg_engine(x, inputs.Layout(x.shape, ndim), plan, mode, divisor_override, want_pullback,
                       "avg_pool")


def avg_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
             count_include_pad=True, divisor_override=None):
    r"""Average pooling over 1, 2 or 3 spatial dims.

    ``y[o] = sum(x over the window's input elements) / divisor``. The divisor is, in
    order of precedence: ``divisor_override``; with ``count_include_pad`` the number of
    taps inside the padded input; otherwise the number of taps inside the input.
    With ``ceil_mode``, taps beyond the padded input never count (PyTorch's rule).
    The gradient spreads ``dy / divisor`` evenly over the window's input elements.

    Args:
        x: ``(N, C, *spatial)`` or ``(C, *spatial)``; float16/32/64.
        kernel_size, stride, padding, dilation, ceil_mode: as in :func:`max_pool`.
            (PyTorch's avg_pool has no dilation; ONNX AveragePool does.)
        count_include_pad: count padding taps in the divisor (PyTorch's default).
        divisor_override: a fixed divisor, an int >= 1.

    Shape:
        As :func:`max_pool`.

    Example:
        >>> avg_pool(np.arange(16.0).reshape(1, 1, 4, 4), 2)
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]])
    """
    return _avg_pool(x, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad,
                     divisor_override)[0]


def _lp_pool(x, p, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, *,
             want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    p = inputs.check_p(p)
    ndim = inputs.count_spatial_dims(x, "x", kernel_size=kernel_size, stride=stride,
                                     padding=padding, dilation=dilation)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim)
    return lp_engine(x, inputs.Layout(x.shape, ndim), plan, p, want_pullback, "lp_pool")


def lp_pool(x, p, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    r"""Power-average (Lp) pooling, the ONNX LpPool definition.

    .. math:: y[o] = \Big(\sum_{j \in \text{window}(o)} |x_j|^p\Big)^{1/p}

    Padding contributes 0. The gradient is ``dy * sign(x) * (|x| / y)^(p-1)``, and 0
    where ``y = 0`` (a valid subgradient).

    Unlike ONNX, PyTorch's ``lp_pool`` takes no absolute value (it computes
    ``sum(x^p)^(1/p)``, which is NaN or sign-flipped for negative inputs with odd or
    fractional ``p``); the two agree on non-negative inputs. PyTorch's version also has
    no padding or dilation.

    Args:
        x: ``(N, C, *spatial)`` or ``(C, *spatial)``; float16/32/64.
        p: the norm's order, a finite number > 0 (ONNX uses integers, default 2).
        kernel_size, stride, padding, dilation, ceil_mode: as in :func:`max_pool`.

    Example:
        >>> lp_pool(np.array([[[3.0, -4.0]]]), 2, 2)
        array([[[5.]]])
    """
    return _lp_pool(x, p, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _global_max_pool(x, ties="first", *, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=False)
    ndim = inputs.global_dims(x, spatial_dims)
    plan = geometry.adaptive_plan(x.shape[-ndim:], (1,) * ndim)
    return max_engine(x, inputs.Layout(x.shape, ndim), plan, False, ties, want_pullback,
                       "global_max_pool")


def global_max_pool(x, ties="first", *, spatial_dims=None):
    """Max over all spatial positions: ``(N, C, *spatial) -> (N, C, 1, ..., 1)``.

    ``spatial_dims`` (1-3) says how many trailing dims are spatial; by default
    ``x.ndim - 2`` (a batched input). Give it for an unbatched ``(C, *spatial)`` input.
    ``ties`` as in :func:`max_pool`.
    """
    return _global_max_pool(x, ties, spatial_dims=spatial_dims)[0]


def _global_avg_pool(x, *, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.global_dims(x, spatial_dims)
    plan = geometry.adaptive_plan(x.shape[-ndim:], (1,) * ndim)
    return avg_engine(x, inputs.Layout(x.shape, ndim), plan, "real", None, want_pullback,
                       "global_avg_pool", kind="global_avg")


def global_avg_pool(x, *, spatial_dims=None):
    """Mean over all spatial positions: ``(N, C, *spatial) -> (N, C, 1, ..., 1)``.

    ``spatial_dims`` as in :func:`global_max_pool`.
    """
    return _global_avg_pool(x, spatial_dims=spatial_dims)[0]


def _global_lp_pool(x, p, *, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    p = inputs.check_p(p)
    ndim = inputs.global_dims(x, spatial_dims)
    plan = geometry.adaptive_plan(x.shape[-ndim:], (1,) * ndim)
    return lp_engine(x, inputs.Layout(x.shape, ndim), plan, p, want_pullback, "global_lp_pool")


def global_lp_pool(x, p, *, spatial_dims=None):
    """``(sum of |x|^p over all spatial positions)^(1/p)``, ONNX GlobalLpPool.

    ``spatial_dims`` as in :func:`global_max_pool`; ``p`` as in :func:`lp_pool`.
    """
    return _global_lp_pool(x, p, spatial_dims=spatial_dims)[0]


def _adaptive_max_pool(x, output_size, return_indices=False, ties="first", *,
                       want_pullback=False):
    x = inputs.check_array(x, "x", floating=False)
    ndim = inputs.count_spatial_dims(x, "x", output_size=output_size)
    plan = inputs.adaptive_plan(x, output_size, ndim)
    return max_engine(x, inputs.Layout(x.shape, ndim), plan, return_indices, ties, want_pullback,
                       "adaptive_max_pool")


def adaptive_max_pool(x, output_size, return_indices=False, ties="first"):
    """Max pooling to a fixed output size, with PyTorch's bins.

    Output position ``o`` of an axis of length ``L`` pools
    ``[floor(o * L / out), ceil((o + 1) * L / out))``; bins may overlap, and ``out`` may
    exceed ``L``.

    Args:
        x: ``(N, C, *spatial)`` or ``(C, *spatial)``.
        output_size: an int, or one per spatial dim (``None`` keeps that dim's size).
        return_indices, ties: as in :func:`max_pool`.
    """
    return _adaptive_max_pool(x, output_size, return_indices, ties)[0]


def _adaptive_avg_pool(x, output_size, *, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.count_spatial_dims(x, "x", output_size=output_size)
    plan = inputs.adaptive_plan(x, output_size, ndim)
    return avg_engine(x, inputs.Layout(x.shape, ndim), plan, "real", None, want_pullback,
                       "adaptive_avg_pool")


def adaptive_avg_pool(x, output_size):
    """Average pooling to a fixed output size, with the bins of :func:`adaptive_max_pool`."""
    return _adaptive_avg_pool(x, output_size)[0]


def _max_unpool(y, indices, kernel_size, stride=None, padding=0, output_size=None, *,
                want_pullback=False):
    y = inputs.check_array(y, "y", floating=False)
    if want_pullback:
        inputs.gradient_input(y, "max_unpool")
    ndim = inputs.count_spatial_dims(y, "y", kernel_size=kernel_size, stride=stride,
                                     padding=padding)
    layout = inputs.Layout(y.shape, ndim)
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    stride = kernel if stride is None else geometry.per_dim(stride, ndim, "stride")
    if isinstance(padding, str):
        raise ValueError("max_unpool takes numeric padding (int, per-dim ints or pairs), "
                         f"got {padding!r}; give output_size to undo a 'same' pooling")
    pads = geometry.resolve_padding(padding, layout.spatial, kernel, stride, (1,) * ndim)
    out_spatial = geometry.unpool_output_spatial(layout.spatial, kernel, stride, pads,
                                                 output_size, layout.lead)
    indices = indices if isinstance(indices, np.ndarray) else np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"indices must be an integer array (int64, as max_pool returns), "
                        f"got {indices.dtype}")
    if indices.shape != y.shape:
        raise ValueError(f"indices has shape {indices.shape} but y has shape {y.shape}; "
                         f"they must match")
    lead = layout.kernel_shape(())[:2]
    count = math.prod(layout.spatial)
    plane = math.prod(out_spatial)
    # validate (and later index with) a private int64 copy: the kernels do not bounds-check
    # and the pullback must not see later changes to the caller's array
    if indices.size and (indices.min() < 0 or indices.max() >= plane):
        raise ValueError(
            f"indices must lie in [0, {plane}) for an unpooled plane of {out_spatial}, got "
            f"values from {indices.min()} to {indices.max()}")
    flat_indices = np.array(layout.to_kernel(indices).reshape(lead + (count,)), dtype=np.int64)
    flat_y = inputs.compute_view(y, layout).reshape(lead + (count,))
    out = np.zeros(lead + (plane,), dtype=flat_y.dtype)
    written = np.empty(flat_y.shape, dtype=np.uint8)
    forward = dispatch.choose("unpool", "forward", None, dispatch.Operand(out.dtype, "nchw"))
    forward(flat_y, flat_indices, out, written)
    result = out.astype(y.dtype, copy=False).reshape(layout.user_shape(out_spatial))
    if not want_pullback:
        return result, None

    def backward(dout):
        dy = np.empty(flat_y.shape, dtype=dout.dtype)
        flat_dout = np.ascontiguousarray(dout).reshape(lead + (plane,))
        backward_kernel(flat_dout, flat_indices, written, dy)
        return dy
    saved = {"indices": flat_indices, "written": written}
    backward_kernel = dispatch.choose("unpool", "backward", None,
                                      dispatch.Operand(flat_y.dtype, "nchw"))
    return result, Pullback("max_unpool", backward, result.shape, y.shape, y.dtype, saved,
                            (forward.name, backward_kernel.name))


def max_unpool(y, indices, kernel_size, stride=None, padding=0, output_size=None):
    """The partial inverse of :func:`max_pool`: each value goes back to its index.

    ``out`` is zero except ``out[n, c, indices[n, c, k]] = y[n, c, k]`` (flat positions in
    each ``(n, c)`` plane, as ``max_pool(..., return_indices=True)`` returns). Where
    overlapping windows chose the same input, several entries name one place: the last
    in row-major order is written and receives that place's gradient.

    Args:
        y: pooled values ``(N, C, *spatial)`` or ``(C, *spatial)``.
        indices: integer array shaped like ``y``, each in ``[0, prod(unpooled spatial))``.
        kernel_size, stride, padding: the pooling's (numeric padding only).
        output_size: the unpooled spatial size (or full shape). Default
            ``(L - 1) * stride - before - after + kernel``; any size whose pooling gives
            back ``L`` (strictly within ``default +- stride``) is allowed, as in PyTorch.
    """
    return _max_unpool(y, indices, kernel_size, stride, padding, output_size)[0]


_VJP_RULES = {
    max_pool: _max_pool,
    avg_pool: _avg_pool,
    lp_pool: _lp_pool,
    global_max_pool: _global_max_pool,
    global_avg_pool: _global_avg_pool,
    global_lp_pool: _global_lp_pool,
    adaptive_max_pool: _adaptive_max_pool,
    adaptive_avg_pool: _adaptive_avg_pool,
    max_unpool: _max_unpool,
}


def vjp(op, x, *args, **kwargs):
    """Run ``op(x, *args, **kwargs)`` and return ``(y, pullback)``.

    ``pullback(dy)`` is the exact vector-Jacobian product: it returns ``dx`` with x's
    shape and dtype, for ``dy`` with the output's shape, and may be called more than
    once. With ``return_indices=True``, ``y`` is ``(values, indices)`` and ``dy`` is the
    gradient of the values. For :func:`max_unpool`, ``x`` is the pooled values ``y``.

    Example:
        >>> y, pullback = vjp(max_pool, np.array([[[[1.0, 3.0], [2.0, 0.5]]]]), 2)
        >>> pullback(np.full_like(y, 2.5))
        array([[[[0. , 2.5],
                 [0. , 0. ]]]])
    """
    rule = _VJP_RULES.get(op) if callable(op) else None
    if rule is None:
        names = ", ".join(f.__name__ for f in _VJP_RULES)
        raise TypeError(f"vjp needs one of poolgrad's operators ({names}), got {op!r}")
    return rule(x, *args, want_pullback=True, **kwargs)
