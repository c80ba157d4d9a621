"""The CPU implementations of the ``torch.ops.poolgrad`` operators (:mod:`._ops`).

Each runs the NumPy engines of :mod:`poolgrad.engines` (and so the Numba kernels that
:mod:`poolgrad.kernels.dispatch` chooses) on ``tensor.numpy()`` views, with no copy of
``x`` or ``dy``, and returns tensors with the shapes, dtypes and strides the fake
implementations describe. float16 is computed in float32 by the engines; bfloat16,
which NumPy lacks, is converted to float32 and back. Importing this module registers
them.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import torch
from torch import Tensor

from .. import _inputs, engines, geometry, ops
from ..engines import polyphase
from ..engines.pullback import circular_pad as circular_pad_array
from ..engines.pullback import fold_circular
from ..kinds import fractional as numpy_fractional
from . import _kind_ops, _ops


def _on_cpu(*tensors: Tensor) -> None:
    _ops.check_devices(*tensors, allowed=("cpu",))


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
    strides of :func:`poolgrad.torch._ops.empty`, converted to ``dtype`` if given."""
    t = torch.from_numpy(a)
    if not t.is_contiguous(memory_format=fmt):
        t = t.contiguous(memory_format=fmt)
    expected = _strides(tuple(t.shape), fmt)
    if t.stride() != expected:  # differs only where a dim has size 1
        t = t.as_strided(t.shape, expected)
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def _layout(shape, ndim) -> _inputs.Layout:
    return _inputs.Layout(tuple(int(s) for s in shape), ndim)


@functools.lru_cache(maxsize=1024)
def _window_job(window: tuple[int, ...], shape: tuple[int, ...]):
    """``(layout, plan, out shape)`` of a pooling over ``window`` of an input of
    ``shape``: the arithmetic of every call, done once per geometry (after a large
    kernel, Python's work runs from cold caches and costs several times what it does
    alone)."""
    plan = _ops.plan_of(window, shape[2:])
    return _layout(shape, _ops.window_ndim(window)), plan, shape[:2] + plan.out_spatial


def _job(x: Tensor, window) -> tuple:
    return _window_job(tuple(window), tuple(x.shape))


@_ops.implement(_ops.max_pool, "cpu")
def max_pool(x: Tensor, window: list[int], ties: str) -> tuple[Tensor, Tensor]:
    """Values and each window's winning tap (uint8 up to 256 taps, then uint16)."""
    _on_cpu(x)
    xa = _array(x)
    layout, plan, _ = _job(x, window)
    _, yk, winners, _ = engines.max_forward(xa, layout, plan, record=True)
    out_shape = layout.user_shape(plan.out_spatial)
    fmt = _ops.memory_format(x)
    y = yk.astype(xa.dtype, copy=False).reshape(out_shape)
    return _tensor(y, fmt, x.dtype), _tensor(winners.reshape(out_shape), fmt)


@_ops.implement(_ops.max_pool_values, "cpu")
def max_pool_values(x: Tensor, window: list[int]) -> Tensor:
    """The values of :func:`max_pool` alone, for inference: no winners written."""
    _on_cpu(x)
    xa = _array(x)
    layout, plan, _ = _job(x, window)
    y, _ = engines.max_engine(xa, layout, plan,
                              return_indices=False, ties="first", want_pullback=False,
                              op="max_pool")
    return _tensor(y, _ops.memory_format(x), x.dtype)


@_ops.implement(_ops.max_pool_backward, "cpu")
def max_pool_backward(dy: Tensor, winners: Tensor, window: list[int],
                      x_size: list[int]) -> Tensor:
    """``dy`` routed to each window's winner; overlapping windows add up."""
    _on_cpu(dy, winners)
    layout, plan, _ = _window_job(tuple(window), tuple(x_size))
    dya = _array(dy)
    pullback = engines.max_pullback(layout.to_kernel(winners.numpy()), plan, layout, dya.dtype)
    return _tensor(pullback(dya), _ops.memory_format(winners), dy.dtype)


