"""Pooling kinds with learnable parameters, on fused kernels of their own: GeM (a
learnable power mean), mixed pooling (a learnable blend of max and average) and gated
pooling (a blend set per window by a learned gate).

Their pullbacks return ``(dx, dparam)``: the parameter's gradient summed over the
batch, as float64, shaped like the parameter (a float for ``p`` and ``alpha``).
"""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from .. import autodiff, engines
from ..engines import Pullback
from ..engines.pullback import copy_target, owned
from ..kernels import blend

# ------------------------------------------------------------------------------- GeM


def _gem_pool(x, p=3.0, kernel_size=None, stride=None, eps=1e-6, *, spatial_dims=None,
              want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    p = inputs.check_p(p)
    eps = inputs.check_real(eps, "eps", positive=True)
    if kernel_size is None and stride is not None:
        raise ValueError("gem_pool: stride needs a kernel_size (kernel_size=None pools "
                         "globally)")
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims, kernel_size=kernel_size,
                                       stride=stride)
    if kernel_size is None:
        plan = None
        y_spatial = (1,) * ndim
    else:
        plan = inputs.sliding_plan(x, kernel_size, stride, 0, 1, False, ndim)
        y_spatial = plan.out_spatial
    layout = inputs.Layout(x.shape, ndim)
    xk = inputs.compute_view(x, layout)
    # the pullback's own copies, in their layout (the kernels it runs follow it); x's
    # copied by the forward as it reads x
    copy = copy_target(xk, x) if want_pullback else None
    yk = engines.gem_forward(xk, plan, p, eps, copy)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(y_spatial))
    if not want_pullback:
        return y, None
    xk, yk = xk if copy is None else copy, owned(yk, y, keep_layout=True)

    def backward(dy, with_dp):
        dx, terms = engines.gem_backward(xk, yk, layout.to_kernel(dy), plan, p, eps,
                                         with_dp)
        return dx, (engines.p_gradient(terms) if with_dp else None)
    return y, Pullback("gem_pool", backward, y.shape, x.shape, x.dtype, {"x": xk, "y": yk},
                       engines.gem_kernels(xk, plan), params=("p",))


def gem_pool(x, p=3.0, kernel_size=None, stride=None, eps=1e-6, *, spatial_dims=None):
    r"""Generalized-mean (GeM) pooling (Radenovic, Tolias & Chum, TPAMI 2019).

    .. math:: y = \Big(\frac{1}{|W|} \sum_{j \in W} \max(x_j, \epsilon)^p\Big)^{1/p}

    over each window ``W`` (``kernel_size`` and ``stride``, no padding), or over all
    spatial positions with ``kernel_size=None`` (the retrieval head). ``p = 1`` is
    average pooling and ``p -> inf`` tends to max pooling. Fused kernels make one pass
    over x each way (:mod:`poolgrad.kernels.power_mean`); a window whose sum of powers
    overflows or underflows is summed again relative to its maximum, so a large ``p``
    neither overflows nor underflows.

    The pullback returns ``(dx, dp)``: ``dx_j = dy (z_j / y)^(p-1) / |W|`` where
    ``x_j >= eps`` (0 where the clamp holds), and ``dp`` summed over every output of
    ``dy (y / p) sum_W r^p log r / sum_W r^p``, ``r = z / y`` and ``z = max(x, eps)``.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        p: the power, a finite number > 0 (3 is the usual start when learned).
        kernel_size: None (global, the default) or an int / per-dim ints.
        stride: per window; defaults to kernel_size.
        eps: the clamp, a number > 0.
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default: a per-dim
            argument's length, else ``x.ndim - 2``, batched); lets x be unbatched.

    Example:
        >>> gem_pool(np.array([[[1.0, 2.0]]]), p=1.0)
        array([[[1.5]]])
    """
    return _gem_pool(x, p, kernel_size, stride, eps, spatial_dims=spatial_dims)[0]


# ---------------------------------------------------------------- mixed and gated


