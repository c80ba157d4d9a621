"""The autograd formulas of poolgrad's operators, and :func:`call`, the one way to call them.

Each op's formula is a ``setup_context`` that saves what its backward needs and a
backward that calls ops in turn, so it is differentiable again: max pooling's backward
and its gather are each other's gradients, average pooling's backward and forward are
each other's adjoints, and the second derivatives of Lp and of split-tie max are written
as window-sum composites. GeM's backward is differentiated through its composite form
(:func:`gem_composite`), recomputed when a second derivative is asked for, and so are
the weighted averages' (:func:`weighted_composite`) and the blends' of mixed and
gated pooling (:func:`blend_composite`). Stochastic pooling's draw routes its
gradient as max pooling does, through its winners. The blur's backward is linear in
``dy``: its gradient is the forward again, a max-blur's after a gather at the winners.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._kind_ops import (
    MIXED,
    SOFT,
    blend_pool,
    blend_pool_backward,
    blur_args,
    blur_geometry,
    blur_pool,
    blur_pool_backward,
    fractional_max_pool,
    fractional_max_pool_backward,
    fractional_max_pool_indices,
    gem_pool,
    gem_pool_backward,
    stochastic_pool_sample,
    weighted_pool,
    weighted_pool_backward,
)
from ._ops import (
    IMPLEMENTATIONS,
    avg_pool,
    avg_pool_backward,
    is_channels_last,
    is_global,
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
    sliding_window,
    window_ndim,
)

AUTOGRAD: dict = {}  # op -> (backward, setup_context)


def _autograd(op, backward, setup_context) -> None:
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
    """An op's implementation under the op's own autograd formula (eager mode)."""

    @staticmethod
    def forward(ctx, op, implementation, *args):
        output = implementation(*args)
        ctx.op = op
        AUTOGRAD[op][1](ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *AUTOGRAD[ctx.op][0](ctx, *grads))




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


def gem_composite(x: Tensor, p, eps: float, window) -> tuple[Tensor, Tensor, tuple]:
    """GeM in torch's own differentiable ops: ``(y, the clamped taps, their dims)``, the
    taps as ``(N, C, *out, *taps)`` (or ``(N, C, 1.., L)`` for a global window), each
    window scaled by its (detached) maximum, which ``y`` does not depend on."""
    z = x.clamp_min(eps)
    if is_global(window):
        taps, dims = z.flatten(2).reshape(*x.shape[:2], *(1,) * (x.dim() - 2), -1), (-1,)
    else:
        taps, dims = windows(z, window, math.nan), tuple(range(-window_ndim(window), 0))
    largest = taps.detach().amax(dim=dims, keepdim=True)
    y = ((taps / largest) ** p).mean(dims, keepdim=True) ** (1 / p) * largest
    return y.squeeze(dims), taps, dims


def _gem_p_terms(dy: Tensor, y: Tensor, taps: Tensor, dims, p) -> Tensor:
    """Each window's term of ``dp``: ``dy (y / p) S1 / S0`` (:mod:`poolgrad.kernels.power_mean`)."""
    r = taps / y.reshape(*y.shape, *(1,) * len(dims))
    power = r ** p
    return dy * (y / p) * (power * r.log()).sum(dims) / power.sum(dims)


def weighted_composite(x: Tensor, kind: int, window) -> Tensor:
    """A weighted window average in torch's own differentiable ops, over the real taps:
    SoftPool with each window's maximum detached (the function, and so its gradient, do
    not depend on it), or stochastic pooling's ``sum x^2 / sum x`` (0 where the sum is)."""
    dims = tuple(range(-window_ndim(window), 0))
    if kind == SOFT:
        real = windows(torch.ones((1, 1, *x.shape[2:]), dtype=torch.bool, device=x.device),
                       window, False)
        taps = windows(x, window, -math.inf)
        weights = torch.exp(taps - taps.detach().amax(dim=dims, keepdim=True))
        values = torch.where(real, taps, torch.zeros((), dtype=x.dtype, device=x.device))
        return (weights * values).sum(dims) / weights.sum(dims)
    taps = windows(x, window, 0.0)
    total = taps.sum(dims)
    some = total != 0
    safe = torch.where(some, total, torch.ones((), dtype=x.dtype, device=x.device))
    return torch.where(some, (taps * taps).sum(dims) / safe, torch.zeros_like(total))


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


_autograd(max_pool, _max_grad, _max_setup)