@_ops.implement(_ops.max_pool_gather, "cpu")
def max_pool_gather(dx: Tensor, winners: Tensor, window: list[int]) -> Tensor:
    """``dx`` read at each window's winner: the adjoint of :func:`max_pool_backward`."""
    _on_cpu(dx, winners)
    layout, plan, _ = _job(dx, window)
    dy = engines.max_gather(_array(dx), layout.to_kernel(winners.numpy()), plan, layout)
    return _tensor(dy, _ops.memory_format(winners), dx.dtype)


@_ops.implement(_ops.max_pool_indices, "cpu")
def max_pool_indices(winners: Tensor, window: list[int], x_size: list[int]) -> Tensor:
    """PyTorch's int64 indices: each winner's flat position in its input plane."""
    _on_cpu(winners)
    layout, plan, _ = _window_job(tuple(window), tuple(x_size))
    indices = engines.winner_indices(layout.to_kernel(winners.numpy()), plan)
    return _tensor(indices.reshape(winners.shape), _ops.memory_format(winners))


@_ops.implement(_ops.max_pool_split_backward, "cpu")
def max_pool_split_backward(dy: Tensor, x: Tensor, window: list[int]) -> Tensor:
    """``ties="split"``: each window's ``dy`` shared equally among its tied maxima."""
    _on_cpu(dy, x)
    xa = _array(x)
    layout, plan, _ = _job(x, window)
    _, pullback = engines.max_engine(xa, layout, plan,
                                     return_indices=False, ties="split", want_pullback=True,
                                     op="max_pool")
    return _tensor(pullback(_array(dy)), _ops.memory_format(x), dy.dtype)


@_ops.implement(_ops.avg_pool, "cpu")
def avg_pool(x: Tensor, window: list[int], count_include_pad: bool,
             divisor_override: int | None) -> Tensor:
    """Window means (adaptive windows: the means of PyTorch's bins)."""
    _on_cpu(x)
    xa = _array(x)
    layout, plan, _ = _job(x, window)
    y, _ = engines.avg_engine(xa, layout, plan,
                              divisor_mode=_ops.divisor_mode(window, count_include_pad),
                              divisor_override=divisor_override, want_pullback=False,
                              op="avg_pool", kind=_ops.avg_kind(window))
    return _tensor(y, _ops.memory_format(x), x.dtype)


@_ops.implement(_ops.avg_pool_backward, "cpu")
def avg_pool_backward(dy: Tensor, window: list[int], x_size: list[int],
                      count_include_pad: bool, divisor_override: int | None,
                      channels_last: bool) -> Tensor:
    """``dy / divisor`` spread over each window's input elements."""
    _on_cpu(dy)
    layout, plan, _ = _window_job(tuple(window), tuple(x_size))
    dya = _array(dy)
    pullback = engines.avg_pullback(plan, layout, dya.dtype,
                                    channels_last=channels_last,
                                    divisor_mode=_ops.divisor_mode(window, count_include_pad),
                                    divisor_override=divisor_override,
                                    kind=_ops.avg_kind(window))
    return _tensor(pullback(dya), _ops.format_of(channels_last, len(x_size)), dy.dtype)


@_ops.implement(_ops.lp_pool, "cpu")
def lp_pool(x: Tensor, p: float, window: list[int]) -> Tensor:
    """``(sum over the window of |x|^p)^(1/p)`` (ONNX LpPool)."""
    _on_cpu(x)
    xa = _array(x)
    layout, plan, _ = _job(x, window)
    y, _ = engines.lp_engine(xa, layout, plan, p,
                             want_pullback=False, op="lp_pool")
    return _tensor(y, _ops.memory_format(x), x.dtype)


@_ops.implement(_ops.lp_pool_backward, "cpu")
def lp_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: float, window: list[int]) -> Tensor:
    """``dy * sign(x) * (|x| / y)^(p-1)`` summed over the windows holding each input."""
    _on_cpu(dy, x, y)
    xa, ya = _array(x), _array(y)
    layout, plan, _ = _job(x, window)
    xk, yk = _inputs.compute_view(xa, layout), _inputs.compute_view(ya, layout)
    pullback = engines.lp_pullback(xk, yk, p, plan, layout, xa.dtype)
    return _tensor(pullback(_array(dy)), _ops.memory_format(x), dy.dtype)


