"""poolgrad's pooling as PyTorch operators: ``torch.ops.poolgrad.*``.

Each operator is a :func:`torch.library.custom_op` whose CPU implementation runs the
NumPy engines of :mod:`poolgrad.engines` on ``tensor.numpy()`` views (no copy of ``x`` or
``dy``), whose CUDA implementation (:mod:`._cuda`) runs Triton kernels, and with a fake
implementation for ``torch.compile``; :mod:`._autograd` gives each one its
autograd formula. Every backward is an operator of its own with its own formula, so
gradients of gradients work:

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
input's memory format (channels-last in, channels-last out). float16 is computed in
float32 by the engines; bfloat16, which NumPy lacks, is converted to float32 and back.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from .. import _inputs
from .. import engines, geometry, ops

SLIDING, ADAPTIVE = 0, 1
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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
    return k, s, tuple(zip(lo, hi)), d, bool(window[-1])


def plan_of(window, in_spatial) -> geometry.WindowPlan:
    return _plan(tuple(window), tuple(int(s) for s in in_spatial))


@functools.lru_cache(maxsize=1024)
def _plan(window: tuple[int, ...], in_spatial: tuple[int, ...]) -> geometry.WindowPlan:
    if window[0] == ADAPTIVE:
        return geometry.adaptive_plan(in_spatial, tuple(window[1:]))
    kernel, stride, pads, dilation, ceil_mode = sliding_args(window)
    return geometry.sliding_plan(in_spatial, kernel, stride, dilation, pads, ceil_mode)


def _global(window) -> bool:
    return window[0] == ADAPTIVE and all(o == 1 for o in window[1:])


# --------------------------------------------------------------- tensors and arrays


def memory_format(t: Tensor) -> torch.memory_format:
    """channels_last (3d) for a 4-d (5-d) tensor stored so and not also contiguous."""
    if t.dim() > 3 and not t.is_contiguous():
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return torch.channels_last
        if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            return torch.channels_last_3d
    return torch.contiguous_format


def _empty(shape, like: Tensor, fmt, dtype=None) -> Tensor:
    """What the real implementations return, for the fake ones."""
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device,
                       memory_format=fmt)


def _check_device(*tensors: Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(
                f"poolgrad.torch runs on CPU and CUDA tensors; got a tensor on {t.device}: "
                f"move it with .cpu() or .cuda()")


def _array(t: Tensor) -> np.ndarray:
    """A NumPy view of ``t`` (bfloat16: a float32 copy, NumPy has no bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


@functools.lru_cache(maxsize=1024)
def _strides(shape: tuple[int, ...], fmt: torch.memory_format) -> tuple[int, ...]:
    return torch.empty(shape, device="meta", memory_format=fmt).stride()


def _tensor(a: np.ndarray, fmt, dtype: torch.dtype | None = None) -> Tensor:
    """``a`` as a tensor (no copy when it is stored in ``fmt``), with exactly the
    strides of :func:`_empty`, converted to ``dtype`` if given."""
    t = torch.from_numpy(a)
    if not t.is_contiguous(memory_format=fmt):
        t = t.contiguous(memory_format=fmt)
    expected = _strides(tuple(t.shape), fmt)
    if t.stride() != expected:  # differs only where a dim has size 1
        t = t.as_strided(t.shape, expected)
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def _layout(shape, ndim) -> _inputs.Layout:
    return _inputs.Layout(tuple(int(s) for s in shape), ndim)


def _out_shape(x: Tensor, window) -> list:
    """The output shape, for the fake implementations: geometry's arithmetic rule alone
    (no window tables), so that symbolic sizes (``dynamic=True``) pass through."""
    if window[0] == ADAPTIVE:
        return [*x.shape[:2], *window[1:]]
    kernel, stride, pads, dilation, ceil_mode = sliding_args(window)
    sizes = [geometry.output_length(length, k, s, d, lo, hi, ceil_mode, axis)
             for axis, (length, k, s, (lo, hi), d) in enumerate(
                 zip(x.shape[2:], kernel, stride, pads, dilation, strict=True))]
    return [*x.shape[:2], *sizes]


def _winner_dtype(x: Tensor, window) -> torch.dtype:
    if window[0] == SLIDING:
        taps = math.prod(sliding_args(window)[0])
    else:  # an adaptive bin's extent depends on the input size
        taps = plan_of(window, [int(s) for s in x.shape[2:]]).window_size
    return _TORCH_DTYPE[geometry.position_dtype(taps)]


# ------------------------------------------------------------------------ operators

# op -> its CPU implementation, which poolgrad.torch.functional may call directly in
# plain eager inference (see there); CUDA_IMPLEMENTATIONS likewise for CUDA tensors
CPU_IMPLEMENTATIONS: dict = {}
CUDA_IMPLEMENTATIONS: dict = {}


def _operator(name: str):
    """Register the decorated function as ``torch.ops.poolgrad.<name>`` (no mutation)."""
    def register(implementation):
        op = torch.library.custom_op(f"poolgrad::{name}", implementation, mutates_args=())
        CPU_IMPLEMENTATIONS[op] = implementation
        return op
    return register


# ---------------------------------------------------------------------- max pooling


@_operator("max_pool")
def max_pool(x: Tensor, window: list[int], ties: str) -> tuple[Tensor, Tensor]:
    """Values and each window's winning tap (uint8 up to 256 taps, then uint16)."""
    _check_device(x)
    xa = _array(x)
    ndim = window_ndim(window)
    layout = _layout(xa.shape, ndim)
    y, pullback = engines.max_engine(xa, layout, plan_of(window, xa.shape[2:]), False, "first",
                                 True, "max_pool")
    fmt = memory_format(x)
    winners = pullback.saved["window_positions"].reshape(y.shape)
    return _tensor(y, fmt, x.dtype), _tensor(winners, fmt)


@max_pool.register_fake
def _(x, window, ties):
    shape = _out_shape(x, window)
    fmt = memory_format(x)
    return _empty(shape, x, fmt), _empty(shape, x, fmt, _winner_dtype(x, window))


_TORCH_DTYPE = {np.dtype(np.uint8): torch.uint8, np.dtype(np.uint16): torch.uint16,
                np.dtype(np.uint32): torch.uint32, np.dtype(np.uint64): torch.uint64}


@_operator("max_pool_values")
def max_pool_values(x: Tensor, window: list[int]) -> Tensor:
    """The values of :func:`max_pool` alone, for inference: no winners written."""
    _check_device(x)
    xa = _array(x)
    layout = _layout(xa.shape, window_ndim(window))
    y, _ = engines.max_engine(xa, layout, plan_of(window, xa.shape[2:]), False, "first", False,
                          "max_pool")
    return _tensor(y, memory_format(x), x.dtype)


@max_pool_values.register_fake
def _(x, window):
    return _empty(_out_shape(x, window), x, memory_format(x))


@_operator("max_pool_backward")
def max_pool_backward(dy: Tensor, winners: Tensor, window: list[int],
                      x_size: list[int]) -> Tensor:
    """``dy`` routed to each window's winner; overlapping windows add up."""
    _check_device(dy, winners)
    ndim = window_ndim(window)
    layout = _layout(x_size, ndim)
    plan = plan_of(window, x_size[2:])
    dya = _array(dy)
    pullback = engines.max_pullback(layout.to_kernel(winners.numpy()), plan, layout, dya.dtype)
    return _tensor(pullback(dya), memory_format(winners), dy.dtype)


@max_pool_backward.register_fake
def _(dy, winners, window, x_size):
    return _empty(x_size, dy, memory_format(winners))


@_operator("max_pool_gather")
def max_pool_gather(dx: Tensor, winners: Tensor, window: list[int]) -> Tensor:
    """``dx`` read at each window's winner: the adjoint of :func:`max_pool_backward`."""
    _check_device(dx, winners)
    layout = _layout(dx.shape, window_ndim(window))
    plan = plan_of(window, dx.shape[2:])
    dy = engines.max_gather(_array(dx), layout.to_kernel(winners.numpy()), plan, layout)
    return _tensor(dy, memory_format(winners), dx.dtype)


@max_pool_gather.register_fake
def _(dx, winners, window):
    return _empty(winners.shape, dx, memory_format(winners))


@_operator("max_pool_indices")
def max_pool_indices(winners: Tensor, window: list[int], x_size: list[int]) -> Tensor:
    """PyTorch's int64 indices: each winner's flat position in its input plane."""
    _check_device(winners)
    layout = _layout(x_size, window_ndim(window))
    plan = plan_of(window, x_size[2:])
    indices = engines.winner_indices(layout.to_kernel(winners.numpy()), plan)
    return _tensor(indices.reshape(winners.shape), memory_format(winners))


@max_pool_indices.register_fake
def _(winners, window, x_size):
    return _empty(winners.shape, winners, memory_format(winners), torch.int64)


@_operator("max_pool_split_backward")
def max_pool_split_backward(dy: Tensor, x: Tensor, window: list[int]) -> Tensor:
    """``ties="split"``: each window's ``dy`` shared equally among its tied maxima."""
    _check_device(dy, x)
    xa = _array(x)
    layout = _layout(xa.shape, window_ndim(window))
    _, pullback = engines.max_engine(xa, layout, plan_of(window, xa.shape[2:]), False, "split",
                                 True, "max_pool")
    return _tensor(pullback(_array(dy)), memory_format(x), dy.dtype)


@max_pool_split_backward.register_fake
def _(dy, x, window):
    return _empty(x.shape, dy, memory_format(x))


# ------------------------------------------------------------------ average pooling


def avg_kind(window) -> str:
    return "global_avg" if _global(window) else "avg"


def divisor_mode(window, count_include_pad) -> str:
    return "padded" if count_include_pad and window[0] == SLIDING else "real"


@_operator("avg_pool")
def avg_pool(x: Tensor, window: list[int], count_include_pad: bool,
             divisor_override: int | None) -> Tensor:
    """Window means (adaptive windows: the means of PyTorch's bins)."""
    _check_device(x)
    xa = _array(x)
    layout = _layout(xa.shape, window_ndim(window))
    y, _ = engines.avg_engine(xa, layout, plan_of(window, xa.shape[2:]),
                          divisor_mode(window, count_include_pad), divisor_override, False,
                          "avg_pool", avg_kind(window))
    return _tensor(y, memory_format(x), x.dtype)


@avg_pool.register_fake
def _(x, window, count_include_pad, divisor_override):
    return _empty(_out_shape(x, window), x, memory_format(x))


@_operator("avg_pool_backward")
def avg_pool_backward(dy: Tensor, window: list[int], x_size: list[int],
                      count_include_pad: bool, divisor_override: int | None,
                      channels_last: bool) -> Tensor:
    """``dy / divisor`` spread over each window's input elements."""
    _check_device(dy)
    ndim = window_ndim(window)
    layout = _layout(x_size, ndim)
    dya = _array(dy)
    pullback = engines.avg_pullback(plan_of(window, x_size[2:]), layout, dya.dtype,
                                channels_last, divisor_mode(window, count_include_pad),
                                divisor_override, kind=avg_kind(window))
    return _tensor(pullback(dya), format_of(channels_last, len(x_size)), dy.dtype)


@avg_pool_backward.register_fake
def _(dy, window, x_size, count_include_pad, divisor_override, channels_last):
    return _empty(x_size, dy, format_of(channels_last, len(x_size)))


def format_of(channels_last: bool, dims: int) -> torch.memory_format:
    if channels_last and dims in (4, 5):
        return torch.channels_last if dims == 4 else torch.channels_last_3d
    return torch.contiguous_format


# ----------------------------------------------------------------------- Lp pooling


@_operator("lp_pool")
def lp_pool(x: Tensor, p: float, window: list[int]) -> Tensor:
    """``(sum over the window of |x|^p)^(1/p)`` (ONNX LpPool)."""
    _check_device(x)
    xa = _array(x)
    layout = _layout(xa.shape, window_ndim(window))
    y, _ = engines.lp_engine(xa, layout, plan_of(window, xa.shape[2:]), p, False, "lp_pool")
    return _tensor(y, memory_format(x), x.dtype)


@lp_pool.register_fake
def _(x, p, window):
    return _empty(_out_shape(x, window), x, memory_format(x))


@_operator("lp_pool_backward")
def lp_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: float, window: list[int]) -> Tensor:
    """``dy * sign(x) * (|x| / y)^(p-1)`` summed over the windows holding each input."""
    _check_device(dy, x, y)
    xa, ya = _array(x), _array(y)
    layout = _layout(xa.shape, window_ndim(window))
    xk, yk = _inputs.compute_view(xa, layout), _inputs.compute_view(ya, layout)
    pullback = engines.lp_pullback(xk, yk, p, plan_of(window, xa.shape[2:]), layout, xa.dtype)
    return _tensor(pullback(_array(dy)), memory_format(x), dy.dtype)


