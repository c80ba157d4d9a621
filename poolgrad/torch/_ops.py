"""poolgrad's pooling as PyTorch operators: ``torch.ops.poolgrad.*``.

This module defines each operator, a :func:`torch.library.custom_op` with its schema
and its fake implementation (for ``torch.compile``), and holds the helpers every device
shares. The implementations register themselves against these operators
(:func:`implement`): :mod:`._cpu` runs the NumPy engines of :mod:`poolgrad.engines` on
``tensor.numpy()`` views, :mod:`._cuda` the Triton kernels of :mod:`.triton`. On any
other device an operator raises a ValueError that says so. :mod:`._autograd` gives each
operator its autograd formula. Every backward is an operator of its own with its own
formula, so gradients of gradients work:

============================  =====================================  ==================
operator                      what it computes                       its gradient
============================  =====================================  ==================
``max_pool``                  values and winners (1 byte per output) ``max_pool_backward``
``max_pool_values``           values only (inference)                recomputes winners
``max_pool_backward``         ``dy`` routed to the winners           ``max_pool_gather``
``max_pool_gather``           ``dx`` read at the winners             ``max_pool_backward``
``max_pool_split_backward``   ``ties="split"``: shared among ties    a masked window sum
``max_pool_indices``          PyTorch's int64 indices from winners   (integer output)
``avg_pool``                  window means                           ``avg_pool_backward``
``avg_pool_backward``         ``dy`` spread over the windows         ``avg_pool``
``lp_pool``                   Lp norms of the windows                ``lp_pool_backward``
``lp_pool_backward``          the Lp gradient                        window-sum composites
``max_unpool``                values back at their indices           ``max_unpool_backward``
``max_unpool_backward``       the unpooled gradient at the indices   ``max_unpool``
============================  =====================================  ==================

Inputs are batched ``(N, C, *spatial)`` (:mod:`poolgrad.torch.functional` adds and
removes the batch dim). The window geometry travels as one list of ints, its canonical
form (:func:`sliding_window`, :func:`adaptive_window`). Outputs and gradients keep the
input's memory format (channels-last in, channels-last out).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from .. import geometry

SLIDING, ADAPTIVE = 0, 1
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# max pooling also takes integers (values and indices; integers carry no gradient)
MAX_DTYPES = (*FLOAT_DTYPES, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
DEVICES = ("cpu", "cuda")


# ------------------------------------------------------------------- window geometry


def sliding_window(kernel, stride, padding, dilation, ceil_mode) -> list[int]:
    """``[SLIDING, *kernel, *stride, *before, *after, *dilation, ceil_mode]`` from
    canonical per-dim tuples and ``(before, after)`` pairs."""
    before = [lo for lo, _ in padding]
    after = [hi for _, hi in padding]
    return [SLIDING, *kernel, *stride, *before, *after, *dilation, int(ceil_mode)]


def adaptive_window(output_size) -> list[int]:
    """``[ADAPTIVE, *output_size]``."""
    return [ADAPTIVE, *output_size]


def window_ndim(window) -> int:
    return len(window) - 1 if window[0] == ADAPTIVE else (len(window) - 2) // 5


def sliding_args(window) -> tuple:
    """``(kernel, stride, padding pairs, dilation, ceil_mode)`` of a sliding window."""
    n = window_ndim(window)
    k, s, lo, hi, d = (tuple(window[1 + i * n: 1 + (i + 1) * n]) for i in range(5))
    return k, s, tuple(zip(lo, hi, strict=True)), d, bool(window[-1])


def plan_of(window, in_spatial) -> geometry.WindowPlan:
    return _plan(tuple(window), tuple(int(s) for s in in_spatial))


@functools.lru_cache(maxsize=1024)
def _plan(window: tuple[int, ...], in_spatial: tuple[int, ...]) -> geometry.WindowPlan:
    if window[0] == ADAPTIVE:
        return geometry.adaptive_plan(in_spatial, tuple(window[1:]))
    kernel, stride, pads, dilation, ceil_mode = sliding_args(window)
    return geometry.sliding_plan(in_spatial, kernel, stride, dilation, pads, ceil_mode)


def is_global(window) -> bool:
    """Whether ``window`` is one window over each whole plane."""
    return window[0] == ADAPTIVE and all(o == 1 for o in window[1:])


def avg_kind(window) -> str:
    """The dispatch's op for an average over ``window``: a global one has its own."""
    return "global_avg" if is_global(window) else "avg"


def divisor_mode(window, count_include_pad) -> str:
    return "padded" if count_include_pad and window[0] == SLIDING else "real"


