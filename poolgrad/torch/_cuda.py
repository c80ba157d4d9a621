"""The CUDA implementations of the ``torch.ops.poolgrad`` operators (:mod:`._ops`).

Each takes the arguments of its operator and returns what the CPU implementation
returns, with the same shapes, dtypes and strides (the fake implementations describe
both), computed by the Triton kernels that :func:`.triton.dispatch.choose` picks.
Outputs are allocated with ``torch.empty`` on the input's device, and every kernel
launches on the current stream, so the operators work under CUDA graph capture.
Importing this module registers them; Triton is imported when a kernel first runs.

The functions never look at the device: under ``TRITON_INTERPRET=1`` they run on CPU
tensors, which is how the tests check them without a GPU (:data:`IMPLEMENTATIONS`).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .. import geometry
from . import _kind_ops, _ops
from ._fractional import covering_windows, device_windows, extent_bound
from ._ops import empty
from .triton import dispatch


def _five(t: Tensor) -> Tensor:
    """The ``(N, C, D, H, W)`` view of an ``(N, C, *spatial)`` tensor (no copy)."""
    while t.dim() < 5:
        t = t.unsqueeze(2)
    return t


def _out_shape(x: Tensor, plan) -> list[int]:
    return [*x.shape[:2], *plan.out_spatial]


# ---------------------------------------------------------------------- max pooling


def max_pool(x: Tensor, window: list[int], ties: str) -> tuple[Tensor, Tensor]:
    plan = _ops.plan_of(window, x.shape[2:])
    fmt = _ops.memory_format(x)
    y = empty(_out_shape(x, plan), x, fmt)
    winners = empty(y.shape, x, fmt, _ops.winner_dtype(x, window))
    dispatch.choose("max", "forward", plan, record=True)(_five(x), _five(y), _five(winners))
    return y, winners


def max_pool_values(x: Tensor, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    y = empty(_out_shape(x, plan), x, _ops.memory_format(x))
    dispatch.choose("max", "forward", plan)(_five(x), _five(y), None)
    return y


def max_pool_backward(dy: Tensor, winners: Tensor, window: list[int],
                      x_size: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x_size[2:])
    dx = empty(x_size, dy, _ops.memory_format(winners))
    dispatch.choose("max", "backward", plan)(_five(dy), _five(winners), _five(dx))
    return dx


def max_pool_gather(dx: Tensor, winners: Tensor, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, dx.shape[2:])
    dy = empty(winners.shape, dx, _ops.memory_format(winners))
    dispatch.choose("max", "gather", plan)(_five(dx), _five(winners), _five(dy))
    return dy


def max_pool_indices(winners: Tensor, window: list[int], x_size: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x_size[2:])
    indices = empty(winners.shape, winners, _ops.memory_format(winners), torch.int64)
    dispatch.choose("max", "indices", plan)(_five(winners), _five(indices))
    return indices


def max_pool_split_backward(dy: Tensor, x: Tensor, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    fmt = _ops.memory_format(x)
    y, winners = max_pool(x, window, "first")
    ties = empty(y.shape, x, fmt, _ops.compute_dtype(x))
    dispatch.choose("max", "tie_count", plan)(_five(x), _five(y), _five(ties))
    dx = empty(x.shape, dy, fmt)
    dispatch.choose("max", "split", plan)(_five(x), _five(y), _five(dy), _five(ties),
                                      _five(winners), _five(dx))
    return dx


# ------------------------------------------------------------------ average pooling


def avg_pool(x: Tensor, window: list[int], count_include_pad: bool,
             divisor_override: int | None) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    y = empty(_out_shape(x, plan), x, _ops.memory_format(x))
    divisor = (_ops.divisor_mode(window, count_include_pad), divisor_override)
    dispatch.choose(_ops.avg_kind(window), "forward", plan)(_five(x), _five(y), divisor)
    return y


def avg_pool_backward(dy: Tensor, window: list[int], x_size: list[int],
                      count_include_pad: bool, divisor_override: int | None,
                      channels_last: bool) -> Tensor:
    plan = _ops.plan_of(window, x_size[2:])
    dx = empty(x_size, dy, _ops.format_of(channels_last, len(x_size)))
    divisor = (_ops.divisor_mode(window, count_include_pad), divisor_override)
    dispatch.choose(_ops.avg_kind(window), "backward", plan)(_five(dy), divisor, _five(dx))
    return dx


# ----------------------------------------------------------------------- Lp pooling


def lp_pool(x: Tensor, p: float, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    y = empty(_out_shape(x, plan), x, _ops.memory_format(x))
    dispatch.choose("lp", "forward", plan)(_five(x), _five(y), p)
    return y


def lp_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: float, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    dx = empty(x.shape, dy, _ops.memory_format(x))
    dispatch.choose("lp", "backward", plan)(_five(x), _five(y), _five(dy), p, _five(dx))
    return dx


# ---------------------------------------------------------------------------------- GeM


def gem_pool(x: Tensor, p: Tensor, eps: float, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    y = empty(_out_shape(x, plan), x, _ops.memory_format(x))
    dispatch.choose("gem", "forward", plan)(_five(x), _five(y), p, eps)
    return y


def gem_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: Tensor, eps: float,
                      window: list[int], with_dp: bool) -> tuple[Tensor, Tensor]:
    plan = _ops.plan_of(window, x.shape[2:])
    dx = empty(x.shape, dy, _ops.memory_format(x))
    dispatch.choose("gem", "backward", plan)(_five(x), _five(y), _five(dy), p, eps, _five(dx))
    terms = torch.zeros(y.shape, dtype=_ops.compute_dtype(x), device=x.device)
    if with_dp:
        dispatch.choose("gem", "p_terms", plan)(_five(x), _five(y), _five(dy), p, eps,
                                                _five(terms))
    return dx, terms


# ------------------------------------------------------------------ weighted averages


def weighted_pool(x: Tensor, kind: int, window: list[int]) -> tuple[Tensor, Tensor]:
    plan = _ops.plan_of(window, x.shape[2:])
    fmt = _ops.memory_format(x)
    y = empty(_out_shape(x, plan), x, fmt)
    norm = empty(y.shape, x, fmt, _ops.compute_dtype(x))
    dispatch.choose("weighted", "forward", plan)(_five(x), _five(y), _five(norm), kind)
    return y, norm


def weighted_pool_values(x: Tensor, kind: int, window: list[int]) -> Tensor:
    return weighted_pool(x, kind, window)[0]


def weighted_pool_backward(dy: Tensor, x: Tensor, y: Tensor, norm: Tensor, kind: int,
                           window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    dx = empty(x.shape, dy, _ops.memory_format(x))
    if norm.stride() != y.stride():  # the kernel reads norm with y's strides
        y, norm = y.contiguous(), norm.contiguous()
    dispatch.choose("weighted", "backward", plan)(_five(x), _five(y), _five(norm), _five(dy),
                                                kind, _five(dx))
    return dx


# ------------------------------------------------------------ blends of max and mean


def blend_pool(x: Tensor, weights: Tensor, kind: int, window: list[int]) -> Tensor:
    plan = _ops.plan_of(window, x.shape[2:])
    y = empty(_out_shape(x, plan), x, _ops.memory_format(x))
    dispatch.choose("blend", "forward", plan)(_five(x), kind, weights.contiguous(), _five(y))
    return y


def blend_pool_backward(dy: Tensor, x: Tensor, weights: Tensor, kind: int,
                        window: list[int]) -> tuple[Tensor, Tensor]:
    plan = _ops.plan_of(window, x.shape[2:])
    dx = empty(x.shape, dy, _ops.memory_format(x))
    dweights = torch.empty(weights.shape, dtype=torch.float64, device=x.device)
    dispatch.choose("blend", "backward", plan)(_five(x), _five(dy), kind,
                                               weights.contiguous(), _five(dx), dweights)
    return dx, dweights


def stochastic_pool_sample(x: Tensor, seed: Tensor, window: list[int]) -> tuple[Tensor, Tensor]:
    plan = _ops.plan_of(window, x.shape[2:])
    fmt = _ops.memory_format(x)
    y = empty(_out_shape(x, plan), x, fmt)
    winners = empty(y.shape, x, fmt, _ops.winner_dtype(x, window))
    dispatch.choose("stochastic", "sample", plan)(_five(x), seed.reshape(1), _five(y),
                                                _five(winners))
    return y, winners


# ------------------------------------------------------------------ anti-aliased pooling


def _blur_plan(blur: list[int], x_size) -> geometry.BlurPlan:
    return _kind_ops.blur_plan_of(tuple(blur), tuple(int(s) for s in x_size[2:]))


def blur_pool_values(x: Tensor, blur: list[int]) -> Tensor:
    """The chain's output (:mod:`.triton.blur`): the stride-1 map is never stored."""
    plan = _blur_plan(blur, x.shape)
    y = empty(_kind_ops.blur_out_shape(x, blur), x, _ops.memory_format(x))
    dispatch.choose("blur", "forward", plan)(_five(x), _five(y))
    return y