def _values_setup(ctx, inputs, output):
    ctx.window = inputs[1]
    ctx.save_for_backward(inputs[0])


def _values_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    _, winners = call(max_pool, x, ctx.window, "first")  # recorded only now that it is needed
    return call(max_pool_backward, dy, winners, ctx.window, list(x.shape)), None


_autograd(max_pool_values, _values_grad, _values_setup)


def _winners_setup(ctx, inputs, output):
    ctx.window = inputs[2]
    ctx.save_for_backward(inputs[1])


def _max_backward_grad(ctx, g):
    (winners,) = ctx.saved_tensors
    return call(max_pool_gather, g, winners, ctx.window), None, None, None


_autograd(max_pool_backward, _max_backward_grad, _winners_setup)


def _gather_setup(ctx, inputs, output):
    dx, winners, window = inputs
    ctx.window, ctx.dx_size = window, list(dx.shape)
    ctx.save_for_backward(winners)


def _gather_grad(ctx, g):
    (winners,) = ctx.saved_tensors
    return call(max_pool_backward, g, winners, ctx.window, ctx.dx_size), None, None


_autograd(max_pool_gather, _gather_grad, _gather_setup)


def _split_setup(ctx, inputs, output):
    ctx.window = inputs[2]
    ctx.save_for_backward(inputs[1])


def _split_grad(ctx, g):
    (x,) = ctx.saved_tensors
    return _split_adjoint(g, x, ctx.window), None, None  # piecewise constant in x


_autograd(max_pool_split_backward, _split_grad, _split_setup)


def _avg_setup(ctx, inputs, output):
    x, ctx.window, ctx.count_include_pad, ctx.divisor_override = inputs
    ctx.x_size = list(x.shape)
    ctx.channels_last = is_channels_last(x)


def _avg_grad(ctx, dy):
    dx = call(avg_pool_backward, dy, ctx.window, ctx.x_size, ctx.count_include_pad,
                           ctx.divisor_override, ctx.channels_last)
    return dx, None, None, None


_autograd(avg_pool, _avg_grad, _avg_setup)


def _avg_backward_setup(ctx, inputs, output):
    _, ctx.window, _, ctx.count_include_pad, ctx.divisor_override, _ = inputs


def _avg_backward_grad(ctx, g):
    return (call(avg_pool, g, ctx.window, ctx.count_include_pad, ctx.divisor_override),
            None, None, None, None, None)


_autograd(avg_pool_backward, _avg_backward_grad, _avg_backward_setup)


def _lp_setup(ctx, inputs, output):
    x, ctx.p, ctx.window = inputs
    ctx.save_for_backward(x, output)


def _lp_grad(ctx, dy):
    x, y = ctx.saved_tensors
    return call(lp_pool_backward, dy, x, y, ctx.p, ctx.window), None, None


_autograd(lp_pool, _lp_grad, _lp_setup)


def _lp_backward_setup(ctx, inputs, output):
    dy, x, y, ctx.p, ctx.window = inputs
    ctx.save_for_backward(dy, x, y)


def _lp_backward_grad(ctx, g):
    dy, x, y = ctx.saved_tensors
    grad_dy, grad_x, grad_y = _lp_backward_gradients(x, y, dy, ctx.p, ctx.window, g)
    return grad_dy, grad_x, grad_y, None, None


_autograd(lp_pool_backward, _lp_backward_grad, _lp_backward_setup)


def _unpool_setup(ctx, inputs, output):
    _, indices, ctx.window, _ = inputs
    ctx.save_for_backward(indices)


def _unpool_grad(ctx, dout):
    (indices,) = ctx.saved_tensors
    return call(max_unpool_backward, dout, indices, ctx.window), None, None, None


_autograd(max_unpool, _unpool_grad, _unpool_setup)


def _unpool_backward_setup(ctx, inputs, output):
    dout, indices, ctx.window = inputs
    ctx.out_spatial = list(dout.shape[2:])
    ctx.save_for_backward(indices)


def _unpool_backward_grad(ctx, g):
    (indices,) = ctx.saved_tensors
    return call(max_unpool, g, indices, ctx.window, ctx.out_spatial), None, None


_autograd(max_unpool_backward, _unpool_backward_grad, _unpool_backward_setup)


def _gem_setup(ctx, inputs, output):
    x, p, ctx.eps, ctx.window = inputs
    ctx.with_dp = p.requires_grad
    ctx.save_for_backward(x, p, output)


