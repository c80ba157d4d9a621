"""Attention pooling: learned queries attend over all spatial positions and read out a
weighted average of the features, one weighting per head (the readout heads of set
transformers, CaiT's class attention and CLIP's attention pool, in their value-free
form: the values are the features themselves, so the output is a pooling)."""

from __future__ import annotations

import math

import numpy as np

from .. import _inputs as inputs
from .. import autodiff
from ..engines import Pullback
from ..engines.pullback import owned


def _check(x, queries, key_weight, heads, spatial_dims):
    x = inputs.check_array(x, "x", floating=True)
    layout = inputs.Layout(x.shape, inputs.resolve_spatial_dims(x.shape, spatial_dims))
    channels = layout.lead[-1]
    queries = inputs.check_array(queries, "queries", floating=True)
    key_weight = inputs.check_array(key_weight, "key_weight", floating=True)
    inputs.check_attention_shapes(queries.shape, key_weight.shape, heads, channels)
    return x, queries, key_weight, layout.batched, channels


def _attention_pool(x, queries, key_weight, heads=1, *, spatial_dims=None,
                    want_pullback=False):
    x, queries, key_weight, batched, channels = _check(x, queries, key_weight, heads,
                                                       spatial_dims)
    compute = inputs.COMPUTE_DTYPE[x.dtype]
    n = x.shape[0] if batched else 1
    xs = np.asarray(x, compute).reshape(n, channels, -1)  # (N, C, L)
    q = queries.astype(compute).reshape(-1, heads, channels // heads)  # (M, H, d)
    w = key_weight.astype(compute)
    scale = compute.type(1 / math.sqrt(channels // heads))
    keys = np.matmul(w, xs).reshape(n, heads, channels // heads, -1)  # (N, H, d, L)
    scores = np.einsum("mhd,nhdl->nmhl", q, keys) * scale
    scores -= scores.max(axis=-1, keepdims=True)
    attn = np.exp(scores)
    attn /= attn.sum(axis=-1, keepdims=True)  # (N, M, H, L), softmax over positions
    values = xs.reshape(n, heads, channels // heads, -1)
    y = np.einsum("nmhl,nhdl->nmhd", attn, values).reshape(n, -1, channels)
    result = y.astype(x.dtype, copy=False)
    if not batched:
        result = result[0]
    if not want_pullback:
        return result, None
    xs = owned(xs, x)  # the pullback's own copy where xs views x
    values = xs.reshape(n, heads, channels // heads, -1)

    def backward(dy):
        dy = dy.reshape(n, -1, heads, channels // heads)
        d_attn = np.einsum("nmhd,nhdl->nmhl", dy, values)
        dx = np.einsum("nmhl,nmhd->nhdl", attn, dy).reshape(n, channels, -1)
        d_scores = attn * (d_attn - np.sum(attn * d_attn, axis=-1, keepdims=True)) * scale
        d_queries = np.einsum("nmhl,nhdl->mhd", d_scores, keys)
        d_keys = np.einsum("nmhl,mhd->nhdl", d_scores, q).reshape(n, channels, -1)
        d_weight = np.einsum("ncl,nkl->ck", d_keys, xs)
        dx += np.matmul(w.T, d_keys)
        return (dx, d_queries.reshape(queries.shape).astype(np.float64),
                d_weight.astype(np.float64))
    return result, Pullback("attention_pool", backward, result.shape, x.shape, x.dtype,
                            {"x": xs, "attention": attn}, ("numpy", "numpy"),
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
