"""The layers of :mod:`poolgrad.nn`: weights, activations, the core's pooling
operators as layers, and the sequence that runs them."""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..engines.pullback import circular_pad, fold_circular
from ..geometry import is_int, output_length, per_dim


def _take_saved(owner, name: str, forward: str):
    """Take (and release) what ``owner.forward`` saved for its ``backward``: a second
    ``backward``, or one with no ``forward`` before it, is a RuntimeError."""
    value = owner.__dict__.pop(name, None)
    if value is None:
        raise RuntimeError(f"{type(owner).__name__}.backward called without {forward} "
                           "before it (or twice)")
    return value


class Layer:
    """Base class: no weights, no state; ``training`` switches Dropout and state saving."""

    def __init__(self):
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.training = True

    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _saved(self, name: str):
        """Take (and release) what ``forward`` saved for ``backward``."""
        return _take_saved(self, name, "a training forward")

    def __repr__(self):
        return f"{type(self).__name__}()"


def _he_normal(rng, shape, fan_in, dtype):
    """He (Kaiming) normal initialisation, for layers followed by ReLU."""
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(dtype)


class Linear(Layer):
    """``y = x @ W.T + b`` with ``W`` of shape ``(out_features, in_features)``."""

    def __init__(self, in_features: int, out_features: int, *, rng=None, dtype=np.float32):
        super().__init__()
        rng = np.random.default_rng(rng)
        self.params = {"W": _he_normal(rng, (out_features, in_features), in_features, dtype),
                       "b": np.zeros(out_features, dtype=dtype)}

    def forward(self, x):
        if x.ndim != 2 or x.shape[1] != self.params["W"].shape[1]:
            raise ValueError(f"Linear expects (N, {self.params['W'].shape[1]}) input, got "
                             f"shape {x.shape}")
        if self.training:
            self._x = x
        return x @ self.params["W"].T + self.params["b"]

    def backward(self, dy):
        x = self._saved("_x")
        self.grads = {"W": dy.T @ x, "b": dy.sum(axis=0)}
        return dy @ self.params["W"]

    def __repr__(self):
        out_features, in_features = self.params["W"].shape
        return f"Linear({in_features}, {out_features})"


