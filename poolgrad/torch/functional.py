"""``torch.nn.functional``'s pooling functions, with poolgrad's kernels and semantics.

The names and signatures are ``torch.nn.functional``'s: ``max_pool1d/2d/3d``,
``avg_pool*``, ``lp_pool*``, ``adaptive_max_pool*``, ``adaptive_avg_pool*`` and
``max_unpool*``. poolgrad's extras are keyword arguments torch does not have: padding
``"same"``, ``"valid"`` and ``(before, after)`` pairs for every sliding pool; padding
and ``dilation`` for Lp; ``dilation`` for average; ``ties="split"`` for max.

Where poolgrad differs from torch (all documented in the README's semantics table):

- ``lp_pool*`` takes ``abs(x)`` (ONNX LpPool); torch computes ``sum(x**p)**(1/p)``,
  NaN or sign-flipped for negative inputs. They agree on non-negative inputs without
  ``ceil_mode`` partial windows (torch scales those as if they were whole).
- padding may exceed half the kernel as long as every window holds an input element
  (ONNX's rule).
- a window holding NaN routes its gradient to its first NaN (torch's CPU kernel: the
  last).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _inputs as inputs
from .. import geometry
from ..engines import TIE_RULES
from . import _ops as ops
from ._autograd import call

__all__ = [f"{name}{n}d" for name in ("max_pool", "avg_pool", "lp_pool", "adaptive_max_pool",
                                      "adaptive_avg_pool", "max_unpool") for n in (1, 2, 3)]



def batched(input, ndim: int, name: str, dtypes=ops.FLOAT_DTYPES) -> tuple[Tensor, bool]:
    """``input`` as ``(N, C, *spatial)``, and whether it came unbatched; its dtype one of
    ``dtypes``."""
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() not in (ndim + 1, ndim + 2):
        raise ValueError(
            f"{name}: input must have {ndim + 1} dims (C, *spatial) or {ndim + 2} dims "
            f"(N, C, *spatial) for {ndim} spatial dim(s), got shape {tuple(input.shape)}")
    if input.dtype not in dtypes:
        names = [str(d).removeprefix("torch.") for d in dtypes]
        raise TypeError(f"{name}: input must be {', '.join(names[:-1])} or {names[-1]}, got "
                        f"{input.dtype}")
    if input.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: poolgrad.torch runs on CPU and CUDA tensors, got a "
                         f"tensor on {input.device}; move it with .cpu() or .cuda()")
    if any(s < 1 for s in input.shape[-ndim:]):
        raise ValueError(f"{name}: input has an empty spatial dim: shape "
                         f"{tuple(input.shape)}")
    unbatched = input.dim() == ndim + 1
    return (input.unsqueeze(0) if unbatched else input), unbatched


def _keeps_winners(x: Tensor, ties: str) -> bool:
    """Whether max pooling should keep its winners for a backward: when one may follow.
    An export's or a JIT trace's graph must not depend on the grad mode, so there it is
    the tie rule that decides: first-maximum ties take the values-only op (its backward
    recomputes the winners), split ties :func:`ops.max_pool` (its backward shares them)."""
    if torch.compiler.is_exporting() or torch.jit.is_tracing():
        return ties != "first"
    return torch.is_grad_enabled() and x.requires_grad


def sliding(x: Tensor, ndim, kernel_size, stride, padding, dilation, ceil_mode) -> list[int]:
    window = arguments(_window)(ndim, kernel_size, stride, padding, dilation, ceil_mode,
                                tuple(x.shape[2:]))
    return list(window)


def arguments(function):
    """A :func:`poolgrad._inputs.memoized` check of the arguments, or under
    ``torch.compile`` the check itself, which Dynamo traces."""
    return function.uncached if torch.compiler.is_compiling() else function


@inputs.memoized
def _window(ndim, kernel_size, stride, padding, dilation, ceil_mode, spatial) -> tuple[int, ...]:
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    no_stride = stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0)
    stride = kernel if no_stride else geometry.per_dim(stride, ndim, "stride")
    dilation = geometry.per_dim(dilation, ndim, "dilation")
    pads = geometry.resolve_padding(padding, spatial, kernel, stride, dilation)
    ceil_mode = geometry.flag(ceil_mode, "ceil_mode")
    return tuple(ops.sliding_window(kernel, stride, pads, dilation, ceil_mode))


def unbatch(t: Tensor, unbatched: bool) -> Tensor:
    return t.squeeze(0) if unbatched else t


# -------------------------------------------------------------------------------- max


def _max_pool(input, ndim, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
              ties):
    name = f"max_pool{ndim}d"
    x, unbatched = batched(input, ndim, name, ops.MAX_DTYPES)
    if ties not in TIE_RULES:
        raise ValueError(f"{name}: ties must be one of {TIE_RULES}, got {ties!r}")
    window = sliding(x, ndim, kernel_size, stride, padding, dilation, ceil_mode)
    return max_result(x, window, unbatched, return_indices, ties)


def max_result(x, window, unbatched, return_indices, ties):
    return_indices = geometry.flag(return_indices, "return_indices")
    if not (return_indices or _keeps_winners(x, ties)):
        return unbatch(call(ops.max_pool_values, x, window), unbatched)
    y, winners = call(ops.max_pool, x, window, ties)
    if not return_indices:
        return unbatch(y, unbatched)
    indices = call(ops.max_pool_indices, winners, window, list(x.shape))
    return unbatch(y, unbatched), unbatch(indices, unbatched)


def _adaptive_max_pool(input, ndim, output_size, return_indices):
    x, unbatched = batched(input, ndim, f"adaptive_max_pool{ndim}d", ops.MAX_DTYPES)
    window = ops.adaptive_window(inputs.adaptive_sizes(output_size, x.shape[2:], ndim))
    return max_result(x, window, unbatched, return_indices, "first")


_MAX_DOC = """Max pooling over {n} spatial dim(s): ``torch.nn.functional.max_pool{n}d``.

    Each output is its window's largest input; padding never wins. A plain call keeps
    nothing; when ``input`` requires grad the op records each window's winning tap in 1
    byte (uint8; uint16 beyond 256 taps) for the backward, where PyTorch keeps int64.

    Args:
        input: ``(N, C, *spatial)`` or ``(C, *spatial)``, float16, bfloat16, float32,
            float64 or an integer dtype (uint8, int8 to int64: values and indices, no
            gradient), on the CPU or CUDA; channels-last input gives channels-last output.
        kernel_size, stride (default: kernel_size), dilation: an int or one per dim.
        padding: an int or one per dim, as in torch; also ``"same"``, ``"valid"`` or one
            ``(before, after)`` pair per dim.
        ceil_mode, return_indices: as in torch (indices are int64, torch's convention).
        ties: ``"first"`` (torch's rule) or ``"split"`` (tied maxima share the gradient).
    """


def _make_max_pool(ndim):
    def max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 return_indices=False, *, ties="first"):
        return _max_pool(input, ndim, kernel_size, stride, padding, dilation, ceil_mode,
                         return_indices, ties)
    return _named(max_pool, f"max_pool{ndim}d", _MAX_DOC, ndim)


def _make_adaptive_max_pool(ndim):
    def adaptive_max_pool(input, output_size, return_indices=False):
        return _adaptive_max_pool(input, ndim, output_size, return_indices)
    return _named(adaptive_max_pool, f"adaptive_max_pool{ndim}d", _ADAPTIVE_DOC, ndim)


def _named(function, name, doc, ndim):
    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc.format(n=ndim)
    function.__module__ = __name__
    return function


_ADAPTIVE_DOC = """Pooling over {n} spatial dim(s) to a fixed output size, with torch's bins:
    output ``o`` of an axis of length ``L`` pools ``[floor(o*L/out), ceil((o+1)*L/out))``.
    ``output_size`` is an int or one per dim, ``None`` keeping that dim's size. An output
    size of all ones uses the global-pooling kernels.
    """


# ---------------------------------------------------------------------------- average


def _avg_pool(input, ndim, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override, dilation):
    name = f"avg_pool{ndim}d"
    x, unbatched = batched(input, ndim, name)
    window = sliding(x, ndim, kernel_size, stride, padding, dilation, ceil_mode)
    divisor_override = inputs.check_divisor_override(divisor_override, f"{name}: ")
    include = geometry.flag(count_include_pad, "count_include_pad")
    return unbatch(call(ops.avg_pool, x, window, include, divisor_override), unbatched)


def _adaptive_avg_pool(input, ndim, output_size):
    x, unbatched = batched(input, ndim, f"adaptive_avg_pool{ndim}d")
    window = ops.adaptive_window(inputs.adaptive_sizes(output_size, x.shape[2:], ndim))
    return unbatch(call(ops.avg_pool, x, window, False, None), unbatched)


_AVG_DOC = """Average pooling over {n} spatial dim(s): ``torch.nn.functional.avg_pool{n}d``.

    The divisor is ``divisor_override`` if given, else with ``count_include_pad`` the
    window's taps inside the padded input, else its taps inside the input. Padding also
    takes ``"same"``, ``"valid"`` and ``(before, after)`` pairs, and ``dilation`` (a
    poolgrad extra, as in ONNX AveragePool) spaces the taps.
    """


def _make_avg_pool(ndim):
    def avg_pool(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None, *, dilation=1):
        return _avg_pool(input, ndim, kernel_size, stride, padding, ceil_mode,
                         count_include_pad, divisor_override, dilation)
    return _named(avg_pool, f"avg_pool{ndim}d", _AVG_DOC, ndim)


def _make_adaptive_avg_pool(ndim):
    def adaptive_avg_pool(input, output_size):
        return _adaptive_avg_pool(input, ndim, output_size)
    return _named(adaptive_avg_pool, f"adaptive_avg_pool{ndim}d", _ADAPTIVE_DOC, ndim)


# --------------------------------------------------------------------------------- Lp


def _lp_pool(input, ndim, norm_type, kernel_size, stride, ceil_mode, padding, dilation):
    x, unbatched = batched(input, ndim, f"lp_pool{ndim}d")
    p = inputs.check_p(norm_type)
    window = sliding(x, ndim, kernel_size, stride, padding, dilation, ceil_mode)
    return unbatch(call(ops.lp_pool, x, p, window), unbatched)


_LP_DOC = """Power-average pooling over {n} spatial dim(s): ``torch.nn.functional.lp_pool{n}d``.

    ``(sum over the window of abs(x)**p) ** (1/p)``, the ONNX LpPool definition. torch
    takes no absolute value (NaN or sign-flipped for negative inputs); the two agree on
    non-negative inputs, except on ``ceil_mode``'s partial windows, which torch scales as
    if they were whole. ``padding`` (adding 0) and ``dilation`` are poolgrad extras.
    """


def _make_lp_pool(ndim):
    def lp_pool(input, norm_type, kernel_size, stride=None, ceil_mode=False, *, padding=0,
                dilation=1):
        return _lp_pool(input, ndim, norm_type, kernel_size, stride, ceil_mode, padding,
                        dilation)
    return _named(lp_pool, f"lp_pool{ndim}d", _LP_DOC, ndim)


# -------------------------------------------------------------------------- unpooling


def _max_unpool(input, indices, ndim, kernel_size, stride, padding, output_size):
    name = f"max_unpool{ndim}d"
    y, unbatched = batched(input, ndim, name)
    if not isinstance(indices, Tensor) or indices.dtype != torch.int64:
        got = indices.dtype if isinstance(indices, Tensor) else type(indices).__name__
        raise TypeError(f"{name}: indices must be an int64 tensor (as max_pool{ndim}d "
                        f"returns), got {got}")
    if indices.shape != input.shape:
        raise ValueError(f"{name}: indices has shape {tuple(indices.shape)} but input has "
                         f"shape {tuple(input.shape)}; they must match")
    if isinstance(padding, str):
        raise ValueError(f"{name}: padding must be numeric (an int, one per dim or "
                         f"(before, after) pairs), got {padding!r}")
    spatial = tuple(y.shape[2:])
    window = _window(ndim, kernel_size, stride, padding, 1, False, spatial)
    kernel, stride, pads, _, _ = ops.sliding_args(window)
    out_spatial = geometry.unpool_output_spatial(spatial, kernel, stride, pads, output_size,
                                                 tuple(input.shape[:-ndim]))
    batched_indices = indices.unsqueeze(0) if unbatched else indices
    return unbatch(call(ops.max_unpool, y, batched_indices, window, list(out_spatial)),
                    unbatched)


_UNPOOL_DOC = """The partial inverse of max pooling over {n} spatial dim(s):
    ``torch.nn.functional.max_unpool{n}d``. Zeros, with each value at its int64 index (flat
    in its ``(n, c)`` plane, as ``max_pool{n}d(..., return_indices=True)`` gives). Where
    several entries name one place, the last in row-major order is written and gets that
    place's gradient. ``output_size`` as in torch: spatial sizes or the full shape.
    """


def _make_max_unpool(ndim):
    def max_unpool(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        return _max_unpool(input, indices, ndim, kernel_size, stride, padding, output_size)
    return _named(max_unpool, f"max_unpool{ndim}d", _UNPOOL_DOC, ndim)


max_pool1d, max_pool2d, max_pool3d = (_make_max_pool(n) for n in (1, 2, 3))
avg_pool1d, avg_pool2d, avg_pool3d = (_make_avg_pool(n) for n in (1, 2, 3))
lp_pool1d, lp_pool2d, lp_pool3d = (_make_lp_pool(n) for n in (1, 2, 3))
adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d = (
    _make_adaptive_max_pool(n) for n in (1, 2, 3))
adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d = (
    _make_adaptive_avg_pool(n) for n in (1, 2, 3))
max_unpool1d, max_unpool2d, max_unpool3d = (_make_max_unpool(n) for n in (1, 2, 3))
