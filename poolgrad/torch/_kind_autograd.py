"""The autograd formulas of the pooling kinds' operators (:mod:`._kind_ops`), as
:mod:`._autograd` gives the core's.

GeM's backward is differentiated through its composite form (:func:`gem_composite`),
recomputed when a second derivative is asked for, and so are the weighted averages'
(:func:`weighted_composite`), the blends' of mixed and gated pooling
(:func:`blend_composite`) and attention pooling's (:func:`attention_composite`).
Stochastic pooling's draw routes its gradient as max pooling does, through its
winners. The blur's backward is linear in ``dy``: its gradient is the forward again, a
max-blur's after a gather at the winners.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._autograd import call, register_autograd, windows
from ._kind_ops import (
    MIXED,
    SOFT,
    aps_gather,
    aps_pool,
    aps_scatter,
    attention_pool,
    attention_pool_backward,
    blend_pool,
    blend_pool_backward,
    blur_args,
    blur_geometry,
    blur_max_window,
    blur_pool,
    blur_pool_backward,
    blur_pool_values,
    circular_fold,
    circular_pad,
    fractional_max_pool,
    fractional_max_pool_backward,
    fractional_max_pool_indices,
    gem_pool,
    gem_pool_backward,
    stochastic_pool_sample,
    weighted_pool,
    weighted_pool_backward,
    weighted_pool_values,
)
from ._ops import (
    avg_pool,
    is_global,
    max_pool,
    max_pool_backward,
    max_pool_gather,
    window_ndim,
)

# ------------------------------------------------------------ composites for 2nd order


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


# --------------------------------------------------------------------------- formulas


def _gem_setup(ctx, inputs, output):
    x, p, ctx.eps, ctx.window = inputs
    ctx.with_dp = p.requires_grad
    ctx.save_for_backward(x, p, output)


def _gem_grad(ctx, dy):
    x, p, y = ctx.saved_tensors
    dx, terms = call(gem_pool_backward, dy, x, y, p, ctx.eps, ctx.window, ctx.with_dp)
    # in float64 whatever the terms are (float32 for float32 x): one order-independent
    # rounding, where a float32 sum rounds differently in eager and compiled graphs
    dp = terms.sum(dtype=torch.float64).to(p.dtype).reshape(p.shape) if ctx.with_dp else None
    return dx, dp, None, None


register_autograd(gem_pool, _gem_grad, _gem_setup)


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


register_autograd(gem_pool_backward, _gem_backward_grad, _gem_backward_setup)


def _weighted_setup(ctx, inputs, output):
    x, ctx.kind, ctx.window = inputs
    y, norm = output
    ctx.mark_non_differentiable(norm)
    ctx.save_for_backward(x, y, norm)


def _weighted_grad(ctx, dy, _):
    x, y, norm = ctx.saved_tensors
    return call(weighted_pool_backward, dy, x, y, norm, ctx.kind, ctx.window), None, None


register_autograd(weighted_pool, _weighted_grad, _weighted_setup)


def _weighted_values_setup(ctx, inputs, output):
    x, ctx.kind, ctx.window = inputs
    ctx.save_for_backward(x)


def _weighted_values_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    y, norm = call(weighted_pool, x, ctx.kind, ctx.window)  # kept only now that it is needed
    return call(weighted_pool_backward, dy, x, y, norm, ctx.kind, ctx.window), None, None


register_autograd(weighted_pool_values, _weighted_values_grad, _weighted_values_setup)


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


register_autograd(weighted_pool_backward, _weighted_backward_grad, _weighted_backward_setup)


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


register_autograd(blend_pool, _blend_grad, _blend_setup)


def _blend_backward_setup(ctx, inputs, output):
    dy, x, weights, ctx.kind, ctx.window = inputs
    ctx.save_for_backward(dy, x, weights)


def _composite_second_order(composite, saved, grads):
    """The gradients in ``(dy, x, param)`` (``saved``) of a backward op's outputs ``(dx,
    dparam)``, given theirs (``grads``, None where not asked), through ``composite(x,
    param)``, the function the op differentiates: None for each where none was asked."""
    higher = torch.is_grad_enabled()  # (create_graph)
    with torch.enable_grad():
        dy_, x_, p_ = (t.detach().requires_grad_() for t in saved)
        first = torch.autograd.grad(composite(x_, p_), (x_, p_), dy_, create_graph=True)
        asked = [(output, grad.to(output.dtype))
                 for output, grad in zip(first, grads, strict=True) if grad is not None]
        if not asked:
            return None, None, None
        outputs, given = zip(*asked, strict=True)
        return torch.autograd.grad(outputs, (dy_, x_, p_), given, allow_unused=True,
                                   create_graph=higher)


def _blend_backward_grad(ctx, grad_dx, grad_dweights):
    """As :func:`_gem_backward_grad`, through :func:`blend_composite`."""
    grad_dy, grad_x, grad_w = _composite_second_order(
        lambda x, w: blend_composite(x, w, ctx.kind, ctx.window), ctx.saved_tensors,
        (grad_dx, grad_dweights))
    return grad_dy, grad_x, grad_w, None, None


register_autograd(blend_pool_backward, _blend_backward_grad, _blend_backward_setup)


def _sample_setup(ctx, inputs, output):
    x, _, ctx.window = inputs
    _, winners = output
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(winners)
    ctx.save_for_backward(winners)


def _sample_grad(ctx, dy, _):
    (winners,) = ctx.saved_tensors
    return call(max_pool_backward, dy, winners, ctx.window, ctx.x_size), None, None


register_autograd(stochastic_pool_sample, _sample_grad, _sample_setup)


def _blur_setup(ctx, inputs, output):
    x, ctx.blur = inputs
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _blur_grad(ctx, dy, _):
    (winners,) = ctx.saved_tensors
    return call(blur_pool_backward, dy, winners, ctx.blur, ctx.x_size), None


register_autograd(blur_pool, _blur_grad, _blur_setup)


def _blur_values_setup(ctx, inputs, output):
    x, ctx.blur = inputs
    ctx.save_for_backward(x)


def _blur_values_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    winners = call(blur_pool, x, ctx.blur)[1]  # kept only now that they are needed
    return call(blur_pool_backward, dy, winners, ctx.blur, list(x.shape)), None


register_autograd(blur_pool_values, _blur_values_grad, _blur_values_setup)


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
    mapped = call(max_pool_gather, g, winners, blur_max_window(kernel))
    plain = blur_geometry("none", (1,) * len(kernel), stride, sizes, pads, mode)
    return call(blur_pool, mapped, plain)[0], None, None, None


register_autograd(blur_pool_backward, _blur_backward_grad, _blur_backward_setup)


def _fractional_setup(ctx, inputs, output):
    x, samples, orders, ctx.fractional = inputs
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1], samples, orders)


def _fractional_grad(ctx, dy, _):
    winners, samples, orders = ctx.saved_tensors
    return call(fractional_max_pool_backward, dy, winners, samples, orders, ctx.fractional,
                ctx.x_size), None, None, None


register_autograd(fractional_max_pool, _fractional_grad, _fractional_setup)


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


register_autograd(fractional_max_pool_backward, _fractional_backward_grad,
                  _fractional_backward_setup)


# ------------------------------------------------------- adaptive polyphase sampling


def _aps_setup(ctx, inputs, output):
    x, ctx.steps, _ = inputs
    ctx.x_size = list(x.shape)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _aps_grad(ctx, dy, _):
    (phases,) = ctx.saved_tensors
    return call(aps_scatter, dy, phases, ctx.steps, ctx.x_size), None, None


register_autograd(aps_pool, _aps_grad, _aps_setup)


def _gather_setup(ctx, inputs, output):
    x, phases, ctx.steps = inputs
    ctx.x_size = list(x.shape)
    ctx.save_for_backward(phases)


def _gather_grad(ctx, dy):
    (phases,) = ctx.saved_tensors
    return call(aps_scatter, dy, phases, ctx.steps, ctx.x_size), None, None


register_autograd(aps_gather, _gather_grad, _gather_setup)


def _scatter_setup(ctx, inputs, output):
    _, phases, ctx.steps, _ = inputs
    ctx.save_for_backward(phases)


def _scatter_grad(ctx, dx):
    (phases,) = ctx.saved_tensors
    return call(aps_gather, dx, phases, ctx.steps), None, None, None


register_autograd(aps_scatter, _scatter_grad, _scatter_setup)


# ---------------------------------------------------------------- circular padding


def _pad_setup(ctx, inputs, output):
    x, ctx.pads = inputs
    ctx.x_size = list(x.shape)


def _pad_grad(ctx, dy):
    return call(circular_fold, dy, ctx.pads, ctx.x_size), None


register_autograd(circular_pad, _pad_grad, _pad_setup)


def _fold_setup(ctx, inputs, output):
    _, ctx.pads, _ = inputs


def _fold_grad(ctx, dx):
    return call(circular_pad, dx, ctx.pads), None, None


register_autograd(circular_fold, _fold_grad, _fold_setup)


# ------------------------------------------------------------------ attention pooling


def attention_composite(x: Tensor, projected: Tensor, heads: int) -> Tensor:
    """Attention pooling in torch's own differentiable ops, in ``projected``'s dtype
    (float64), the readouts ``(N, M, C)`` in x's: row ``m * heads + h`` of the weights
    is query ``m`` over head ``h``'s channels."""
    n, channels = x.shape[:2]
    features = x.reshape(n, channels, -1).to(projected.dtype)  # (N, C, L)
    weights = torch.softmax(projected @ features, dim=-1)  # (N, R, L)
    queries, d = projected.shape[0] // heads, channels // heads
    y = torch.einsum("nmhl,nhdl->nmhd", weights.reshape(n, queries, heads, -1),
                     features.reshape(n, heads, d, -1))
    return y.reshape(n, queries, channels).to(x.dtype)


def _attention_setup(ctx, inputs, output):
    x, projected, ctx.heads = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, projected, output[1])


def _attention_grad(ctx, dy, _):
    x, projected, attn = ctx.saved_tensors
    dx, dprojected = call(attention_pool_backward, dy, x, projected, attn, ctx.heads)
    return dx, dprojected, None


register_autograd(attention_pool, _attention_grad, _attention_setup)


def _attention_backward_setup(ctx, inputs, output):
    dy, x, projected, _, ctx.heads = inputs
    ctx.save_for_backward(dy, x, projected)


def _attention_backward_grad(ctx, grad_dx, grad_dprojected):
    """As :func:`_gem_backward_grad`, through :func:`attention_composite`: the weights
    are the function of ``x`` and ``projected`` they are."""
    grad_dy, grad_x, grad_p = _composite_second_order(
        lambda x, p: attention_composite(x, p, ctx.heads), ctx.saved_tensors,
        (grad_dx, grad_dprojected))
    return grad_dy, grad_x, grad_p, None, None


register_autograd(attention_pool_backward, _attention_backward_grad,
                  _attention_backward_setup)
