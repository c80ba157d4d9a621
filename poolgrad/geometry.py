"""Window geometry: every pooling argument normalised to one canonical form.

Pure Python and NumPy, no Numba. Everything downstream sees

* per-dim tuples for kernel, stride and dilation,
* padding as ``((before, after), ...)`` with one pair per spatial dim,
* a :class:`WindowPlan`: small int tables that tell a kernel, for each output
  position along each axis, where its window starts and which of its taps fall
  inside the real input.

Kernels always see three spatial axes. Inputs with one or two spatial dims get
leading axes of size 1 (a window of one tap), so one kernel serves 1-d, 2-d
and 3-d pooling.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KERNEL_AXES = 3  # spatial axes every kernel works on


def ceildiv(a: int, b: int) -> int:
    """Ceiling of a / b for integers, b > 0."""
    return -(-a // b)


def is_int(value) -> bool:
    """An int or a NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def flag(value, name: str) -> bool:
    """A boolean option: True/False (NumPy's too) or 0/1; never a truthy string."""
    if isinstance(value, (bool, np.bool_)) or (is_int(value) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def _listed(value):
    """NumPy arrays of per-dim values behave like lists."""
    return value.tolist() if isinstance(value, np.ndarray) else value


def per_dim(value, ndim: int, name: str, minimum: int = 1) -> tuple[int, ...]:
    """An int or a sequence of ``ndim`` ints, each at least ``minimum``, as a tuple."""
    value = _listed(value)
    if is_int(value):
        values = (int(value),) * ndim
    elif isinstance(value, Sequence) and not isinstance(value, str):
        if not all(is_int(v) for v in value):
            raise TypeError(f"{name} must be an int or a sequence of ints, got {value!r}")
        values = tuple(int(v) for v in value)
        if len(values) != ndim:
            raise ValueError(
                f"{name} has {len(values)} values {values} but the input has {ndim} "
                f"spatial dim(s); give one int, or one per spatial dim"
            )
    else:
        raise TypeError(f"{name} must be an int or a sequence of ints, got {value!r}")
    if any(v < minimum for v in values):
        raise ValueError(f"{name} must be >= {minimum} in every spatial dim, got {values}")
    return values


def sequence_length(value) -> int | None:
    """How many spatial dims a per-dim argument speaks for (None for an int or a string)."""
    value = _listed(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return len(value)
    return None


def resolve_padding(
    padding,
    in_spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
) -> tuple[tuple[int, int], ...]:
    """Padding in its canonical form, one ``(before, after)`` pair per spatial dim.

    Accepted forms: an int; one int per dim (symmetric); one ``(before, after)`` pair
    per dim (asymmetric, like ONNX ``pads``); ``"valid"`` (no padding); ``"same"``
    (output length ``ceil(L / stride)``, an odd total puts the extra element at the
    end, like ONNX ``SAME_UPPER``).
    """
    ndim = len(in_spatial)
    padding = _listed(padding)
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return ((0, 0),) * ndim
        if mode == "same":
            pairs = []
            for length, k, s, d in zip(in_spatial, kernel, stride, dilation, strict=True):
                total = max((ceildiv(length, s) - 1) * s + d * (k - 1) + 1 - length, 0)
                pairs.append((total // 2, total - total // 2))
            return tuple(pairs)
        raise ValueError(
            f'padding must be "valid", "same", an int or per-dim values, got {padding!r}'
        )
    if is_int(padding):
        pairs = ((int(padding), int(padding)),) * ndim
    elif isinstance(padding, Sequence):
        if len(padding) != ndim:
            raise ValueError(
                f"padding has {len(padding)} entries {tuple(padding)!r} but the input has {ndim} "
                f"spatial dim(s); give one int, one int per dim, or one (before, after) pair "
                f"per dim"
            )
        pairs = []
        for entry in padding:
            if is_int(entry):
                pairs.append((int(entry), int(entry)))
            elif (
                isinstance(entry, Sequence)
                and not isinstance(entry, str)
                and len(entry) == 2
                and all(is_int(v) for v in entry)
            ):
                pairs.append((int(entry[0]), int(entry[1])))
            else:
                raise TypeError(
                    f"padding entries must be ints or (before, after) pairs of ints, got {entry!r}"
                )
        pairs = tuple(pairs)
    else:
        raise TypeError(
            f'padding must be an int, per-dim ints, (before, after) pairs, "valid" or "same", '
            f"got {padding!r}"
        )
    if any(v < 0 for pair in pairs for v in pair):
        raise ValueError(f"padding must be >= 0, got {pairs}")
    return pairs


def output_length(
    length: int, kernel: int, stride: int, dilation: int, before: int, after: int,
    ceil_mode: bool, axis: int = 0,
) -> int:
    """Number of windows along one axis.

    ``floor((L + before + after - dilation*(kernel-1) - 1) / stride) + 1``, or ceil with
    ``ceil_mode``. With ``ceil_mode`` a last window that would start inside the end
    padding is dropped (the PyTorch and ONNX rule; Dumoulin & Visin, arXiv 1603.07285).
    """
    span = dilation * (kernel - 1) + 1
    room = length + before + after - span
    count = (ceildiv(room, stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (count - 1) * stride >= length + before:
        count -= 1
    if count < 1:
        raise ValueError(
            f"the output would be empty in spatial dim {axis}: the window (kernel {kernel}, "
            f"dilation {dilation}, so {span} wide) does not fit the padded input "
            f"({length} + padding {before} + {after})"
        )
    return count


class AxisWindows:
    """The windows along one axis, as int64 arrays indexed by output position.

    ``start[o]``: input coordinate of tap 0 (negative inside the front padding).
    Tap ``j`` reads coordinate ``start[o] + j * dilation``. ``first[o]``/``end[o]``:
    the taps ``[first, end)`` that fall inside the input. ``padded[o]``: the taps that
    fall inside the padded input (count_include_pad's divisor). ``extent``: the tap
    count used to number positions inside a window.

    ``rule`` is the arithmetic the tables come from, for kernels that recompute them
    per element instead of reading them (the Triton kernels):
    ``("sliding", stride, before, after)``, where window ``o`` starts at
    ``o * stride - before`` and ``after`` is the end padding that ``padded`` counts, or
    ``("adaptive",)`` for PyTorch's bins.
    """

    def __init__(self, length, start, first, end, padded, dilation, extent, rule):
        self.length = int(length)
        self.start, self.first, self.end, self.padded = (
            _frozen(a) for a in (start, first, end, padded)
        )
        self.dilation = int(dilation)
        self.extent = int(extent)
        self.rule = rule

    @property
    def count(self) -> int:
        return len(self.start)

    @functools.cached_property
    def tiles(self) -> bool:
        """Whether the windows tile the axis: window ``o`` is exactly the coordinates
        ``[o*extent, (o+1)*extent)``, all real, so every coordinate is read by at most
        one window (those past the last window by none)."""
        whole = np.arange(self.count, dtype=np.int64) * self.extent
        return bool((self.dilation == 1 or self.extent == 1)
                    and np.array_equal(self.start, whole) and np.all(self.first == 0)
                    and np.all(self.end == self.extent))

    @functools.cached_property
    def interior(self) -> tuple[int, int, int] | None:
        """``(lo, hi, stride)`` if consecutive windows start ``stride`` apart and the
        windows wholly inside the input (no tap in the padding) are ``[lo, hi)``;
        ``(0, 0, stride)`` if there are none; None for uneven strides (adaptive axes)
        or inside windows that are not one run. Row kernels ask it on every call."""
        if self.count < 1:
            return None
        stride = int(self.start[1] - self.start[0]) if self.count > 1 else self.extent
        if self.count > 1 and not np.all(np.diff(self.start) == stride):
            return None
        full = (self.first == 0) & (self.end == self.extent)
        inside = np.flatnonzero(full)
        if len(inside) == 0:
            return 0, 0, stride
        lo, hi = int(inside[0]), int(inside[-1]) + 1
        return (lo, hi, stride) if full[lo:hi].all() else None

    @functools.cached_property
    def cover(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which (output, tap) pairs read each input coordinate, in CSR form.

        Returns ``(ptr, out, tap)``: coordinate ``i`` is read by ``out[ptr[i]:ptr[i+1]]``
        at taps ``tap[ptr[i]:ptr[i+1]]``, outputs in increasing order. Backward kernels
        gather through it, so each input is written once and the sum over overlapping
        windows has a fixed order (deterministic at any thread count).
        """
        taps_per_out = self.end - self.first
        outs = np.repeat(np.arange(self.count, dtype=np.int64), taps_per_out)
        offsets = np.arange(len(outs), dtype=np.int64) - np.repeat(
            np.cumsum(taps_per_out) - taps_per_out, taps_per_out
        )
        taps = np.repeat(self.first, taps_per_out) + offsets
        coords = self.start[outs] + taps * self.dilation
        order = np.argsort(coords, kind="stable")  # stable: outputs stay increasing
        ptr = np.zeros(self.length + 1, dtype=np.int64)
        np.cumsum(np.bincount(coords, minlength=self.length), out=ptr[1:])
        return _frozen(ptr), _frozen(outs[order]), _frozen(taps[order])


def _frozen(array) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.int64)
    array.flags.writeable = False
    return array


def _raise_padding_only(before, after, kernel, stride, dilation, length, axis, window, count):
    which = "some window" if window is None else f"window {window}"
    raise ValueError(
        f"padding ({before}, {after}) is too large in spatial dim {axis}: {which} of "
        f"{count} holds only padding (kernel {kernel}, stride {stride}, dilation {dilation}, "
        f"input length {length}); every window must hold at least one input element"
    )


@functools.lru_cache(maxsize=512)
def sliding_axis(
    length: int, kernel: int, stride: int, dilation: int, before: int, after: int,
    ceil_mode: bool, axis: int = 0,
) -> AxisWindows:
    """Windows of a strided, dilated, padded pooling along one axis (validated)."""
    if kernel == 1:
        dilation = 1  # one tap: the dilation never applies
    count = output_length(length, kernel, stride, dilation, before, after, ceil_mode, axis)
    span = dilation * (kernel - 1) + 1
    # A real element is read by at most one window per tap, so more than length * kernel
    # windows means some hold only padding (checked before anything is allocated).
    if before >= span or (count - 1) * stride - before >= length or count > length * kernel:
        # the first or the last window lies wholly in the padding; checked here so that
        # absurd paddings never reach the per-window tables below
        _raise_padding_only(before, after, kernel, stride, dilation, length, axis,
                            0 if before >= span else None, count)
    # (a stride beyond the padded input leaves one window: never multiply by it)
    start = np.arange(count, dtype=np.int64) * (stride if count > 1 else 0) - before
    # taps j with 0 <= start + j*dilation < length
    first = np.maximum(0, -(start // dilation))  # ceil(-start / dilation), start < 0
    end = np.minimum(kernel, (length - 1 - start) // dilation + 1)
    empty = np.flatnonzero(first >= end)
    if len(empty):
        _raise_padding_only(before, after, kernel, stride, dilation, length, axis,
                            int(empty[0]), count)
    padded = np.minimum(kernel, (length + after - 1 - start) // dilation + 1)
    return AxisWindows(length, start, first, end, padded, dilation, kernel,
                       ("sliding", int(stride), int(before), int(after)))


@functools.lru_cache(maxsize=512)
def adaptive_axis(length: int, count: int) -> AxisWindows:
    """PyTorch's adaptive bins: ``[floor(o*L/out), ceil((o+1)*L/out))``."""
    outs = np.arange(count, dtype=np.int64)
    start = outs * length // count
    stop = -((-(outs + 1) * length) // count)
    size = stop - start
    return AxisWindows(length, start, np.zeros(count), size, size, 1, int(size.max()),
                       ("adaptive",))


@dataclass(frozen=True, eq=False)
class WindowPlan:
    """Everything a kernel needs about the windows, for exactly three axes.

    ``table[axis]`` rows: 0 ``start``, 1 ``first``, 2 ``end`` (see :class:`AxisWindows`),
    padded with zeros to the longest axis.
    """

    axes: tuple[AxisWindows, ...]  # the real spatial axes, 1 to 3

    @property
    def kernel_axes(self) -> tuple[AxisWindows, ...]:
        # a leading axis of length 1 with a one-tap window changes nothing
        unit = sliding_axis(1, 1, 1, 1, 0, 0, False)
        return (unit,) * (KERNEL_AXES - len(self.axes)) + self.axes

    @property
    def tiles(self) -> bool:
        """Whether the windows tile every axis (see :attr:`AxisWindows.tiles`)."""
        return all(a.tiles for a in self.axes)

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple(a.count for a in self.axes)

    @property
    def in_spatial(self) -> tuple[int, ...]:
        return tuple(a.length for a in self.axes)

    @property
    def window_size(self) -> int:
        """Number of tap positions in one window (padding included)."""
        return math.prod(a.extent for a in self.axes)

    @functools.cached_property
    def table(self) -> np.ndarray:
        axes = self.kernel_axes
        table = np.zeros((KERNEL_AXES, 3, max(a.count for a in axes)), dtype=np.int64)
        for i, a in enumerate(axes):
            table[i, 0, : a.count] = a.start
            table[i, 1, : a.count] = a.first
            table[i, 2, : a.count] = a.end
        return _frozen(table)

    @functools.cached_property
    def dilation(self) -> np.ndarray:
        return _frozen([a.dilation for a in self.kernel_axes])

    @functools.cached_property
    def extent(self) -> np.ndarray:
        return _frozen([a.extent for a in self.kernel_axes])

    @functools.cached_property
    def cover(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The axes' :attr:`AxisWindows.cover` tables, stacked and zero-padded."""
        covers = [a.cover for a in self.kernel_axes]
        ptr = np.zeros((KERNEL_AXES, max(len(c[0]) for c in covers)), dtype=np.int64)
        out = np.zeros((KERNEL_AXES, max(len(c[1]) for c in covers)), dtype=np.int64)
        tap = np.zeros_like(out)
        for i, (p, o, t) in enumerate(covers):
            ptr[i, : len(p)] = p
            out[i, : len(o)] = o
            tap[i, : len(t)] = t
        return _frozen(ptr), _frozen(out), _frozen(tap)

    def divisor_table(self, mode: str, override: int | None, dtype) -> np.ndarray:
        """Per-axis factors whose product over the three axes is each window's divisor.

        ``mode`` is ``"padded"`` (count_include_pad) or ``"real"`` (only input elements).
        With ``override`` the first axis carries the constant and the others carry 1.
        Each call returns a writeable copy (the type the kernels are compiled for) of a
        table the plan keeps per arguments.
        """
        key = (mode, override, np.dtype(dtype))
        kept = self.__dict__.setdefault("_divisor_tables", {})  # frozen: no setattr
        if key not in kept:
            kept[key] = self._divisor_table(*key)
        return kept[key].copy()

    def _divisor_table(self, mode: str, override: int | None, dtype: np.dtype) -> np.ndarray:
        axes = self.kernel_axes
        factors = np.ones((KERNEL_AXES, max(a.count for a in axes)), dtype=dtype)
        if override is not None:
            factors[0, :] = override
            return factors
        for i, a in enumerate(axes):
            factors[i, : a.count] = a.padded if mode == "padded" else a.end - a.first
        return factors


def position_dtype(window_size: int) -> np.dtype:
    """Smallest unsigned integer type that numbers every tap of a window."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if window_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


@functools.lru_cache(maxsize=512)
def sliding_plan(
    in_spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    ceil_mode: bool,
) -> WindowPlan:
    """The plan of a strided, dilated, padded pooling (all arguments canonical)."""
    axes = tuple(
        sliding_axis(length, k, s, d, lo, hi, bool(ceil_mode), axis)
        for axis, (length, k, s, d, (lo, hi)) in enumerate(
            zip(in_spatial, kernel, stride, dilation, padding, strict=True)
        )
    )
    return WindowPlan(axes)


@functools.lru_cache(maxsize=512)
def adaptive_plan(in_spatial: tuple[int, ...], out_spatial: tuple[int, ...]) -> WindowPlan:
    """The plan of an adaptive pooling (PyTorch's bins)."""
    return WindowPlan(
        tuple(adaptive_axis(L, o) for L, o in zip(in_spatial, out_spatial, strict=True))
    )


def unpool_output_spatial(
    in_spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    output_size,
    lead: tuple[int, ...] = (),
) -> tuple[int, ...]:
    """Spatial size of max_unpool's output, PyTorch's rule.

    Default ``(L - 1) * stride - before - after + kernel``; an explicit size (spatial
    dims, or the full shape) must lie strictly between default - stride and
    default + stride, the sizes whose pooling gives back ``L``. A full shape must start
    with ``lead``, the input's leading (N, C) or (C,) dims.
    """
    default = tuple(
        (length - 1) * s - lo - hi + k
        for length, k, s, (lo, hi) in zip(in_spatial, kernel, stride, padding, strict=True)
    )
    if output_size is None:
        sizes = default
    else:
        output_size = _listed(output_size)
        if (isinstance(output_size, str) or not isinstance(output_size, Sequence)
                or not all(is_int(v) for v in output_size)):
            raise TypeError(f"output_size must be a sequence of ints, got {output_size!r}")
        sizes = tuple(int(v) for v in output_size)
        if len(sizes) > len(default):
            if tuple(lead) != sizes[: len(sizes) - len(default)]:
                raise ValueError(
                    f"output_size {sizes} must give {len(default)} spatial sizes, or the full "
                    f"shape starting with {tuple(lead)}"
                )
            sizes = sizes[len(sizes) - len(default):]
        if len(sizes) != len(default):
            raise ValueError(
                f"output_size {tuple(output_size)} must give {len(default)} spatial sizes "
                f"(or the full shape)"
            )
        for axis, (size, d, s) in enumerate(zip(sizes, default, stride, strict=True)):
            if not d - s < size < d + s:
                raise ValueError(
                    f"output_size {sizes} is not possible in spatial dim {axis}: it must lie "
                    f"strictly between {d - s} and {d + s}"
                )
    if any(v < 1 for v in sizes):
        raise ValueError(f"the unpooled size {sizes} must be >= 1 in every spatial dim")
    return sizes


# ----------------------------------------------------------------------------------
# Anti-aliased pooling: a stride-1 pre-reduction, then a blur subsampled by the stride

BLUR_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")  # kernel codes 0-3
BLUR_PRE = ("none", "max", "avg")
MAX_FILTER_SIZE = 7


def binomial_filter(size: int) -> tuple[float, ...]:
    """Row ``size - 1`` of Pascal's triangle, normalised to sum 1 (``[1, 2, 1] / 4``).
    The N-d filter is its outer product over the axes (Zhang 2019, kornia, timm)."""
    return tuple(math.comb(size - 1, t) / 2 ** (size - 1) for t in range(size))


@dataclass(frozen=True, eq=False)
class BlurPlan:
    """One anti-aliased pooling's chain of separable line passes on a ``(D, H, W)``
    plane (the table :mod:`poolgrad.kernels.blur` runs; its docstring gives the
    rows). ``pre_kernel`` is the stride-1 max window over the kernel axes (all ones
    when there is no max); an average's box filter is a pass of its own."""

    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    map_spatial: tuple[int, ...]  # after the stride-1 max or average
    pre: str
    pre_kernel: np.ndarray
    passes: np.ndarray
    shapes: np.ndarray
    filters: np.ndarray  # float64; weights(dtype) gives the kernels' copy
    # for the rows kernels, per axis: the pre-pool's window, the blur (identity if none)
    window: tuple[int, int, int]
    axis_blurs: np.ndarray  # (3, 5) int64: (taps, stride, before, after, mode)
    axis_filters: np.ndarray  # (3, width) float64

    def weights(self, dtype, table: str = "filters") -> np.ndarray:
        """``filters`` (or ``axis_filters``) in ``dtype``, cast once per dtype."""
        kept = self.__dict__.setdefault("_" + table, {})  # frozen: no setattr
        key = np.dtype(dtype)
        if key not in kept:
            kept[key] = getattr(self, table).astype(key)
        return kept[key]


@functools.lru_cache(maxsize=512)
def blur_plan(
    in_spatial: tuple[int, ...],
    pre: str,
    kernel: tuple[int, ...],
    filter_size: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    mode: str,
) -> BlurPlan:
    """The chain of an anti-aliased pooling (canonical arguments; ``kernel`` all ones
    for a plain blur). Per axis: the stride-1 pre-reduction shortens length ``L`` to
    ``M = L - kernel + 1``; the blur pads ``M`` by ``padding`` (``mode``) and keeps
    every ``stride``-th of its ``filter_size``-tap sums: ``(M + before + after -
    filter_size) // stride + 1`` outputs."""
    ndim = len(in_spatial)
    lead = KERNEL_AXES - ndim
    mapped = []
    for i, (length, k) in enumerate(zip(in_spatial, kernel, strict=True)):
        if length - k + 1 < 1:
            raise ValueError(f"kernel_size {tuple(kernel)} is larger than the input "
                             f"{tuple(in_spatial)} in spatial dim {i}")
        mapped.append(length - k + 1)
    # the max map is the chain's start; an average's box is a pass of its own
    shape = [1] * lead + list(mapped if pre == "max" else in_spatial)
    shapes, passes, filters, out = [], [], [], []
    axis_blurs, axis_filters = [(1, 1, 0, 0, 0)] * KERNEL_AXES, [(1.0,)] * KERNEL_AXES

    def add(axis, taps, step, before, code, length, weights):
        shapes.append(tuple(shape))
        passes.append((axis, taps, step, before, code))
        filters.append(weights)
        shape[axis] = length

    for i, (m, k, f, s, (before, after)) in enumerate(
            zip(mapped, kernel, filter_size, stride, padding, strict=True)):
        if mode == "reflect" and (before >= m or after >= m):
            raise ValueError(
                f"reflect padding needs padding smaller than the length it reflects, as in "
                f"PyTorch: spatial dim {i} has length {m}"
                f"{' after the stride-1 pooling' if k > 1 else ''} and padding "
                f"({before}, {after}); use padding_mode 'replicate', 'zeros' or 'circular'")
        count = (m + before + after - f) // s + 1
        if count < 1:
            raise ValueError(
                f"filter_size {f} does not fit spatial dim {i}: length {m} with padding "
                f"({before}, {after}) is shorter than the filter")
        axis = lead + i
        if pre == "avg" and k > 1:
            add(axis, k, 1, 0, 0, m, (1.0 / k,) * k)
        if not (f == 1 and s == 1 and before == 0 and after == 0):
            add(axis, f, s, before, BLUR_PADDING_MODES.index(mode), count, binomial_filter(f))
            axis_blurs[axis] = [f, s, before, after, BLUR_PADDING_MODES.index(mode)]
            axis_filters[axis] = binomial_filter(f)
        out.append(count)
    shapes.append(tuple(shape))
    pre_kernel = [1] * lead + list(kernel) if pre == "max" else [1] * KERNEL_AXES
    return BlurPlan(tuple(in_spatial), tuple(out), tuple(mapped), pre, _frozen(pre_kernel),
                    _frozen(np.reshape(passes, (-1, 5))), _frozen(np.reshape(shapes, (-1, 3))),
                    _filter_table(filters), (1,) * lead + tuple(kernel), _frozen(axis_blurs),
                    _filter_table(axis_filters))


def _filter_table(filters) -> np.ndarray:
    """Rows of taps, zero-padded to the longest, read-only."""
    width = max([1, *(len(w) for w in filters)])  # (no default=: torch.compile traces it)
    table = np.zeros((len(filters), width))
    for row, weights in enumerate(filters):
        table[row, : len(weights)] = weights
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class FractionalPlan:
    """A fractional max pooling's sizes, for the dispatch (its windows differ from
    plane to plane and come with each call)."""

    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