def out_shape(x: Tensor, window) -> list:
    """The output shape: geometry's arithmetic rule alone (no window tables), so that
    symbolic sizes (``dynamic=True``) pass through the fake implementations."""
    if window[0] == ADAPTIVE:
        return [*x.shape[:2], *window[1:]]
    kernel, stride, pads, dilation, ceil_mode = sliding_args(window)
    sizes = [geometry.output_length(length, k, s, d, lo, hi, ceil_mode, axis)
             for axis, (length, k, s, (lo, hi), d) in enumerate(
                 zip(x.shape[2:], kernel, stride, pads, dilation, strict=True))]
    return [*x.shape[:2], *sizes]


TORCH_DTYPE = {np.dtype(np.uint8): torch.uint8, np.dtype(np.uint16): torch.uint16,
                np.dtype(np.uint32): torch.uint32, np.dtype(np.uint64): torch.uint64}


def winner_dtype(x: Tensor, window) -> torch.dtype:
    """The dtype of max pooling's winners: the smallest unsigned type that numbers a
    window's taps."""
    if window[0] == SLIDING:
        taps = math.prod(sliding_args(window)[0])
    else:  # an adaptive bin's extent depends on the input size
        taps = plan_of(window, [int(s) for s in x.shape[2:]]).window_size
    return TORCH_DTYPE[geometry.position_dtype(taps)]


# ------------------------------------------------------------------- memory formats


def memory_format(t: Tensor) -> torch.memory_format:
    """channels_last (3d) for a 4-d (5-d) tensor stored so and not also contiguous: the
    one channels-last test of poolgrad.torch (NumPy arrays have
    :func:`poolgrad.kernels.dispatch.is_channels_last`)."""
    if t.dim() > 3 and not t.is_contiguous():
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return torch.channels_last
        if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            return torch.channels_last_3d
    return torch.contiguous_format


def is_channels_last(t: Tensor) -> bool:
    return memory_format(t) != torch.contiguous_format


def format_of(channels_last: bool, dims: int) -> torch.memory_format:
    if channels_last and dims in (4, 5):
        return torch.channels_last if dims == 4 else torch.channels_last_3d
    return torch.contiguous_format


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype ``t``'s values are computed in: float64 for float64, else float32
    (the engines' rule: half precisions are computed in float32)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


@functools.lru_cache(maxsize=256)
def constant(values: tuple[float, ...], dtype: torch.dtype, device) -> Tensor:
    """``values`` as a 1-d tensor of ``dtype`` on ``device``, kept per arguments: a call
    under CUDA graph capture then copies nothing to the device (after a first call
    outside it), and a kernel gets the values in ``dtype`` (a Python float reaches a
    Triton kernel as float32)."""
    return torch.tensor(values, dtype=dtype, device=device)


def empty(shape, like: Tensor, fmt, dtype=None) -> Tensor:
    """A result as every implementation returns it (and the fake ones describe it)."""
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device,
                       memory_format=fmt)


# ------------------------------------------------------------------------ operators

# device -> {op: its implementation there}, for the operators' direct eager calls
# (:func:`poolgrad.torch._autograd.call`)
IMPLEMENTATIONS: dict[str, dict] = {device: {} for device in DEVICES}


def define(function):
    """``torch.ops.poolgrad.<name>`` with ``function``'s schema (no mutation). The
    function is every device's default, and refuses: :func:`implement` registers the
    CPU and CUDA implementations."""
    return torch.library.custom_op(f"poolgrad::{function.__name__}", function,
                                   mutates_args=())


def implement(op, device: str):
    """Register the decorated function as ``op``'s implementation on ``device``."""
    def register(implementation):
        op.register_kernel(device)(implementation)
        IMPLEMENTATIONS[device][op] = implementation
        return implementation
    return register


def check_devices(*tensors: Tensor, allowed=DEVICES) -> None:
    """A ValueError naming the first tensor whose device type is not ``allowed``."""
    for t in tensors:
        if t.device.type not in allowed:
            raise ValueError(
                f"poolgrad.torch runs on CPU and CUDA tensors; got a tensor on {t.device}: "
                f"move it with .cpu() or .cuda()")


def refuse_device(*tensors: Tensor) -> None:
    """Every operator's default, for a device with no implementation: a ValueError that
    names the tensor off the CPU and CUDA, or the devices that lack one."""
    check_devices(*tensors)
    raise ValueError(f"poolgrad.torch has no implementation for tensors on "
                     f"{sorted({str(t.device) for t in tensors})}")


# ---------------------------------------------------------------------- max pooling


