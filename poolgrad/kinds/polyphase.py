"""Truly shift-invariant downsampling: adaptive polyphase sampling (APS, Chaman &
Dokmanic, "Truly shift-invariant convolutional neural networks", CVPR 2021). The
kernels and their order of operations: :mod:`poolgrad.kernels.polyphase`.
"""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from .. import autodiff, geometry, ops
from ..engines import Pullback
from ..engines import polyphase as engine
from . import blur

NORMS = tuple(engine.NORMS)


def _phases(phase, n: int, count: int, batched: bool) -> np.ndarray | None:
    """A given ``phase`` (None, one int for every example, or one per example) as an
    ``(n,)`` int64 array, each in ``[0, count)``."""
    if phase is None:
        return None
    values = np.asarray(phase)
    if values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"aps_pool: phase must be None, an int or an integer array, got "
                        f"{values.dtype if values.ndim else type(phase).__name__}")
    expected = (n,) if batched else ()
    if values.ndim and values.shape != expected:
        raise ValueError(f"aps_pool: phase must be one int or one per example, shape "
                         f"{expected}, got shape {values.shape}")
    if values.size and (values.min() < 0 or values.max() >= count):
        raise ValueError(f"aps_pool: phase must be in [0, {count}) (the stride's "
                         f"components), got {values.min() if values.min() < 0 else values.max()}")
    return np.broadcast_to(values.astype(np.int64), (n,)).copy()


def _aps_pool(x, stride=2, *, norm="l2", phase=None, return_indices=False,
              spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    if norm not in NORMS:
        raise ValueError(f"aps_pool: norm must be one of {', '.join(NORMS)}, got {norm!r}")
    if not isinstance(return_indices, (bool, np.bool_)):
        raise TypeError(f"aps_pool: return_indices must be True or False, got "
                        f"{return_indices!r}")
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims, "aps_pool: ", stride=stride)
    steps = geometry.per_dim(stride, ndim, "stride")
    layout = inputs.Layout(x.shape, ndim)
    xk = inputs.compute_view(x, layout)
    kernel_steps = np.array((1,) * (geometry.KERNEL_AXES - ndim) + steps, np.int64)
    count = engine.phase_count(steps)
    phases = _phases(phase, xk.shape[0], count, layout.batched)
    if phases is None:
        phases = engine.choose_phases(engine.phase_norms(xk, kernel_steps, norm))
    yk = engine.phase_gather(xk, kernel_steps, phases)
    out_spatial = engine.components(layout.spatial, steps)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(out_spatial))
    chosen = phases if layout.batched else phases[0]
    result = (y, chosen) if return_indices else y
    if not want_pullback:
        return result, None
    saved = phases.astype(geometry.position_dtype(count))  # one small integer per example

    def backward(dy):
        return engine.phase_scatter(layout.to_kernel(dy), kernel_steps,
                                    saved.astype(np.int64), xk.shape[2:])
    return result, Pullback("aps_pool", backward, y.shape, x.shape, x.dtype,
                            {"phases": saved},
                            ("polyphase.phase_gather", "polyphase.phase_scatter"))


def aps_pool(x, stride=2, *, norm="l2", phase=None, return_indices=False,
             spatial_dims=None):
    r"""Adaptive polyphase sampling (APS; Chaman & Dokmanic, CVPR 2021): downsampling by
    ``stride`` that keeps, for each example, its polyphase component with the largest
    norm, where plain subsampling always keeps the even one.

    x is split into its ``prod(stride)`` polyphase components, component ``(a, b)``
    (2-d) being ``x[..., a::s_h, b::s_w]``; they are numbered row-major, ``a * s_w +
    b``. An input whose size is not a multiple of the stride is first padded
    circularly to one (``x[..., i mod L]``), as the paper does. For each example the
    norm of each component is taken over all its channels and positions, and the first
    largest wins (ties go to the lowest phase; a NaN norm counts as the largest). The
    output is that component.

    Shifting x circularly by any amount shifts the output circularly and changes no
    value: a network of circular convolutions, APS at every stride and a global
    average head is exactly invariant to circular shifts of its input.

    The gradient goes to the chosen component alone, each example's to its own (as
    max pooling's goes to its winners); the pullback keeps one small integer per
    example. The choice itself passes no gradient.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim ``stride`` gives their number; float16/32/64.
        stride: an int >= 1 or one per spatial dim.
        norm: ``"l2"`` (compared as the sum of squares), ``"l1"`` or ``"max"`` (the
            largest absolute value). Sums run in float64 in a fixed order: the same
            choice at any thread count and in either memory layout.
        phase: None (choose by the norm), or the phase to take: one int for every
            example or one per example (an ``(N,)`` integer array), in ``[0,
            prod(stride))``. A residual block's shortcut takes the main path's, or the
            network is not invariant.
        return_indices: also return the phase of each example, int64 ``(N,)`` (a
            0-d array for an unbatched x).
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default: a per-dim
            stride's length, else ``x.ndim - 2``, batched); lets x be unbatched.

    Returns:
        ``(N, C, *ceil(spatial / stride))`` with x's dtype, or ``(y, phases)``.

    Example:
        >>> x = np.array([[[0.0, 5.0, 1.0, 4.0]]])
        >>> aps_pool(x, 2, return_indices=True)
        (array([[[5., 4.]]]), array([1]))
    """
    return _aps_pool(x, stride, norm=norm, phase=phase, return_indices=return_indices,
                     spatial_dims=spatial_dims)[0]