@_ops.implement(_ops.max_unpool, "cpu")
def max_unpool(y: Tensor, indices: Tensor, window: list[int],
               output_size: list[int]) -> Tensor:
    """Zeros, with each value of ``y`` at its index (flat in its ``(n, c)`` plane)."""
    _on_cpu(y, indices)
    kernel, stride, pads, _, _ = _ops.sliding_args(window)
    out = ops.max_unpool(_array(y), indices.numpy(), kernel, stride, pads, tuple(output_size))
    return _tensor(out, torch.contiguous_format, y.dtype)


@_ops.implement(_ops.max_unpool_backward, "cpu")
def max_unpool_backward(dout: Tensor, indices: Tensor, window: list[int]) -> Tensor:
    """``dout`` read at each index; where several entries name one place, the last
    (the one written) gets it and the others 0."""
    _on_cpu(dout, indices)
    kernel, stride, pads, _, _ = _ops.sliding_args(window)
    douta = _array(dout)
    zeros = np.zeros(tuple(indices.shape), dtype=douta.dtype)
    _, pullback = ops.vjp(ops.max_unpool, zeros, indices.numpy(), kernel, stride, pads,
                          douta.shape[2:])
    return _tensor(pullback(douta), torch.contiguous_format, dout.dtype)



@_ops.implement(_kind_ops.gem_pool, "cpu")
def gem_pool(x: Tensor, p: Tensor, eps: float, window: list[int]) -> Tensor:
    """``mean(max(x, eps)^p)^(1/p)`` over each sliding window, or over each whole plane
    (a global window); ``p`` a one-element tensor (learnable)."""
    _on_cpu(x, p)
    xa = _array(x)
    layout, plan, shape = _job(x, window)
    yk = engines.gem_forward(_inputs.compute_view(xa, layout),
                             None if _ops.is_global(window) else plan, float(p), eps)
    y = yk.astype(xa.dtype, copy=False).reshape(shape)
    return _tensor(y, _ops.memory_format(x), x.dtype)


@_ops.implement(_kind_ops.gem_pool_backward, "cpu")
def gem_pool_backward(dy: Tensor, x: Tensor, y: Tensor, p: Tensor, eps: float,
                      window: list[int], with_dp: bool) -> tuple[Tensor, Tensor]:
    """``dx``, and with ``with_dp`` each window's term of ``dp`` (``y``'s shape, in the
    compute dtype; their sum is ``dp``), else zeros."""
    _on_cpu(dy, x, y, p)
    xa, ya, dya = _array(x), _array(y), _array(dy)
    layout, plan, _ = _job(x, window)
    xk, yk = _inputs.compute_view(xa, layout), _inputs.compute_view(ya, layout)
    dyk = layout.to_kernel(dya.astype(xk.dtype, copy=False))
    dx, terms = engines.gem_backward(xk, yk, dyk, None if _ops.is_global(window) else plan,
                                     float(p), eps, with_dp)
    compute = _ops.compute_dtype(x)
    terms = (torch.from_numpy(np.ascontiguousarray(terms).reshape(y.shape)).to(compute)
             if with_dp else torch.zeros(y.shape, dtype=compute))
    return _tensor(dx.reshape(x.shape), _ops.memory_format(x), dy.dtype), terms


@_ops.implement(_kind_ops.weighted_pool, "cpu")
def weighted_pool(x: Tensor, kind: int, window: list[int]) -> tuple[Tensor, Tensor]:
    """Each window's weighted average (SOFT or SELF) and its ``norm``."""
    _on_cpu(x)
    layout, plan, shape = _job(x, window)
    y, norm = engines.weighted_forward(_inputs.compute_view(_array(x), layout), plan, kind)
    fmt = _ops.memory_format(x)
    return (_tensor(y.reshape(shape), fmt, x.dtype),
            _tensor(norm.reshape(shape), fmt, _ops.compute_dtype(x)))


@_ops.implement(_kind_ops.weighted_pool_values, "cpu")
def weighted_pool_values(x: Tensor, kind: int, window: list[int]) -> Tensor:
    """Each window's weighted average, without the ``norm`` a backward reads."""
    _on_cpu(x)
    layout, plan, shape = _job(x, window)
    y, _ = engines.weighted_forward(_inputs.compute_view(_array(x), layout), plan, kind,
                                    keep_norm=False)
    return _tensor(y.reshape(shape), _ops.memory_format(x), x.dtype)


