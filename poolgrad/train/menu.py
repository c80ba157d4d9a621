"""The downsampling menu of ``poolgrad train --pool``: each name with the layers it
stands for in the NumPy engine (:mod:`poolgrad.nn`) and in the torch engine
(:mod:`poolgrad.torch`), side by side, so that both engines build the same networks.

Every downsampling halves each spatial size: the pooling kinds with 2-wide windows
(fractional max pooling with 3-wide ones at a ratio of 1/2), or a learned strided
convolution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .. import nn
from ..tools.choices import check_choice


class Stage(NamedTuple):
    """Where a downsampling goes: the stage's ``index`` (0 first), its ``width`` (the
    channels it gets), the ``ndim`` spatial dims and the run's ``seed``. The NumPy
    engine also passes its ``rng``: the one that draws the weights, layer after layer,
    so a layer that draws takes its share in the network's order."""
    index: int
    width: int
    ndim: int
    seed: int
    rng: np.random.Generator | None = None
    dtype: type = np.float32


class Downsampling(NamedTuple):
    """A menu entry: ``numpy(stage)`` returns :mod:`poolgrad.nn` layers;
    ``torch(stage, pooling, torch_nn)`` returns ``torch.nn`` modules, given
    :mod:`poolgrad.torch` as ``pooling`` and ``torch.nn`` (the caller imports PyTorch,
    so that this menu does not)."""
    numpy: Callable
    torch: Callable


def _strided_conv(s: Stage):
    return [nn.Conv(s.width, s.width, 2, stride=2, ndim=s.ndim, rng=s.rng, dtype=s.dtype),
            nn.ReLU()]


def _torch_strided_conv(s: Stage, pooling, torch_nn):
    return [getattr(torch_nn, f"Conv{s.ndim}d")(s.width, s.width, 2, stride=2), torch_nn.ReLU()]


DOWNSAMPLING = {
    "max": Downsampling(lambda s: [nn.MaxPool(2)],
                        lambda s, pooling, _: [getattr(pooling, f"MaxPool{s.ndim}d")(2)]),
    "avg": Downsampling(lambda s: [nn.AvgPool(2)],
                        lambda s, pooling, _: [getattr(pooling, f"AvgPool{s.ndim}d")(2)]),
    "lp": Downsampling(lambda s: [nn.LpPool(2, 2)],
                       lambda s, pooling, _: [getattr(pooling, f"LPPool{s.ndim}d")(2, 2)]),
    "blur": Downsampling(lambda s: [nn.BlurPool(2)],
                         lambda s, pooling, _: [pooling.BlurPool(2)]),
    "max-blur": Downsampling(lambda s: [nn.MaxBlurPool(2, 2)],
                             lambda s, pooling, _: [pooling.MaxBlurPool(2, 2)]),
    "avg-blur": Downsampling(lambda s: [nn.AvgBlurPool(2, 2)],
                             lambda s, pooling, _: [pooling.AvgBlurPool(2, 2)]),
    "soft": Downsampling(lambda s: [nn.SoftPool(2)],
                         lambda s, pooling, _: [pooling.SoftPool(2)]),
    # the NumPy engine's draws come from the network's generator, the torch engine's
    # from a seed per stage
    "stochastic": Downsampling(
        lambda s: [nn.StochasticPool(2, rng=s.rng)],
        lambda s, pooling, _: [pooling.StochasticPool(2, seed=s.seed + s.index)]),
    # 3-wide windows, as PyTorch's example: 2-wide ones at a ratio of 1/2 fall exactly
    # where 2x2 max pooling's do (alpha = 2 leaves nothing to chance)
    "fractional": Downsampling(
        lambda s: [nn.FractionalMaxPool(3, output_ratio=0.5, rng=s.rng)],
        lambda s, pooling, _: [pooling.FractionalMaxPool(3, output_ratio=0.5,
                                                         seed=s.seed + s.index)]),
    "gem": Downsampling(lambda s: [nn.GeMPool(3.0, kernel_size=2)],
                        lambda s, pooling, _: [pooling.GeMPool(3.0, kernel_size=2)]),
    "mixed": Downsampling(lambda s: [nn.MixedPool(2)],
                          lambda s, pooling, _: [pooling.MixedPool(2)]),
    "gated": Downsampling(lambda s: [nn.GatedPool(2, ndim=s.ndim)],
                          lambda s, pooling, _: [pooling.GatedPool(2, ndim=s.ndim)]),
    # adaptive polyphase sampling: each example's 2x subsampling of largest norm, alone
    # or after the max at stride 1 (circular padding), APS's replacement for max pooling
    "aps": Downsampling(lambda s: [nn.APSPool(2)],
                        lambda s, pooling, _: [pooling.APSPool(2)]),
    "max-aps": Downsampling(lambda s: [nn.MaxAPSPool(2, 2)],
                            lambda s, pooling, _: [pooling.MaxAPSPool(2, 2)]),
    # learnable polyphase sampling: the choice scored by a small per-position network
    # (the Gumbel-softmax mixture in training, the hard choice in evaluation)
    "lps": Downsampling(
        lambda s: [nn.LPSPool(s.width, 2, rng=s.rng)],
        lambda s, pooling, _: [pooling.LPSPool(s.width, 2, seed=s.seed + s.index)]),
    # a learned 2x downsampling in place of pooling
    "strided-conv": Downsampling(_strided_conv, _torch_strided_conv),
}
POOLS = tuple(DOWNSAMPLING)  # the --pool choices


CONV_PADDINGS = ("zeros", "circular")


def check_conv_padding(name, error: type[ValueError] = ValueError) -> str:
    """``name`` if it is a convolution padding (:data:`CONV_PADDINGS`); otherwise
    ``error`` naming the allowed ones."""
    return check_choice(name, CONV_PADDINGS, "conv padding", error)


def check_pool(name, what: str = "pool", error: type[ValueError] = ValueError) -> str:
    """``name`` if it is on the menu (:data:`POOLS`); otherwise ``error`` saying
    ``unknown {what} ...`` and what is allowed."""
    return check_choice(name, POOLS, what, error)
