"""Fractional max pooling (Graham, "Fractional Max-Pooling", 2014): max pooling that
shrinks each spatial dim by a factor between 1 and 2 (or any factor), with windows
placed by a random or pseudo-random sequence drawn afresh for every ``(n, c)`` plane.
The kernels: :mod:`poolgrad.kernels.fractional`.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _inputs as inputs
from .. import autodiff, geometry
from ..engines import Pullback
from ..engines import fractional as windows
from ..kernels.fractional import pseudo_random_on_grid, pseudo_random_windows

SEQUENCES = ("pseudo_random", "random")
REGIONS = ("disjoint", "overlapping")


def sample_axis(ndim: int, axis: int) -> int:
    """Which entry of a plane's samples places spatial axis ``axis``: PyTorch's order,
    ``(W, H)`` for 2 dims and ``(D, H, W)`` for 3."""
    return 1 - axis if ndim == 2 else axis


def pseudo_random_constants(dtype, span: int, steps: int):
    """The pseudo-random sequence's ``alpha = span / steps`` and indices ``0, 1, ...,
    steps - 1``, both in ``dtype`` (the draws'), as :func:`boundaries` computes them."""
    dtype = np.dtype(dtype).type
    alpha = dtype(span) / dtype(steps) if steps else dtype(0)  # (no step: unused)
    return alpha, np.arange(steps).astype(dtype)


def boundaries(u: np.ndarray, span: int, steps: int, sequence: str, rng) -> np.ndarray:
    """``(P, steps + 1)`` increasing integers from 0 to ``span``, one row per plane.

    ``"pseudo_random"``: ``b[i] = int((i + u) * a) - int(u * a)`` with ``a = span /
    steps``, computed in ``u``'s dtype (PyTorch's ``generate_intervals``: Graham's
    ``ceil(a (i + u))`` with floor for ceil, which moves a boundary only where ``a (i +
    u)`` is an integer), and ``b[steps] = span``. ``"random"``: the
    steps are ``span // steps`` or one more, in an order shuffled per plane by ``rng``.
    """
    planes = u.shape[0]
    b = np.empty((planes, steps + 1), np.int64)
    b[:, steps] = span
    if steps == 0:
        return b
    if sequence == "pseudo_random":  # the disjoint regions' starts are the b[i], i < steps
        pseudo_random_windows(u, *pseudo_random_constants(u.dtype, span, steps), span, 0,
                              span, b[:, :steps], np.empty((planes, steps), np.int64))
    else:
        short, longer = divmod(span, steps)
        rank = np.argsort(rng.random((planes, steps)), axis=1)
        b[:, 0] = 0
        b[:, 1:] = np.cumsum(short + (rank < longer), axis=1)
    return b


# the kernel's codes for Graham's regions (a whole number is PyTorch's window length)
_REGION_CODES = {"disjoint": 0, "overlapping": -1}


def region_tables(spatial, kernel, out, u, sequence, generator):
    """Every plane's windows: ``(starts, lengths, extent)``, ``starts`` and ``lengths``
    ``(P, 3, max(out))`` int64 over the kernels' (D, H, W) axes (an unused axis, and the
    columns past an axis's windows: start 0, length 1), ``extent`` the longest window
    per axis.

    Args:
        spatial, out: the input's and output's spatial sizes.
        kernel: per dim, the window's length, or Graham's regions, ``"disjoint"`` or
            ``"overlapping"``.
        u: ``(P, ndim)`` draws in PyTorch's order (:func:`sample_axis`).
        sequence: ``"pseudo_random"`` or ``"random"``; generator: what ``"random"``
            draws its orders from (``.random(shape)``).
    """
    ndim = len(spatial)
    planes = u.shape[0]
    axes = geometry.KERNEL_AXES
    starts = np.empty((planes, axes, max(out)), np.int64)
    lengths = np.empty_like(starts)
    starts[:, :axes - ndim] = 0
    lengths[:, :axes - ndim] = 1
    extent = [1] * axes
    for axis, (length, k, o) in enumerate(zip(spatial, kernel, out, strict=True)):
        row = axes - ndim + axis
        draws = u[:, sample_axis(ndim, axis)]
        # PyTorch's: windows of k from o starts spanning n - k; Graham's: from each
        # boundary to the next (and its first, if overlapping)
        window = _REGION_CODES[k] if isinstance(k, str) else k
        span, steps = (length, o) if isinstance(k, str) else (length - k, o - 1)
        if sequence == "pseudo_random":  # in one pass, with no boundaries array
            extent[row] = pseudo_random_windows(
                draws, *pseudo_random_constants(draws.dtype, span, steps), span, window,
                length, starts[:, row], lengths[:, row])
            continue
        b = boundaries(draws, span, steps, sequence, generator)
        if window > 0:
            starts[:, row, :o] = b
            lengths[:, row, :o] = k
        else:
            ends = np.minimum(b[:, 1:] + 1, length) if window < 0 else b[:, 1:]
            starts[:, row, :o] = b[:, :o]
            lengths[:, row, :o] = ends - b[:, :o]
        starts[:, row, o:] = 0
        lengths[:, row, o:] = 1
        extent[row] = int(lengths[:, row, :o].max(initial=1))  # initial: no planes
    return starts, lengths, np.array(extent, np.int64)


def pseudo_random_grid(spatial, kernel, out, u, sequence):
    """``(plan, starts)`` where the pseudo-random sequence places every plane's windows
    on one grid, else None: the max pooling plan that
    :func:`poolgrad.engines.fractional.regular_grid` finds in the tables, and the
    windows' starts as :func:`region_tables` lays them out (a broadcast view), found
    without building the tables. Arguments as :func:`region_tables` takes them.

    Such a grid needs a whole mean step ``alpha = (n - k) / (o - 1)`` along every axis
    (the last window starts at ``n - k``), and the draws' rounding can still move a
    window off it, so every plane is checked. Ratio 0.5 of an even length with k 2 is
    such a case, and building and reading its tables took a fifth of the forward."""
    # Graham's overlapping regions end one past the next start, but the last: never one grid
    if sequence != "pseudo_random" or "overlapping" in kernel or u.shape[0] == 0:
        return None
    ndim = len(spatial)
    axes = geometry.KERNEL_AXES
    starts = np.zeros((axes, max(out)), np.int64)
    window, stride = [], []
    for axis, (length, k, o) in enumerate(zip(spatial, kernel, out, strict=True)):
        # region_tables' span and steps: Graham's disjoint regions end at the next start
        span, steps = (length, o) if k == "disjoint" else (length - k, o - 1)
        alpha, index = pseudo_random_constants(u.dtype, span, steps)
        if steps == 0 or not float(alpha).is_integer() or alpha < 1:
            return None
        step = int(alpha)
        if span != steps * step:  # alpha rounded to a whole number (a span from 2^24 in
            return None           # float32): the last window, at span, is off the grid
        if not pseudo_random_on_grid(u[:, sample_axis(ndim, axis)], alpha, index, step):
            return None
        starts[axes - ndim + axis, :o] = np.arange(o) * step
        window.append(step if k == "disjoint" else k)
        stride.append(step)
    plan = geometry.sliding_plan(tuple(spatial), tuple(window), tuple(stride), (1,) * ndim,
                                 ((0, 0),) * ndim, False)
    return plan, np.broadcast_to(starts, (u.shape[0],) + starts.shape)


def plane_windows(spatial, kernel, out, u, sequence, generator, search=True):
    """``(tables, grid, starts)``: every plane's windows, the max pooling plan of the
    grid they lie on (None if none, or without ``search``) and their starts, as
    :func:`region_tables` lays them out. Windows that :func:`pseudo_random_grid` finds
    on a grid come without tables (None): the engines read none for a grid. Arguments
    as :func:`region_tables` takes them."""
    if search:
        on_grid = pseudo_random_grid(spatial, kernel, out, u, sequence)
        if on_grid is not None:
            return None, *on_grid
    tables = region_tables(spatial, kernel, out, u, sequence, generator)
    grid = windows.regular_grid(tables, spatial, out) if search else None
    return tables, grid, tables[0]


def _output_sizes(spatial, ndim, output_size, output_ratio):
    if (output_size is None) == (output_ratio is None):
        raise ValueError("fractional_max_pool needs exactly one of output_size and "
                         "output_ratio")
    if output_size is not None:
        return geometry.per_dim(output_size, ndim, "output_size")
    ratios = output_ratio if geometry.sequence_length(output_ratio) else (output_ratio,) * ndim
    if len(ratios) != ndim or not all(isinstance(r, numbers.Real) and 0 < r < 1
                                      for r in ratios):
        raise ValueError(f"output_ratio must be a number in (0, 1) or {ndim} of them, got "
                         f"{output_ratio!r}")
    sizes = tuple(int(length * r) for length, r in zip(spatial, ratios, strict=True))
    if min(sizes) < 1:
        raise ValueError(f"output_ratio {output_ratio!r} of spatial size {tuple(spatial)} "
                         f"leaves an empty output {sizes}")
    return sizes


def _check_fit(spatial, kernel, out):
    for axis, (length, k, o) in enumerate(zip(spatial, kernel, out, strict=True)):
        if isinstance(k, str):
            if o > length:
                raise ValueError(f"fractional_max_pool: output size {o} exceeds input size "
                                 f"{length} along spatial dim {axis}")
        elif k > length or o + k - 1 > length:
            raise ValueError(f"fractional_max_pool: output size {o} with kernel {k} needs at "
                             f"least {o + k - 1} inputs along spatial dim {axis}, got {length}")


def check_samples(samples, lead, ndim, sequence) -> np.ndarray:
    """``samples`` checked (shape ``lead + (ndim,)``, values in ``[0, 1)``, only for the
    pseudo-random sequence), in float64 if given so, else float32."""
    if sequence != "pseudo_random":
        raise ValueError('samples place the "pseudo_random" sequence; the "random" one is '
                         'drawn from rng')
    s = inputs.check_array(samples, "samples", floating=True)
    if s.shape != lead + (ndim,):
        raise ValueError(f"samples must have shape {lead + (ndim,)} (the batch and channel "
                         f"dims, then one per spatial dim), got {s.shape}")
    if not np.all((s >= 0) & (s < 1)):
        raise ValueError("samples must lie in [0, 1)")
    return in_sample_precision(s)


def in_sample_precision(u: np.ndarray) -> np.ndarray:
    """``u`` in the precision the sequences are computed in: float64 if given so, else
    float32 (PyTorch computes them in the input's)."""
    return u if u.dtype == np.float32 else u.astype(
        np.float64 if u.dtype == np.float64 else np.float32)


@inputs.memoized
def fractional_arguments(shape, kernel_size, output_size, output_ratio, sequence,
                         spatial_dims, where=""):
    """``(ndim, kernel, output sizes)`` of a fractional max pooling of an input of
    ``shape``, checked; ``kernel`` holds a length or the region kind per dim. ``where``
    prefixes the errors of the input's shape."""
    regions = kernel_size if isinstance(kernel_size, str) else None
    if regions is not None and regions not in REGIONS:
        raise ValueError(f"kernel_size must be an int, one per spatial dim, or one of "
                         f"{', '.join(map(repr, REGIONS))}; got {kernel_size!r}")
    if sequence not in SEQUENCES:
        raise ValueError(f"sequence must be one of {', '.join(map(repr, SEQUENCES))}, got "
                         f"{sequence!r}")
    per_dim_args = {"output_size": output_size}
    if regions is None:
        per_dim_args["kernel_size"] = kernel_size
    if geometry.sequence_length(output_ratio) is not None:
        per_dim_args["output_ratio"] = output_ratio
    ndim = inputs.resolve_spatial_dims(shape, spatial_dims, where, **per_dim_args)
    spatial = tuple(shape[-ndim:])
    kernel = (regions,) * ndim if regions else geometry.per_dim(kernel_size, ndim, "kernel_size")
    out = _output_sizes(spatial, ndim, output_size, output_ratio)
    _check_fit(spatial, kernel, out)
    return ndim, kernel, out


def _fractional_max_pool(x, kernel_size, output_size=None, output_ratio=None,
                         return_indices=False, *, samples=None, rng=None,
                         sequence="pseudo_random", spatial_dims=None, want_pullback=False):
    x = inputs.check_array(x, "x", floating=True)
    ndim, kernel, out = fractional_arguments(x.shape, kernel_size, output_size, output_ratio,
                                             sequence, spatial_dims)
    layout = inputs.Layout(x.shape, ndim)
    compute = inputs.COMPUTE_DTYPE[x.dtype]
    generator = None
    if samples is None:
        generator = inputs.generator(rng)
        u = generator.random(layout.lead + (ndim,)).astype(compute)
    elif rng is not None:
        raise ValueError("fractional_max_pool takes samples or rng, not both")
    else:
        u = check_samples(samples, layout.lead, ndim, sequence)

    planes = int(np.prod(layout.lead))
    tables, grid, starts = plane_windows(layout.spatial, kernel, out,
                                         u.reshape(planes, ndim), sequence, generator)
    view = inputs.compute_view(x, layout)
    # y and the winners stored as x is (channels-last in, channels-last out)
    y, winners, forward = windows.fractional_forward_stored(view, tables, out, grid)
    values = y.astype(x.dtype, copy=False).reshape(layout.user_shape(out))
    result = values
    if return_indices:
        indices = windows.fractional_indices_stored(tables, winners, layout.spatial, grid)
        result = (values, indices.reshape(values.shape))
    if not want_pullback:
        return result, None

    backward, backward_name = windows.fractional_routing(tables, winners, layout.spatial,
                                                         grid, view.dtype)
    return result, Pullback("fractional_max_pool",
                            lambda dy: backward(layout.to_kernel(dy)).reshape(x.shape),
                            values.shape, x.shape, x.dtype,
                            {"window_positions": winners, "starts": starts},
                            (forward, backward_name))


def fractional_max_pool(x, kernel_size, output_size=None, output_ratio=None,
                        return_indices=False, *, samples=None, rng=None,
                        sequence="pseudo_random", spatial_dims=None):
    r"""Fractional max pooling (Graham 2014): max pooling to any output size, over
    windows placed afresh, at random, in every ``(n, c)`` plane.

    Along a spatial dim of length ``n`` pooled to ``o`` outputs, the windows start at
    integers ``b[0] = 0 < b[1] < ... `` placed by one of two sequences:

    * ``"pseudo_random"`` (PyTorch's and Graham's): ``b[i] = int((i + u) a) - int(u a)``
      with one uniform draw ``u`` per plane and dim and ``a`` the mean step;
    * ``"random"``: steps of ``floor(a)`` and ``ceil(a)`` in a random order.

    The windows are either ``kernel_size`` long (PyTorch's form: ``o`` windows whose
    starts span ``n - kernel_size``, so the last ends at ``n``), or Graham's regions,
    ``kernel_size="disjoint"`` (from one start to the next, ``a = n / o``) or
    ``"overlapping"`` (one element further). Each window's maximum is taken as by
    :func:`poolgrad.max_pool` (the first maximum, or the first NaN), and the gradient
    goes to it; where windows overlap, the contributions add up.

    With the same ``samples`` it equals ``torch.nn.functional.fractional_max_pool2d``
    / ``3d`` (given as ``_random_samples``): the same values, indices and gradients,
    the sequences computed in the samples' precision as PyTorch computes them in the
    input's. (PyTorch's index of a window holding NaN is its last NaN; here the first.)

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        kernel_size: an int or one per spatial dim, or ``"disjoint"`` or
            ``"overlapping"``.
        output_size: an int or one per dim; or instead
        output_ratio: a number in (0, 1) or one per dim, giving ``int(n * ratio)``
            outputs.
        return_indices: also return each winner's flat index in its input plane
            (int64, as PyTorch's).
        samples: the ``u`` of the pseudo-random sequence, shaped ``x.shape[:-ndim] +
            (ndim,)`` in ``[0, 1)``, the last axis in PyTorch's order: ``(W, H)`` for 2
            spatial dims, ``(D, H, W)`` for 3. Not with ``rng``.
        rng: an int seed or a ``numpy.random.Generator`` for the draws (``samples`` as
            ``rng.random(...)`` in x's precision, then the ``"random"`` orders); None
            draws fresh entropy. The same seed gives the same bits.
        sequence: ``"pseudo_random"`` or ``"random"``.
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default: a per-dim
            argument's length, else ``x.ndim - 2``, batched); lets x be unbatched.

    Returns:
        ``y`` shaped ``x.shape[:-ndim] + output``, or ``(y, indices)``.
    """
    return _fractional_max_pool(x, kernel_size, output_size, output_ratio, return_indices,
                                samples=samples, rng=rng, sequence=sequence,
                                spatial_dims=spatial_dims)[0]


autodiff.register({fractional_max_pool: _fractional_max_pool})