def blur_pool(x: Tensor, blur: list[int]) -> tuple[Tensor, Tensor]:
    """The output and a max-blur's winners, one per stride-1 window (else empty)."""
    plan = _blur_plan(blur, x.shape)
    dtype = _kind_ops.blur_winner_dtype(blur)
    if plan.pre != "max":
        return blur_pool_values(x, blur), empty([0], x, torch.contiguous_format, dtype)
    winners = empty(_kind_ops.blur_winners_shape(x, blur), x, _ops.memory_format(x), dtype)
    dispatch.choose("blur", "winners", plan)(_five(x), _five(winners))
    return blur_pool_values(x, blur), winners


def blur_pool_backward(dy: Tensor, winners: Tensor, blur: list[int],
                       x_size: list[int]) -> Tensor:
    """The transposed blur as a gather; a max-blur's into its stride-1 map (in the
    arithmetic dtype), which max pooling's backward then routes to the winners."""
    plan = _blur_plan(blur, x_size)
    fmt = _ops.memory_format(dy)
    dx = empty(x_size, dy, fmt)
    if plan.pre != "max":
        dispatch.choose("blur", "backward", plan)(_five(dy), _five(dx))
        return dx
    mapped = empty([*x_size[:2], *plan.map_spatial], dy, fmt, _ops.compute_dtype(dy))
    dispatch.choose("blur", "backward", plan)(_five(dy), _five(mapped))
    window = _kind_ops.blur_max_window(_kind_ops.blur_args(blur)[1])
    dispatch.choose("max", "backward", _ops.plan_of(window, x_size[2:]))(
        _five(mapped), _five(winners), _five(dx))
    return dx


