"""The pooling kinds of :mod:`poolgrad.kinds` as layers, and the core's pooling layers
by name."""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from .. import kinds, ops
from .layers import AvgPool, Layer, LpPool, MaxPool, Pool


class BlurPool(Pool):
    """:func:`poolgrad.blur_pool` as a layer (anti-aliased subsampling)."""
    op = staticmethod(kinds.blur_pool)

    def __init__(self, stride=2, filter_size=3, padding_mode="reflect", padding=None, *,
                 spatial_dims=None):
        super().__init__(stride=stride, filter_size=filter_size, padding_mode=padding_mode,
                         padding=padding, spatial_dims=spatial_dims)


class _StrideOneBlurPool(Pool):
    """A stride-1 pooling, then a blur subsampled by the stride."""

    def __init__(self, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                 padding=None, *, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, stride=stride, filter_size=filter_size,
                         padding_mode=padding_mode, padding=padding,
                         spatial_dims=spatial_dims)


class MaxBlurPool(_StrideOneBlurPool):
    """:func:`poolgrad.max_blur_pool` as a layer (anti-aliased max pooling)."""
    op = staticmethod(kinds.max_blur_pool)


class AvgBlurPool(_StrideOneBlurPool):
    """:func:`poolgrad.avg_blur_pool` as a layer (anti-aliased average pooling)."""
    op = staticmethod(kinds.avg_blur_pool)


class SoftPool(Pool):
    """:func:`poolgrad.soft_pool` as a layer."""
    op = staticmethod(kinds.soft_pool)

    def __init__(self, kernel_size, stride=None, padding=0, *, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         spatial_dims=spatial_dims)


class StochasticPool(Pool):
    """:func:`poolgrad.stochastic_pool` as a layer: a draw per window in training (from
    the layer's own generator, seeded by ``rng``), the weighted average in evaluation."""

    def __init__(self, kernel_size, stride=None, padding=0, *, rng=None, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         spatial_dims=spatial_dims)
        self.rng = np.random.default_rng(rng)

    def forward(self, x):
        options = dict(self.options, training=self.training)
        if self.training:
            options["rng"] = self.rng
            y, self._pullback = ops.vjp(kinds.stochastic_pool, x, **options)
            return y
        return kinds.stochastic_pool(x, **options)


class FractionalMaxPool(Pool):
    """:func:`poolgrad.fractional_max_pool` as a layer: fresh windows for every call
    (training or not, as PyTorch's), drawn from the layer's own generator, seeded by
    ``rng``."""

    def __init__(self, kernel_size, output_size=None, output_ratio=None, *,
                 sequence="pseudo_random", rng=None, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, output_size=output_size,
                         output_ratio=output_ratio, sequence=sequence,
                         spatial_dims=spatial_dims)
        self.rng = np.random.default_rng(rng)

    def forward(self, x):
        options = dict(self.options, rng=self.rng)
        if not self.training:
            return kinds.fractional_max_pool(x, **options)
        y, self._pullback = ops.vjp(kinds.fractional_max_pool, x, **options)
        return y


class APSPool(Pool):
    """:func:`poolgrad.aps_pool` as a layer: each example's polyphase component of
    largest norm. ``phases`` holds the phases of the last forward, for a residual
    shortcut to follow (``aps_pool(shortcut, stride, phase=layer.phases)``)."""
    op = staticmethod(kinds.aps_pool)

    def __init__(self, stride=2, *, norm="l2", spatial_dims=None):
        super().__init__(stride=stride, norm=norm, spatial_dims=spatial_dims)
        self.phases = None

    def forward(self, x):
        options = dict(self.options, return_indices=True)
        if not self.training:
            y, self.phases = type(self).op(x, **options)
            return y
        (y, self.phases), self._pullback = ops.vjp(type(self).op, x, **options)
        return y


class MaxAPSPool(APSPool):
    """:func:`poolgrad.max_aps_pool` as a layer (APS's replacement for ``MaxPool``);
    ``phases`` as :class:`APSPool`'s."""
    op = staticmethod(kinds.max_aps_pool)

    def __init__(self, kernel_size=2, stride=2, filter_size=None, *, norm="l2",
                 spatial_dims=None):
        Pool.__init__(self, kernel_size=kernel_size, stride=stride, filter_size=filter_size,
                      norm=norm, spatial_dims=spatial_dims)
        self.phases = None


class LPSPool(Layer):
    """:func:`poolgrad.lps_pool` as a layer: learnable polyphase sampling, its scoring
    network's weights ``params["W1"]`` ``(hidden, channels)`` (``N(0, 1 / channels)``
    from ``rng``), ``params["b1"]`` (0) and ``params["w2"]`` (``N(0, 1 / hidden)``),
    float64. In training the soft Gumbel-softmax mixture, its noise from the layer's own
    generator (seeded by ``rng``); in evaluation the hard choice. ``phases`` holds the
    phases of the last forward."""

    def __init__(self, channels: int, stride=2, *, hidden: int = 8, temperature=1.0,
                 rng=None, spatial_dims=None):
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"LPSPool: hidden must be an int >= 1, got {hidden!r}")
        self.options = {"stride": stride, "temperature": temperature,
                        "spatial_dims": spatial_dims}
        self.rng = np.random.default_rng(rng)
        self.params = {"W1": self.rng.standard_normal((hidden, channels)) / np.sqrt(channels),
                       "b1": np.zeros(hidden),
                       "w2": self.rng.standard_normal(hidden) / np.sqrt(hidden)}
        self.phases = None

    def _weights(self):
        return self.params["W1"], self.params["b1"], self.params["w2"]

    def forward(self, x):
        options = dict(self.options, training=self.training, return_indices=True)
        if not self.training:
            y, self.phases = kinds.lps_pool(x, self._weights(), **options)
            return y
        (y, self.phases), self._pullback = ops.vjp(kinds.lps_pool, x, self._weights(),
                                                   rng=self.rng, **options)
        return y

    def backward(self, dy):
        dx, dW1, db1, dw2 = self._saved("_pullback")(dy)
        self.grads = {"W1": dW1, "b1": db1, "w2": dw2}
        return dx

    def __repr__(self):
        hidden, channels = self.params["W1"].shape
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"LPSPool({channels}, hidden={hidden}, {args})"


