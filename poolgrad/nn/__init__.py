"""A small NumPy layer stack for training CNNs, in the style of Caffe layers.

Every layer has ``forward(x)`` and ``backward(dy) -> dx``. A layer with weights keeps
them in ``params`` and, after ``backward``, their gradients in ``grads`` (same keys).
``forward`` saves what ``backward`` needs and ``backward`` releases it, so a layer holds
a batch's state only between the two calls.

The pooling layers call the core's :func:`poolgrad.vjp`: each example of a batch is
routed through its own argmax (or its own windows); only the weight gradients of the
other layers sum over the batch.

Example:
    >>> rng = np.random.default_rng(0)
    >>> model = Sequential(Conv(1, 4, 3, padding=1, rng=rng), ReLU(), MaxPool(2),
    ...                    Flatten(), Linear(4 * 4 * 4, 10, rng=rng))
    >>> logits = model.forward(rng.standard_normal((2, 1, 8, 8)).astype(np.float32))
    >>> logits.shape
    (2, 10)
"""

from .layers import (
    AdaptiveAvgPool,
    AdaptiveMaxPool,
    AvgPool,
    Conv,
    Conv1d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    GlobalMaxPool,
    Layer,
    Linear,
    LpPool,
    MaxPool,
    Pool,
    ReLU,
    Sequential,
    SoftmaxCrossEntropy,
)
from .pools import (
    POOLING,
    APSPool,
    AttentionPool,
    AvgBlurPool,
    BlurPool,
    FractionalMaxPool,
    GatedPool,
    GeMPool,
    LPSPool,
    MaxAPSPool,
    MaxBlurPool,
    MixedPool,
    SoftPool,
    StochasticPool,
)

__all__ = ["APSPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "AttentionPool", "AvgBlurPool",
           "AvgPool", "BlurPool", "Conv", "Conv1d", "Conv2d", "Dropout", "Flatten",
           "FractionalMaxPool", "GatedPool", "GeMPool", "GlobalAvgPool", "GlobalMaxPool", "Layer",
           "Linear", "LPSPool", "LpPool", "MaxAPSPool", "MaxBlurPool", "MaxPool", "MixedPool",
           "POOLING", "Pool", "ReLU", "Sequential", "SoftPool", "SoftmaxCrossEntropy",
           "StochasticPool"]