# -------------------------------------------------------------- fractional max pooling


def fractional_max_pool(x: Tensor, samples: Tensor, orders: Tensor,
                        fractional: list[int]) -> tuple[Tensor, Tensor]:
    """The windows built on the device from the draws, each one's maximum and winner
    (:mod:`.triton.fractional`)."""
    starts, lengths = device_windows(fractional, x.shape, samples, orders)
    fmt = _ops.memory_format(x)
    y = empty([*x.shape[:2], *_kind_ops.fractional_args(fractional)[1]], x, fmt)
    winners = empty(y.shape, x, fmt, _ops.TORCH_DTYPE[geometry.position_dtype(
        _kind_ops.fractional_taps(fractional, x.shape[2:]))])
    dispatch.choose("fractional", "forward", None)(
        _five(x), starts, lengths, extent_bound(fractional, x.shape[2:]), _five(y),
        _five(winners))
    return y, winners


def fractional_max_pool_backward(dy: Tensor, winners: Tensor, samples: Tensor,
                                 orders: Tensor, fractional: list[int],
                                 x_size: list[int]) -> Tensor:
    starts, lengths = device_windows(fractional, x_size, samples, orders)
    first, last = covering_windows(starts, lengths, fractional, x_size)
    dx = empty(x_size, dy, _ops.memory_format(dy))
    dispatch.choose("fractional", "backward", None)(
        _five(dy), _five(winners), starts, first, last, extent_bound(fractional, x_size[2:]),
        _five(dx))
    return dx


