"""Adaptive polyphase sampling on the kernels of :mod:`poolgrad.kernels.polyphase`:
each example's component norms, the choice, the gather and the scatter back. The NumPy
operators (:func:`poolgrad.aps_pool`) and poolgrad.torch's CPU operators run these
same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in x's own dtype (the gather and the
scatter move values and do no arithmetic); outputs are stored in the layout of their
input (channels-last in, channels-last out)."""

from __future__ import annotations

import math

import numpy as np

from ..kernels import dispatch, polyphase
from .pullback import empty

NORMS = {"l2": polyphase.L2, "l1": polyphase.L1, "max": polyphase.MAX}


def components(spatial, steps) -> tuple[int, ...]:
    """The spatial shape of one component: ``ceil(L / s)`` per axis."""
    return tuple(-(-int(length) // int(step)) for length, step in zip(spatial, steps,
                                                                        strict=True))


def phase_norms(xk: np.ndarray, steps: np.ndarray, norm: str) -> np.ndarray:
    """``(N, prod(steps))`` float64: each example's component norms, the planes' shares
    added in channel order (the squared l2 norm for ``"l2"``)."""
    n, c = xk.shape[:2]
    partials = np.empty((n, c, int(np.prod(steps))), np.float64)
    dispatch.choose("polyphase", "norms", None, dispatch.operand(xk))(xk, steps, NORMS[norm],
                                                              partials)
    if norm == "max":  # NaN wins, as np.max would give it
        return np.max(partials, axis=1)
    norms = np.zeros((n, partials.shape[2]), np.float64)
    for channel in range(c):  # in order: the same bits at any thread count
        norms += partials[:, channel]
    return norms


def choose_phases(norms: np.ndarray) -> np.ndarray:
    """Each example's phase: the first largest norm, a NaN counting as largest (the
    first NaN), as ``np.argmax`` picks."""
    return np.argmax(norms, axis=1).astype(np.int64)


def phase_gather(xk: np.ndarray, steps: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """The component ``phases[n]`` of each example, stored as ``xk`` is."""
    operand = dispatch.operand(xk)
    shape = xk.shape[:2] + components(xk.shape[2:], steps)
    y = empty(shape, xk.dtype, operand.layout == "channels_last")
    dispatch.choose("polyphase", "gather", None, operand)(xk, steps, phases, y)
    return y


def phase_scatter(dyk: np.ndarray, steps: np.ndarray, phases: np.ndarray,
                  spatial) -> np.ndarray:
    """The transpose of :func:`phase_gather`: ``dx`` of spatial shape ``spatial`` (5-d),
    ``dyk`` at the chosen positions, 0 elsewhere, stored as ``dyk`` is."""
    operand = dispatch.operand(dyk)
    dx = empty(dyk.shape[:2] + tuple(spatial), dyk.dtype, operand.layout == "channels_last")
    dispatch.choose("polyphase", "scatter", None, operand)(dyk, steps, phases, dx)
    return dx


def kernel_names(xk: np.ndarray) -> tuple[str, str]:
    """The kernels that gather ``xk``'s components and scatter their gradient."""
    operand = dispatch.operand(xk)
    return (dispatch.choose("polyphase", "gather", None, operand).name,
            dispatch.choose("polyphase", "scatter", None, operand).name)


def phase_count(steps) -> int:
    return math.prod(int(s) for s in steps)