class AttentionPool(Layer):
    """:func:`poolgrad.attention_pool` as a readout head in place of global average
    pooling: ``(N, channels, *spatial)`` to ``(N, queries * channels)`` (unbatched with
    ``spatial_dims``: ``(channels, *spatial)`` to ``(queries * channels,)``).

    The queries start at 0, so the layer starts as global average pooling and learns
    where to look; the key projection starts random (``N(0, 1 / channels)``, from
    ``rng``). Both are float64 parameters, ``params["queries"]`` and
    ``params["key_weight"]``."""

    def __init__(self, channels: int, heads: int = 1, queries: int = 1, *, rng=None,
                 spatial_dims=None):
        super().__init__()
        inputs.check_attention_sizes(channels, heads, queries)
        self.heads, self.spatial_dims = heads, spatial_dims
        rng = np.random.default_rng(rng)
        self.params = {"queries": np.zeros((queries, channels)),
                       "key_weight": rng.standard_normal((channels, channels))
                       / np.sqrt(channels)}

    def forward(self, x):
        args = (x, self.params["queries"], self.params["key_weight"], self.heads)
        if not self.training:
            y = kinds.attention_pool(*args, spatial_dims=self.spatial_dims)
        else:
            y, self._pullback = ops.vjp(kinds.attention_pool, *args,
                                        spatial_dims=self.spatial_dims)
        return y.reshape(y.shape[:-2] + (-1,))  # (N, M, C) or unbatched (M, C), flattened

    def backward(self, dy):
        pullback = self._saved("_pullback")
        dx, d_queries, d_weight = pullback(dy.reshape(pullback.y_shape))
        self.grads = {"queries": d_queries, "key_weight": d_weight}
        return dx

    def __repr__(self):
        queries, channels = self.params["queries"].shape
        return (f"AttentionPool({channels}, heads={self.heads}, queries={queries}, "
                f"spatial_dims={self.spatial_dims})")


class _LearnedPool(Layer):
    """A pooling whose pullback also returns its parameter's gradient: ``params[name]``
    (float64, stepped by the optimizers like any weight) and, after ``backward``,
    ``grads[name]``. With ``learn=False`` the parameter is fixed (no ``params``)."""

    name = None  # the parameter, as the operator's keyword

    def __init__(self, value, learn: bool, **options):
        super().__init__()
        self.options = options
        self.value = np.array(value, dtype=np.float64)
        if learn:
            self.params = {self.name: self.value}

    def _argument(self):
        value = self.params.get(self.name, self.value)  # the optimizer's, once loaded
        return float(value[()]) if value.ndim == 0 else value

    def forward(self, x):
        options = {**self.options, self.name: self._argument()}
        if not self.training:
            return self.op(x, **options)
        y, self._pullback = ops.vjp(self.op, x, **options)
        return y

    def backward(self, dy):
        pullback = self._saved("_pullback")
        if not self.params:
            return pullback(dy, params=False)
        dx, grad = pullback(dy)
        self.grads = {self.name: np.asarray(grad, dtype=np.float64).reshape(
            self.value.shape)}
        return dx

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({self.name}={self._argument()!r}, {args})"


class GeMPool(_LearnedPool):
    """:func:`poolgrad.gem_pool` as a layer, its ``p`` learned (a 0-d parameter)."""
    name = "p"
    op = staticmethod(kinds.gem_pool)

    def __init__(self, p=3.0, kernel_size=None, stride=None, eps=1e-6, *, learn=True,
                 spatial_dims=None):
        # refused here, not at the first forward (the operator checks it again at every
        # call, where an optimizer may have stepped it out of range)
        super().__init__(inputs.check_p(p), learn, kernel_size=kernel_size, stride=stride,
                         eps=inputs.check_real(eps, "eps", positive=True),
                         spatial_dims=spatial_dims)


class MixedPool(_LearnedPool):
    """:func:`poolgrad.mixed_pool` as a layer, its ``alpha`` learned (0-d)."""
    name = "alpha"
    op = staticmethod(kinds.mixed_pool)

    def __init__(self, kernel_size, stride=None, padding=0, alpha=0.5, *, learn=True,
                 spatial_dims=None):
        super().__init__(inputs.check_real(alpha, "alpha"), learn, kernel_size=kernel_size,
                         stride=stride, padding=padding, spatial_dims=spatial_dims)


class GatedPool(_LearnedPool):
    """:func:`poolgrad.gated_pool` as a layer, its gate (the window's shape, zeros at
    the start: an even blend) learned. The window has ``spatial_dims`` dims (``ndim``,
    its older name), else as many as a per-dim kernel_size, else 2."""
    name = "gate"
    op = staticmethod(kinds.gated_pool)

    def __init__(self, kernel_size, stride=None, padding=0, *, ndim=None, learn=True,
                 spatial_dims=None):
        window = inputs.gate_window(kernel_size, spatial_dims, ndim)
        super().__init__(np.zeros(window), learn, kernel_size=window, stride=stride,
                         padding=padding, spatial_dims=spatial_dims)


# The core's pooling layers by name (poolgrad explain's --kind). poolgrad train's
# downsampling menu, which holds every kind, is poolgrad.train.menu.
POOLING = {"max": MaxPool, "avg": AvgPool, "lp": LpPool}