def fractional_max_pool_indices(winners: Tensor, samples: Tensor, orders: Tensor,
                                fractional: list[int], x_size: list[int]) -> Tensor:
    starts, _ = device_windows(fractional, x_size, samples, orders)
    indices = empty(winners.shape, winners, _ops.memory_format(winners), torch.int64)
    dispatch.choose("fractional", "indices", None)(
        _five(winners), starts, extent_bound(fractional, x_size[2:]), _triple(x_size[2:]),
        _five(indices))
    return indices


# -------------------------------------------------------------------------- unpooling


def _planes(t: Tensor, count: int) -> Tensor:
    """``t`` as C-contiguous ``(N, C, count)`` planes in row-major spatial order."""
    return t.contiguous().reshape(t.shape[0], t.shape[1], count)


def _check_indices(indices: Tensor, plane: int, output_size) -> None:
    """The CPU's range check. It reads the indices back (a sync), so it is skipped
    while a CUDA graph is captured: out-of-range indices are then dropped unreported."""
    if indices.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= plane):
        raise ValueError(f"indices must lie in [0, {plane}) for an unpooled plane of "
                         f"{tuple(output_size)}, got values from {int(indices.min())} to "
                         f"{int(indices.max())}")


def max_unpool(y: Tensor, indices: Tensor, window: list[int],
               output_size: list[int]) -> Tensor:
    n, c, count, plane = y.shape[0], y.shape[1], math.prod(y.shape[2:]), math.prod(output_size)
    _check_indices(indices, plane, output_size)
    out = torch.zeros((n, c, *output_size), dtype=y.dtype, device=y.device)
    written = torch.empty((n, c, count), dtype=torch.uint8, device=y.device)
    dispatch.choose("unpool", "forward", None)(_planes(y, count), _planes(indices, count),
                                            out.view(n, c, plane), written)
    return out


def max_unpool_backward(dout: Tensor, indices: Tensor, window: list[int]) -> Tensor:
    n, c, count = indices.shape[0], indices.shape[1], math.prod(indices.shape[2:])
    flat_dout = _planes(dout, math.prod(dout.shape[2:]))
    flat_indices = _planes(indices, count)
    written = torch.empty((n, c, count), dtype=torch.uint8, device=dout.device)
    dispatch.choose("unpool", "forward", None)(None, flat_indices, flat_dout, written)
    dy = torch.empty(indices.shape, dtype=dout.dtype, device=dout.device)
    dispatch.choose("unpool", "backward", None)(flat_dout, flat_indices, written,
                                              dy.view(n, c, count))
    return dy


def _on_their_device(implementation):
    """``implementation`` run with its tensors' device current (Triton launches on the
    current device's stream: a tensor on cuda:1 while cuda:0 is current would otherwise
    get the wrong one), after checking that they share one device."""
    @functools.wraps(implementation)
    def run(*args):
        devices = {a.device for a in args if isinstance(a, Tensor)}
        if len(devices) > 1:
            raise ValueError(f"{implementation.__name__}: all tensors must be on one device, "
                             f"got {sorted(map(str, devices))}")
        device = next(iter(devices))
        if device.type != "cuda":  # CPU tensors: the interpreter's tests
            return implementation(*args)
        with torch.cuda.device(device):
            return implementation(*args)
    return run


# operator name -> its CUDA implementation
# ------------------------------------------------------- adaptive polyphase sampling


def _triple(per_dim) -> tuple[int, ...]:
    """Per-spatial-dim integers as the kernels' ``(D, H, W)``: leading axes get 1."""
    return (1,) * (3 - len(per_dim)) + tuple(int(v) for v in per_dim)