autodiff.register({aps_pool: _aps_pool})


def _circular_pad(x: np.ndarray, ndim: int, before, after) -> np.ndarray:
    """``x`` padded circularly along its last ``ndim`` axes."""
    return np.pad(x, [(0, 0)] * (x.ndim - ndim) + list(zip(before, after, strict=True)),
                  mode="wrap")


def _fold(dpad: np.ndarray, ndim: int, before, sizes) -> np.ndarray:
    """The transpose of :func:`_circular_pad`: each padded position's gradient added onto
    the element it copied."""
    dx = dpad
    for axis, (start, length) in enumerate(zip(before, sizes, strict=True)):
        axis += dx.ndim - ndim
        positions = (np.arange(dx.shape[axis]) - start) % length
        folded = np.zeros(dx.shape[:axis] + (length,) + dx.shape[axis + 1:], dx.dtype)
        np.add.at(folded, (slice(None),) * axis + (positions,), dx)
        dx = folded
    return dx


def _max_aps_pool(x, kernel_size=2, stride=2, filter_size=None, *, norm="l2", phase=None,
                  return_indices=False, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims, "max_aps_pool: ",
                                       kernel_size=kernel_size, stride=stride,
                                       filter_size=filter_size)
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    before = tuple((k - 1) // 2 for k in kernel)  # as padding="same" splits it
    after = tuple(k - 1 - b for k, b in zip(kernel, before, strict=True))
    batched = x.ndim == ndim + 2
    padded = _circular_pad(x if batched else x[None], ndim, before, after)
    first = ((ops.max_pool, (kernel, 1), {}) if filter_size is None else
             (blur.max_blur_pool, (kernel, 1, filter_size, "circular"), {}))
    stages = [first, (aps_pool, (stride,), {"norm": norm, "phase": phase,
                                            "return_indices": return_indices})]
    value, pullbacks = padded, []
    for op, args, kwargs in stages:
        if want_pullback:
            value, pullback = autodiff.vjp(op, value, *args, **kwargs)
            pullbacks.append(pullback)
        else:
            value = op(value, *args, **kwargs)
    if not batched:
        value = tuple(v[0] for v in value) if return_indices else value[0]
    if not want_pullback:
        return value, None
    y = value[0] if return_indices else value

    def backward(dy):
        grad = dy if batched else dy[None]
        for pullback in reversed(pullbacks):
            grad = pullback(grad)
        dx = _fold(grad, ndim, before, x.shape[x.ndim - ndim:])
        return dx if batched else dx[0]
    saved = {f"{pullback.op}.{name}": array for pullback in pullbacks
             for name, array in pullback.saved.items()}
    return value, Pullback("max_aps_pool", backward, y.shape, x.shape, x.dtype, saved,
                           tuple(pullbacks[0].kernels.values()))


def max_aps_pool(x, kernel_size=2, stride=2, filter_size=None, *, norm="l2", phase=None,
                 return_indices=False, spatial_dims=None):
    """Max pooling made shift-invariant (APS's replacement for ``MaxPool``): the max over
    every ``kernel_size`` window at stride 1 with circular padding (``kernel_size - 1``
    in all, split as ``padding="same"`` splits it), an optional binomial blur of
    ``filter_size`` taps at stride 1 (circular), then :func:`aps_pool` at ``stride``.

    Each stage commutes with circular shifts, so the whole does what :func:`aps_pool`
    does: a circular shift of x (sizes multiples of the stride) shifts each example's
    output circularly. The gradient goes back through APS's choice, the blur and the
    max's winners (first maximum, NaN wins), and padding folds onto what it copied.

    Args:
        x: as :func:`aps_pool` takes it.
        kernel_size: the max's window, an int or one per spatial dim.
        stride, norm, phase, return_indices, spatial_dims: as :func:`aps_pool`'s.
        filter_size: None (no blur) or the blur's taps per dim, 1-7.

    Returns:
        ``(N, C, *ceil(spatial / stride))``, or ``(y, phases)``.
    """
    return _max_aps_pool(x, kernel_size, stride, filter_size, norm=norm, phase=phase,
                         return_indices=return_indices, spatial_dims=spatial_dims)[0]


autodiff.register({max_aps_pool: _max_aps_pool})