@_ops.implement(_kind_ops.weighted_pool_backward, "cpu")
def weighted_pool_backward(dy: Tensor, x: Tensor, y: Tensor, norm: Tensor, kind: int,
                           window: list[int]) -> Tensor:
    """``dx``: each input's share of the windows that read it."""
    _on_cpu(dy, x, y, norm)
    layout, plan, _ = _job(x, window)
    xk = _inputs.compute_view(_array(x), layout)
    yk, normk = (layout.to_kernel(_array(t).astype(xk.dtype, copy=False)) for t in (y, norm))
    dyk = layout.to_kernel(_array(dy).astype(xk.dtype, copy=False))
    dx = engines.weighted_backward(xk, yk, normk, dyk, plan, kind)
    return _tensor(dx.reshape(x.shape), _ops.memory_format(x), dy.dtype)


@_ops.implement(_kind_ops.stochastic_pool_sample, "cpu")
def stochastic_pool_sample(x: Tensor, seed: Tensor, window: list[int]) -> tuple[Tensor, Tensor]:
    """One drawn tap per window: its value and its winner."""
    _on_cpu(x, seed)
    layout, plan, shape = _job(x, window)
    y, winners = engines.stochastic_sample(_inputs.compute_view(_array(x), layout), plan,
                                           seed=_seed(seed))
    fmt = _ops.memory_format(x)
    return _tensor(y.reshape(shape), fmt, x.dtype), _tensor(winners.reshape(shape), fmt)


def _seed(seed: Tensor) -> int:
    """The one int64 of ``seed``, which must be that (a ValueError otherwise)."""
    if seed.dtype != torch.int64 or seed.numel() != 1:
        raise ValueError(f"stochastic_pool_sample: seed must be one int64, got "
                         f"{seed.dtype} of shape {tuple(seed.shape)}")
    return int(seed.reshape(()))


def _blend_weights(weights: Tensor) -> np.ndarray:
    return np.ascontiguousarray(_array(weights), np.float64).ravel()


@_ops.implement(_kind_ops.blend_pool, "cpu")
def blend_pool(x: Tensor, weights: Tensor, kind: int, window: list[int]) -> Tensor:
    """Each window's blend of its maximum and mean (MIXED or GATED)."""
    _on_cpu(x, weights)
    layout, plan, shape = _job(x, window)
    y = engines.blend_forward(_inputs.compute_view(_array(x), layout), plan, kind,
                              _blend_weights(weights))
    return _tensor(y.reshape(shape), _ops.memory_format(x), x.dtype)


@_ops.implement(_kind_ops.blend_pool_backward, "cpu")
def blend_pool_backward(dy: Tensor, x: Tensor, weights: Tensor, kind: int,
                        window: list[int]) -> tuple[Tensor, Tensor]:
    """``dx`` and the weights' gradient (float64, shaped as ``weights``)."""
    _on_cpu(dy, x, weights)
    layout, plan, _ = _job(x, window)
    xk = _inputs.compute_view(_array(x), layout)
    dyk = layout.to_kernel(_array(dy).astype(xk.dtype, copy=False))
    dx, dweights = engines.blend_backward(xk, dyk, plan, kind, _blend_weights(weights))
    return (_tensor(dx.reshape(x.shape), _ops.memory_format(x), dy.dtype),
            torch.from_numpy(dweights.reshape(weights.shape)))


def _blur_forward(x: Tensor, blur: list[int], record: bool):
    """``(y, winners, plan)`` of an anti-aliased pooling of ``x``, both in NumPy, shaped
    as the user's tensors (winners empty unless ``record`` and a max)."""
    xa = _array(x)
    plan = _kind_ops.blur_plan_of(tuple(blur), tuple(xa.shape[2:]))
    y, winners = engines.blur_forward(
        _inputs.compute_view(xa, _layout(xa.shape, len(plan.in_spatial))), plan,
        record=record)
    lead = tuple(xa.shape[:2])
    if record and plan.pre == "max":
        winners = winners.reshape(lead + plan.map_spatial)
    return y.reshape(lead + plan.out_spatial), winners, plan


