"""The pooling kinds of :mod:`poolgrad.kinds` in PyTorch: functions and modules.

Each kind is an operator of its own (``torch.ops.poolgrad.*``, on the Numba kernels of
the NumPy operator on the CPU and Triton kernels on CUDA), or an exact composition of
poolgrad.torch's operators (max and average pooling and the max's gather) and torch's
own differentiable ops (window views, matrix products, softmax). So
autograd, gradients of gradients, ``torch.compile`` and CUDA tensors work for every
kind, and the values and gradients are those of the NumPy operators (the tests compare
them in float64). What each is:

==========================  =================================================
kind                        composition
==========================  =================================================
``blur_pool``               its own operators (``blur_pool``: the padding, the
                            binomial filter and the stride in one pass)
``max_blur_pool``           the same, after a stride-1 max whose winners (1 byte
                            per window) route the gradient
``avg_blur_pool``           the same, after a stride-1 average
``soft_pool``               its own operators (``weighted_pool``)
``stochastic_pool``         its own operators: training, ``stochastic_pool_sample``
                            (the draw; its gradient is max pooling's routing);
                            evaluation, ``weighted_pool``
``fractional_max_pool``     its own operators (the draws in, the windows
                            built on the tensor's device)
``gem_pool``                its own operators (fused Numba kernels on the CPU,
                            Triton on CUDA); ``p`` a tensor
``mixed_pool``              its own operators (``blend_pool``)
``gated_pool``              the same, blended by ``sigmoid(gate . window)``
``attention_pool``          its own operators for a CPU training pass (the fused
                            Numba kernels); else matrix products and a softmax
==========================  =================================================

Inputs follow the NumPy operators' rule (:func:`poolgrad._inputs.resolve_spatial_dims`):
``(N, C, *spatial)`` with 1-3 spatial dims, or unbatched ``(C, *spatial)`` (the result
unbatched too) where ``spatial_dims`` or a per-dim argument gives their number. The
learnable parameters are checked as the NumPy operators check them, at every eager call.
The random kinds take a ``torch.Generator`` (or an int seed) for their draws.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor, nn

from .. import _inputs as inputs
from .. import geometry
from ..kinds import blur as numpy_blur
from ..kinds import fractional as numpy_fractional
from . import _kind_ops as kind_ops
from . import _ops as ops
from ._autograd import call
from ._fractional import sequence_steps
from .functional import arguments, sliding, unbatch
from .functional import batched as _check_input
from .onnx import refuse_export

__all__ = ["attention_pool", "avg_blur_pool", "blur_pool", "fractional_max_pool",
           "gated_pool", "gem_pool", "max_blur_pool", "mixed_pool", "soft_pool",
           "stochastic_pool", "AttentionPool", "AvgBlurPool", "BlurPool",
           "FractionalMaxPool", "GatedPool", "GeMPool", "MaxBlurPool", "MixedPool",
           "SoftPool", "StochasticPool"]


def _shape(x, name: str) -> tuple[int, ...]:
    if not isinstance(x, Tensor):
        _check_input(x, 1, name)  # raises its TypeError
    return tuple(x.shape)


def kind_input(x, name: str, spatial_dims, **per_dim_args) -> tuple[Tensor, int, bool]:
    """``(x as (N, C, *spatial), its number of spatial dims, whether it came unbatched)``:
    the number by the NumPy operators' rule, ``x`` checked as poolgrad.torch checks every
    input (a float tensor on the CPU or CUDA, no empty dim)."""
    ndim = arguments(inputs.resolve_spatial_dims)(_shape(x, name), spatial_dims,
                                                  f"{name}: ", **per_dim_args)
    x, unbatched = _check_input(x, ndim, name)
    return x, ndim, unbatched


def _check_parameter(value, name: str, *, positive: bool = False) -> None:
    """A parameter given as a number or a tensor, checked as the NumPy operators check it
    (:func:`poolgrad._inputs.check_real`, ``check_values``). A tensor's values are read in
    eager calls only: under ``torch.compile`` reading them would break the graph."""
    if not isinstance(value, Tensor):
        inputs.check_real(value, name, positive=positive)
    elif not torch.compiler.is_compiling():
        inputs.check_values(value.detach().flatten().tolist(), name, positive=positive)


def _window(x, kernel_size, stride, padding) -> list[int]:
    return sliding(x, x.dim() - 2, kernel_size, stride, padding, 1, False)


def _taps(ndim: int) -> tuple[int, ...]:
    return tuple(range(-ndim, 0))


def seeded_generator(generator, device) -> torch.Generator | None:
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, (int, np.integer)):
        raise TypeError(f"generator must be None, an int seed or a torch.Generator, got "
                        f"{type(generator).__name__}")
    return torch.Generator(device=device).manual_seed(int(generator))


def draw(sample, shape, generator, device, dtype) -> Tensor:
    """``sample(shape, ...)`` (``torch.rand``, say) from ``generator`` (None, an int seed
    or a torch.Generator), on ``device``. A generator draws where it lives, as torch's
    samplers demand, and its draws go to ``device``: a CPU generator serves a CUDA
    tensor; an int seeds a generator on ``device``."""
    generator = seeded_generator(generator, device)
    where = device if generator is None else generator.device
    return sample(*shape, generator=generator, dtype=dtype, device=where).to(device)


# ----------------------------------------------------------------------- anti-aliased


def _blur_kind(x, pre, kernel_size, stride, filter_size, padding, padding_mode,
               spatial_dims, name):
    ndim, kernel, stride, sizes, pads, blur_geometry = arguments(_blur_setup)(
        _shape(x, name), pre, kernel_size, stride, filter_size, padding, padding_mode,
        spatial_dims, name)
    x, unbatched = _check_input(x, ndim, name)
    if _needs_backward(x):
        return unbatch(call(kind_ops.blur_pool, x, list(blur_geometry))[0], unbatched)
    return unbatch(call(kind_ops.blur_pool_values, x, list(blur_geometry)), unbatched)


@torch.compiler.assume_constant_result
def _check_blur(in_spatial, pre, kernel, sizes, stride, pads, padding_mode) -> bool:
    """The NumPy operator's plan, built for its checks (sizes, reflect padding shorter
    than the map). torch.compile runs it while tracing, on the static sizes, and keeps
    none of it in the graph (the plan's NumPy tables are not for Dynamo to trace)."""
    geometry.blur_plan(in_spatial, pre, kernel, sizes, stride, pads, padding_mode)
    return True


@inputs.memoized
def _blur_setup(shape, pre, kernel_size, stride, filter_size, padding, padding_mode,
                spatial_dims, name):
    """The blur kinds' arguments checked, with the operators' geometry: ``(ndim, kernel,
    stride, filter sizes, pads, geometry)``."""
    ndim, kernel, stride, sizes, pads = numpy_blur.blur_arguments.uncached(
        shape, kernel_size, stride, filter_size, padding, padding_mode, spatial_dims,
        f"{name}: ")
    _check_blur(tuple(shape[-ndim:]), pre, kernel, sizes, stride, pads, padding_mode)
    blur_geometry = kind_ops.blur_geometry(pre, kernel, stride, sizes, pads, padding_mode)
    return ndim, kernel, stride, sizes, pads, tuple(blur_geometry)


def blur_pool(x, stride=2, filter_size=3, padding_mode="reflect", padding=None, *,
              spatial_dims=None):
    """:func:`poolgrad.blur_pool` on a tensor (the same arguments). ``x`` is ``(N, C,
    *spatial)``, or ``(C, *spatial)`` where ``spatial_dims`` or a per-dim argument gives
    the number of spatial dims."""
    return _blur_kind(x, "none", 1, stride, filter_size, padding, padding_mode, spatial_dims,
                      "blur_pool")


def max_blur_pool(x, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                  padding=None, *, spatial_dims=None):
    """:func:`poolgrad.max_blur_pool` on a tensor: poolgrad's stride-1 max pooling (its
    winners, 1 byte per window, route the gradient), then :func:`blur_pool`. ``x`` as
    :func:`blur_pool` takes it."""
    return _blur_kind(x, "max", kernel_size, stride, filter_size, padding, padding_mode,
                      spatial_dims, "max_blur_pool")


def avg_blur_pool(x, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                  padding=None, *, spatial_dims=None):
    """:func:`poolgrad.avg_blur_pool` on a tensor; ``x`` as :func:`blur_pool` takes it."""
    return _blur_kind(x, "avg", kernel_size, stride, filter_size, padding, padding_mode,
                      spatial_dims, "avg_blur_pool")


# --------------------------------------------------------------------------- weighted


def soft_pool(x, kernel_size, stride=None, padding=0, *, spatial_dims=None):
    """:func:`poolgrad.soft_pool` on a tensor: the ``weighted_pool`` operator (one fused
    pass, forward and backward). ``x`` as :func:`blur_pool` takes it."""
    x, _, unbatched = kind_input(x, "soft_pool", spatial_dims, kernel_size=kernel_size,
                               stride=stride, padding=padding)
    window = _window(x, kernel_size, stride, padding)
    return unbatch(_weighted(x, kind_ops.SOFT, window), unbatched)


def _needs_backward(x: Tensor) -> bool:
    """Whether a kind should keep what its backward reads (a max's winners, SoftPool's
    ``norm``): when a backward may follow. An export's or a JIT trace's graph takes the
    values-only operators, whose gradients recompute what they did not keep."""
    return (torch.is_grad_enabled() and x.requires_grad and not torch.compiler.is_exporting()
            and not torch.jit.is_tracing())


def _weighted(x: Tensor, kind: int, window) -> Tensor:
    """The ``weighted_pool`` operator, or its values alone where no backward follows."""
    if _needs_backward(x):
        return call(kind_ops.weighted_pool, x, kind, window)[0]
    return call(kind_ops.weighted_pool_values, x, kind, window)


def stochastic_pool(x, kernel_size, stride=None, padding=0, *, training=True,
                    generator=None, spatial_dims=None):
    """:func:`poolgrad.stochastic_pool` on a tensor. Each call takes one seed from
    ``generator`` (``torch.randint(2**63 - 1, (1,))`` on the generator's device, x's for
    an int seed or None), from which the ``stochastic_pool_sample`` operator counts each
    window's draw as the NumPy operator does (so the same seed gives the same draws on
    the CPU and on CUDA) and picks its tap in one pass (its gradient is max pooling's
    routing); evaluation is the ``weighted_pool`` operator. ``x`` as :func:`blur_pool`
    takes it."""
    x, _, unbatched = kind_input(x, "stochastic_pool", spatial_dims, kernel_size=kernel_size,
                               stride=stride, padding=padding)
    refuse_export("stochastic_pool cannot be exported: it draws at random in training, and "
                  "checks x >= 0 on the data in evaluation, which a graph cannot; export "
                  "a model with max_pool or avg_pool in its place")
    return unbatch(_stochastic(x, _window(x, kernel_size, stride, padding), training,
                               generator), unbatched)


def _in_memory_order(t: Tensor) -> Tensor:
    """``t``'s dims permuted into the order of its strides: a contiguous view of a dense
    tensor in any layout, which torch reduces several times faster than a channels-last
    one (its min took 7.6 ms against 3.6 for the whole NumPy pooling)."""
    return t.permute(*sorted(range(t.dim()), key=lambda d: -t.stride(d)))


def _stochastic(x, window, training, generator):
    """Stochastic pooling of a batched x."""
    # NaN, the min's too, fails as a negative does. A compiled graph cannot branch on the
    # data, so it is not checked there, but the CPU operators check the taps as they
    # read them, compiled or not
    if (x.device.type != "cpu" and not torch.compiler.is_compiling() and x.numel()
            and not bool(_in_memory_order(x.detach()).min() >= 0)):
        raise ValueError("stochastic_pool samples with probabilities x / sum(x), so x must "
                         "be >= 0 (as after a ReLU) and not NaN")
    if not training:
        return _weighted(x, kind_ops.SELF, window)
    seed = draw(functools.partial(torch.randint, 2**63 - 1), ((1,),), generator, x.device,
                torch.int64)
    return call(kind_ops.stochastic_pool_sample, x, seed, window)[0]


# ------------------------------------------------------------------------- fractional


def fractional_max_pool(x, kernel_size, output_size=None, output_ratio=None,
                        return_indices=False, *, samples=None, generator=None,
                        sequence="pseudo_random", spatial_dims=None):
    """:func:`poolgrad.fractional_max_pool` on a tensor. ``samples`` is torch's
    ``_random_samples`` (``(N, C, ndim)``, PyTorch's order; ``(1, C, ndim)`` for an
    unbatched x, as torch's), on x's device; without it they are ``torch.rand`` draws
    (float64 for a float64 x, else float32) from ``generator``: a torch.Generator, which
    draws where it lives (a CPU one serves a CUDA x), or an int seed of a generator on
    x's device, or None for the device's default one. The random sequence's orders come
    from it too. The windows are built on x's device, and on CUDA the Triton kernels of
    :mod:`poolgrad.torch.triton.fractional` pool over them. ``x`` as :func:`blur_pool`
    takes it."""
    refuse_export("fractional_max_pool cannot be exported: its windows are drawn at random "
                  "at every call; export a model with max_pool in its place")
    ndim, kernel, out = arguments(numpy_fractional.fractional_arguments)(
        _shape(x, "fractional_max_pool"), kernel_size, output_size, output_ratio, sequence,
        spatial_dims, "fractional_max_pool: ")
    x, unbatched = _check_input(x, ndim, "fractional_max_pool")
    n, c = x.shape[:2]
    source = seeded_generator(generator, x.device.type)
    if samples is None:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        samples = draw(torch.rand, ((n, c, ndim),), source, x.device, dtype)
    elif generator is not None:
        raise ValueError("fractional_max_pool takes samples or generator, not both")
    elif not torch.compiler.is_compiling():  # a compiled graph cannot read the data
        checked = samples.detach().cpu()  # NumPy has no bfloat16: checked as float32
        checked = checked.float() if checked.dtype == torch.bfloat16 else checked
        numpy_fractional.check_samples(checked.numpy(), (n, c), ndim, sequence)
    if samples.device != x.device:
        raise ValueError(f"fractional_max_pool: samples must be on x's device {x.device}, "
                         f"got {samples.device}")
    orders = torch.cat([draw(torch.rand, ((n * c, steps),), source, x.device, torch.float64)
                        for steps in sequence_steps(kernel, out, sequence)]
                       or [torch.empty((n * c, 0), dtype=torch.float64, device=x.device)], 1)
    windows = kind_ops.fractional_geometry(kernel, out, sequence)
    y, winners = call(kind_ops.fractional_max_pool, x, samples, orders, windows)
    indices = (call(kind_ops.fractional_max_pool_indices, winners, samples, orders, windows,
                    list(x.shape)) if return_indices else None)
    if return_indices:
        return unbatch(y, unbatched), unbatch(indices, unbatched)
    return unbatch(y, unbatched)


# ----------------------------------------------------------------- learnable parameters


def gem_pool(x, p=3.0, kernel_size=None, stride=None, eps=1e-6, *, spatial_dims=None):
    """:func:`poolgrad.gem_pool` on a tensor; ``p`` a number or a tensor (learnable: its
    gradient is the composition's), finite and > 0 (checked at every eager call). ``x``
    as :func:`blur_pool` takes it."""
    _check_parameter(p, "p", positive=True)
    _check_parameter(eps, "eps", positive=True)
    if isinstance(p, Tensor) and p.numel() != 1:
        raise ValueError(f"gem_pool: p must be a number or a one-element tensor, got a "
                         f"tensor of shape {tuple(p.shape)}")
    if kernel_size is None and stride is not None:
        raise ValueError("gem_pool: stride needs a kernel_size (kernel_size=None pools "
                         "globally)")
    x, ndim, unbatched = kind_input(x, "gem_pool", spatial_dims, kernel_size=kernel_size,
                                  stride=stride)
    window = (ops.adaptive_window((1,) * ndim) if kernel_size is None
              else _window(x, kernel_size, stride, 0))
    power = p if isinstance(p, Tensor) else ops.constant((float(p),), torch.float64, x.device)
    return unbatch(call(kind_ops.gem_pool, x, power, float(eps), window), unbatched)


def mixed_pool(x, kernel_size, stride=None, padding=0, alpha=0.5, *, spatial_dims=None):
    """:func:`poolgrad.mixed_pool` on a tensor; ``alpha`` a number or a tensor, finite
    (checked at every eager call). ``x`` as :func:`blur_pool` takes it."""
    _check_parameter(alpha, "alpha")
    if isinstance(alpha, Tensor) and alpha.numel() != 1:
        raise ValueError(f"mixed_pool: alpha must be a number or a one-element tensor, got "
                         f"a tensor of shape {tuple(alpha.shape)}")
    x, _, unbatched = kind_input(x, "mixed_pool", spatial_dims, kernel_size=kernel_size,
                               stride=stride, padding=padding)
    window = _window(x, kernel_size, stride, padding)
    weights = alpha.reshape(1) if isinstance(alpha, Tensor) else ops.constant(
        (float(alpha),), torch.float64, x.device)
    return unbatch(call(kind_ops.blend_pool, x, weights, kind_ops.MIXED, window), unbatched)


def gated_pool(x, gate, kernel_size, stride=None, padding=0, *, spatial_dims=None):
    """:func:`poolgrad.gated_pool` on a tensor: ``gate`` shaped as the window and finite
    (checked at every eager call). ``x`` as :func:`blur_pool` takes it."""
    x, _, unbatched = kind_input(x, "gated_pool", spatial_dims, kernel_size=kernel_size,
                               stride=stride, padding=padding)
    window = _window(x, kernel_size, stride, padding)
    inputs.check_gate_shape(gate.shape, ops.sliding_args(window)[0])
    _check_parameter(gate, "gate")
    return unbatch(call(kind_ops.blend_pool, x, gate, kind_ops.GATED, window), unbatched)


def attention_pool(x, queries, key_weight, heads=1, *, spatial_dims=None):
    """:func:`poolgrad.attention_pool` on a tensor: ``(N, C, *spatial)`` to ``(N, M, C)``,
    or with ``spatial_dims`` ``(C, *spatial)`` to ``(M, C)``."""
    x, _, unbatched = kind_input(x, "attention_pool", spatial_dims)
    n, channels = x.shape[:2]
    for name, t in (("queries", queries), ("key_weight", key_weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"attention_pool: {name} must be a tensor, got {type(t).__name__}")
        if t.device != x.device:
            raise ValueError(f"attention_pool: {name} must be on x's device {x.device}, got "
                             f"{t.device}")
    inputs.check_attention_shapes(queries.shape, key_weight.shape, heads, channels)
    if _fused_training_pass(x, queries, key_weight):
        # the NumPy operator's fused kernels and projection (float64), its backward an op
        # too; the products below took 1.5x as long (docs/kinds.md)
        m, d = queries.shape[0], channels // heads
        projected = torch.einsum("mhd,hdc->mhc", queries.to(torch.float64).reshape(m, heads, d),
                                 key_weight.to(torch.float64).reshape(heads, d, channels))
        projected = projected.reshape(m * heads, channels) * (1 / math.sqrt(d))
        return unbatch(call(kind_ops.attention_pool, x, projected, heads)[0], unbatched)
    return unbatch(attention_products(x, queries, key_weight, heads, _needs_backward(x)),
                   unbatched)


def _fused_training_pass(x, *parameters) -> bool:
    """Whether attention pooling runs its ops: a CPU pass a backward may follow, under no
    functorch transform or forward-mode AD (the ops have no rules for them)."""
    return (x.device.type == "cpu" and any(_needs_backward(t) for t in (x, *parameters))
            and not torch._C._are_functorch_transforms_active()
            and torch.autograd.forward_ad._current_level < 0)


def attention_products(x, queries, key_weight, heads, backward):
    """Attention pooling of batched ``x`` in torch's own ops: matrix products and a
    softmax, the forward alone (and CUDA's training pass) of :func:`attention_pool`.
    ``backward``: take the products in the order that a backward reads fastest."""
    n, channels = x.shape[:2]
    m, d = queries.shape[0], channels // heads
    # the scores as (q W_k) . x, as the NumPy operator takes them (C times fewer
    # multiplications than the keys W_k x); one head without an einsum's permutes
    q, w = queries.to(x.dtype), key_weight.to(x.dtype)
    projected = (q @ w if heads == 1 else torch.einsum(
        "mhd,hdc->mhc", q.reshape(m, heads, d), w.reshape(heads, d, channels)).reshape(
            m * heads, channels)) / math.sqrt(d)
    # Products in the order that reads x as stored, so that both parts of dx land so: one
    # landing transposed made their add and the copy into x's layout strided (22 ms of a
    # 23 ms NCHW forward+backward, against 13). A forward alone takes the (N, C, L) view
    # below in either layout: on channels-last x it is strided, which the matrix
    # products read as a transposed operand, and it beat these per-pixel products
    # (docs/performance.md)
    if backward and x.dim() > 3 and ops.is_channels_last(x):
        pixels = x.permute(0, *range(2, x.dim()), 1).reshape(n, -1, channels)  # (N, L, C)
        length = pixels.shape[1]
        scores = (pixels @ projected.T).transpose(1, 2)  # (N, M*H, L)
        weights = torch.softmax(scores, dim=-1).reshape(n, m, heads, length).transpose(1, 2)
        y = weights @ pixels.reshape(n, length, heads, d).transpose(1, 2)  # (N, H, M, d)
        return y.transpose(1, 2).reshape(n, m, channels)
    features = x.reshape(n, channels, -1)  # (N, C, L), a view in either layout
    length = features.shape[-1]
    scores = projected @ features  # (N, M*H, L)
    weights = torch.softmax(scores, dim=-1).reshape(n, m, heads, length)
    values = features.reshape(n, heads, d, length)
    if backward:  # values . weights: dx's parts both (N, C, L)
        y = (values @ weights.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (N, M, H, d)
    elif heads > 1 and features.stride(1) == 1:
        # channels-last: per head, values^T is a strided batch that the product first
        # copies whole. Every head's weights against all channels reads x once as the
        # (N, L, C) it is, and each channel keeps its own head's block: heads times the
        # multiplications, faster up to 64 heads (docs/performance.md)
        every = (weights.reshape(n, m * heads, length) @ features.transpose(1, 2)).reshape(
            n, m, heads, heads, d)
        y = torch.diagonal(every, dim1=2, dim2=3).transpose(-1, -2)  # (N, M, H, d)
    else:  # weights . values is the faster product (0.49 ms against 0.96 here)
        y = (weights.transpose(1, 2) @ values.transpose(-1, -2)).transpose(1, 2)
    return y.reshape(n, -1, channels)


# --------------------------------------------------------------------------- modules


class _Module(nn.Module):
    """A kind's module: prints as ``poolgrad.Name(...)``, as the core's modules do, so
    that ``print(model)`` after :func:`~poolgrad.torch.replace_pooling` shows them."""

    def _get_name(self):
        name = type(self).__name__
        return f"poolgrad.{name}" if type(self).__module__ == __name__ else name


class _Kind(_Module):
    """A kind as a module: ``function(x, **options)``."""

    function = None

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, x):
        return type(self).function(x, **self.options)

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


class BlurPool(_Kind):
    """:func:`blur_pool` as a module."""
    function = staticmethod(blur_pool)

    def __init__(self, stride=2, filter_size=3, padding_mode="reflect", padding=None, *,
                 spatial_dims=None):
        super().__init__(stride=stride, filter_size=filter_size, padding_mode=padding_mode,
                         padding=padding, spatial_dims=spatial_dims)


class MaxBlurPool(_Kind):
    """:func:`max_blur_pool` as a module."""
    function = staticmethod(max_blur_pool)

    def __init__(self, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                 padding=None, *, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, stride=stride, filter_size=filter_size,
                         padding_mode=padding_mode, padding=padding,
                         spatial_dims=spatial_dims)


class AvgBlurPool(MaxBlurPool):
    """:func:`avg_blur_pool` as a module."""
    function = staticmethod(avg_blur_pool)


class SoftPool(_Kind):
    """:func:`soft_pool` as a module."""
    function = staticmethod(soft_pool)

    def __init__(self, kernel_size, stride=None, padding=0, *, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         spatial_dims=spatial_dims)


class StochasticPool(_Kind):
    """:func:`stochastic_pool` as a module: draws in training (from its own generator,
    seeded by ``seed``, or torch's default one), the weighted average in evaluation."""

    def __init__(self, kernel_size, stride=None, padding=0, *, seed=None, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         spatial_dims=spatial_dims)
        self.seed = seed
        self._generator = None

    def forward(self, x):
        if self.training and self.seed is not None and self._generator is None:
            self._generator = torch.Generator(device=x.device).manual_seed(self.seed)
        return stochastic_pool(x, **self.options, training=self.training,
                               generator=self._generator)


class FractionalMaxPool(_Kind):
    """:func:`fractional_max_pool` as a module: fresh windows every call (as torch's),
    drawn from its own CPU generator when seeded."""

    def __init__(self, kernel_size, output_size=None, output_ratio=None, *,
                 sequence="pseudo_random", seed=None, spatial_dims=None):
        super().__init__(kernel_size=kernel_size, output_size=output_size,
                         output_ratio=output_ratio, sequence=sequence,
                         spatial_dims=spatial_dims)
        self._generator = None if seed is None else torch.Generator().manual_seed(seed)

    def manual_seed(self, seed: int) -> FractionalMaxPool:
        """Draw the windows from ``seed`` again, as from a fresh module: passes that must
        see the same windows (an input and its shifted copy) reseed before each."""
        self._generator = torch.Generator().manual_seed(seed)
        return self

    def forward(self, x):
        return fractional_max_pool(x, **self.options, generator=self._generator)


class GeMPool(_Module):
    """:func:`gem_pool` as a module, ``p`` a parameter (fixed with ``learn=False``)."""

    def __init__(self, p=3.0, kernel_size=None, stride=None, eps=1e-6, *, learn=True,
                 spatial_dims=None):
        super().__init__()
        # refused here, not at the first forward (gem_pool checks p again at every call,
        # where an optimizer may have stepped it out of range)
        value = torch.tensor(inputs.check_p(p), dtype=torch.float64)
        if learn:
            self.p = nn.Parameter(value)
        else:  # moves with the module (.to, .cuda), outside its state as before
            self.register_buffer("p", value, persistent=False)
        self.kernel_size, self.stride = kernel_size, stride
        self.eps = inputs.check_real(eps, "eps", positive=True)
        self.spatial_dims = spatial_dims

    def forward(self, x):
        return gem_pool(x, self.p, self.kernel_size, self.stride, self.eps,
                        spatial_dims=self.spatial_dims)


class MixedPool(_Module):
    """:func:`mixed_pool` as a module, ``alpha`` a parameter (fixed with ``learn=False``)."""

    def __init__(self, kernel_size, stride=None, padding=0, alpha=0.5, *, learn=True,
                 spatial_dims=None):
        super().__init__()
        value = torch.tensor(inputs.check_real(alpha, "alpha"), dtype=torch.float64)
        self.alpha = nn.Parameter(value) if learn else value
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.spatial_dims = spatial_dims

    def forward(self, x):
        return mixed_pool(x, self.kernel_size, self.stride, self.padding,
                          self.alpha.to(x.dtype), spatial_dims=self.spatial_dims)


class GatedPool(_Module):
    """:func:`gated_pool` as a module, the gate (zeros: an even blend) a parameter. The
    window has ``spatial_dims`` dims (``ndim``, its older name), else as many as a
    per-dim kernel_size, else 2."""

    def __init__(self, kernel_size, stride=None, padding=0, *, ndim=None, learn=True,
                 spatial_dims=None):
        super().__init__()
        window = inputs.gate_window(kernel_size, spatial_dims, ndim)
        value = torch.zeros(window, dtype=torch.float64)
        self.gate = nn.Parameter(value) if learn else value
        self.kernel_size, self.stride, self.padding = window, stride, padding
        self.spatial_dims = spatial_dims

    def forward(self, x):
        return gated_pool(x, self.gate, self.kernel_size, self.stride, self.padding,
                          spatial_dims=self.spatial_dims)


class AttentionPool(_Module):
    """:func:`attention_pool` as a readout head in place of global average pooling:
    ``(N, channels, *spatial)`` to ``(N, queries * channels)`` (unbatched with
    ``spatial_dims``: ``(channels, *spatial)`` to ``(queries * channels,)``). The queries
    start at 0 (global average pooling), the key projection at ``N(0, 1 / channels)``
    (drawn from ``generator`` if given)."""

    def __init__(self, channels: int, heads: int = 1, queries: int = 1, *, generator=None,
                 spatial_dims=None):
        super().__init__()
        inputs.check_attention_sizes(channels, heads, queries)
        self.heads, self.spatial_dims = heads, spatial_dims
        self.queries = nn.Parameter(torch.zeros(queries, channels))
        self.key_weight = nn.Parameter(
            torch.randn(channels, channels, generator=generator) / math.sqrt(channels))

    def forward(self, x):
        y = attention_pool(x, self.queries, self.key_weight, self.heads,
                           spatial_dims=self.spatial_dims)
        return y.flatten(-2)  # (N, M, C) or unbatched (M, C)
