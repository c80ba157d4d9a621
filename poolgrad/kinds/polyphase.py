"""Truly shift-invariant downsampling: adaptive polyphase sampling (APS, Chaman &
Dokmanic, "Truly shift-invariant convolutional neural networks", CVPR 2021). The
kernels and their order of operations: :mod:`poolgrad.kernels.polyphase`.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import _inputs as inputs
from .. import autodiff, geometry
from ..engines import Pullback
from ..engines import polyphase as engine
from ..engines.pullback import circular_pad, fold_circular
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
    outside = values[(values < 0) | (values >= count)]
    if outside.size:
        raise ValueError(f"aps_pool: phase must be in [0, {count}) (the stride's "
                         f"components), got {outside.flat[0]}")
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
                            {"phases": saved}, engine.kernel_names(xk))


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
    padded = circular_pad(x if batched else x[None], ndim, before, after)
    # max_blur_pool's stride-1 max map (its flat passes; a 1-tap blur is none): the
    # core's max_pool at stride 1 took 37.8 ms on a 32x64x57x57 input, this 4.2
    first = (blur.max_blur_pool, (kernel, 1, filter_size or 1, "circular"), {})
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
        dx = fold_circular(grad, ndim, before, x.shape[x.ndim - ndim:])
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


# ------------------------------------------------------ learnable polyphase sampling


def _check_scorer(weights, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scoring network's ``(W1, b1, w2)`` as float64 arrays, checked: ``W1``
    ``(hidden, C)``, ``b1`` and ``w2`` ``(hidden,)``, all finite."""
    if not isinstance(weights, (tuple, list)) or len(weights) != 3:
        raise TypeError("lps_pool: weights must be (W1, b1, w2), the scoring network's "
                        "(hidden, C), (hidden,) and (hidden,) arrays")
    arrays = tuple(np.asarray(w, dtype=np.float64) for w in weights)
    hidden = arrays[0].shape[0] if arrays[0].ndim == 2 else -1
    expected = ((hidden, channels), (hidden,), (hidden,))
    if hidden < 1 or tuple(a.shape for a in arrays) != expected:
        raise ValueError(f"lps_pool: weights must be W1 (hidden, {channels}), b1 (hidden,) "
                         f"and w2 (hidden,), got shapes {[a.shape for a in arrays]}")
    if not all(np.isfinite(a).all() for a in arrays):
        raise ValueError("lps_pool: the weights must be finite")
    return arrays


def _components(x: np.ndarray, ndim: int, steps) -> tuple[np.ndarray, tuple]:
    """``(components (N, P, C, *M), padded shape)``: x padded circularly to a multiple of
    the stride, split into its phases (row-major)."""
    counts = engine.components(x.shape[2:], steps)
    padded = circular_pad(x, ndim, (0,) * ndim,
                           tuple(m * s - n for m, s, n in zip(counts, steps, x.shape[2:],
                                                              strict=True)))
    parts = [padded[(slice(None), slice(None)) + tuple(
        slice(a, None, s) for a, s in zip(offsets, steps, strict=True))]
        for offsets in itertools.product(*(range(s) for s in steps))]
    return np.stack(parts, axis=1), padded.shape


