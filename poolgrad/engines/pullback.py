"""What every pooling family's engine shares: :class:`Pullback`, the vector-Jacobian
product that :func:`poolgrad.vjp` returns, and the arrays and routing a pullback is
built from.

Channels-last: an ``(N, C, *spatial)`` array stored with C fastest (PyTorch's
channels_last memory format) is pooled by kernels that run along C, and its output
and gradient keep that memory format, as in PyTorch (the dispatch decides; see
:func:`poolgrad.kernels.dispatch.operand`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _inputs as inputs
from ..kernels import dispatch, layouts


class Pullback:
    """The vector-Jacobian product of one operator call: ``dx = pullback(dy)``.

    ``dy`` must have the output's shape; ``dx`` has the input's shape and dtype. A
    pullback is pure: it may be called any number of times. ``saved`` holds the arrays
    it keeps (for max pooling with ``ties="first"``, only the winning tap of each
    window, in the smallest unsigned type that numbers the window's taps). ``kernels``
    names the kernels that ran the forward and that run the backward (``{"forward":
    "tiled.max_pool_forward_tiled", "backward": ...}``; see ``docs/kernels.md``).

    An operator with learnable parameters names them in ``params`` (gem_pool's
    ``("p",)``): its pullback returns ``(dx, dparam, ...)``, each parameter's gradient
    a float64 array shaped like the parameter (the sum over the batch), or with
    ``params=False`` ``dx`` alone, for parameters that are not learned (PyTorch's
    ``requires_grad=False``): GeM then skips the pass that sums ``dp``.
    """

    def __init__(self, op: str, backward, y_shape, x_shape, x_dtype, saved: dict,
                 kernels: tuple[str, str], params: tuple[str, ...] = ()):
        self.op = op
        self.params = tuple(params)
        self.kernels = dict(zip(("forward", "backward"), kernels, strict=True))
        self._backward = backward
        self.y_shape = tuple(y_shape)
        self.x_shape = tuple(x_shape)
        self.x_dtype = np.dtype(x_dtype)
        self.saved = saved

    @property
    def saved_bytes(self) -> int:
        return sum(a.nbytes for a in self.saved.values())

    @property
    def state_bytes_per_output(self) -> float:
        """Bytes this pullback keeps per output element (PyTorch's max pool keeps 8)."""
        return self.saved_bytes / max(math.prod(self.y_shape), 1)

    def __call__(self, dy, *, params: bool = True):
        dy = inputs.check_array(dy, "dy", floating=False)
        if dy.shape != self.y_shape:
            raise ValueError(
                f"{self.op} pullback: dy has shape {dy.shape} but the output has shape "
                f"{self.y_shape}"
            )
        if not isinstance(params, bool):
            raise TypeError(f"{self.op} pullback: params must be True or False, got "
                            f"{params!r}")
        dy = np.asarray(dy, dtype=inputs.COMPUTE_DTYPE[self.x_dtype])
        if not self.params:
            return self._as_input(self._backward(dy))
        dx, *grads = self._backward(dy, params)
        return (self._as_input(dx), *grads) if params else self._as_input(dx)

    def _as_input(self, dx):
        return dx.astype(self.x_dtype, copy=False).reshape(self.x_shape)

    def __repr__(self):
        return (f"Pullback({self.op}, x{self.x_shape} <- dy{self.y_shape}, "
                f"saves {self.saved_bytes} bytes)")


def empty(shape: tuple[int, ...], dtype, channels_last: bool) -> np.ndarray:
    """An uninitialised 5-d ``(N, C, D, H, W)`` array, stored channels-last if asked."""
    if not channels_last:
        return np.empty(shape, dtype=dtype)
    n, c, d, h, w = shape
    return np.empty((n, d, h, w, c), dtype=dtype).transpose(0, 4, 1, 2, 3)


def planes(a: np.ndarray) -> np.ndarray:
    """``(N, C, L)``: a view for C-contiguous and channels-last arrays alike (``L`` given,
    not inferred, so that an empty batch reshapes too)."""
    return a.reshape(a.shape[:2] + (math.prod(a.shape[2:]),))


def owned(view: np.ndarray, x: np.ndarray, *, keep_layout: bool = False) -> np.ndarray:
    """``view`` as an array the pullback owns: later changes to ``x`` (the caller's
    input or output) cannot reach it. A copy is C-contiguous, or with ``keep_layout``
    stored as ``view`` is (for a pullback whose kernels follow the layout)."""
    if not np.shares_memory(view, x):
        return view
    return view.copy(order="K" if keep_layout else "C")


def copy_target(view: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """Where ``view`` shares memory with ``x`` (the caller's), an empty array shaped and
    stored as ``view`` for a forward to copy ``view`` into as it reads it, which the
    pullback then owns (as :func:`owned`, without a second read); else None."""
    return np.empty_like(view) if np.shares_memory(view, x) else None


def routing(kernel, layout, plan, state):
    """``dy -> dx`` through a backward kernel that takes ``(dy, state, dx)``, with ``dx``
    stored as the kernel stores its outputs (the max and average backwards)."""
    dx_shape = layout.kernel_shape(plan.in_spatial)

    def backward(dy):
        dx = empty(dx_shape, dy.dtype, kernel.channels_last)
        kernel(layout.to_kernel(dy), state, dx)
        return dx
    return backward


def circular_pad(x: np.ndarray, ndim: int, before, after) -> np.ndarray:
    """``x`` ``(N, C, *spatial)`` padded circularly along its ``ndim`` spatial axes
    (``before[i]`` and ``after[i]`` per axis), as PyTorch's ``padding_mode="circular"``
    pads, stored channels-last if x is, else C-contiguous. The copy is the kernel
    dispatch's (``("circular", "pad")``): ``np.pad`` wrote C order, 11.4 ms
    for a 32x64x56x56 channels-last float32 array, and its NCHW wrap took 3.5 ms."""
    five = (slice(None),) * 2 + (None,) * (3 - ndim)
    front, back = (0,) * (3 - ndim) + tuple(before), (0,) * (3 - ndim) + tuple(after)
    x5 = x[five]
    padded = empty(x5.shape[:2] + tuple(n + b + a for n, b, a in zip(
        x5.shape[2:], front, back, strict=True)), x.dtype, dispatch.is_channels_last(x5))
    dispatch.choose("circular", "pad", None, dispatch.operand(x5))(x5, front, padded)
    return padded[(slice(None),) * 2 + (0,) * (3 - ndim)]


def fold_circular(dpad: np.ndarray, ndim: int, before, sizes) -> np.ndarray:
    """The transpose of :func:`circular_pad`: each padded position's gradient added onto
    the element it copied (``sizes`` the unpadded lengths), by runs of positions that
    map onto consecutive elements: one copy of the run that covers the whole length,
    then a slice add for each other run (a scatter, ``np.add.at``, took 167 ms for a
    32x64x57x57 gradient, zeros and adds 9.9). Stored as ``dpad`` is (channels-last
    in, channels-last out)."""
    dx = dpad
    for axis, (start, length) in enumerate(zip(before, sizes, strict=True)):
        axis += dx.ndim - ndim
        lead = (slice(None),) * axis
        runs = layouts.circular_runs(length, start, dx.shape[axis])  # (position, target, count)
        whole = next(run for run in runs if run[2] == length)  # the padding is short
        folded = dx[lead + (slice(whole[0], whole[0] + length),)].copy(order="K")
        for position, target, count in runs:
            if (position, target, count) != whole:
                folded[lead + (slice(target, target + count),)] += dx[
                    lead + (slice(position, position + count),)]
        dx = folded
    return dx
