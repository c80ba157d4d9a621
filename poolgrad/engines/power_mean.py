"""GeM pooling: the forward and the backward (``dx`` and the terms of ``dp``) on the
fused kernels of :mod:`poolgrad.kernels.power_mean`, over whole planes (``plan`` None)
or a sliding plan. The NumPy operator (:func:`poolgrad.gem_pool`) and poolgrad.torch's
CPU operators run these same functions.

Arrays are 5-d kernel views ``(N, C, D, H, W)`` in the compute dtype; results are stored
in the layout of ``x`` (channels-last in, channels-last out)."""

from __future__ import annotations

import numpy as np

from ..kernels import dispatch, powers
from .pullback import empty, planes


def _op(plan) -> str:
    return "gem_global" if plan is None else "gem"


def gem_kernels(xk: np.ndarray, plan) -> tuple[str, str]:
    """The names of the kernels that run the forward and the backward of ``xk``."""
    operand = dispatch.operand(xk)
    return tuple(dispatch.choose(_op(plan), direction, plan, operand).name
                 for direction in ("forward", "backward"))


def _scalars(p: float, eps: float, dtype) -> tuple:
    """The kernels' ``(eps, p, whole)`` for inputs and results of ``dtype``."""
    return float(eps), float(p), powers.power_form(p, dtype)


def gem_forward(xk: np.ndarray, plan, p: float, eps: float,
                copy: np.ndarray | None = None) -> np.ndarray:
    """The power means of ``xk``'s windows, or of its whole planes when ``plan`` is
    None (``y`` then ``(N, C, 1, 1, 1)``). ``copy``, if given (shaped and stored as
    ``xk``), gets a copy of ``xk`` for a pullback to own: the global kernels, and the 2x2
    one where its windows cover x, write it in the same pass, from what they have just
    read (else a copy after the forward)."""
    operand = dispatch.operand(xk)
    forward = dispatch.choose(_op(plan), "forward", plan, operand)
    if plan is None:
        y = np.empty(xk.shape[:2], xk.dtype)
        target = None if copy is None else planes(copy)
        if target is not None and not np.shares_memory(target, copy):
            target = None  # a layout whose planes are not a view: copied below
        forward(planes(xk), *_scalars(p, eps, xk.dtype), y, copy=target)
        if copy is not None and target is None:
            np.copyto(copy, xk)
        return y.reshape(xk.shape[:2] + (1, 1, 1))
    y = empty(xk.shape[:2] + tuple(a.count for a in plan.kernel_axes), xk.dtype,
              operand.layout == "channels_last")
    forward(xk, *_scalars(p, eps, xk.dtype), y, copy=copy)
    return y


def gem_backward(xk: np.ndarray, yk: np.ndarray, dyk: np.ndarray, plan, p: float, eps: float,
                 with_dp: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``(dx, p_terms or None)``: ``dx`` in ``dyk``'s dtype and ``xk``'s layout, and with
    ``with_dp`` each window's term of ``dp`` (float64, ``y``'s shape and layout: their
    sum, :func:`p_gradient`, is ``dp``)."""
    operand = dispatch.operand(xk)
    scalars = _scalars(p, eps, xk.dtype)
    backward = dispatch.choose(_op(plan), "backward", plan, operand)
    dx = empty(xk.shape, dyk.dtype, operand.layout == "channels_last")
    if plan is None:  # dx and the terms in one pass (the kernel writes 0s without dp)
        terms = np.empty(yk.shape[:2], np.float64)
        backward(planes(xk), planes(yk)[..., 0], planes(dyk)[..., 0], *scalars, with_dp,
                 planes(dx), terms)
        return dx, terms.reshape(yk.shape) if with_dp else None
    if not with_dp:
        backward(xk, yk, dyk, *scalars, dx)
        return dx, None
    terms = empty(yk.shape, np.float64, operand.layout == "channels_last")  # y's layout
    if backward.records:  # dx and the terms in one pass
        backward(xk, yk, dyk, *scalars, dx, terms)
    else:
        backward(xk, yk, dyk, *scalars, dx)
        dispatch.choose("gem", "p_terms", plan, operand)(xk, yk, dyk, *scalars, terms)
    return dx, terms


def p_gradient(terms: np.ndarray) -> float:
    """``dp``: the sum of :func:`gem_backward`'s terms (5-d, any layout), plane by plane
    in one order, then over the planes in C order: the same bits in either layout."""
    totals = np.empty(terms.shape[:2], np.float64)
    dispatch.choose("gem", "p_total", None, dispatch.operand(terms))(terms, totals)
    return float(np.sum(totals))