@_ops.implement(_kind_ops.blur_pool, "cpu")
def blur_pool(x: Tensor, blur: list[int]) -> tuple[Tensor, Tensor]:
    """Anti-aliased pooling, and a max-blur's winners, both in ``x``'s layout."""
    _on_cpu(x)
    y, winners, plan = _blur_forward(x, blur, record=True)
    fmt = _ops.memory_format(x)
    winners = (_tensor(winners, fmt) if plan.pre == "max"
               else torch.empty(0, dtype=torch.uint8))
    return _tensor(y, fmt, x.dtype), winners


@_ops.implement(_kind_ops.blur_pool_values, "cpu")
def blur_pool_values(x: Tensor, blur: list[int]) -> Tensor:
    """Anti-aliased pooling's output alone, in ``x``'s layout."""
    _on_cpu(x)
    y, _, _ = _blur_forward(x, blur, record=False)
    return _tensor(y, _ops.memory_format(x), x.dtype)


@_ops.implement(_kind_ops.blur_pool_backward, "cpu")
def blur_pool_backward(dy: Tensor, winners: Tensor, blur: list[int],
                       x_size: list[int]) -> Tensor:
    """The transposed blur, then (max-blur) the routing to the winners; ``dx`` in
    ``dy``'s layout."""
    _on_cpu(dy, winners)
    dya = _array(dy)
    plan = _kind_ops.blur_plan_of(tuple(blur), tuple(int(s) for s in x_size[2:]))
    layout = _layout(dya.shape, len(plan.in_spatial))
    wk = (_layout(winners.shape, len(plan.in_spatial)).to_kernel(winners.numpy())
          if plan.pre == "max" else np.empty((0,) * 5, np.uint8))
    dx = engines.blur_backward(_inputs.compute_view(dya, layout), wk, plan)
    return _tensor(dx.reshape(x_size), _ops.memory_format(dy), dy.dtype)



class _Columns:
    """``.random(shape)`` for :func:`poolgrad.kinds.fractional.region_tables`: the next
    ``shape[1]`` columns of the random sequence's ``orders``, dim after dim."""

    def __init__(self, orders: np.ndarray):
        self.orders, self.taken = orders, 0

    def random(self, shape):
        self.taken += shape[1]
        return self.orders[:, self.taken - shape[1]: self.taken]


# How many calls' grids (or the word that their windows lie on none) are kept, keyed
# by their samples' bytes (16 KB for 32x64 planes; a random sequence adds its orders)
_GRIDS_KEPT = 8
_grids: collections.OrderedDict = collections.OrderedDict()
_UNSEEN = object()


def _fractional_tables(fractional, x_size, samples: Tensor, orders: Tensor):
    """``(tables, grid)``: the windows' ``(starts, lengths, extent)`` and the grid they
    lie on (None if none: :func:`poolgrad.engines.fractional.regular_grid`), a function
    of the arguments alone. Windows on a grid give the grid alone (``tables`` None): max
    pooling's kernels need nothing else.

    The last calls' grids are kept by the arguments' values (the samples' bytes, 16 KB
    for 32x64 planes, and the random sequence's orders), so a backward finds its
    forward's grid. Tables are never kept: they are built again (0.25 ms for 32x64 planes
    of 56x56), where four calls' tables kept (2.8 MB each) cost each forward 0.3-0.5 ms in
    the fresh pages of the next calls' arrays."""
    sample_values, order_values = _array(samples), _array(orders)
    key = (tuple(fractional), tuple(int(s) for s in x_size), sample_values.dtype.str,
           sample_values.shape, sample_values.tobytes(), order_values.dtype.str,
           order_values.shape, order_values.tobytes())
    seen = _grids.pop(key, _UNSEEN)
    if seen is not _UNSEEN:
        _grids[key] = seen  # the newest again
        if seen is not None:
            return None, seen
    kernel, out, sequence = _kind_ops.fractional_args(fractional)
    # writable, as the NumPy operator's (a read-only array is another kernel signature)
    u = numpy_fractional.in_sample_precision(
        sample_values.reshape(key[1][0] * key[1][1], len(out)).copy())
    # a grid once searched for and not found is not searched for again
    tables, grid, _ = numpy_fractional.plane_windows(key[1][2:], kernel, out, u, sequence,
                                                     _Columns(order_values),
                                                     search=seen is _UNSEEN)
    if seen is _UNSEEN:
        _grids[key] = grid
        while len(_grids) > _GRIDS_KEPT:
            _grids.popitem(last=False)
    return tables, grid