class Conv(Layer):
    """Convolution (cross-correlation, as in every CNN library) over 1, 2 or 3 spatial
    dims, by im2col and one BLAS matrix product.

    ``x`` is ``(N, in_channels, *spatial)``; the kernel ``W`` is ``(out_channels,
    in_channels, *kernel_size)``. ``stride``, ``padding`` (the same before and after)
    and ``dilation`` are ints or one int per spatial dim, as in PyTorch; ``padding_mode``
    ``"zeros"`` or ``"circular"`` (what leaves one side comes in at the other: with
    circular padding a convolution commutes with circular shifts).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, *, ndim: int = 2, bias: bool = True, padding_mode="zeros",
                 rng=None, dtype=np.float32):
        super().__init__()
        if ndim not in (1, 2, 3):
            raise ValueError(f"ndim must be 1, 2 or 3, got {ndim!r}")
        if padding_mode not in ("zeros", "circular"):
            raise ValueError(f"padding_mode must be 'zeros' or 'circular', got "
                             f"{padding_mode!r}")
        self.padding_mode = padding_mode
        self.ndim = ndim
        self.kernel = per_dim(kernel_size, ndim, "kernel_size")
        self.stride = per_dim(stride, ndim, "stride")
        self.dilation = per_dim(dilation, ndim, "dilation")
        self.padding = per_dim(padding, ndim, "padding", minimum=0)
        rng = np.random.default_rng(rng)
        fan_in = in_channels * math.prod(self.kernel)
        self.params = {"W": _he_normal(rng, (out_channels, in_channels) + self.kernel, fan_in,
                                       dtype)}
        if bias:
            self.params["b"] = np.zeros(out_channels, dtype=dtype)

    def _tap_slices(self, tap, out_spatial):
        return tuple(slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in
                     zip(tap, self.dilation, self.stride, out_spatial, strict=True))

    def forward(self, x):
        W = self.params["W"]
        out_channels, in_channels = W.shape[:2]
        if x.ndim != self.ndim + 2 or x.shape[1] != in_channels:
            raise ValueError(f"Conv expects (N, {in_channels}, {self.ndim} spatial dims) input, "
                             f"got shape {x.shape}")
        n = x.shape[0]
        try:  # the pooling layers' output-size rule, in floor mode
            out_spatial = tuple(
                output_length(length, k, s, d, p, p, ceil_mode=False, axis=axis)
                for axis, (length, k, s, d, p) in enumerate(zip(
                    x.shape[2:], self.kernel, self.stride, self.dilation, self.padding,
                    strict=True)))
        except ValueError:
            raise ValueError(f"Conv: input {x.shape[2:]} is smaller than the kernel "
                             f"{self.kernel} (dilation {self.dilation}, padding {self.padding})"
                             ) from None
        if self.padding_mode == "circular":
            if any(p > length for p, length in zip(self.padding, x.shape[2:], strict=True)):
                raise ValueError(f"Conv: circular padding {self.padding} exceeds the input "
                                 f"{x.shape[2:]}")
            padded = circular_pad(x, self.ndim, self.padding, self.padding)
        else:
            padded = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in self.padding])
        # columns laid out (C, *kernel, N, *out): one matrix product for the whole batch
        cols = np.empty((in_channels,) + self.kernel + (n,) + out_spatial, dtype=x.dtype)
        for tap in np.ndindex(*self.kernel):
            cols[(slice(None),) + tap] = padded[(slice(None), slice(None))
                                                + self._tap_slices(tap, out_spatial)
                                                ].swapaxes(0, 1)
        cols = cols.reshape(in_channels * math.prod(self.kernel), -1)
        y = W.reshape(out_channels, -1) @ cols
        if "b" in self.params:
            y += self.params["b"][:, None]
        if self.training:
            self._cols, self._x_shape = cols, (x.shape, padded.shape, out_spatial)
        y = y.reshape((out_channels, n) + out_spatial)
        return np.ascontiguousarray(y.swapaxes(0, 1))

    def backward(self, dy):
        cols = self._saved("_cols")
        x_shape, padded_shape, out_spatial = self._saved("_x_shape")
        W = self.params["W"]
        out_channels, in_channels = W.shape[:2]
        n = x_shape[0]
        dy_rows = np.ascontiguousarray(dy.swapaxes(0, 1)).reshape(out_channels, -1)
        self.grads = {"W": (dy_rows @ cols.T).reshape(W.shape)}
        if "b" in self.params:
            self.grads["b"] = dy_rows.sum(axis=1)
        dcols = (W.reshape(out_channels, -1).T @ dy_rows).reshape(
            (in_channels,) + self.kernel + (n,) + out_spatial)
        dpadded = np.zeros(padded_shape, dtype=dy.dtype)
        for tap in np.ndindex(*self.kernel):  # overlapping taps add up
            dpadded[(slice(None), slice(None)) + self._tap_slices(tap, out_spatial)] += \
                dcols[(slice(None),) + tap].swapaxes(0, 1)
        if self.padding_mode == "circular":  # the padding's gradient onto what it copied
            return fold_circular(dpadded, self.ndim, self.padding, x_shape[2:])
        inside = tuple(slice(p, p + length) for p, length in
                       zip(self.padding, x_shape[2:], strict=True))
        return dpadded[(slice(None), slice(None)) + inside]

    def __repr__(self):
        out_channels, in_channels = self.params["W"].shape[:2]
        mode = "" if self.padding_mode == "zeros" else f", padding_mode={self.padding_mode!r}"
        return (f"Conv({in_channels}, {out_channels}, kernel_size={self.kernel}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}{mode})")


def Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, **kw):
    """A 1-d :class:`Conv`."""
    return Conv(in_channels, out_channels, kernel_size, stride, padding, dilation, ndim=1, **kw)


def Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, **kw):
    """A 2-d :class:`Conv`."""
    return Conv(in_channels, out_channels, kernel_size, stride, padding, dilation, ndim=2, **kw)


class ReLU(Layer):
    def forward(self, x):
        if self.training:
            self._positive = x > 0
        return np.maximum(x, 0)

    def backward(self, dy):
        return dy * self._saved("_positive")


class Flatten(Layer):
    """``(N, ...)`` to ``(N, features)``."""

    def forward(self, x):
        if self.training:
            self._shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self._saved("_shape"))


class Dropout(Layer):
    """Inverted dropout: in training, zeroes each element with probability ``p`` and
    scales the rest by ``1 / (1 - p)``; the identity in evaluation."""

    def __init__(self, p: float = 0.5, *, rng=None):
        super().__init__()
        if not (isinstance(p, (int, float)) and 0 <= p < 1):
            raise ValueError(f"Dropout p must be in [0, 1), got {p!r}")
        self.p = float(p)
        self.rng = np.random.default_rng(rng)

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        keep = (self.rng.random(x.shape) >= self.p).astype(x.dtype) / x.dtype.type(1 - self.p)
        self._keep = keep
        return x * keep

    def backward(self, dy):
        if self.p == 0:
            return dy
        return dy * self._saved("_keep")

    def __repr__(self):
        return f"Dropout({self.p})"


class Pool(Layer):
    """A pooling layer over one operator of the core: ``forward`` keeps the operator's
    pullback (for max pooling, 1 byte per output: each example's own argmax) and
    ``backward`` applies it once and releases it."""

    op = None  # set by subclasses: one of the core's operators

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, x):
        if not self.training:
            return type(self).op(x, **self.options)
        y, self._pullback = ops.vjp(type(self).op, x, **self.options)
        return y

    def backward(self, dy):
        return self._saved("_pullback")(dy)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({args})"


class MaxPool(Pool):
    """:func:`poolgrad.max_pool` as a layer."""
    op = staticmethod(ops.max_pool)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 ties="first"):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode, ties=ties)


class AvgPool(Pool):
    """:func:`poolgrad.avg_pool` as a layer."""
    op = staticmethod(ops.avg_pool)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode,
                         count_include_pad=count_include_pad, divisor_override=divisor_override)


class LpPool(Pool):
    """:func:`poolgrad.lp_pool` as a layer."""
    op = staticmethod(ops.lp_pool)

    def __init__(self, p, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        super().__init__(p=p, kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode)


class GlobalAvgPool(Pool):
    """:func:`poolgrad.global_avg_pool` as a layer: ``(N, C, *spatial)`` to
    ``(N, C, 1, ...)``."""
    op = staticmethod(ops.global_avg_pool)


class GlobalMaxPool(Pool):
    """:func:`poolgrad.global_max_pool` as a layer."""
    op = staticmethod(ops.global_max_pool)

    def __init__(self, ties="first"):
        super().__init__(ties=ties)


class AdaptiveAvgPool(Pool):
    """:func:`poolgrad.adaptive_avg_pool` as a layer."""
    op = staticmethod(ops.adaptive_avg_pool)

    def __init__(self, output_size):
        super().__init__(output_size=output_size)


class AdaptiveMaxPool(Pool):
    """:func:`poolgrad.adaptive_max_pool` as a layer."""
    op = staticmethod(ops.adaptive_max_pool)

    def __init__(self, output_size, ties="first"):
        super().__init__(output_size=output_size, ties=ties)


class Sequential(Layer):
    """Layers applied in order; ``backward`` runs them in reverse."""

    def __init__(self, *layers: Layer):
        super().__init__()
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dy):
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy

    def train(self, mode: bool = True) -> Sequential:
        for layer in [self] + self.layers:
            layer.training = mode
        return self

    def eval(self) -> Sequential:
        return self.train(False)

    def parameters(self) -> list[tuple[Layer, str]]:
        """``(layer, name)`` of every weight, in a fixed order (what optimizers step)."""
        return [(layer, name) for layer in self.layers for name in layer.params]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"{i}.{name}": layer.params[name]
                for i, layer in enumerate(self.layers) for name in layer.params}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        expected = self.state_dict()
        if set(state) != set(expected):
            raise ValueError(f"weights do not fit this model: expected {sorted(expected)}, "
                             f"got {sorted(state)}")
        for key, value in state.items():
            if value.shape != expected[key].shape:
                raise ValueError(f"weight {key} has shape {value.shape}, the model needs "
                                 f"{expected[key].shape}")
        for i, layer in enumerate(self.layers):
            for name in layer.params:
                layer.params[name] = np.array(state[f"{i}.{name}"], dtype=layer.params[name].dtype)

    def __repr__(self):
        return "Sequential(\n" + "".join(f"  {layer!r},\n" for layer in self.layers) + ")"


class SoftmaxCrossEntropy:
    """Mean softmax cross-entropy over a batch: ``forward(logits, labels) -> loss``;
    ``backward() -> dlogits``, which is ``(softmax - one_hot) / N``. Like the layers,
    ``backward`` releases what ``forward`` saved: calling it again is a RuntimeError."""

    def forward(self, logits: np.ndarray, labels: np.ndarray) -> float:
        labels = np.asarray(labels)
        if logits.ndim != 2 or labels.shape != (logits.shape[0],):
            raise ValueError(f"logits must be (N, classes) and labels (N,), got "
                             f"{logits.shape} and {labels.shape}")
        if not np.issubdtype(labels.dtype, np.integer):
            raise TypeError(f"labels must be integers, got {labels.dtype}")
        if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[1]):
            raise ValueError(f"labels must be in [0, {logits.shape[1]}) (the number of "
                             f"classes), got values from {labels.min()} to {labels.max()}")
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=1))
        self._probs = np.exp(shifted - log_sum[:, None])
        self._labels = labels
        rows = np.arange(len(labels))
        return float(np.mean(log_sum - shifted[rows, labels]))

    def backward(self, count: int | None = None) -> np.ndarray:
        """The gradient of the mean loss for each logit. ``count``: divide by that many
        examples instead of this batch's own: the batch's part of the mean over a larger
        step that it is one of (gradient accumulation, Caffe's ``iter_size``)."""
        size = len(getattr(self, "_labels", ()))
        if count is not None and (not is_int(count) or count < size):
            raise ValueError(f"count must be an integer >= the batch's {size} examples, "
                             f"got {count!r}")
        probs = _take_saved(self, "_probs", "a forward")
        labels = _take_saved(self, "_labels", "a forward")
        grad = probs.copy()
        grad[np.arange(len(labels)), labels] -= 1
        return grad / (len(labels) if count is None else count)