def _gem_grad(ctx, dy):
    x, p, y = ctx.saved_tensors
    dx, terms = call(gem_pool_backward, dy, x, y, p, ctx.eps, ctx.window, ctx.with_dp)
    dp = terms.sum().to(p.dtype).reshape(p.shape) if ctx.with_dp else None
    return dx, dp, None, None


_autograd(gem_pool, _gem_grad, _gem_setup)


def _gem_backward_setup(ctx, inputs, output):
    dy, x, _, p, ctx.eps, ctx.window, ctx.with_dp = inputs
    ctx.save_for_backward(dy, x, p)


def _gem_backward_grad(ctx, grad_dx, grad_terms):
    """The backward's gradients by differentiating its composite form: ``y`` is taken
    as the function of ``x`` it is (its own gradient is 0, the whole dependence goes
    through ``x``)."""
    dy, x, p = ctx.saved_tensors
    higher = torch.is_grad_enabled()  # (create_graph)
    with torch.enable_grad():
        dy_, x_, p_ = (t.detach().requires_grad_() for t in (dy, x, p))
        y, taps, dims = gem_composite(x_, p_, ctx.eps, ctx.window)
        (dx,) = torch.autograd.grad(y, x_, dy_, create_graph=True)
        outputs, grads = [], []
        if grad_dx is not None:
            outputs.append(dx)
            grads.append(grad_dx)
        if ctx.with_dp and grad_terms is not None:
            outputs.append(_gem_p_terms(dy_, y, taps, dims, p_))
            grads.append(grad_terms)
        if not outputs:
            return (None,) * 7
        grad_dy, grad_x, grad_p = torch.autograd.grad(
            outputs, (dy_, x_, p_), grads, allow_unused=True, create_graph=higher)
    return grad_dy, grad_x, None, grad_p, None, None, None


_autograd(gem_pool_backward, _gem_backward_grad, _gem_backward_setup)


def _weighted_setup(ctx, inputs, output):
    x, ctx.kind, ctx.window = inputs
    y, norm = output
    ctx.mark_non_differentiable(norm)
    ctx.save_for_backward(x, y, norm)


def _weighted_grad(ctx, dy, _):
    x, y, norm = ctx.saved_tensors
    return call(weighted_pool_backward, dy, x, y, norm, ctx.kind, ctx.window), None, None


_autograd(weighted_pool, _weighted_grad, _weighted_setup)


def _weighted_backward_setup(ctx, inputs, output):
    dy, x, _, _, ctx.kind, ctx.window = inputs
    ctx.save_for_backward(dy, x)


def _weighted_backward_grad(ctx, grad_dx):
    """As :func:`_gem_backward_grad`: ``y`` and ``norm`` are functions of ``x``, and the
    whole dependence goes through it."""
    dy, x = ctx.saved_tensors
    higher = torch.is_grad_enabled()
    with torch.enable_grad():
        dy_, x_ = (t.detach().requires_grad_() for t in (dy, x))
        (dx,) = torch.autograd.grad(weighted_composite(x_, ctx.kind, ctx.window), x_, dy_,
                                    create_graph=True)
        grad_dy, grad_x = torch.autograd.grad(dx, (dy_, x_), grad_dx, allow_unused=True,
                                              create_graph=higher)
    return grad_dy, grad_x, None, None, None, None


_autograd(weighted_pool_backward, _weighted_backward_grad, _weighted_backward_setup)


def blend_composite(x: Tensor, weights: Tensor, kind: int, window) -> Tensor:
    """Mixed or gated pooling in poolgrad's max and average ops and torch's own
    differentiable ops (the gate's logit over a zero-padded window view)."""
    top = call(max_pool, x, window, "first")[0]
    mean = call(avg_pool, x, window, True, None)
    if kind == MIXED:
        share = weights.to(x.dtype).reshape(())
    else:
        dims = tuple(range(-window_ndim(window), 0))
        share = torch.sigmoid((windows(x, window, 0.0) * weights.to(x.dtype)).sum(dims))
    return share * top + (1 - share) * mean


def _blend_setup(ctx, inputs, output):
    x, weights, ctx.kind, ctx.window = inputs
    ctx.save_for_backward(x, weights)


def _blend_grad(ctx, dy):
    x, weights = ctx.saved_tensors
    dx, dweights = call(blend_pool_backward, dy, x, weights, ctx.kind, ctx.window)
    return dx, dweights.to(weights.dtype), None, None


