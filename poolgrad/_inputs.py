"""What the operators receive, checked and put in the kernels' form: arrays and their
dtypes, the number of spatial dims, the move between the user's shape and the kernels'
5-d ``(N, C, D, H, W)`` views, and the window plans of the pooling arguments
(:mod:`poolgrad.geometry`). Every check raises a ``ValueError`` or ``TypeError`` that
names the argument and what is allowed.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import geometry

# float16 is stored as float16 but computed (and accumulated) in float32
COMPUTE_DTYPE = {
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(np.float32): np.dtype(np.float32),
    np.dtype(np.float64): np.dtype(np.float64),
}


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


def count_spatial_dims(x: np.ndarray, name: str, **per_dim_args) -> int:
    """Number of spatial dims: from the per-dim sequences given, else ``x.ndim - 2``."""
    lengths = {
        k: n for k, v in per_dim_args.items() if (n := geometry.sequence_length(v)) is not None
    }
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise ValueError(f"per-dim arguments disagree on the number of spatial dims: {described}")
    ndim = next(iter(lengths.values())) if lengths else x.ndim - 2
    if ndim not in (1, 2, 3):
        if lengths:
            source = f"{next(iter(lengths))} has {ndim} per-dim values, so"
        else:
            source = f"{name}.ndim - 2 gives"
        raise ValueError(
            f"poolgrad pools 1, 2 or 3 spatial dims, but {source} {ndim} spatial dims "
            f"({name} has shape {x.shape}); {name} must be (N, C, *spatial) or (C, *spatial)"
        )
    if x.ndim not in (ndim + 1, ndim + 2):
        if lengths:
            source, count = next(iter(lengths.items()))
            reason = f"{source} has {count} per-dim values, so {ndim} spatial dim(s), which need"
        else:
            reason = f"{ndim} spatial dim(s) need"
        raise ValueError(
            f"{name} has shape {x.shape} ({x.ndim} dims) but {reason} "
            f"{ndim + 2} dims (N, C, *spatial) or {ndim + 1} dims (C, *spatial)"
        )
    if any(s < 1 for s in x.shape[-ndim:]):
        raise ValueError(f"{name} has an empty spatial dim: shape {x.shape}")
    return ndim


class Layout:
    """Moves between the user's shape and the kernels' 5-d ``(N, C, D, H, W)`` views."""

    def __init__(self, shape: tuple[int, ...], ndim: int):
        self.batched = len(shape) == ndim + 2
        self.ndim = ndim
        self.lead = shape[: len(shape) - ndim]  # (N, C) or (C,)
        self.spatial = shape[len(shape) - ndim:]

    def to_kernel(self, a: np.ndarray) -> np.ndarray:
        """A 5-d view of ``a`` (shaped ``lead + spatial-like``); never a copy."""
        view = a if self.batched else a[None]
        return view[(slice(None), slice(None)) + (None,) * (geometry.KERNEL_AXES - self.ndim)]

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


def check_p(p) -> float:
    if not isinstance(p, numbers.Real) or isinstance(p, (bool, np.bool_)):
        raise TypeError(f"p must be a real number, got {p!r}")
    try:
        value = float(p)
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"p must be a finite number > 0, got {p!r}")
    return value


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


def global_dims(x, spatial_dims) -> int:
    if spatial_dims is None:
        return count_spatial_dims(x, "x")
    if not geometry.is_int(spatial_dims) or spatial_dims not in (1, 2, 3):
        raise ValueError(f"spatial_dims must be 1, 2 or 3, got {spatial_dims!r}")
    return count_spatial_dims(x, "x", spatial_dims=(0,) * spatial_dims)