@_ops.implement(_kind_ops.fractional_max_pool, "cpu")
def fractional_max_pool(x: Tensor, samples: Tensor, orders: Tensor,
                        fractional: list[int]) -> tuple[Tensor, Tensor]:
    """Each window's maximum and its winner, the windows built on the host (the CPU is
    the tensor's device)."""
    _on_cpu(x, samples, orders)
    xa = _array(x)
    out = _kind_ops.fractional_args(fractional)[1]
    tables, grid = _fractional_tables(fractional, xa.shape, samples, orders)
    winner = geometry.position_dtype(_kind_ops.fractional_taps(fractional, xa.shape[2:]))
    # stored as x is: a channels-last x runs the channels-last kernel, no planes
    y, winners, _ = engines.fractional_forward_stored(
        _inputs.compute_view(xa, _layout(xa.shape, len(out))), tables, out, grid, winner)
    shape, fmt = (*xa.shape[:2], *out), _ops.memory_format(x)
    return _tensor(y.reshape(shape), fmt, x.dtype), _tensor(winners.reshape(shape), fmt)


@_ops.implement(_kind_ops.fractional_max_pool_backward, "cpu")
def fractional_max_pool_backward(dy: Tensor, winners: Tensor, samples: Tensor,
                                 orders: Tensor, fractional: list[int],
                                 x_size: list[int]) -> Tensor:
    """Each window's ``dy`` at its winner (max pooling's backward where the windows lie
    on one grid, as the forward ran max pooling)."""
    _on_cpu(dy, winners, samples, orders)
    layout = _layout(dy.shape, len(x_size) - 2)
    tables, grid = _fractional_tables(fractional, x_size, samples, orders)
    dyk = layout.to_kernel(_array(dy))  # copied once if strided
    compute = _inputs.COMPUTE_DTYPE.get(dyk.dtype, dyk.dtype)
    backward, _ = engines.fractional_routing(tables, layout.to_kernel(winners.numpy()),
                                             tuple(x_size[2:]), grid, compute)
    # stored as the winners are (as x is), in NumPy's memory (torch's .contiguous() into
    # fresh memory of its own took 7.3 ms for a 32x64x56x56 float32 dx against 1.7)
    dx = backward(dyk.astype(compute, copy=False))
    return _tensor(dx.reshape(x_size), _ops.memory_format(dy), dy.dtype)


@_ops.implement(_kind_ops.fractional_max_pool_indices, "cpu")
def fractional_max_pool_indices(winners: Tensor, samples: Tensor, orders: Tensor,
                                fractional: list[int], x_size: list[int]) -> Tensor:
    """PyTorch's int64 indices of the winners."""
    _on_cpu(winners, samples, orders)
    tables, grid = _fractional_tables(fractional, x_size, samples, orders)
    indices = engines.fractional_indices_stored(
        tables, _layout(winners.shape, len(x_size) - 2).to_kernel(winners.numpy()),
        tuple(x_size[2:]), grid)
    return _tensor(indices.reshape(winners.shape), _ops.memory_format(winners))


# ------------------------------------------------------- adaptive polyphase sampling


def _aps_job(shape, steps):
    """``(layout, the kernels' steps)`` of a polyphase sampling of an input of
    ``shape``."""
    ndim = len(shape) - 2
    return (_layout(shape, ndim),
            np.array((1,) * (geometry.KERNEL_AXES - ndim) + tuple(steps), np.int64))


def _aps_result(yk: np.ndarray, x: Tensor, steps) -> Tensor:
    shape = _kind_ops.aps_shape(x.shape, steps)
    return _tensor(yk.reshape(shape), _ops.memory_format(x), x.dtype)


@_ops.implement(_kind_ops.aps_pool, "cpu")
def aps_pool(x: Tensor, steps: list[int], norm: int) -> tuple[Tensor, Tensor]:
    """The component of largest norm, and each example's phase."""
    _on_cpu(x)
    layout, kernel_steps = _aps_job(tuple(x.shape), steps)
    xk = _inputs.compute_view(_array(x), layout)
    norm_name = {code: name for name, code in polyphase.NORMS.items()}[norm]
    phases = polyphase.choose_phases(polyphase.phase_norms(xk, kernel_steps, norm_name))
    return (_aps_result(polyphase.phase_gather(xk, kernel_steps, phases), x, steps),
            torch.from_numpy(phases))


