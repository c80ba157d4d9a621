"""The weighted window averages (SoftPool, stochastic pooling's evaluation) and
stochastic pooling's draw, on the fused kernels of :mod:`poolgrad.kernels.weighted`.
The NumPy operators (:func:`poolgrad.soft_pool`, :func:`poolgrad.stochastic_pool`) and
poolgrad.torch's CPU operators run these same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in the compute dtype, pooled along a
sliding plan; ``kind`` is :data:`~poolgrad.kernels.weighted.SOFT` or
:data:`~poolgrad.kernels.weighted.SELF`. The averages and ``dx`` are stored in the
layout of ``x`` (channels-last in, channels-last out); the draws C-contiguous."""

from __future__ import annotations

import numpy as np

from .. import geometry
from ..kernels import dispatch, weighted
from .pullback import empty

_NO_DRAWS = np.empty((0,) * 5)  # the draws are counted from the seed (float64, C order)


def _out_shape(xk: np.ndarray, plan) -> tuple[int, ...]:
    return xk.shape[:2] + tuple(a.count for a in plan.kernel_axes)


def _backward_kernel(xk: np.ndarray, plan, kind: int):
    direction = "backward" if kind == weighted.SOFT else "mean_backward"
    return dispatch.choose("weighted", direction, plan, dispatch.operand(xk))


def weighted_kernels(xk: np.ndarray, plan, kind: int) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    return (dispatch.choose("weighted", "forward", plan, dispatch.operand(xk)).name,
            _backward_kernel(xk, plan, kind).name)


def backward_needs_outputs(xk: np.ndarray, plan, kind: int) -> bool:
    """Whether :func:`weighted_backward` of ``xk`` reads ``y`` and ``norm``; where it
    does not (stochastic pooling's 2x2 mean, which recomputes them), a pullback keeps
    ``x`` alone and passes None for them."""
    return _backward_kernel(xk, plan, kind).needs_outputs


def weighted_forward(xk: np.ndarray, plan, kind: int, *, keep_norm: bool = True,
                     copy: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(y, norm)``: each window's weighted average and what its backward needs (the
    log of SoftPool's normaliser, stochastic pooling's window sum; None without
    ``keep_norm``, for a forward that no backward follows). ``copy``, if given (shaped
    and stored as ``xk``), gets a copy of ``xk`` for a pullback to own: the 2x2 kernel,
    where its windows cover x, writes it in the same pass, from the rows it has just
    read (else a copy after the forward).

    For ``SELF`` (stochastic pooling's evaluation), a ValueError if ``xk`` holds a
    negative number or a NaN: the 2x2 kernel checks the taps as it reads them, the
    others take :func:`require_probabilities`' pass."""
    operand = dispatch.operand(xk)
    forward = dispatch.choose("weighted", "forward", plan, operand)
    shape, stored = _out_shape(xk, plan), operand.layout == "channels_last"
    y = empty(shape, xk.dtype, stored)
    norm = empty(shape, xk.dtype, stored) if keep_norm else None
    invalid = forward(xk, y, norm, kind, copy=copy)  # None: it did not check every input
    if kind == weighted.SELF:
        if invalid is None:
            require_probabilities(xk, plan)
        elif invalid:
            _refuse(xk)
    return y, norm


def weighted_backward(xk: np.ndarray, yk: np.ndarray | None, norm: np.ndarray | None,
                      dyk: np.ndarray, plan, kind: int) -> np.ndarray:
    """``dx`` in ``dyk``'s dtype: each input's share of the windows that read it
    (``yk`` and ``norm`` may be None where :func:`backward_needs_outputs` says so)."""
    backward = _backward_kernel(xk, plan, kind)
    dx = empty(xk.shape, dyk.dtype, backward.channels_last)
    backward(xk, yk, norm, dyk, kind, dx)
    return dx


def require_probabilities(xk: np.ndarray, plan) -> None:
    """A ValueError if ``xk`` holds a negative number, a NaN or +inf, read in memory
    order (stochastic pooling's inputs are the weights of its probabilities)."""
    if not xk.size:
        return
    values = xk.ravel(order="K")  # a view for the layouts the kernels take
    flags = np.empty(max(1, min(64, values.size // 65536)), np.bool_)
    dispatch.choose("stochastic", "check", plan, dispatch.operand(xk))(values, flags)
    if flags.any():
        _refuse(xk)


def _refuse(xk: np.ndarray):
    smallest, largest = np.min(xk), np.max(xk)  # only to name them
    if smallest >= 0 and largest < np.inf:  # finite weights whose window sums overflow
        cure = "scale x down" if xk.dtype == np.float64 else "pool a float64 array or scale x down"
        raise ValueError(
            f"stochastic_pool samples with probabilities x / sum(x) (and averages with "
            f"x^2 / sum(x)), so each window's sums must be finite in {xk.dtype}; got a "
            f"maximum of {largest}: {cure}")
    raise ValueError(
        f"stochastic_pool samples with probabilities x / sum(x), so x must be >= 0 "
        f"(as after a ReLU), finite and not NaN; got a minimum of {smallest} and a "
        f"maximum of {largest}")


def sample_kernel(xk: np.ndarray, plan) -> str:
    """The name of the kernel that draws ``xk``'s taps."""
    return dispatch.choose("stochastic", "sample", plan, dispatch.operand(xk)).name


def stochastic_sample(xk: np.ndarray, plan, *, seed: int = 0,
                      draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(y, winners)``: one tap per window drawn with probability ``x / sum(x)``,
    numbered as max pooling's winners, so that max pooling's backward routes its
    gradient. Both are stored as ``xk`` is (channels-last in, channels-last out).

    The draws are ``draws`` (float64, ``y``'s shape) if given, else counted from the
    64-bit ``seed``: window ``i``, row-major over ``y``, draws
    :func:`poolgrad.kernels.stochastic.counted_uniform` ``(seed, i)``. A ValueError if
    ``xk`` holds a negative number or a NaN: the 2x2 kernel checks the taps as it reads
    them, where they are all of x; otherwise :func:`require_probabilities` does."""
    operand = dispatch.operand(xk)
    sample = dispatch.choose("stochastic", "sample", plan, operand)
    shape, stored = _out_shape(xk, plan), operand.layout == "channels_last"
    y = empty(shape, xk.dtype, stored)
    winners = empty(shape, geometry.position_dtype(plan.window_size), stored)
    invalid = sample(xk, _NO_DRAWS if draws is None else draws, np.uint64(seed), y, winners)
    if invalid is None:
        require_probabilities(xk, plan)
    elif invalid:
        _refuse(xk)
    return y, winners
