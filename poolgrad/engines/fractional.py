"""Fractional max pooling on the kernels of :mod:`poolgrad.kernels.fractional`, given
every plane's windows (:func:`poolgrad.kinds.fractional.region_tables`). The NumPy
operator (:func:`poolgrad.fractional_max_pool`) and poolgrad.torch's CPU operators run
these same functions.

Arrays are planes ``(P, 1, D, H, W)`` (leading unit axes for 1-d and 2-d),
C-contiguous in the compute dtype, but for :func:`fractional_forward_stored` and
:func:`planes_in_layout`, whose 5-d ``(N, C, D, H, W)`` arrays are stored as their
input is (channels-last for a channels-last input); ``tables`` is ``(starts, lengths,
extent)``."""

from __future__ import annotations

import math

import numpy as np

from .. import geometry
from ..kernels import dispatch, layouts
from ..kernels.fractional import on_one_grid
from .maxima import maxima_of, winner_indices
from .pullback import empty


def _plan_operand(in_spatial, out_spatial, dtype):
    return (geometry.FractionalPlan(tuple(in_spatial), tuple(out_spatial)),
            dispatch.Operand(np.dtype(dtype), "nchw"))


def regular_grid(tables, in_spatial, out_spatial) -> geometry.WindowPlan | None:
    """The max pooling plan (no padding) whose windows are every plane's, where the
    planes share one regular grid, else None. A pseudo-random sequence whose mean step
    ``(n - k) / (o - 1)`` is a whole number places every plane's windows so (ratio 0.5
    of an even length with k 2, say): there fractional max pooling is that max pooling,
    with its winner rule and its taps numbered as here, and runs its kernels."""
    starts, lengths, extent = tables
    ndim = len(out_spatial)
    if starts.shape[0] == 0:
        return None
    kernel, stride = [], []
    for axis, (length, count) in enumerate(zip(in_spatial, out_spatial, strict=True)):
        row = geometry.KERNEL_AXES - ndim + axis
        k = int(extent[row])
        step = int(starts[0, row, 1]) if count > 1 else length - k + 1
        if step < 1 or (length - k) // step + 1 != count:
            return None
        if not on_one_grid(starts[:, row], lengths[:, row], count, step, k):
            return None
        kernel.append(k)
        stride.append(step)
    return geometry.sliding_plan(tuple(in_spatial), tuple(kernel), tuple(stride),
                                 (1,) * ndim, ((0, 0),) * ndim, False)


def fractional_planes(xk: np.ndarray) -> np.ndarray:
    """A 5-d kernel view ``(N, C, D, H, W)`` as the kernels' C-contiguous planes
    ``(N * C, 1, D, H, W)``: a view, or for a channels-last one a tiled copy (NumPy's
    strided copy took 9.5 ms of a 32x64x56x56 float32 forward's 19)."""
    return layouts.planes_of(xk).reshape((-1, 1) + xk.shape[2:])


