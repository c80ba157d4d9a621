"""The autograd formulas of poolgrad's core operators, and :func:`call`, the one way to
call them (the kinds' formulas are :mod:`._kind_autograd`'s).

Each op's formula is a ``setup_context`` that saves what its backward needs and a
backward that calls ops in turn, so it is differentiable again: max pooling's backward
and its gather are each other's gradients, average pooling's backward and forward are
each other's adjoints, and the second derivatives of Lp and of split-tie max are written
as window-sum composites (over :func:`windows`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._ops import (
    IMPLEMENTATIONS,
    avg_pool,
    avg_pool_backward,
    is_channels_last,
    lp_pool,
    lp_pool_backward,
    max_pool,
    max_pool_backward,
    max_pool_gather,
    max_pool_split_backward,
    max_pool_values,
    max_unpool,
    max_unpool_backward,
    out_shape,
    sliding_args,
    window_ndim,
)

AUTOGRAD: dict = {}  # op -> (backward, setup_context)


def register_autograd(op, backward, setup_context) -> None:
    """Give ``op`` its autograd formula, the op's and :func:`call`'s."""
    op.register_autograd(backward, setup_context=setup_context)
    AUTOGRAD[op] = (backward, setup_context)


def _plain_eager(args) -> bool:
    """Whether nothing but eager CPU execution would see a call with ``args``: no
    compiler, JIT tracer, fake or dispatch mode, torch-function mode, functorch transform
    or tensor subclass."""
    return (all(type(a) is Tensor for a in args if isinstance(a, Tensor))
            and not torch.compiler.is_compiling() and not torch._C._is_tracing()
            and _get_current_dispatch_mode() is None
            and not torch._C._is_torch_function_mode_enabled()
            and not torch._C._are_functorch_transforms_active())


def call(op, *args):
    """``op(*args)``, in plain eager mode without the dispatcher's Python layers.

    Those layers (autograd wrapping, backend selection, the compiler guard) cost more
    than a small pooling does. When nothing but eager execution would see the call
    (:func:`_plain_eager`), the implementation for the device runs directly, wrapped in
    :class:`_EagerAutograd` (the same setup_context and backward as the op's) when an
    input needs grad. Anything else (torch.compile, export, fake tensors, modes,
    subclasses) calls the op.
    """
    implementation = _implementation(op, args)
    if implementation is None or not _plain_eager(args):
        return op(*args)
    if torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad
                                       for a in args):
        return _EagerAutograd.apply(op, implementation, *args)
    return implementation(*args)


def _implementation(op, args):
    """The implementation the dispatcher would pick for ``args``' device: the CPU's or
    CUDA's, or None for any other device (the op then says what is wrong)."""
    device = next(a.device.type for a in args if isinstance(a, Tensor))
    return IMPLEMENTATIONS.get(device, {}).get(op)


class _EagerAutograd(torch.autograd.Function):
    """An op's implementation under the op's own autograd formula (eager mode).

    A formula gets zeros, as from the op's own autograd, for a differentiable output
    that received no gradient, and None for the others (winners, tap numbers, and
    outputs its setup marks non-differentiable), which every formula ignores: autograd
    would otherwise fill a fresh tensor of zeros for each of them on every backward,
    as large as the output."""

    @staticmethod
    def forward(ctx, op, implementation, *args):
        output = implementation(*args)
        ctx.op = op
        AUTOGRAD[op][1](ctx, args, output)
        ctx.set_materialize_grads(False)
        ctx.zeros = _zero_grads(ctx, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        grads = tuple(torch.zeros(**zeros) if grad is None and zeros is not None else grad
                      for grad, zeros in zip(grads, ctx.zeros, strict=True))
        return (None, None, *AUTOGRAD[ctx.op][0](ctx, *grads))


def _zero_grads(ctx, output) -> tuple:
    """Per output of an op, the ``torch.zeros`` arguments of what its formula gets in
    place of a missing gradient (autograd's zeros: contiguous), or None where it gets
    None: an output that is not floating, or that the setup marked non-differentiable
    (``mark_non_differentiable`` keeps them in ``ctx.non_differentiable``)."""
    fixed = getattr(ctx, "non_differentiable", None) or ()
    return tuple(
        {"size": o.shape, "dtype": o.dtype, "device": o.device}
        if o.is_floating_point() and not any(o is f for f in fixed) else None
        for o in (output if isinstance(output, tuple) else (output,)))


# ------------------------------------------------------------ composites for 2nd order


def windows(t: Tensor, window, fill: float) -> Tensor:
    """``t``'s sliding windows as a ``(N, C, *out, *taps)`` view of a padded copy: the
    composite form the double backwards of Lp and of split max, and the kinds of
    :mod:`.kinds`, are written in (sizes by arithmetic alone, so it compiles)."""
    kernel, stride, pads, dilation, _ = sliding_args(window)
    ndim = len(kernel)
    ends = []
    for (lo, hi), k, s, d, length, out in zip(pads, kernel, stride, dilation, t.shape[2:],
                                              out_shape(t, window)[2:], strict=True):
        # ceil_mode's last window may reach past the end padding
        reach = (out - 1) * s + d * (k - 1) + 1 - (length + lo + hi)
        ends.append((lo, hi + max(reach, 0)))
    flat = [p for lo, hi in reversed(ends) for p in (lo, hi)]
    t = torch.nn.functional.pad(t, flat, value=fill)
    for i, (k, s, d) in enumerate(zip(kernel, stride, dilation, strict=True)):
        t = t.unfold(2 + i, d * (k - 1) + 1, s)
    taps = (slice(None),) * (2 + ndim) + tuple(slice(None, None, d) for d in dilation)
    return t[taps]


def _split_adjoint(g: Tensor, x: Tensor, window) -> Tensor:
    """The adjoint of :func:`max_pool_split_backward`: each window's sum of ``g`` over
    its tied maxima, over their number."""
    ndim = window_ndim(window)
    taps = tuple(range(-ndim, 0))
    y = windows(x, window, -math.inf).amax(dim=taps, keepdim=True)
    tied = windows(x, window, math.nan) == y
    return (windows(g, window, 0.0) * tied).sum(taps) / tied.sum(taps)


def _window_sum(t: Tensor, window) -> Tensor:
    return call(avg_pool, t, window, True, 1)


def _window_sum_adjoint(t: Tensor, window, x: Tensor) -> Tensor:
    return call(avg_pool_backward, t, window, list(x.shape), True, 1,
                is_channels_last(x))


def _lp_backward_gradients(x, y, dy, p, window, g):
    """Gradients of ``dx = a(x) * S^T(dy * y^(1-p))`` (``a(x) = sign(x) |x|^(p-1)``, S the
    window sum) for an incoming ``g``, with respect to ``dy``, ``x`` and ``y``; zero where
    ``y = 0`` or ``x = 0``, the conventions of the first derivative."""
    def power(t, exponent):
        return torch.where(t != 0, t.abs().clamp_min(torch.finfo(t.dtype).tiny) ** exponent,
                           torch.zeros_like(t))
    a = torch.sign(x) * power(x, p - 1)
    along = _window_sum(a * g, window)
    y_scale = power(y, 1 - p)
    grad_dy = y_scale * along
    grad_y = dy * (1 - p) * power(y, -p) * along
    grad_x = g * (p - 1) * power(x, p - 2) * _window_sum_adjoint(dy * y_scale, window, x)
    return grad_dy, grad_x, grad_y


# --------------------------------------------------------------------------- formulas


def _max_setup(ctx, inputs, output):
    x, window, ties = inputs
    ctx.window, ctx.ties, ctx.x_size = window, ties, list(x.shape)
    ctx.save_for_backward(output[1] if ties == "first" else x)


def _max_grad(ctx, dy, _winners_grad):
    (saved,) = ctx.saved_tensors
    if ctx.ties == "first":
        return call(max_pool_backward, dy, saved, ctx.window, ctx.x_size), None, None
    return call(max_pool_split_backward, dy, saved, ctx.window), None, None


register_autograd(max_pool, _max_grad, _max_setup)


def _values_setup(ctx, inputs, output):
    ctx.window = inputs[1]
    ctx.save_for_backward(inputs[0])


def _values_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    _, winners = call(max_pool, x, ctx.window, "first")  # recorded only now that it is needed
    return call(max_pool_backward, dy, winners, ctx.window, list(x.shape)), None


register_autograd(max_pool_values, _values_grad, _values_setup)


def _winners_setup(ctx, inputs, output):
    ctx.window = inputs[2]
    ctx.save_for_backward(inputs[1])


def _max_backward_grad(ctx, g):
    (winners,) = ctx.saved_tensors
    return call(max_pool_gather, g, winners, ctx.window), None, None, None


register_autograd(max_pool_backward, _max_backward_grad, _winners_setup)


def _gather_setup(ctx, inputs, output):
    dx, winners, window = inputs
    ctx.window, ctx.dx_size = window, list(dx.shape)
    ctx.save_for_backward(winners)


def _gather_grad(ctx, g):
    (winners,) = ctx.saved_tensors
    return call(max_pool_backward, g, winners, ctx.window, ctx.dx_size), None, None


register_autograd(max_pool_gather, _gather_grad, _gather_setup)


def _split_setup(ctx, inputs, output):
    ctx.window = inputs[2]
    ctx.save_for_backward(inputs[1])


def _split_grad(ctx, g):
    (x,) = ctx.saved_tensors
    return _split_adjoint(g, x, ctx.window), None, None  # piecewise constant in x


register_autograd(max_pool_split_backward, _split_grad, _split_setup)


def _avg_setup(ctx, inputs, output):
    x, ctx.window, ctx.count_include_pad, ctx.divisor_override = inputs
    ctx.x_size = list(x.shape)
    ctx.channels_last = is_channels_last(x)


def _avg_grad(ctx, dy):
    dx = call(avg_pool_backward, dy, ctx.window, ctx.x_size, ctx.count_include_pad,
                           ctx.divisor_override, ctx.channels_last)
    return dx, None, None, None


register_autograd(avg_pool, _avg_grad, _avg_setup)


def _avg_backward_setup(ctx, inputs, output):
    _, ctx.window, _, ctx.count_include_pad, ctx.divisor_override, _ = inputs


def _avg_backward_grad(ctx, g):
    return (call(avg_pool, g, ctx.window, ctx.count_include_pad, ctx.divisor_override),
            None, None, None, None, None)


register_autograd(avg_pool_backward, _avg_backward_grad, _avg_backward_setup)


def _lp_setup(ctx, inputs, output):
    x, ctx.p, ctx.window = inputs
    ctx.save_for_backward(x, output)


def _lp_grad(ctx, dy):
    x, y = ctx.saved_tensors
    return call(lp_pool_backward, dy, x, y, ctx.p, ctx.window), None, None


register_autograd(lp_pool, _lp_grad, _lp_setup)


def _lp_backward_setup(ctx, inputs, output):
    dy, x, y, ctx.p, ctx.window = inputs
    ctx.save_for_backward(dy, x, y)


def _lp_backward_grad(ctx, g):
    dy, x, y = ctx.saved_tensors
    grad_dy, grad_x, grad_y = _lp_backward_gradients(x, y, dy, ctx.p, ctx.window, g)
    return grad_dy, grad_x, grad_y, None, None


register_autograd(lp_pool_backward, _lp_backward_grad, _lp_backward_setup)


def _unpool_setup(ctx, inputs, output):
    _, indices, ctx.window, _ = inputs
    ctx.save_for_backward(indices)


def _unpool_grad(ctx, dout):
    (indices,) = ctx.saved_tensors
    return call(max_unpool_backward, dout, indices, ctx.window), None, None, None


register_autograd(max_unpool, _unpool_grad, _unpool_setup)


def _unpool_backward_setup(ctx, inputs, output):
    dout, indices, ctx.window = inputs
    ctx.out_spatial = list(dout.shape[2:])
    ctx.save_for_backward(indices)


def _unpool_backward_grad(ctx, g):
    (indices,) = ctx.saved_tensors
    return call(max_unpool, g, indices, ctx.window, ctx.out_spatial), None, None


register_autograd(max_unpool_backward, _unpool_backward_grad, _unpool_backward_setup)
