"""Public pooling operators on NumPy arrays, and :func:`vjp` for their gradients.

Every operator takes ``x`` shaped ``(N, C, *spatial)`` with 1, 2 or 3 spatial dims,
or unbatched ``(C, *spatial)``. How many spatial dims there are comes from the
per-dim arguments: a sequence (``kernel_size=(3, 3)``) names them; when every such
argument is a single int the input is taken as batched, ``x.ndim - 2`` spatial dims.
So an unbatched input needs at least one per-dim tuple.

Each public operator validates its arguments and plans the windows
(:mod:`poolgrad._inputs`, :mod:`poolgrad.geometry`), then hands them to its
family's engine (:mod:`poolgrad.engines`), which runs the kernels that
:mod:`poolgrad.kernels.dispatch` chooses and reshapes the result. Gradients
come only from :func:`vjp`, which returns the output and a :class:`Pullback`.
"""

from __future__ import annotations

import math

import numpy as np

from . import _inputs as inputs
from . import geometry
from .autodiff import register, vjp
from .engines import Pullback, avg_engine, lp_engine, max_engine
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

# --------------------------------------------------------------------------------------
# Operators. Each private ``_op(..., want_pullback)`` returns ``(y, pullback or None)``;
# the public operator returns ``y`` and :func:`vjp` returns both.


def _max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              return_indices=False, ties="first", *, want_pullback=False):
    x = inputs.check_array(x, "x", floating=False)
    ndim = inputs.count_spatial_dims(x.shape, "x", kernel_size=kernel_size, stride=stride,
                                     padding=padding, dilation=dilation)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim)
    return max_engine(x, inputs.Layout(x.shape, ndim), plan, return_indices=return_indices,
                      ties=ties, want_pullback=want_pullback, op="max_pool")


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
    ndim = inputs.count_spatial_dims(x.shape, "x", kernel_size=kernel_size, stride=stride,
                                     padding=padding, dilation=dilation)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim)
    divisor_override = inputs.check_divisor_override(divisor_override)
    mode = "padded" if geometry.flag(count_include_pad, "count_include_pad") else "real"
    return avg_engine(x, inputs.Layout(x.shape, ndim), plan, divisor_mode=mode,
                      divisor_override=divisor_override, want_pullback=want_pullback,
                      op="avg_pool")


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
    ndim = inputs.count_spatial_dims(x.shape, "x", kernel_size=kernel_size, stride=stride,
                                     padding=padding, dilation=dilation)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim)
    return lp_engine(x, inputs.Layout(x.shape, ndim), plan, p, want_pullback=want_pullback,
                     op="lp_pool")


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
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims)
    plan = geometry.adaptive_plan(x.shape[-ndim:], (1,) * ndim)
    return max_engine(x, inputs.Layout(x.shape, ndim), plan, return_indices=False, ties=ties,
                      want_pullback=want_pullback, op="global_max_pool")


def global_max_pool(x, ties="first", *, spatial_dims=None):
    """Max over all spatial positions: ``(N, C, *spatial) -> (N, C, 1, ..., 1)``.

    ``spatial_dims`` (1-3) says how many trailing dims are spatial; by default
    ``x.ndim - 2`` (a batched input). Give it for an unbatched ``(C, *spatial)`` input.
    ``ties`` as in :func:`max_pool`.
    """
    return _global_max_pool(x, ties, spatial_dims=spatial_dims)[0]


def _global_avg_pool(x, *, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims)
    plan = geometry.adaptive_plan(x.shape[-ndim:], (1,) * ndim)
    return avg_engine(x, inputs.Layout(x.shape, ndim), plan, divisor_mode="real",
                      divisor_override=None, want_pullback=want_pullback,
                      op="global_avg_pool", kind="global_avg")


def global_avg_pool(x, *, spatial_dims=None):
    """Mean over all spatial positions: ``(N, C, *spatial) -> (N, C, 1, ..., 1)``.

    ``spatial_dims`` as in :func:`global_max_pool`.
    """
    return _global_avg_pool(x, spatial_dims=spatial_dims)[0]


def _global_lp_pool(x, p, *, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    p = inputs.check_p(p)
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims)
    plan = geometry.adaptive_plan(x.shape[-ndim:], (1,) * ndim)
    return lp_engine(x, inputs.Layout(x.shape, ndim), plan, p, want_pullback=want_pullback,
                     op="global_lp_pool")


def global_lp_pool(x, p, *, spatial_dims=None):
    """``(sum of |x|^p over all spatial positions)^(1/p)``, ONNX GlobalLpPool.

    ``spatial_dims`` as in :func:`global_max_pool`; ``p`` as in :func:`lp_pool`.
    """
    return _global_lp_pool(x, p, spatial_dims=spatial_dims)[0]


def _adaptive_max_pool(x, output_size, return_indices=False, ties="first", *,
                       want_pullback=False):
    x = inputs.check_array(x, "x", floating=False)
    ndim = inputs.count_spatial_dims(x.shape, "x", output_size=output_size)
    plan = inputs.adaptive_plan(x, output_size, ndim)
    return max_engine(x, inputs.Layout(x.shape, ndim), plan, return_indices=return_indices,
                      ties=ties, want_pullback=want_pullback, op="adaptive_max_pool")


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
    ndim = inputs.count_spatial_dims(x.shape, "x", output_size=output_size)
    plan = inputs.adaptive_plan(x, output_size, ndim)
    return avg_engine(x, inputs.Layout(x.shape, ndim), plan, divisor_mode="real",
                      divisor_override=None, want_pullback=want_pullback,
                      op="adaptive_avg_pool")


def adaptive_avg_pool(x, output_size):
    """Average pooling to a fixed output size, with the bins of :func:`adaptive_max_pool`."""
    return _adaptive_avg_pool(x, output_size)[0]


def _max_unpool(y, indices, kernel_size, stride=None, padding=0, output_size=None, *,
                want_pullback=False):
    y = inputs.check_array(y, "y", floating=False)
    if want_pullback:
        inputs.gradient_input(y, "max_unpool")
    ndim = inputs.count_spatial_dims(y.shape, "y", kernel_size=kernel_size, stride=stride,
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


register({
    max_pool: _max_pool,
    avg_pool: _avg_pool,
    lp_pool: _lp_pool,
    global_max_pool: _global_max_pool,
    global_avg_pool: _global_avg_pool,
    global_lp_pool: _global_lp_pool,
    adaptive_max_pool: _adaptive_max_pool,
    adaptive_avg_pool: _adaptive_avg_pool,
    max_unpool: _max_unpool,
})
