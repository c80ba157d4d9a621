"""Pooling by weighted window averages: SoftPool, and stochastic pooling (a sample in
training, the probability-weighted average in evaluation). The kernels and their
formulas: :mod:`poolgrad.kernels.weighted`."""

from __future__ import annotations

import math

import numpy as np

from .. import _inputs as inputs
from .. import autodiff
from ..engines import (
    Pullback,
    backward_needs_outputs,
    max_pullback,
    sample_kernel,
    stochastic_sample,
    weighted_backward,
    weighted_forward,
    weighted_kernels,
)
from ..engines.pullback import copy_target, owned
from ..kernels import stochastic, weighted


def _plan(x, kernel_size, stride, padding, spatial_dims):
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims, kernel_size=kernel_size,
                                       stride=stride, padding=padding)
    plan = inputs.sliding_plan(x, kernel_size, stride, padding, 1, False, ndim)
    return x, inputs.Layout(x.shape, ndim), plan


def _weighted(x, layout, plan, kind, want_pullback, op):
    xk = inputs.compute_view(x, layout)
    # a backward that recomputes y and norm from x needs only x kept; the pullback owns
    # its x (the caller may change theirs), copied by the forward as it reads it
    keep = want_pullback and backward_needs_outputs(xk, plan, kind)
    copy = copy_target(xk, x) if want_pullback else None
    yk, norm = weighted_forward(xk, plan, kind, keep_norm=keep, copy=copy)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    xk = xk if copy is None else copy
    yk = owned(yk, y, keep_layout=True) if keep else None
    saved = {"x": xk, "y": yk, "norm": norm} if keep else {"x": xk}

    def backward(dy):
        return weighted_backward(xk, yk, norm, layout.to_kernel(dy), plan, kind)
    return y, Pullback(op, backward, y.shape, x.shape, x.dtype, saved,
                       weighted_kernels(xk, plan, kind))


def _soft_pool(x, kernel_size, stride=None, padding=0, *, spatial_dims=None,
               want_pullback=False):
    x, layout, plan = _plan(x, kernel_size, stride, padding, spatial_dims)
    return _weighted(x, layout, plan, weighted.SOFT, want_pullback, "soft_pool")


def soft_pool(x, kernel_size, stride=None, padding=0, *, spatial_dims=None):
    r"""SoftPool (Stergiou, Poppe & Kalliatakis, ICCV 2021): each window's average
    weighted by the softmax of its values.

    .. math:: y[o] = \frac{\sum_j e^{x_j} x_j}{\sum_j e^{x_j}}
              = \sum_j w_j x_j, \quad w = \operatorname{softmax}(x_{\text{window}})

    computed with the window's maximum subtracted from every exponent, so it never
    overflows (the reference code does not subtract it). It lies between the window's
    mean and its maximum. The gradient reaches every element:
    ``dy/dx_j = w_j (1 + x_j - y)``. Padding is never part of a window (as max
    pooling's). Infinite inputs give NaN; NaN propagates.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        kernel_size, stride: as in :func:`poolgrad.max_pool` (stride defaults to the
            kernel).
        padding: as in :func:`poolgrad.max_pool` (``"same"`` included); padding is
            never part of a window.
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default: a per-dim
            argument's length, else ``x.ndim - 2``, batched); lets x be unbatched.

    Example:
        >>> soft_pool(np.array([[[0.0, np.log(3.0)]]]), 2)
        array([[[0.82395922]]])
    """
    return _soft_pool(x, kernel_size, stride, padding, spatial_dims=spatial_dims)[0]


def _stochastic_pool(x, kernel_size, stride=None, padding=0, *, training=True, rng=None,
                     spatial_dims=None, want_pullback=False):
    x, layout, plan = _plan(x, kernel_size, stride, padding, spatial_dims)
    if not training:  # the forward checks x >= 0
        return _weighted(x, layout, plan, weighted.SELF, want_pullback, "stochastic_pool")
    xk = inputs.compute_view(x, layout)
    seed = inputs.generator(rng).integers(2**63, dtype=np.uint64)
    yk, pos = stochastic_sample(xk, plan, seed=seed)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    return y, max_pullback(pos, plan, layout, x.dtype, "stochastic_pool",
                           sample_kernel(xk, plan))


def counted_draws(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The float64 draws, shaped ``shape`` (y's), that :func:`stochastic_pool` counts
    from ``seed`` (the one it takes from its ``rng``): for checking a call against the
    definition, or giving another implementation the same draws."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as the kernels' does
        z = np.uint64(seed) + np.arange(1, math.prod(shape) + 1, dtype=np.uint64) * (
            np.uint64(stochastic.GOLDEN_GAMMA))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(stochastic.MIX_1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(stochastic.MIX_2)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) / 2.0**53).reshape(shape)


def stochastic_pool(x, kernel_size, stride=None, padding=0, *, training=True, rng=None,
                    spatial_dims=None):
    r"""Stochastic pooling (Zeiler & Fergus, ICLR 2013).

    In training (``training=True``) each window outputs one of its elements, drawn
    with probability ``x_j / sum(x)`` over the window, and the gradient goes to the
    element drawn (as max pooling's goes to its winner; a window of zeros draws its
    first element). In evaluation it outputs the probability-weighted average
    ``sum(x_j^2) / sum(x_j)`` (0 for a window of zeros), whose gradient is
    ``(2 x_j - y) / sum(x)``.

    Each call takes one seed from ``rng`` (``rng.integers(2**63, dtype=np.uint64)``),
    and window ``i`` of ``y`` (C order) draws ``u_i`` from it: the SplitMix64 output of
    ``seed + (i + 1) * 0x9E3779B97F4A7C15``, its top 53 bits over ``2**53``
    (:func:`counted_draws`; a counter-based stream, each draw computed where it is
    used, not stored). Element ``j`` is drawn when the running sum of the window's
    values (row-major) first exceeds ``u_i * sum(x)``. The same ``rng`` seed gives the
    same bits, in any layout and at any thread count.

    Args:
        x: ``(N, C, *spatial)``, or ``(C, *spatial)`` where ``spatial_dims`` or a per-dim
            argument gives their number; non-negative (as after a ReLU) and finite;
            float16/32/64. A ValueError otherwise, and where a 2x2 window's sum (or, in
            evaluation, sum of squares) overflows x's dtype.
        kernel_size, stride, padding, spatial_dims: as in :func:`soft_pool`.
        training: sample (True) or average (False).
        rng: an int seed or a ``numpy.random.Generator`` (advanced by the call); None
            draws fresh entropy.
    """
    return _stochastic_pool(x, kernel_size, stride, padding, training=training, rng=rng,
                            spatial_dims=spatial_dims)[0]


autodiff.register({soft_pool: _soft_pool, stochastic_pool: _stochastic_pool})