def _lps_pool(x, weights, stride=2, *, training=False, temperature=1.0, rng=None,
              return_indices=False, spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    temperature = inputs.check_real(temperature, "temperature", positive=True)
    if not isinstance(training, (bool, np.bool_)) or not isinstance(return_indices,
                                                                     (bool, np.bool_)):
        raise TypeError("lps_pool: training and return_indices must be True or False")
    ndim = inputs.resolve_spatial_dims(x.shape, spatial_dims, "lps_pool: ", stride=stride)
    steps = geometry.per_dim(stride, ndim, "stride")
    batched = x.ndim == ndim + 2
    xb = (x if batched else x[None]).astype(np.float64)
    W1, b1, w2 = _check_scorer(weights, xb.shape[1])
    comps, padded_shape = _components(xb, ndim, steps)  # (N, P, C, *M)
    n, count = comps.shape[:2]
    flat = comps.reshape(n, count, comps.shape[2], -1)  # (N, P, C, L)
    hidden = np.einsum("hc,npcl->nphl", W1, flat) + b1[:, None]
    active = np.maximum(hidden, 0.0)
    scores = np.einsum("h,nphl->np", w2, active) / flat.shape[3]
    noise = (-np.log(-np.log(inputs.generator(rng).random((n, count))))
             if training else np.zeros((n, count)))
    logits = (scores + noise) / temperature
    phases = np.argmax(logits, axis=1)
    if training:
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        mixed = np.einsum("np,np...->n...", probabilities, comps)
    else:  # the hard choice, taken (weighted by 0, an infinite component would give NaN)
        probabilities = np.eye(count)[phases]
        mixed = comps[np.arange(n), phases]
    y = mixed.astype(x.dtype) if batched else mixed[0].astype(x.dtype)
    chosen = phases if batched else phases[0]
    result = (y, chosen) if return_indices else y
    if not want_pullback:
        return result, None

    def backward(dy, with_params):
        dyb = (dy if batched else dy[None]).astype(np.float64)
        dcomps = probabilities.reshape(n, count, *(1,) * (comps.ndim - 2)) * dyb[:, None]
        grads = (np.zeros_like(W1), np.zeros_like(b1), np.zeros_like(w2))
        if training:  # through the softmax to the scores, the scorer and the components
            dp = np.einsum("ncl,npcl->np", dyb.reshape(n, flat.shape[2], -1), flat)
            dscores = probabilities * (dp - (probabilities * dp).sum(axis=1, keepdims=True))
            dscores /= temperature
            dactive = np.einsum("np,h->nph", dscores, w2)[..., None] / flat.shape[3]
            dhidden = dactive * (hidden > 0)
            grads = (np.einsum("nphl,npcl->hc", dhidden, flat), dhidden.sum(axis=(0, 1, 3)),
                     np.einsum("np,nphl->h", dscores, active) / flat.shape[3])
            dcomps = dcomps + np.einsum("hc,nphl->npcl", W1, dhidden).reshape(comps.shape)
        dpad = np.zeros(padded_shape)
        for phase, offsets in enumerate(itertools.product(*(range(s) for s in steps))):
            dpad[(slice(None), slice(None)) + tuple(
                slice(a, None, s) for a, s in zip(offsets, steps, strict=True))] = dcomps[:, phase]
        dx = fold_circular(dpad, ndim, (0,) * ndim, xb.shape[2:])
        dx = dx if batched else dx[0]
        return (dx, *grads) if with_params else (dx, None, None, None)
    saved = {"x": xb, "probabilities": probabilities}
    return result, Pullback("lps_pool", backward, y.shape, x.shape, x.dtype, saved,
                            ("numpy.einsum", "numpy.einsum"), params=("W1", "b1", "w2"))


def lps_pool(x, weights, stride=2, *, training=False, temperature=1.0, rng=None,
             return_indices=False, spatial_dims=None):
    r"""Learnable polyphase sampling (LPS; Rojas-Gomez, Lim, Schwing, Do & Yeh, NeurIPS
    2022): :func:`aps_pool` with the choice learned.

    A small scoring network gives each polyphase component ``c`` (as :func:`aps_pool`
    splits x) a score, the mean over its positions of ``w2 . relu(W1 c + b1)`` (a
    per-position network, so a circular shift of the component leaves its score as it
    is). In evaluation (``training=False``) the output is each example's component of
    highest score (the first on a tie). In training it is the mixture ``sum_p
    softmax((s + g) / temperature)_p c_p``, ``g`` Gumbel noise drawn from ``rng``, whose
    gradient reaches x and the scoring network (Gumbel-softmax; Jang, Gu & Poole 2017).
    As the temperature falls the mixture tends to the hard choice.

    The pullback returns ``(dx, dW1, db1, dw2)`` (float64, summed over the batch), or
    ``dx`` alone with ``params=False``; in evaluation the choice passes no gradient, so
    the weights' gradients are 0 and ``dx`` goes to the chosen component alone.

    Args:
        x: as :func:`aps_pool` takes it.
        weights: ``(W1, b1, w2)``: ``(hidden, C)``, ``(hidden,)`` and ``(hidden,)``,
            finite.
        stride: as :func:`aps_pool`'s.
        training: the soft mixture (True) or the hard choice (False).
        temperature: the softmax's, a number > 0.
        rng: an int seed or a ``numpy.random.Generator`` for the Gumbel noise (training
            only); None draws fresh entropy.
        return_indices: also return each example's phase (of highest ``s + g``).
        spatial_dims: as :func:`aps_pool`'s.
    """
    return _lps_pool(x, weights, stride, training=training, temperature=temperature, rng=rng,
                     return_indices=return_indices, spatial_dims=spatial_dims)[0]


autodiff.register({lps_pool: _lps_pool})