def planes_in_layout(planes: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``planes`` ``(P, 1, D, H, W)`` as a 5-d ``(N, C, D, H, W)`` array (``like``'s
    ``N`` and ``C``) stored as the 5-d kernel view ``like`` is: a view, or for a
    channels-last one the tiled copy (a channels-last input gives channels-last
    outputs, as everywhere else)."""
    shape = like.shape[:2] + planes.shape[2:]
    if not dispatch.is_channels_last(like):
        return planes.reshape(shape)
    out = empty(shape, planes.dtype, True)
    layouts.store_planes(out, planes.reshape((-1,) + planes.shape[2:]))
    return out


def _grid(ndim: int) -> tuple[int, ...]:
    return (1,) * (geometry.KERNEL_AXES - ndim)


def fractional_forward(planes: np.ndarray, tables, out_spatial,
                       winner_dtype=None) -> tuple[np.ndarray, np.ndarray, str]:
    """``(y, winners, kernel name)``, both arrays ``(P, 1, *out)`` (3-d): each window's
    maximum and its winning tap, row-major over the extent, in ``winner_dtype``
    (default: the smallest that holds the extent's taps)."""
    starts, lengths, extent = tables
    ndim = len(out_spatial)
    shape = planes.shape[:2] + _grid(ndim) + tuple(out_spatial)
    y = np.empty(shape, planes.dtype)
    winners = np.empty(shape, winner_dtype or geometry.position_dtype(math.prod(extent)))
    plan, operand = _plan_operand(planes.shape[-ndim:], out_spatial, planes.dtype)
    forward = dispatch.choose("fractional", "forward", plan, operand)
    forward(planes, starts, lengths, extent, y, winners)
    return y, winners, forward.name


def fractional_forward_stored(xk: np.ndarray, tables, out_spatial, grid,
                              winner_dtype=None) -> tuple[np.ndarray, np.ndarray, str]:
    """``(y, winners, kernel name)`` of the 5-d kernel view ``xk`` ``(N, C, D, H, W)``,
    both arrays 5-d and stored as ``xk`` is: windows on one grid (``grid``, the plan
    :func:`regular_grid` gives, or None) run max pooling's kernels for it, a
    channels-last ``xk`` its own kernel (which pools blocks of channels in cache: no
    planes written); any other runs on its planes (:func:`fractional_planes`)."""
    ndim = len(out_spatial)
    shape = xk.shape[:2] + _grid(ndim) + tuple(out_spatial)
    if grid is not None:  # (the tables are not read: poolgrad.torch keeps none for a grid)
        y, winners, forward = maxima_of(xk, grid, shape, record=True)
        return y, winners.astype(winner_dtype or winners.dtype, copy=False), forward.name
    starts, lengths, extent = tables
    winner_dtype = winner_dtype or geometry.position_dtype(math.prod(extent))
    operand = dispatch.operand(xk)
    if operand.layout != "channels_last":
        y, winners, name = fractional_forward(fractional_planes(xk), tables, out_spatial,
                                              winner_dtype)
        return y.reshape(shape), winners.reshape(shape), name
    y = empty(shape, xk.dtype, True)
    winners = empty(shape, winner_dtype, True)
    plan = geometry.FractionalPlan(tuple(xk.shape[-ndim:]), tuple(out_spatial))
    forward = dispatch.choose("fractional", "forward", plan, operand)
    forward(xk, starts, lengths, extent, y, winners)
    return y, winners, forward.name


def fractional_backward(dy: np.ndarray, tables, winners: np.ndarray,
                        in_spatial) -> np.ndarray:
    """``dx`` planes ``(P, 1, D, H, W)`` in ``dy``'s dtype: each window's ``dy`` at its
    winner (``dy`` and ``winners`` as the forward gave them)."""
    starts, _, extent = tables
    ndim = len(in_spatial)
    dx = np.empty(dy.shape[:2] + _grid(ndim) + tuple(in_spatial), dy.dtype)
    plan, operand = _plan_operand(in_spatial, dy.shape[-ndim:], dy.dtype)
    dispatch.choose("fractional", "backward", plan, operand)(dy, starts, extent, winners, dx)
    return dx


def fractional_routing(tables, winners: np.ndarray, in_spatial, grid, dtype):
    """``(backward, kernel name)``: ``backward(dyk)`` gives each window's ``dy`` at its
    winner as ``dx`` ``(N, C, D, *in_spatial)``, stored as ``winners`` are (as
    :func:`fractional_forward_stored` gave them), for a 5-d kernel view ``dyk`` in
    ``dtype`` (the compute dtype). Windows on one grid (``grid``, :func:`regular_grid`'s
    plan, or None) run max pooling's backward for it, which adds ``dy`` at the winners
    in the same order from the same +0 (the same bits) and reads a channels-last ``dy``
    where it lies (``tables`` are then not read); any other runs on planes."""
    ndim = len(in_spatial)
    if grid is not None:
        kernel = dispatch.choose("max", "backward", grid, dispatch.stored_as(
            dispatch.is_channels_last(winners), dtype))
        dx_shape = winners.shape[:2] + _grid(ndim) + tuple(in_spatial)

        def by_grid(dyk):
            dx = empty(dx_shape, dyk.dtype, kernel.channels_last)
            kernel(dyk, winners, dx)
            return dx
        return by_grid, kernel.name
    plan, planes = _plan_operand(in_spatial, winners.shape[-ndim:], dtype)
    winner_planes = fractional_planes(winners)

    def on_planes(dyk):
        dx = fractional_backward(fractional_planes(dyk), tables, winner_planes, in_spatial)
        return planes_in_layout(dx, winners)
    return on_planes, dispatch.choose("fractional", "backward", plan, planes).name


def fractional_indices(tables, winners: np.ndarray, in_spatial) -> np.ndarray:
    """Each winner's flat position in its input plane (PyTorch's int64 indices),
    ``winners``' shape."""
    starts, _, extent = tables
    full = (1,) * (geometry.KERNEL_AXES - len(in_spatial)) + tuple(in_spatial)
    indices = np.empty(winners.shape, np.int64)
    plan, operand = _plan_operand(in_spatial, winners.shape[-len(in_spatial):], np.float64)
    dispatch.choose("fractional", "indices", plan, operand)(starts, extent, winners, full[1],
                                                            full[2], indices)
    return indices


def fractional_indices_stored(tables, winners: np.ndarray, in_spatial, grid) -> np.ndarray:
    """PyTorch's int64 indices of ``winners`` (5-d, as :func:`fractional_forward_stored`
    gave them), stored as they are: max pooling's for windows on one grid (``grid``;
    ``tables`` are then not read), else :func:`fractional_indices` on planes."""
    if grid is not None:
        return winner_indices(winners, grid)
    return planes_in_layout(fractional_indices(tables, fractional_planes(winners), in_spatial),
                            winners)