@define
def max_pool(x: Tensor, window: list[int], ties: str) -> tuple[Tensor, Tensor]:
    """Values and each window's winning tap (uint8 up to 256 taps, then uint16)."""
    refuse_device(x)


@max_pool.register_fake
def _(x, window, ties):
    shape = out_shape(x, window)
    fmt = memory_format(x)
    return empty(shape, x, fmt), empty(shape, x, fmt, winner_dtype(x, window))


@define
def max_pool_values(x: Tensor, window: list[int]) -> Tensor:
    """The values of :func:`max_pool` alone, for inference: no winners written."""
    refuse_device(x)


@max_pool_values.register_fake
def _(x, window):
    return empty(out_shape(x, window), x, memory_format(x))


@define
def max_pool_backward(dy: Tensor, winners: Tensor, window: list[int],
                      x_size: list[int]) -> Tensor:
    """``dy`` routed to each window's winner; overlapping windows add up."""
    refuse_device(dy, winners)


@max_pool_backward.register_fake
def _(dy, winners, window, x_size):
    return empty(x_size, dy, memory_format(winners))


@define
def max_pool_gather(dx: Tensor, winners: Tensor, window: list[int]) -> Tensor:
    """``dx`` read at each window's winner: the adjoint of :func:`max_pool_backward`."""
    refuse_device(dx, winners)


@max_pool_gather.register_fake
def _(dx, winners, window):
    return empty(winners.shape, dx, memory_format(winners))


@define
def max_pool_indices(winners: Tensor, window: list[int], x_size: list[int]) -> Tensor:
    """PyTorch's int64 indices: each winner's flat position in its input plane."""
    refuse_device(winners)


@max_pool_indices.register_fake
def _(winners, window, x_size):
    return empty(winners.shape, winners, memory_format(winners), torch.int64)


@define
def max_pool_split_backward(dy: Tensor, x: Tensor, window: list[int]) -> Tensor:
    """``ties="split"``: each window's ``dy`` shared equally among its tied maxima."""
    refuse_device(dy, x)


@max_pool_split_backward.register_fake
def _(dy, x, window):
    return empty(x.shape, dy, memory_format(x))


# ------------------------------------------------------------------ average pooling


@define
def avg_pool(x: Tensor, window: list[int], count_include_pad: bool,
             divisor_override: int | None) -> Tensor:
    """Window means (adaptive windows: the means of PyTorch's bins)."""
    refuse_device(x)


@avg_pool.register_fake
def _(x, window, count_include_pad, divisor_override):
    return empty(out_shape(x, window), x, memory_format(x))


@define
def avg_pool_backward(dy: Tensor, window: list[int], x_size: list[int],
                      count_include_pad: bool, divisor_override: int | None,
                      channels_last: bool) -> Tensor:
    """``dy / divisor`` spread over each window's input elements."""
    refuse_device(dy)


@avg_pool_backward.register_fake
def _(dy, window, x_size, count_include_pad, divisor_override, channels_last):
    return empty(x_size, dy, format_of(channels_last, len(x_size)))


# ----------------------------------------------------------------------- Lp pooling


@define
def lp_pool(x: Tensor, p: float, window: list[int]) -> Tensor:
    """``(sum over the window of |x|^p)^(1/p)`` (ONNX LpPool)."""
    refuse_device(x)


@lp_pool.register_fake
def _(x, p, window):
    return empty(out_shape(x, window), x, memory_format(x))


@define
def lp_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: float, window: list[int]) -> Tensor:
    """``dy * sign(x) * (|x| / y)^(p-1)`` summed over the windows holding each input."""
    refuse_device(dy, x, y)


@lp_pool_backward.register_fake
def _(dy, x, y, p, window):
    return empty(x.shape, dy, memory_format(x))


# -------------------------------------------------------------------------- unpooling


@define
def max_unpool(y: Tensor, indices: Tensor, window: list[int],
               output_size: list[int]) -> Tensor:
    """Zeros, with each value of ``y`` at its index (flat in its ``(n, c)`` plane)."""
    refuse_device(y, indices)


@max_unpool.register_fake
def _(y, indices, window, output_size):
    return empty([*y.shape[:2], *output_size], y, torch.contiguous_format)


@define
def max_unpool_backward(dout: Tensor, indices: Tensor, window: list[int]) -> Tensor:
    """``dout`` read at each index; where several entries name one place, the last
    (the one written) gets it and the others 0."""
    refuse_device(dout, indices)


@max_unpool_backward.register_fake
def _(dout, indices, window):
    return empty(indices.shape, dout, torch.contiguous_format)