@lp_pool_backward.register_fake
def _(dy, x, y, p, window):
    return _empty(x.shape, dy, memory_format(x))


# -------------------------------------------------------------------------- unpooling


@_operator("max_unpool")
def max_unpool(y: Tensor, indices: Tensor, window: list[int],
               output_size: list[int]) -> Tensor:
    """Zeros, with each value of ``y`` at its index (flat in its ``(n, c)`` plane)."""
    _check_device(y, indices)
    kernel, stride, pads, _, _ = sliding_args(window)
    out = ops.max_unpool(_array(y), indices.numpy(), kernel, stride, pads, tuple(output_size))
    return _tensor(out, torch.contiguous_format, y.dtype)


@max_unpool.register_fake
def _(y, indices, window, output_size):
    return _empty([*y.shape[:2], *output_size], y, torch.contiguous_format)


@_operator("max_unpool_backward")
def max_unpool_backward(dout: Tensor, indices: Tensor, window: list[int]) -> Tensor:
    """``dout`` read at each index; where several entries name one place, the last
    (the one written) gets it and the others 0."""
    _check_device(dout, indices)
    kernel, stride, pads, _, _ = sliding_args(window)
    douta = _array(dout)
    zeros = np.zeros(tuple(indices.shape), dtype=douta.dtype)
    _, pullback = ops.vjp(ops.max_unpool, zeros, indices.numpy(), kernel, stride, pads,
                          douta.shape[2:])
    return _tensor(pullback(douta), torch.contiguous_format, dout.dtype)


@max_unpool_backward.register_fake
def _(dout, indices, window):
    return _empty(indices.shape, dout, torch.contiguous_format)


# ------------------------------------------------------------------------------ CUDA


def _register_cuda() -> None:
    """Each operator's CUDA kernel: :mod:`._cuda` (Triton, imported when first run)."""
    from . import _cuda
    for name, implementation in _cuda.IMPLEMENTATIONS.items():
        op = globals()[name]
        op.register_kernel("cuda")(implementation)
        CUDA_IMPLEMENTATIONS[op] = implementation


_register_cuda()