def aps_gather(x: Tensor, phases: Tensor, steps: list[int]) -> Tensor:
    y = empty(_kind_ops.aps_shape(x.shape, steps), x, _ops.memory_format(x))
    dispatch.choose("polyphase", "gather", None)(_five(x), _triple(steps),
                                                 phases.contiguous(), _five(y))
    return y


def aps_pool(x: Tensor, steps: list[int], norm: int) -> tuple[Tensor, Tensor]:
    n, c = x.shape[:2]
    partials = torch.empty((n, c, math.prod(steps)), dtype=torch.float64, device=x.device)
    dispatch.choose("polyphase", "norms", None)(_five(x), _triple(steps), norm,
                                                partials)
    # the first largest, a NaN as largest (torch's argmax, as NumPy's)
    norms = partials.amax(1) if norm == _kind_ops.APS_MAX else partials.sum(1)
    phases = norms.argmax(1)
    return aps_gather(x, phases, steps), phases


def aps_scatter(dy: Tensor, phases: Tensor, steps: list[int], x_size: list[int]) -> Tensor:
    dx = empty(x_size, dy, _ops.memory_format(dy))
    dispatch.choose("polyphase", "scatter", None)(_five(dy), _triple(steps),
                                                  phases.contiguous(), _five(dx))
    return dx


# ------------------------------------------------------------------- circular padding


def circular_pad(x: Tensor, pads: list[int]) -> Tensor:
    """``x`` padded circularly, stored as x is; a pad longer than its dim wraps round
    again, as on the CPU."""
    out = empty(_kind_ops.padded_shape(x.shape, pads), x, _ops.memory_format(x))
    dispatch.choose("circular", "pad", None)(_five(x), _triple(pads[0::2]), _five(out))
    return out


def circular_fold(dy: Tensor, pads: list[int], x_size: list[int]) -> Tensor:
    dx = empty(x_size, dy, _ops.memory_format(dy))
    dispatch.choose("circular", "fold", None)(_five(dy), _triple(pads[0::2]), _five(dx))
    return dx


IMPLEMENTATIONS = {
    "max_pool": max_pool,
    "max_pool_values": max_pool_values,
    "max_pool_backward": max_pool_backward,
    "max_pool_gather": max_pool_gather,
    "max_pool_indices": max_pool_indices,
    "max_pool_split_backward": max_pool_split_backward,
    "avg_pool": avg_pool,
    "avg_pool_backward": avg_pool_backward,
    "lp_pool": lp_pool,
    "lp_pool_backward": lp_pool_backward,
    "max_unpool": max_unpool,
    "max_unpool_backward": max_unpool_backward,
    "gem_pool": gem_pool,
    "gem_pool_backward": gem_pool_backward,
    "weighted_pool": weighted_pool,
    "weighted_pool_backward": weighted_pool_backward,
    "weighted_pool_values": weighted_pool_values,
    "stochastic_pool_sample": stochastic_pool_sample,
    "fractional_max_pool": fractional_max_pool,
    "fractional_max_pool_backward": fractional_max_pool_backward,
    "fractional_max_pool_indices": fractional_max_pool_indices,
    "blend_pool": blend_pool,
    "blur_pool": blur_pool,
    "blur_pool_values": blur_pool_values,
    "blur_pool_backward": blur_pool_backward,
    "blend_pool_backward": blend_pool_backward,
    "aps_pool": aps_pool,
    "aps_gather": aps_gather,
    "aps_scatter": aps_scatter,
    "circular_pad": circular_pad,
    "circular_fold": circular_fold,
}
IMPLEMENTATIONS = {name: _on_their_device(implementation)
                   for name, implementation in IMPLEMENTATIONS.items()}
for _name, _implementation in IMPLEMENTATIONS.items():
    _ops.implement(getattr(_kind_ops, _name, None) or getattr(_ops, _name), "cuda")(
        _implementation)
