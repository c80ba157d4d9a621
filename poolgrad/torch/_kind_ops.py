"""The pooling kinds' PyTorch operators: ``torch.ops.poolgrad.*`` for the kinds of
:mod:`poolgrad.torch.kinds` that run kernels of their own, defined as :mod:`._ops`
defines the core's (a :func:`torch.library.custom_op`, its schema and its fake
implementation; :mod:`._cpu` and :mod:`._cuda` implement them, :mod:`._autograd` gives
their formulas):

================================  =====================================  ==================
operator                          what it computes                       its gradient
================================  =====================================  ==================
``gem_pool``                  power means (GeM), ``p`` a tensor      ``gem_pool_backward``
``gem_pool_backward``         ``dx`` and the terms of ``dp``         recomputed composite
``weighted_pool``             SoftPool, stochastic pooling's mean    ``weighted_pool_backward``
``weighted_pool_backward``    its gather backward                    recomputed composite
``weighted_pool_values``      ``weighted_pool``'s y (inference)      recomputes ``norm``
``stochastic_pool_sample``    one drawn tap per window, its winner   ``max_pool_backward``
``blend_pool``                mixed and gated pooling's blends       ``blend_pool_backward``
``blend_pool_backward``       ``dx`` and the weights' gradient       recomputed composite
``blur_pool``                 anti-aliased pooling, winners          ``blur_pool_backward``
``blur_pool_backward``        the transposed chain, routed winners   ``blur_pool`` (+gather)
``blur_pool_values``          ``blur_pool``'s y (inference)          recomputes winners
``fractional_max_pool``       maxima over each plane's windows       ``..._backward``
``fractional_max_pool_backward`` ``dy`` at the winners                 a gather at indices
``fractional_max_pool_indices`` PyTorch's int64 indices from winners (integer output)
``aps_pool``                  each example's polyphase component of  ``aps_scatter``
                              largest norm, and its phase
``aps_gather``                the components of given phases         ``aps_scatter``
``aps_scatter``               ``dy`` at the chosen positions         ``aps_gather``
``circular_pad``              x padded circularly                    ``circular_fold``
``circular_fold``             each padded position's ``dy`` added    ``circular_pad``
                              onto the element it copies
``attention_pool``            attention pooling's readouts and its   ``..._backward``
                              weights (a CPU training pass)
``attention_pool_backward``   ``dx`` and ``dprojected``              recomputed composite
================================  =====================================  ==================
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .. import geometry
from ._ops import (
    TORCH_DTYPE,
    compute_dtype,
    define,
    empty,
    memory_format,
    out_shape,
    refuse_device,
    sliding_window,
    winner_dtype,
)

# ---------------------------------------------------------------------------------- GeM


@define
def gem_pool(x: Tensor, p: Tensor, eps: float, window: list[int]) -> Tensor:
    """``mean(max(x, eps)^p)^(1/p)`` over each sliding window, or over each whole plane
    (a global window); ``p`` a one-element tensor (learnable)."""
    refuse_device(x, p)


@gem_pool.register_fake
def _(x, p, eps, window):
    return empty(out_shape(x, window), x, memory_format(x))


@define
def gem_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: Tensor, eps: float,
                      window: list[int], with_dp: bool) -> tuple[Tensor, Tensor]:
    """``dx``, and with ``with_dp`` each window's term of ``dp`` (``y``'s shape, in the
    compute dtype; their sum is ``dp``), else zeros."""
    refuse_device(dy, x, y, p)


@gem_pool_backward.register_fake
def _(dy, x, y, p, eps, window, with_dp):
    return (empty(x.shape, dy, memory_format(x)),
            empty(y.shape, y, torch.contiguous_format, compute_dtype(x)))


# ------------------------------------------------------------------ weighted averages

SOFT, SELF = 0, 1  # :mod:`poolgrad.kernels.weighted`'s kinds


@define
def weighted_pool(x: Tensor, kind: int, window: list[int]) -> tuple[Tensor, Tensor]:
    """Each window's weighted average over its real taps: ``kind`` SOFT (SoftPool,
    weights ``exp(x)``) or SELF (stochastic pooling's evaluation, weights ``x``), and its
    ``norm`` (what the backward reads: ``M + log(S)``, or ``S``), both stored as ``x``."""
    refuse_device(x)


@weighted_pool.register_fake
def _(x, kind, window):
    shape, fmt = out_shape(x, window), memory_format(x)
    return empty(shape, x, fmt), empty(shape, x, fmt, compute_dtype(x))


@define
def weighted_pool_values(x: Tensor, kind: int, window: list[int]) -> Tensor:
    """:func:`weighted_pool`'s averages alone, for inference: no ``norm`` written."""
    refuse_device(x)


@weighted_pool_values.register_fake
def _(x, kind, window):
    return empty(out_shape(x, window), x, memory_format(x))


@define
def weighted_pool_backward(dy: Tensor, x: Tensor, y: Tensor, norm: Tensor, kind: int,
                           window: list[int]) -> Tensor:
    """``dx``: each input's share of the windows that read it."""
    refuse_device(dy, x, y, norm)


@weighted_pool_backward.register_fake
def _(dy, x, y, norm, kind, window):
    return empty(x.shape, dy, memory_format(x))


@define
def stochastic_pool_sample(x: Tensor, seed: Tensor, window: list[int]) -> tuple[Tensor, Tensor]:
    """One real tap per window, drawn with probability ``x / sum(x)`` by the draws
    counted from ``seed`` (int64, one element, on x's device), as
    :func:`poolgrad.stochastic_pool` counts them: its value and its tap number (max
    pooling's winners, so :func:`max_pool_backward` routes the gradient). A ValueError
    on the CPU if x holds a negative number or a NaN."""
    refuse_device(x, seed)


@stochastic_pool_sample.register_fake
def _(x, seed, window):
    shape, fmt = out_shape(x, window), memory_format(x)
    return empty(shape, x, fmt), empty(shape, x, fmt, winner_dtype(x, window))


# ------------------------------------------------------------ blends of max and mean

MIXED, GATED = 0, 1  # :mod:`poolgrad.kernels.blend`'s kinds


@define
def blend_pool(x: Tensor, weights: Tensor, kind: int, window: list[int]) -> Tensor:
    """``s max + (1 - s) mean`` over each window (the mean counts padding): ``kind``
    MIXED with ``weights`` ``[alpha]`` (``s = alpha``), or GATED with the gate's
    weights shaped as the window (``s = sigmoid(gate . window)``)."""
    refuse_device(x, weights)


@blend_pool.register_fake
def _(x, weights, kind, window):
    return empty(out_shape(x, window), x, memory_format(x))


@define
def blend_pool_backward(dy: Tensor, x: Tensor, weights: Tensor, kind: int,
                        window: list[int]) -> tuple[Tensor, Tensor]:
    """``dx``, and the weights' gradient summed over every window (float64, shaped as
    ``weights``)."""
    refuse_device(dy, x, weights)


@blend_pool_backward.register_fake
def _(dy, x, weights, kind, window):
    return (empty(x.shape, dy, memory_format(x)),
            empty(weights.shape, weights, torch.contiguous_format, torch.float64))


# ------------------------------------------------------------------ anti-aliased pooling

def blur_geometry(pre: str, kernel, stride, sizes, pads, mode: str) -> list[int]:
    """``[pre, *kernel, *stride, *filter sizes, *before, *after, mode]`` (``pre`` and
    ``mode`` as their indices in :data:`poolgrad.geometry.BLUR_PRE` and
    :data:`poolgrad.geometry.BLUR_PADDING_MODES`)."""
    return [geometry.BLUR_PRE.index(pre), *kernel, *stride, *sizes, *(lo for lo, _ in pads),
            *(hi for _, hi in pads), geometry.BLUR_PADDING_MODES.index(mode)]


def blur_args(blur) -> tuple:
    """``(pre, kernel, stride, sizes, pads, mode)`` of a :func:`blur_geometry`."""
    n = (len(blur) - 2) // 5
    kernel, stride, sizes, lo, hi = (tuple(blur[1 + i * n: 1 + (i + 1) * n]) for i in range(5))
    return (geometry.BLUR_PRE[blur[0]], kernel, stride, sizes, tuple(zip(lo, hi, strict=True)),
            geometry.BLUR_PADDING_MODES[blur[-1]])


@functools.lru_cache(maxsize=256)
def blur_plan_of(blur: tuple[int, ...], in_spatial: tuple[int, ...]) -> geometry.BlurPlan:
    pre, kernel, stride, sizes, pads, mode = blur_args(blur)
    return geometry.blur_plan(in_spatial, pre, kernel, sizes, stride, pads, mode)


def blur_max_window(kernel) -> list[int]:
    """A max-blur's stride-1 max over ``kernel`` (no padding) as a window: the geometry
    its winners number their taps in, which max pooling's ops route and gather by."""
    ones = (1,) * len(kernel)
    return sliding_window(kernel, ones, ((0, 0),) * len(kernel), ones, False)


def blur_out_shape(x: Tensor, blur) -> list:
    """The output shape by arithmetic alone (symbolic sizes pass)."""
    _, kernel, stride, sizes, pads, _ = blur_args(blur)
    return [*x.shape[:2], *((length - k + 1 + lo + hi - f) // s + 1
                            for length, k, s, f, (lo, hi) in zip(
                                x.shape[2:], kernel, stride, sizes, pads, strict=True))]


def blur_winners_shape(x: Tensor, blur) -> list:
    """A max-blur's winners: one per stride-1 window; none for the others."""
    pre, kernel, *_ = blur_args(blur)
    if pre != "max":
        return [0]
    return [*x.shape[:2], *(length - k + 1 for length, k in zip(x.shape[2:], kernel,
                                                               strict=True))]


def blur_winner_dtype(blur) -> torch.dtype:
    pre, kernel, *_ = blur_args(blur)
    taps = math.prod(kernel) if pre == "max" else 1
    return TORCH_DTYPE[geometry.position_dtype(taps)]


@define
def blur_pool(x: Tensor, blur: list[int]) -> tuple[Tensor, Tensor]:
    """Anti-aliased pooling: the optional stride-1 max or mean, the binomial blur and the
    subsampling, per plane; with a max, each stride-1 window's winner (else empty).
    Both in ``x``'s layout."""
    refuse_device(x)


@blur_pool.register_fake
def _(x, blur):
    return (empty(blur_out_shape(x, blur), x, memory_format(x)),
            empty(blur_winners_shape(x, blur), x,
                  memory_format(x) if blur_args(blur)[0] == "max" else torch.contiguous_format,
                  blur_winner_dtype(blur)))


@define
def blur_pool_values(x: Tensor, blur: list[int]) -> Tensor:
    """:func:`blur_pool`'s output alone, for inference: a max-blur keeps no winners."""
    refuse_device(x)


@blur_pool_values.register_fake
def _(x, blur):
    return empty(blur_out_shape(x, blur), x, memory_format(x))


@define
def blur_pool_backward(dy: Tensor, winners: Tensor, blur: list[int],
                       x_size: list[int]) -> Tensor:
    """The transposed blur, then (max-blur) the routing to the winners."""
    refuse_device(dy, winners)


@blur_pool_backward.register_fake
def _(dy, winners, blur, x_size):
    return empty(x_size, dy, memory_format(dy))


# ------------------------------------------------------------- fractional max pooling

REGION_CODES = {"disjoint": -1, "overlapping": -2}
SEQUENCES = ("pseudo_random", "random")


def fractional_geometry(kernel, out, sequence: str) -> list[int]:
    """``[*kernel, *out, sequence]``: per dim the window's length or Graham's regions'
    :data:`REGION_CODES`, the output sizes, the :data:`SEQUENCES` index."""
    return [*(REGION_CODES.get(k, k) for k in kernel), *out, SEQUENCES.index(sequence)]


def fractional_args(fractional) -> tuple:
    """``(kernel, out, sequence)`` of a :func:`fractional_geometry`."""
    ndim = (len(fractional) - 1) // 2
    regions = {code: name for name, code in REGION_CODES.items()}  # ints: SymInts hash not
    kernel = tuple(regions[int(k)] if k < 0 else k for k in fractional[:ndim])
    return kernel, tuple(fractional[ndim: 2 * ndim]), SEQUENCES[int(fractional[-1])]


def fractional_extents(fractional, spatial) -> tuple[int, ...]:
    """Per dim a bound on any window's length, whatever the draws: the window's length,
    or a region's mean step ``n / o`` rounded up, plus one for the sequence's rounding
    and one more if overlapping."""
    kernel, out, _ = fractional_args(fractional)
    return tuple(int(k) if not isinstance(k, str) else
                 min(int(n), -(-int(n) // int(o)) + 1 + (k == "overlapping"))
                 for k, n, o in zip(kernel, spatial, out, strict=True))


def fractional_taps(fractional, spatial) -> int:
    """A bound on the taps of any window (the product of :func:`fractional_extents`):
    the winners' dtype holds it."""
    return math.prod(fractional_extents(fractional, spatial))


@define
def fractional_max_pool(x: Tensor, samples: Tensor, orders: Tensor,
                        fractional: list[int]) -> tuple[Tensor, Tensor]:
    """Each window's maximum and winning tap, the windows placed per plane by ``samples``
    ``(N, C, ndim)`` (the pseudo-random ``u``) or the random sequence's ``orders``
    ``(N * C, steps)`` (float64 draws, one column per step, dim after dim)."""
    refuse_device(x, samples, orders)


@fractional_max_pool.register_fake
def _(x, samples, orders, fractional):
    shape = [*x.shape[:2], *fractional_args(fractional)[1]]
    fmt = memory_format(x)
    return (empty(shape, x, fmt),
            empty(shape, x, fmt, TORCH_DTYPE[geometry.position_dtype(
                fractional_taps(fractional, x.shape[2:]))]))


@define
def fractional_max_pool_backward(dy: Tensor, winners: Tensor, samples: Tensor,
                                 orders: Tensor, fractional: list[int],
                                 x_size: list[int]) -> Tensor:
    """Each window's ``dy`` at its winner (the windows rebuilt from the draws)."""
    refuse_device(dy, winners, samples, orders)


@fractional_max_pool_backward.register_fake
def _(dy, winners, samples, orders, fractional, x_size):
    return empty(x_size, dy, memory_format(dy))


@define
def fractional_max_pool_indices(winners: Tensor, samples: Tensor, orders: Tensor,
                                fractional: list[int], x_size: list[int]) -> Tensor:
    """PyTorch's int64 indices: each winner's flat position in its input plane."""
    refuse_device(winners, samples, orders)


@fractional_max_pool_indices.register_fake
def _(winners, samples, orders, fractional, x_size):
    return empty(winners.shape, winners, memory_format(winners), torch.int64)


# ------------------------------------------------------- adaptive polyphase sampling


APS_L2, APS_L1, APS_MAX = 0, 1, 2  # :mod:`poolgrad.kernels.polyphase`'s norms


def aps_shape(x_size, steps) -> list[int]:
    """``(N, C, *ceil(spatial / steps))``: one polyphase component's shape."""
    return [*x_size[:2], *(-(-int(n) // int(s)) for n, s in zip(x_size[2:], steps,
                                                                  strict=True))]


@define
def aps_pool(x: Tensor, steps: list[int], norm: int) -> tuple[Tensor, Tensor]:
    """Each example's polyphase component of largest norm (``norm`` one of
    :mod:`poolgrad.kernels.polyphase`'s ``L2``, ``L1``, ``MAX``; the first largest, a
    NaN as largest), and its phase (int64, ``(N,)``)."""
    refuse_device(x)


@aps_pool.register_fake
def _(x, steps, norm):
    return (empty(aps_shape(x.shape, steps), x, memory_format(x)),
            x.new_empty((x.shape[0],), dtype=torch.int64))


@define
def aps_gather(x: Tensor, phases: Tensor, steps: list[int]) -> Tensor:
    """Component ``phases[n]`` of each example (int64 ``(N,)``, each in ``[0,
    prod(steps))``)."""
    refuse_device(x, phases)


@aps_gather.register_fake
def _(x, phases, steps):
    return empty(aps_shape(x.shape, steps), x, memory_format(x))


@define
def aps_scatter(dy: Tensor, phases: Tensor, steps: list[int], x_size: list[int]) -> Tensor:
    """The transpose of :func:`aps_gather`: ``dy`` at each example's chosen positions of
    an ``x_size`` tensor, 0 elsewhere."""
    refuse_device(dy, phases)


@aps_scatter.register_fake
def _(dy, phases, steps, x_size):
    return empty(x_size, dy, memory_format(dy))


# ------------------------------------------------------------------- circular padding


def padded_shape(x_size, pads) -> list[int]:
    """``x_size`` with each spatial dim grown by its ``(before, after)`` in ``pads``."""
    return [*x_size[:2], *(int(n) + pads[2 * i] + pads[2 * i + 1]
                           for i, n in enumerate(x_size[2:]))]


@define
def circular_pad(x: Tensor, pads: list[int]) -> Tensor:
    """``x`` padded circularly, ``pads`` the ``before, after`` of each spatial dim in
    order, stored as x is; a pad longer than its dim wraps round again, as the NumPy
    operators pad."""
    refuse_device(x)


@circular_pad.register_fake
def _(x, pads):
    return empty(padded_shape(x.shape, pads), x, memory_format(x))


@define
def circular_fold(dy: Tensor, pads: list[int], x_size: list[int]) -> Tensor:
    """The transpose of :func:`circular_pad`: each padded position's ``dy`` added onto
    the element of an ``x_size`` tensor it copies, stored as dy is."""
    refuse_device(dy)


@circular_fold.register_fake
def _(dy, pads, x_size):
    return empty(x_size, dy, memory_format(dy))


# ------------------------------------------------------------------ attention pooling


@define
def attention_pool(x: Tensor, projected: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Attention pooling's readouts ``(N, M, C)`` in x's dtype and its weights ``(N, R,
    L)`` (float64, which the backward takes), for x ``(N, C, *spatial)`` and
    ``projected`` ``(R, C)`` float64: the queries folded into the key projection and
    the scale (:mod:`poolgrad.kernels.attention`). The CPU's training pass; a forward
    alone, and CUDA, take torch's own ops (docs/kinds.md)."""
    refuse_device(x, projected)


@attention_pool.register_fake
def _(x, projected, heads):
    n, channels = x.shape[:2]
    return (x.new_empty((n, projected.shape[0] // heads, channels)),
            x.new_empty((n, projected.shape[0], math.prod(x.shape[2:])), dtype=torch.float64))


@define
def attention_pool_backward(dy: Tensor, x: Tensor, projected: Tensor, attn: Tensor,
                            heads: int) -> tuple[Tensor, Tensor]:
    """``dx`` (x's shape, dtype and layout) and ``dprojected`` (float64, summed over the
    batch in a fixed order) from ``dy`` ``(N, M, C)`` and the forward's weights."""
    refuse_device(dy, x, projected, attn)


@attention_pool_backward.register_fake
def _(dy, x, projected, attn, heads):
    return empty(x.shape, x, memory_format(x)), projected.new_empty(projected.shape)