def _blend(x, kernel_size, stride, padding, spatial_dims, kind, weights, param: str,
           want_pullback):
    """Mixed or gated pooling on the fused kernels (:mod:`poolgrad.engines.blend`):
    ``y``, and with ``want_pullback`` its pullback, which returns ``(dx, dparam)``:
    ``dparam`` shaped as ``weights`` (``alpha``: a float)."""
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims, kernel_size=kernel_size,
                                       stride=stride, padding=padding)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, 1, False, ndim)
    if kind == blend.GATED:
        inputs.check_gate_shape(weights.shape, tuple(a.extent for a in plan.axes))
    flat = np.ascontiguousarray(weights, np.float64).ravel()
    layout = inputs.Layout(x.shape, ndim)
    xk = inputs.compute_view(x, layout)
    yk = engines.blend_forward(xk, plan, kind, flat)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    xk = owned(xk, x, keep_layout=True)

    def backward(dy, _):  # the weights' gradient comes from the same pass: always kept
        dx, dweights = engines.blend_backward(xk, layout.to_kernel(dy), plan, kind, flat)
        return dx, (float(dweights[0]) if kind == blend.MIXED
                    else dweights.reshape(weights.shape))
    name = "mixed_pool" if kind == blend.MIXED else "gated_pool"
    return y, Pullback(name, backward, y.shape, x.shape, x.dtype, {"x": xk},
                       engines.blend_kernels(xk, plan), params=(param,))


def _mixed_pool(x, kernel_size, stride=None, padding=0, alpha=0.5, *, spatial_dims=None,
                want_pullback=False):
    alpha = inputs.check_real(alpha, "alpha")
    return _blend(x, kernel_size, stride, padding, spatial_dims, blend.MIXED,
                  np.array([alpha]), "alpha", want_pullback)


def mixed_pool(x, kernel_size, stride=None, padding=0, alpha=0.5, *, spatial_dims=None):
    r"""Mixed pooling (Lee, Gallagher & Tu, AISTATS 2016):
    ``y = alpha * max_pool(x) + (1 - alpha) * avg_pool(x)``.

    ``alpha`` is a fixed or learnable scalar, any finite number: the paper's lies in
    [0, 1] (a blend), but a learned one may step outside, which extrapolates rather than
    fails. The pullback returns
    ``(dx, dalpha)``: ``dx`` is ``alpha`` times max pooling's routing plus
    ``1 - alpha`` times average pooling's spreading, and ``dalpha = sum(dy * (max -
    avg))``. The average counts padding in its divisor (PyTorch's default).

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        kernel_size, stride, padding: as in :func:`poolgrad.max_pool`.
        alpha: the max branch's weight, a finite number (0 to 1 blends).
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default: a per-dim
            argument's length, else ``x.ndim - 2``, batched); lets x be unbatched.

    Example:
        >>> mixed_pool(np.array([[[1.0, 3.0]]]), 2, alpha=0.25)
        array([[[2.25]]])
    """
    return _mixed_pool(x, kernel_size, stride, padding, alpha, spatial_dims=spatial_dims)[0]


def _gated_pool(x, gate, kernel_size, stride=None, padding=0, *, spatial_dims=None,
                want_pullback=False):
    gate = inputs.check_array(gate, "gate", floating=True)
    inputs.check_values(gate.ravel().tolist(), "gate")
    return _blend(x, kernel_size, stride, padding, spatial_dims, blend.GATED, gate, "gate",
                  want_pullback)


def gated_pool(x, gate, kernel_size, stride=None, padding=0, *, spatial_dims=None):
    r"""Gated max-average pooling (Lee, Gallagher & Tu, AISTATS 2016): mixed pooling
    whose blend is set per window by a learned gate.

    .. math:: y[o] = \sigma(g \cdot x_{W(o)}) \max_{W(o)} x
              + \big(1 - \sigma(g \cdot x_{W(o)})\big) \operatorname{avg}_{W(o)} x

    ``g`` (``gate``) has the window's shape and is shared by every channel; padding
    adds 0 to the gate's dot product. The pullback returns ``(dx, dgate)``: ``dx``
    gets both branches' routing and the gate's path, ``dgate`` (float64, shaped like
    ``gate``) sums ``dy (max - avg) s (1 - s) x`` over every window.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        gate: the gate's weights, finite, shaped like the window (``kernel_size`` per dim).
        kernel_size, stride, padding, spatial_dims: as in :func:`mixed_pool` (numeric
            padding).
    """
    return _gated_pool(x, gate, kernel_size, stride, padding, spatial_dims=spatial_dims)[0]


autodiff.register({gem_pool: _gem_pool, mixed_pool: _mixed_pool, gated_pool: _gated_pool})
