"""Attention pooling: learned queries attend over all spatial positions and read out a
weighted average of the features, one weighting per head (the readout heads of set
transformers, CaiT's class attention and CLIP's attention pool, in their value-free
form: the values are the features themselves, so the output is a pooling)."""

from __future__ import annotations

import math

import numpy as np

from .. import _inputs as inputs
from .. import autodiff, engines
from ..engines import Pullback
from ..engines.pullback import owned


def _check(x, queries, key_weight, heads, spatial_dims):
    x = inputs.check_array(x, "x", floating=True)
    layout = inputs.Layout(x.shape, inputs.resolve_spatial_dims(x.shape, spatial_dims))
    channels = layout.lead[-1]
    queries = inputs.check_array(queries, "queries", floating=True)
    key_weight = inputs.check_array(key_weight, "key_weight", floating=True)
    inputs.check_attention_shapes(queries.shape, key_weight.shape, heads, channels)
    return x, queries, key_weight, layout


def _by_head(queries: np.ndarray, key_weight: np.ndarray, heads: int):
    """``(q, w, scale)``: the queries ``(M, heads, d)``, the rows of ``W_k`` by head
    ``(heads, d, C)`` and ``1 / sqrt(d)``."""
    m, channels = queries.shape
    d = channels // heads
    return (queries.reshape(m, heads, d), key_weight.reshape(heads, d, channels),
            1 / math.sqrt(d))


def _projection(queries: np.ndarray, key_weight: np.ndarray, heads: int) -> np.ndarray:
    """The scores' weights ``(M * heads, C)``: ``q . (W_k x) / sqrt(d)`` taken as
    ``((q W_k) / sqrt(d)) . x``, row ``m * heads + h`` holding query ``m`` over head
    ``h``'s rows of ``W_k``. The scores then cost C times fewer multiplications than
    forming the keys ``W_k x``."""
    q, w, scale = _by_head(queries, key_weight, heads)
    return np.einsum("mhd,hdc->mhc", q, w).reshape(-1, key_weight.shape[1]) * scale


def _projection_gradients(dprojected, queries, key_weight, heads):
    """``(dqueries, dkey_weight)`` from the gradient of :func:`_projection`."""
    q, w, scale = _by_head(queries, key_weight, heads)
    grad = dprojected.reshape(q.shape[:2] + (-1,)) * scale
    return (np.einsum("mhc,hdc->mhd", grad, w).reshape(queries.shape),
            np.einsum("mhd,mhc->hdc", q, grad).reshape(key_weight.shape))


def _attention_pool(x, queries, key_weight, heads=1, *, spatial_dims=None,
                    want_pullback=False):
    x, queries, key_weight, layout = _check(x, queries, key_weight, heads, spatial_dims)
    xk = inputs.compute_view(x, layout)
    # the pullback's own copies, which later changes to the caller's arrays cannot reach
    queries, key_weight = np.array(queries, np.float64), np.array(key_weight, np.float64)
    projected = _projection(queries, key_weight, heads)
    yk, attn = engines.attention_forward(xk, projected, heads)
    y = yk.astype(x.dtype, copy=False)
    if not layout.batched:
        y = y[0]
    if not want_pullback:
        return y, None
    xk = owned(xk, x, keep_layout=True)

    def backward(dy, with_params):  # dprojected comes from the pass that gives dx
        dyk = np.ascontiguousarray(dy).reshape(yk.shape)
        dx, dprojected = engines.attention_backward(xk, dyk, projected, attn, heads)
        if not with_params:
            return (dx,)
        return (dx, *_projection_gradients(dprojected, queries, key_weight, heads))
    return y, Pullback("attention_pool", backward, y.shape, x.shape, x.dtype,
                       {"x": xk, "attention": attn}, engines.attention_kernels(xk),
                       params=("queries", "key_weight"))


def attention_pool(x, queries, key_weight, heads=1, *, spatial_dims=None):
    r"""Multi-head attention pooling over all spatial positions.

    For ``x`` ``(N, C, *spatial)`` with positions ``l`` and head ``h`` owning channels
    ``c`` in its block of ``d = C / heads``:

    .. math:: k = W_k x, \quad a_{m h l} = \operatorname{softmax}_l
              \Big(\tfrac{1}{\sqrt d} \sum_{c \in h} q_{m c}\, k_{c l}\Big), \quad
              y_{m c} = \sum_l a_{m h(c) l}\, x_{c l}

    Each query ``m`` and head reads out its own weighted average of the positions; with
    all queries 0 every weight is ``1 / L`` and this is global average pooling. The
    gradient reaches every position, by its weight and through the softmax.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` gives their number; float16/32/64.
        queries: ``(M, C)``, the learned queries.
        key_weight: ``(C, C)``, the key projection ``W_k``.
        heads: how many heads share the channels (a divisor of C).
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default ``x.ndim -
            2``, batched, as the global poolings); lets x be unbatched.

    Returns:
        ``(N, M, C)`` (``(M, C)`` for unbatched x). ``vjp``'s pullback returns ``(dx,
        dqueries, dkey_weight)``, the parameters' gradients summed over the batch
        (float64).
    """
    return _attention_pool(x, queries, key_weight, heads, spatial_dims=spatial_dims)[0]


autodiff.register({attention_pool: _attention_pool})
