"""What the operators receive, checked and put in the kernels' form: arrays and their
dtypes, the number of spatial dims, the move between the user's shape and the kernels'
5-d ``(N, C, D, H, W)`` views, the window plans of the pooling arguments
(:mod:`poolgrad.geometry`), and the kinds' learned parameters. Every check raises a
``ValueError`` or ``TypeError`` that names the argument and what is allowed. The checks of
shapes and parameters take shapes and numbers, not arrays, so that poolgrad.torch's kinds
call the same ones.
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from . import geometry
from .kernels.dispatch import is_channels_last

# float16 is stored as float16 but computed (and accumulated) in float32
COMPUTE_DTYPE = {
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(np.float32): np.dtype(np.float32),
    np.dtype(np.float64): np.dtype(np.float64),
}


# --------------------------------------------------------------------------------------
# Arguments kept per call

_KEYED_EXACTLY = (bool, int, str, type(None), np.integer, np.bool_)
_MEMO_SIZE = 1024


def _argument_key(value):
    """``value`` as a key that tells apart what ``==`` does not: ``1``, ``True``, ``1.0``,
    ``np.int64(1)``, ``(1,)`` and ``[1]`` (a float by its repr, so -0.0 is not 0.0 and NaN
    is NaN); a TypeError for anything but these and tuples and lists of them."""
    kind = type(value)
    if kind is int or kind is str or value is None:
        return value  # the commonest arguments, told apart by their own == and hash
    if isinstance(value, (tuple, list)):
        return kind, tuple(map(_argument_key, value))
    if isinstance(value, _KEYED_EXACTLY):
        return kind, value
    if isinstance(value, (float, np.floating)):
        return kind, repr(value)
    raise TypeError(f"{kind.__name__} is not a plain argument")


def memoized(function):
    """``function``, a pure check and canonicalisation of plain arguments (ints, floats,
    strings, None, and tuples and lists of them), with its results kept per arguments:
    the operators' Python work per call, which on a small input costs more than the
    pooling, is done once per geometry. The results must be immutable. A call that
    raises is not kept (so it raises again), and one with any other argument (an array,
    a tensor) is not looked up. ``.uncached`` is ``function`` itself, for a tracer (such
    as ``torch.compile``'s) that must see the work."""
    kept = {}

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            key = _argument_key(args), _argument_key(tuple(kwargs.items()))
        except TypeError:
            return function(*args, **kwargs)
        result = kept.get(key, kept)
        if result is kept:
            result = function(*args, **kwargs)
            if len(kept) >= _MEMO_SIZE:
                kept.clear()
            kept[key] = result
        return result

    call.uncached = function
    return call


# --------------------------------------------------------------------------------------
# Input handling


def check_array(x, name: str, floating: bool) -> np.ndarray:
    """``x`` as an ndarray of a supported dtype in native byte order (a copy only for
    swapped byte order)."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; pooling would ignore its mask. Pass "
                        f"{name}.filled(value) or {name}.data")
    if not isinstance(x, np.ndarray) or type(x) is not np.ndarray:
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name} must be a numeric array, got {type(x).__name__}") from error
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))  # kernels read native byte order only
    allowed = "float16, float32 or float64"
    if floating:
        if x.dtype not in COMPUTE_DTYPE:
            raise TypeError(f"{name} must have dtype {allowed}, got {x.dtype}")
    elif x.dtype not in COMPUTE_DTYPE and x.dtype.kind not in "iu":
        raise TypeError(f"{name} must have dtype {allowed} or an integer dtype, got {x.dtype}")
    return x


def _per_dim_count(per_dim_args, where="") -> tuple[str, int] | None:
    """``(name, count)`` of the first per-dim sequence among ``per_dim_args``, checked to
    agree with the others on the number of spatial dims; None without one."""
    counts = {}
    for key, value in per_dim_args.items():  # (no walrus in a comprehension: torch.compile)
        count = geometry.sequence_length(value)
        if count is not None:
            counts[key] = count
    if len(set(counts.values())) > 1:
        described = ", ".join(f"{k} has {n}" for k, n in counts.items())
        raise ValueError(f"{where}per-dim arguments disagree on the number of spatial dims: "
                         f"{described}")
    return next(iter(counts.items()), None)


def _spatial_dims(shape, name, given, how, where) -> int:
    """The number of spatial dims of an input of ``shape``: ``given`` as ``(why, count)``,
    else (None) ``len(shape) - 2``, batched. ``how`` tells, for the error, how a caller
    gives the count; ``where`` prefixes the errors (a function's name)."""
    shape, rank = tuple(shape), len(shape)
    if given is None:
        ndim = rank - 2
        if ndim not in (1, 2, 3):
            raise ValueError(
                f"{where}{name} has shape {shape} ({rank} dims) but must be batched, "
                f"(N, C, *spatial) with 1-3 spatial dims (3-5 dims), or unbatched, "
                f"(C, *spatial) (2-4 dims) with {how} saying how many dims are spatial")
    else:
        why, ndim = given
        if ndim not in (1, 2, 3):
            raise ValueError(f"{where}poolgrad pools 1, 2 or 3 spatial dims, but {why} "
                             f"({name} has shape {shape})")
        if rank not in (ndim + 1, ndim + 2):
            raise ValueError(
                f"{where}{name} has shape {shape} ({rank} dims) but {why}, which need "
                f"{ndim + 2} dims (N, C, *spatial) batched or {ndim + 1} dims (C, *spatial) "
                f"unbatched")
    if any(s < 1 for s in shape[rank - ndim:]):
        raise ValueError(f"{where}{name} has an empty spatial dim: shape {shape}")
    return ndim


def _given_by(per_dim: tuple[str, int] | None) -> tuple[str, int] | None:
    if per_dim is None:
        return None
    source, count = per_dim
    return f"{source} has {count} per-dim values, so {count} spatial dim(s)", count


def count_spatial_dims(shape, name: str, **per_dim_args) -> int:
    """The core operators' number of spatial dims of an input of ``shape``: from the
    per-dim sequences among ``per_dim_args`` (the input then batched or unbatched), else
    ``len(shape) - 2`` (batched)."""
    how = f"a per-dim {next(iter(per_dim_args))}"
    return _spatial_dims(shape, name, _given_by(_per_dim_count(per_dim_args)), how, "")


@memoized
def resolve_spatial_dims(shape, spatial_dims, where: str = "", **per_dim_args) -> int:
    """The kinds' and the global pools' rule, one for NumPy and torch: the number of
    spatial dims of an input of ``shape`` is ``spatial_dims`` (1-3) if given, else the
    length of the per-dim sequences among ``per_dim_args``, else ``len(shape) - 2``. Only
    a number given so lets the input be unbatched, ``(C, *spatial)``: by ``len(shape) -
    2``, rank 3 is a batch of 1-d signals (as torch's ``F.interpolate`` reads it).
    ``where`` prefixes the errors (a function's name)."""
    per_dim = _per_dim_count(per_dim_args, where)
    how = "spatial_dims" + (f" or a per-dim {next(iter(per_dim_args))}" if per_dim_args
                            else "")
    if spatial_dims is None:
        return _spatial_dims(shape, "x", _given_by(per_dim), how, where)
    if not geometry.is_int(spatial_dims) or spatial_dims not in (1, 2, 3):
        raise ValueError(f"{where}spatial_dims must be 1, 2 or 3, got {spatial_dims!r}")
    spatial_dims = int(spatial_dims)
    if per_dim is not None and per_dim[1] != spatial_dims:
        raise ValueError(f"{where}spatial_dims={spatial_dims} but {per_dim[0]} has "
                         f"{per_dim[1]} per-dim values; they must agree")
    why = f"spatial_dims={spatial_dims} gives {spatial_dims} spatial dim(s)"
    return _spatial_dims(shape, "x", (why, spatial_dims), how, where)


class Layout:
    """Moves between the user's shape and the kernels' 5-d ``(N, C, D, H, W)`` views."""

    def __init__(self, shape: tuple[int, ...], ndim: int):
        self.batched = len(shape) == ndim + 2
        self.ndim = ndim
        self.lead = shape[: len(shape) - ndim]  # (N, C) or (C,)
        self.spatial = shape[len(shape) - ndim:]

    def to_kernel(self, a: np.ndarray) -> np.ndarray:
        """``a`` (shaped ``lead + spatial-like``) as a 5-d array the kernels read: a view
        where ``a`` is C-contiguous or channels-last, else (a slice, a transpose, a
        broadcast gradient) a C-ordered copy. The fast kernels serve those two layouts,
        and no kernel compiles for any other (each a compile of seconds)."""
        view = a if self.batched else a[None]
        view = view[(slice(None), slice(None)) + (None,) * (geometry.KERNEL_AXES - self.ndim)]
        if view.flags.c_contiguous or is_channels_last(view):
            return view
        return np.ascontiguousarray(view)

    def kernel_shape(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        lead = self.lead if self.batched else (1,) + self.lead
        return lead + (1,) * (geometry.KERNEL_AXES - self.ndim) + tuple(spatial)

    def user_shape(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        return self.lead + tuple(spatial)


def compute_view(x: np.ndarray, layout: Layout) -> np.ndarray:
    """The kernel view of ``x`` in its compute dtype (float16 becomes float32)."""
    view = layout.to_kernel(x)
    compute = COMPUTE_DTYPE.get(x.dtype, x.dtype)
    return view if compute == x.dtype else view.astype(compute)


def gradient_input(x: np.ndarray, op: str) -> None:
    if x.dtype not in COMPUTE_DTYPE:
        raise TypeError(f"vjp({op}): gradients need a floating-point x, got {x.dtype}")


def check_real(value, name: str, *, positive: bool = False) -> float:
    """A parameter given as a number: real, finite and, with ``positive``, > 0."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or (positive and number <= 0):
        raise ValueError(f"{name} must be a finite number{' > 0' if positive else ''}, got "
                         f"{value!r}")
    return number


def check_p(p) -> float:
    """The power of Lp pooling and GeM: a finite number > 0."""
    return check_real(p, "p", positive=True)


def check_values(values, name: str, *, positive: bool = False) -> None:
    """A parameter given as an array, by its values (a flat list of numbers: an array's or
    a tensor's ``tolist()``): one value is checked as :func:`check_real` checks a number,
    more must all be finite (and > 0 with ``positive``)."""
    if len(values) == 1:
        check_real(values[0], name, positive=positive)
        return
    for value in values:
        if not math.isfinite(value) or (positive and value <= 0):
            raise ValueError(f"{name} must hold finite numbers{' > 0' if positive else ''} "
                             f"only, got {value!r} among its values")


def gate_window(kernel_size, spatial_dims=None, ndim=None) -> tuple[int, ...]:
    """A gated pooling layer's window, its gate's shape: ``kernel_size`` per spatial dim,
    their number ``spatial_dims`` (or ``ndim``, its older name), else the length of a
    per-dim ``kernel_size``, else 2."""
    if spatial_dims is not None and ndim is not None and spatial_dims != ndim:
        raise ValueError(f"spatial_dims={spatial_dims!r} and ndim={ndim!r} disagree; give "
                         f"spatial_dims only")
    count = next((n for n in (spatial_dims, ndim, geometry.sequence_length(kernel_size))
                  if n is not None), 2)
    if not geometry.is_int(count) or count not in (1, 2, 3):
        raise ValueError(f"spatial_dims must be 1, 2 or 3, got {count!r}")
    return geometry.per_dim(kernel_size, int(count), "kernel_size")


def check_gate_shape(shape, window) -> None:
    """Gated pooling's gate: one weight per tap of the window."""
    if tuple(shape) != tuple(window):
        raise ValueError(f"gate must have the window's shape {tuple(window)}, got "
                         f"{tuple(shape)}")


def check_attention_shapes(queries_shape, key_weight_shape, heads, channels) -> None:
    """Attention pooling's queries ``(M, C)``, key projection ``(C, C)`` and heads (a
    divisor of C), against the input's ``channels``."""
    queries_shape, key_weight_shape = tuple(queries_shape), tuple(key_weight_shape)
    if len(queries_shape) != 2 or queries_shape[1] != channels:
        raise ValueError(f"queries must be (queries, C) = (M, {channels}), got shape "
                         f"{queries_shape}")
    if key_weight_shape != (channels, channels):
        raise ValueError(f"key_weight must be (C, C) = ({channels}, {channels}), got shape "
                         f"{key_weight_shape}")
    if not geometry.is_int(heads) or heads < 1 or channels % heads:
        raise ValueError(f"heads must be a positive int dividing the {channels} channels, "
                         f"got {heads!r}")


def check_attention_sizes(channels, heads, queries) -> None:
    """An attention pooling layer's sizes: positive ints, ``heads`` dividing ``channels``."""
    for name, value in (("channels", channels), ("heads", heads), ("queries", queries)):
        if not geometry.is_int(value) or value < 1:
            raise ValueError(f"AttentionPool: {name} must be a positive int, got {value!r}")
    if channels % heads:
        raise ValueError(f"AttentionPool: heads ({heads}) must divide channels ({channels})")


def check_divisor_override(value, where: str = "") -> int | None:
    """``divisor_override``: None, or an int >= 1 (average pooling's fixed divisor).
    ``where`` prefixes the error (a function's name)."""
    if value is None:
        return None
    if not geometry.is_int(value) or value < 1:
        raise ValueError(f"{where}divisor_override must be None or an int >= 1, got "
                         f"{value!r}")
    return int(value)


def generator(rng) -> np.random.Generator:
    """``rng`` (None, an int seed or a Generator) as a ``numpy.random.Generator``."""
    if isinstance(rng, (bool, np.bool_)) or (
            rng is not None and not isinstance(rng, (numbers.Integral, np.random.Generator))):
        raise TypeError(f"rng must be None, an int seed or a numpy.random.Generator, got "
                        f"{type(rng).__name__}")
    return np.random.default_rng(rng)


def sliding_plan(x, kernel_size, stride, padding, dilation, ceil_mode, ndim):
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    stride = kernel if stride is None else geometry.per_dim(stride, ndim, "stride")
    dilation = geometry.per_dim(dilation, ndim, "dilation")
    spatial = x.shape[-ndim:]
    pads = geometry.resolve_padding(padding, spatial, kernel, stride, dilation)
    ceil_mode = geometry.flag(ceil_mode, "ceil_mode")
    return geometry.sliding_plan(spatial, kernel, stride, dilation, pads, ceil_mode)


def adaptive_sizes(output_size, spatial, ndim) -> tuple[int, ...]:
    """An adaptive pooling's output size per dim; ``None`` keeps the input's (PyTorch)."""
    if output_size is None or geometry.sequence_length(output_size) is None:
        sizes = (output_size,) * ndim
    else:
        sizes = tuple(output_size)
    sizes = tuple(int(length) if s is None else s
                  for s, length in zip(sizes, spatial, strict=True))
    return geometry.per_dim(sizes, ndim, "output_size")


def adaptive_plan(x, output_size, ndim):
    spatial = x.shape[-ndim:]
    return geometry.adaptive_plan(spatial, adaptive_sizes(output_size, spatial, ndim))