def _phases(phases: Tensor, n: int) -> np.ndarray:
    return np.ascontiguousarray(phases.detach().numpy(), np.int64).reshape(n)


@_ops.implement(_kind_ops.aps_gather, "cpu")
def aps_gather(x: Tensor, phases: Tensor, steps: list[int]) -> Tensor:
    """The components of the given phases."""
    _on_cpu(x, phases)
    layout, kernel_steps = _aps_job(tuple(x.shape), steps)
    xk = _inputs.compute_view(_array(x), layout)
    return _aps_result(polyphase.phase_gather(xk, kernel_steps, _phases(phases, x.shape[0])),
                       x, steps)


@_ops.implement(_kind_ops.aps_scatter, "cpu")
def aps_scatter(dy: Tensor, phases: Tensor, steps: list[int], x_size: list[int]) -> Tensor:
    """``dy`` at the chosen positions, stored as ``dy`` is."""
    _on_cpu(dy, phases)
    layout, kernel_steps = _aps_job(tuple(int(s) for s in x_size), steps)
    dyk = _inputs.compute_view(_array(dy), _layout(tuple(dy.shape), len(steps)))
    dx = polyphase.phase_scatter(dyk, kernel_steps, _phases(phases, dy.shape[0]),
                                 layout.kernel_shape(x_size[2:])[2:])
    return _tensor(dx.reshape(x_size), _ops.memory_format(dy), dy.dtype)


# ------------------------------------------------------------------- circular padding


@_ops.implement(_kind_ops.circular_pad, "cpu")
def circular_pad(x: Tensor, pads: list[int]) -> Tensor:
    """``x`` padded circularly by the NumPy operators' kernel, stored as x is (F.pad's
    backward, a chain of slices, took 26 ms of a 32x64x56x56 max_aps_pool's 57)."""
    _on_cpu(x)
    padded = circular_pad_array(_array(x), x.dim() - 2, pads[0::2], pads[1::2])
    return _tensor(padded, _ops.memory_format(x), x.dtype)


@_ops.implement(_kind_ops.circular_fold, "cpu")
def circular_fold(dy: Tensor, pads: list[int], x_size: list[int]) -> Tensor:
    """Each padded position's ``dy`` added onto the element it copies."""
    _on_cpu(dy)
    dx = fold_circular(_array(dy), dy.dim() - 2, pads[0::2], [int(n) for n in x_size[2:]])
    return _tensor(dx, _ops.memory_format(dy), dy.dtype)


# ------------------------------------------------------------------ attention pooling


def _attention_operands(x: Tensor, projected: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """x's kernel view in its compute dtype, and ``projected`` as the kernels take it."""
    xk = _inputs.compute_view(_array(x), _layout(tuple(x.shape), x.dim() - 2))
    return xk, np.ascontiguousarray(_array(projected), np.float64)


@_ops.implement(_kind_ops.attention_pool, "cpu")
def attention_pool(x: Tensor, projected: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """The readouts and weights of :func:`poolgrad.attention_pool`'s fused kernels."""
    _on_cpu(x, projected)
    y, attn = engines.attention_forward(*_attention_operands(x, projected), heads)
    return torch.from_numpy(y).to(x.dtype), torch.from_numpy(attn)


@_ops.implement(_kind_ops.attention_pool_backward, "cpu")
def attention_pool_backward(dy: Tensor, x: Tensor, projected: Tensor, attn: Tensor,
                            heads: int) -> tuple[Tensor, Tensor]:
    """``dx`` and ``dprojected`` from the fused backward kernels."""
    _on_cpu(dy, x, projected, attn)
    xk, projected_k = _attention_operands(x, projected)
    dyk = np.ascontiguousarray(_array(dy), xk.dtype)
    dx, dprojected = engines.attention_backward(
        xk, dyk, projected_k, np.ascontiguousarray(_array(attn)), heads)
    return (_tensor(dx.reshape(tuple(x.shape)), _ops.memory_format(x), x.dtype),
            torch.from_numpy(dprojected))