_autograd(blend_pool, _blend_grad, _blend_setup)


def _blend_backward_setup(ctx, inputs, output):
    dy, x, weights, ctx.kind, ctx.window = inputs
    ctx.save_for_backward(dy, x, weights)


def _blend_backward_grad(ctx, grad_dx, grad_dweights):
    """As :func:`_gem_backward_grad`, through :func:`blend_composite`."""
    dy, x, weights = ctx.saved_tensors
    higher = torch.is_grad_enabled()
    with torch.enable_grad():
        dy_, x_, w_ = (t.detach().requires_grad_() for t in (dy, x, weights))
        y = blend_composite(x_, w_, ctx.kind, ctx.window)
        dx, dw = torch.autograd.grad(y, (x_, w_), dy_, create_graph=True)
        asked = [(output, grad.to(output.dtype))
                 for output, grad in ((dx, grad_dx), (dw, grad_dweights)) if grad is not None]
        if not asked:
            return (None,) * 5
        outputs, grads = zip(*asked, strict=True)
        grad_dy, grad_x, grad_w = torch.autograd.grad(
            outputs, (dy_, x_, w_), grads, allow_unused=True, create_graph=higher)
    return grad_dy, grad_x, grad_w, None, None


_autograd(blend_pool_backward, _blend_backward_grad, _blend_backward_setup)


def _sample_setup(ctx, inputs, output):
    x, _, ctx.window = inputs
    _, winners = output
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(winners)
    ctx.save_for_backward(winners)


def _sample_grad(ctx, dy, _):
    (winners,) = ctx.saved_tensors
    return call(max_pool_backward, dy, winners, ctx.window, ctx.x_size), None, None


_autograd(stochastic_pool_sample, _sample_grad, _sample_setup)


def _blur_setup(ctx, inputs, output):
    x, ctx.blur = inputs
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _blur_grad(ctx, dy, _):
    (winners,) = ctx.saved_tensors
    return call(blur_pool_backward, dy, winners, ctx.blur, ctx.x_size), None


_autograd(blur_pool, _blur_grad, _blur_setup)


def _blur_backward_setup(ctx, inputs, output):
    _, winners, ctx.blur, _ = inputs
    ctx.save_for_backward(winners)


def _blur_backward_grad(ctx, g):
    """The adjoint of the backward: the forward on ``g``, a max-blur's on ``g`` read at
    its winners (the max map the winners chose) with no pre-reduction."""
    (winners,) = ctx.saved_tensors
    pre, kernel, stride, sizes, pads, mode = blur_args(ctx.blur)
    if pre != "max":
        return call(blur_pool, g, ctx.blur)[0], None, None, None
    ones = (1,) * len(kernel)
    mapped = call(max_pool_gather, g, winners,
                  sliding_window(kernel, ones, ((0, 0),) * len(kernel), ones, False))
    plain = blur_geometry("none", ones, stride, sizes, pads, mode)
    return call(blur_pool, mapped, plain)[0], None, None, None


_autograd(blur_pool_backward, _blur_backward_grad, _blur_backward_setup)


def _fractional_setup(ctx, inputs, output):
    x, samples, orders, ctx.fractional = inputs
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1], samples, orders)


def _fractional_grad(ctx, dy, _):
    winners, samples, orders = ctx.saved_tensors
    return call(fractional_max_pool_backward, dy, winners, samples, orders, ctx.fractional,
                ctx.x_size), None, None, None


_autograd(fractional_max_pool, _fractional_grad, _fractional_setup)


def _fractional_backward_setup(ctx, inputs, output):
    _, winners, samples, orders, ctx.fractional, ctx.x_size = inputs
    ctx.save_for_backward(winners, samples, orders)


def _fractional_backward_grad(ctx, g):
    """The adjoint of routing to the winners: ``g`` read at them (a gather, whose own
    gradient is torch's scatter-add, so every order of derivative works)."""
    winners, samples, orders = ctx.saved_tensors
    indices = call(fractional_max_pool_indices, winners, samples, orders, ctx.fractional,
                   ctx.x_size)
    n, c = ctx.x_size[:2]
    read = g.reshape(n, c, -1).gather(2, indices.reshape(n, c, -1)).reshape(indices.shape)
    return read, None, None, None, None, None


_autograd(fractional_max_pool_backward, _fractional_backward_grad, _fractional_backward_setup)
