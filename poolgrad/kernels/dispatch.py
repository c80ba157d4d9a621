"""The one place that chooses a Numba kernel: by op, pass, layout, geometry and dtype.

:mod:`poolgrad.engines` (and :mod:`poolgrad.ops`, for unpooling) describe a call,
``choose(op, direction, plan, operand)``, and run the :class:`Kernel` they get back.
Nothing else picks a kernel. Each ``(op, direction)`` has a list of rules, tried in
order; the first whose ``serves`` accepts the call wins, and the last rule of every list,
the general kernel, serves every call. The table of which call goes where, and why each
kernel exists, is ``docs/kernels.md``.

A :class:`Kernel` runs with the same arguments whichever kernel it is, 5-d arrays
``(N, C, D, H, W)`` whatever their memory layout (the signatures below): the rule's
``run`` turns them into the arguments its family's kernel takes (a channels-last view, a
flat row, the plan's tables), so a kernel's own parameters never leak into the engines.

Run signatures (one per op and direction)::

    ("max", "forward")     run(x, y, pos)      pos None unless kernel.records
    ("max", "indices")     run(pos, indices)   winners -> PyTorch's flat int64 indices
    ("max", "backward")    run(dy, pos, dx)
    ("max", "tie_count")   run(x, y, ties)     ties="split": ties per window
    ("max", "split")       run(x, y, dy, ties, pos, dx)
    ("avg", "forward")     run(x, y, divisor)  divisor: plan.divisor_table(...)
    ("avg", "backward")    run(dy, divisor, dx)
    ("global_avg", ...)    as ("avg", ...), for a global average (one window per plane)
    ("lp", "forward")      run(x, y, p)
    ("lp", "backward")     run(x, y, dy, p, dx)
    ("unpool", "forward")  run(y, indices, out, written)   flat (N, C, L) arrays
    ("unpool", "backward") run(dout, indices, written, dy)
    ("blur", "forward")    run(x, y, winners)  planes (N*C, D, H, W), C-contiguous;
    ("blur", "backward")   run(dy, winners, dx)  plan: a BlurPlan; winners: the
                                               stride-1 max's (unused without one)
    ("weighted", "forward")  run(x, y, norm, kind, copy=None) -> None, or for SELF
                             whether a tap was < 0 or NaN where the kernel read all
                             of x; kind: weighted.SOFT or SELF; norm may be None (not
                             written); copy (keyword), if given, gets x (stored as x is)
    ("weighted", "backward") run(x, y, norm, dy, kind, dx)  SoftPool's
    ("weighted", "mean_backward")  the same, stochastic pooling's mean; y and norm
                             None where the kernel does not needs_outputs
    ("stochastic", "sample") run(x, draws, y, pos)  pos: winners, as a max forward's
    ("blend", "forward")   run(x, kind, weights, y)  kind: blend.MIXED or GATED;
    ("blend", "backward")  run(x, dy, kind, weights, dx, dweights)  weights float64
    ("attention", "forward")   run(x, projected, heads, y, attn)  (N, C, L) views;
    ("attention", "backward")  run(x, dy, projected, attn, heads, dx, dprojected)
    ("fractional", "forward")  run(x, starts, lengths, extent, y, pos)  5-d (N, C, D, H,
                                               W), any layout (planes among them)
    ("fractional", "backward") run(dy, starts, extent, pos, dx)  (N*C, 1, D, H, W); the
    ("fractional", "indices")  run(starts, extent, pos, in_h, in_w, indices)  windows
                                               per plane; plan: a FractionalPlan
    ("gem", "forward")     run(x, eps, p, whole, y, copy=None)   whole: power_form(p, dtype);
                           copy (keyword), if given, gets x (stored as x is)
    ("gem", "backward")    run(x, y, dy, eps, p, whole, dx, terms=None)  terms (dp's, y's
                                               shape) only where kernel.records
    ("gem", "p_terms")     run(x, y, dy, eps, p, whole, terms)  each window's dp term
    ("gem", "p_total")     run(terms, totals)  5-d terms (any layout); totals (N, C); plan None
    ("gem_global", "forward")   run(x, eps, p, whole, y, copy=None)  (N, C, L) views;
                                               y (N, C); copy as for "gem";
    ("gem_global", "backward")  run(x, y, dy, eps, p, whole, with_dp, dx, terms); plan None
    ("circular", "pad")    run(x, before, padded)  5-d, stored alike; before per axis; plan None

This is the NumPy (CPU) backend's dispatch. The CUDA backend's, for torch tensors, is
:mod:`poolgrad.torch.triton.dispatch`, beside the code that uses it, with the same
signatures.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from . import (
    blocks,
    gather_rows,
    kind_rules,
    layouts,
    power_mean,
    powers,
    row_passes,
    sum_pool,
    tiled,
)
from . import channels_last as cl
from . import channels_last_tiles as cl_tiles
from . import max_pool as general_max
from . import unpool as unpool_kernels
from .rule import Kernel, apart, full_windows, paired_quads, rules_of, whole_planes, wide_rows
from .rule import Rule as _Rule
from .rule import always as _always
from .rule import values_only as _values
from .simd import BLOCK

LAYOUTS = ("nchw", "channels_last", "strided")

# Dtypes the vectorized kernels (row passes, tiles, blocks, channels-last) are compiled
# for; any other dtype (the integers of a max forward) takes the general kernels.
_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# (kernel, stride) along W with a vectorized row pass (see :mod:`.row_passes`)
ROW_PASS_W = ((2, 2), (3, 2), (4, 4))


@dataclass(frozen=True)
class Operand:
    """What a kernel choice needs to know of the array a pass reads or writes: its
    compute dtype, its memory layout (one of ``LAYOUTS``) and whether it is
    writeable."""

    dtype: np.dtype
    layout: str
    writeable: bool = True

    @property
    def fast(self) -> bool:
        """Whether the vectorized NCHW kernels take it (each other dtype, and the
        read-only variant, would cost another long compile for little use)."""
        return self.layout == "nchw" and self.writeable and self.dtype in _FAST_DTYPES


def is_channels_last(a: np.ndarray) -> bool:
    """Whether the 5-d kernel view ``a`` is stored with C fastest and is not also
    C-contiguous (any dtype: winners take the layout of the values they go with)."""
    return not a.flags.c_contiguous and a.transpose(0, 2, 3, 4, 1).flags.c_contiguous


def operand(a: np.ndarray) -> Operand:
    """The :class:`Operand` of a 5-d kernel view ``a``. ``"nchw"``: C-contiguous;
    ``"channels_last"``: C fastest in memory (PyTorch's channels_last) and not also
    C-contiguous, for the float dtypes that have channels-last kernels; otherwise
    ``"strided"``."""
    if a.flags.c_contiguous:
        layout = "nchw"
    elif a.dtype in _FAST_DTYPES and is_channels_last(a):
        layout = "channels_last"
    else:
        layout = "strided"
    return Operand(a.dtype, layout, bool(a.flags.writeable))


def stored_as(channels_last: bool, dtype) -> Operand:
    """The :class:`Operand` of a fresh array of ``dtype`` stored channels-last or
    C-contiguous: what a backward writes ``dx`` as (a forward kernel's
    ``channels_last`` says which)."""
    return Operand(np.dtype(dtype), "channels_last" if channels_last else "nchw")


# -------------------------------------------------------------------------- geometry
# Which plans the vectorized kernels serve. Pure functions of the plan.


def row_interior(plan):
    """``(lo, hi, stride)`` as an int64 array if the row passes serve this plan's W
    axis, else None: undilated taps, even windows (not adaptive) and a (kernel, stride)
    in ``ROW_PASS_W``. ``[lo, hi)`` are the output columns whose windows lie wholly
    inside the input (:attr:`~poolgrad.geometry.AxisWindows.interior`). Each call
    returns a fresh array."""
    axis = plan.kernel_axes[2]
    interior = axis.interior
    if axis.dilation != 1 or interior is None or (axis.extent, interior[2]) not in ROW_PASS_W:
        return None
    return np.array(interior, dtype=np.int64)


def _tiled_forward(plan) -> bool:
    """Windows that tile the input, with a W kernel of 2 or 4: the widths of
    ``ROW_PASS_W`` whose stride is the kernel (each width a compile of its own)."""
    return plan.tiles and plan.extent[2] in (2, 4)


def _stride2_blocks(plan) -> bool:
    """3 taps at stride 2 along W (a row pass geometry) and rows of at least one
    :data:`~poolgrad.kernels.simd.BLOCK`."""
    interior = plan.kernel_axes[2].interior
    return (row_interior(plan) is not None and plan.extent[2] == 3 and interior[2] == 2
            and plan.out_spatial[-1] >= BLOCK)


def _recorded_stride2_blocks(plan) -> bool:
    """3 taps at stride 2 along W and at least one block of windows clear of the W
    padding in every row (the recorded blocks do the cut windows one by one)."""
    interior = plan.kernel_axes[2].interior
    return (row_interior(plan) is not None and plan.extent[2] == 3 and interior[2] == 2
            and interior[1] - interior[0] >= BLOCK)


# --------------------------------------------------------------------- argument helpers


def _cl(a):
    """The ``(N, D, H, W, C)`` view of a 5-d array."""
    return a.transpose(0, 2, 3, 4, 1)


def _contiguous(a):
    """``a`` C-contiguous and writeable (a read-only array: a compile of its own)."""
    if a.flags.c_contiguous and a.flags.writeable:
        return a
    return np.array(a, order="C")


def _zero(dtype):
    """+0 in a 1-element array: a runtime value the compiler must not fold (kernels)."""
    return np.zeros(1, dtype)


def _tap_like(dtype):
    """The dtype of taps as wide as the values (channels-last max), as an empty array."""
    return np.empty(0, np.int32 if dtype == np.float32 else np.int64)


@functools.cache
def _float_bits(dtype: np.dtype) -> np.ndarray:
    """The bits of -0, the exponent field and the quiet-NaN flag, as signed ints (shared)."""
    bits = np.dtype(f"i{dtype.itemsize}")
    info = np.finfo(dtype)
    exponent = ((1 << info.iexp) - 1) << info.nmant
    quiet = 1 << (info.nmant - 1)
    negative_zero = np.array(-0.0, dtype=dtype).view(bits)[()]
    table = np.array([negative_zero, exponent, quiet], dtype=bits)
    table.flags.writeable = False
    return table


# ---------------------------------------------------------------------------- max


def _max_general(plan):
    return lambda x, y, pos: general_max.max_pool_forward(x, plan.table, plan.dilation,
                                                          plan.extent, y, pos)


def _max_cl(plan):
    return lambda x, y, pos: cl.max_pool_forward(_cl(x), plan.table, plan.dilation,
                                                 plan.extent, _tap_like(x.dtype), _cl(y),
                                                 _cl(pos))


def _max_tiled(plan, values_only=False):
    width = row_passes.width_witness(plan.extent[2])

    def run(x, y, pos):
        args = (x, plan.table, plan.extent, plan.dilation, width,
                tiled.row_form(plan.extent[2], plan.out_spatial[-1], x.itemsize), y)
        return (tiled.max_values_forward_tiled(*args) if values_only else
                tiled.max_pool_forward_tiled(*args, pos))
    return run


def _max_blocks(plan):
    interior = row_interior(plan)
    return lambda x, y, pos: blocks.max_pool_forward_blocks(x, plan.table, plan.extent,
                                                          plan.dilation, interior, y, pos)


def _max_values_blocks(plan):
    return lambda x, y, pos: blocks.max_values_forward_blocks(x, plan.table, plan.extent,
                                                            plan.dilation, y)


def _max_rows(plan):
    interior, width = row_interior(plan), row_passes.width_witness(plan.extent[2])
    return lambda x, y, pos: row_passes.max_pool_forward_rows(x, plan.table, plan.extent,
                                                        plan.dilation, interior, width, y,
                                                        pos)


def _max_values_rows(plan):
    interior, width = row_interior(plan), row_passes.width_witness(plan.extent[2])
    return lambda x, y, pos: row_passes.max_values_forward_rows(x, plan.table, plan.extent,
                                                          plan.dilation, interior, width, y)


def _max_indices(plan):
    in_h, in_w = plan.kernel_axes[1].length, plan.kernel_axes[2].length
    return lambda pos, indices: general_max.window_positions_to_indices(
        pos, plan.table, plan.dilation, plan.extent, in_h, in_w, indices)


def _max_back_general(plan):
    ptr, outs, taps = plan.cover
    return lambda dy, pos, dx: general_max.max_pool_backward(dy, pos, ptr, outs, taps,
                                                             plan.extent, dx)


def _max_back_cl(plan):
    ptr, outs, taps = plan.cover
    return lambda dy, pos, dx: cl.max_pool_backward(
        _contiguous(_cl(dy)), _cl(pos), ptr, outs, taps, plan.extent, _tap_like(dx.dtype),
        _zero(dx.dtype), _cl(dx))


def _max_back_tiled(plan):
    # the gradients move as integer bits (see tiled.max_pool_backward_tiled)
    width = tiled.tiled_width(plan.extent[2])

    def run(dy, pos, dx):
        bits = _float_bits(dx.dtype)
        tiled.max_pool_backward_tiled(_contiguous(dy).view(bits.dtype), pos, plan.extent,
                                     width, bits, dx.view(bits.dtype))
    return run


def _max_back_rows(plan):
    ptr, outs, taps = plan.cover
    interior = row_interior(plan)
    return lambda dy, pos, dx: gather_rows.max_pool_backward_rows(
        _contiguous(dy), pos, ptr, outs, taps, plan.table, plan.extent, interior, dx)


def _tie_count(plan):
    return lambda x, y, ties: general_max.max_pool_tie_count(x, plan.table, plan.dilation,
                                                             y, ties)


def _split(plan):
    ptr, outs, taps = plan.cover
    return lambda x, y, dy, ties, pos, dx: general_max.max_pool_backward_split(
        x, y, dy, ties, pos, ptr, outs, taps, plan.extent, dx)


# ---------------------------------------------------------------------------- avg


def _avg_general(plan):
    return lambda x, y, divisor: sum_pool.avg_pool_forward(x, plan.table, plan.dilation,
                                                           divisor, y)


def _avg_cl(plan):
    return lambda x, y, divisor: cl.avg_pool_forward(_cl(x), plan.table, plan.dilation,
                                                     divisor, _zero(x.dtype), _cl(y))


def _avg_tiled(plan):
    width = row_passes.width_witness(plan.extent[2])
    return lambda x, y, divisor: tiled.avg_pool_forward_tiled(x, plan.extent, divisor,
                                                             _zero(x.dtype), width, y)


def _avg_blocks(plan):
    return lambda x, y, divisor: blocks.avg_pool_forward_blocks(
        x, plan.table, plan.extent, plan.dilation, divisor, _zero(x.dtype), y)


def _avg_rows(plan):
    interior = row_interior(plan)
    return lambda x, y, divisor: row_passes.avg_pool_forward_rows(
        x, plan.table, plan.extent, plan.dilation, interior, divisor, _zero(x.dtype), y)


def _avg_back_general(plan):
    ptr, outs, _ = plan.cover
    return lambda dy, divisor, dx: sum_pool.avg_pool_backward(dy, divisor, ptr, outs, dx)


def _avg_back_cl(plan):
    ptr, outs, _ = plan.cover
    return lambda dy, divisor, dx: cl.avg_pool_backward(_contiguous(_cl(dy)), divisor, ptr,
                                                        outs, _cl(dx))


def _avg_back_rows(plan):
    ptr, outs, _ = plan.cover
    interior = row_interior(plan)
    return lambda dy, divisor, dx: gather_rows.avg_pool_backward_rows(
        _contiguous(dy), divisor, ptr, outs, plan.table, plan.extent, interior, dx)


def _planes(a):
    """A C-contiguous 5-d array as ``(planes, plane length)``."""
    return a.reshape(a.shape[0] * a.shape[1], math.prod(a.shape[2:]))  # also when empty


def _one_divisor(divisor):
    """The divisor of a plan's only window, from its per-axis table (the plane's size,
    or an override), multiplied as the general kernels multiply it."""
    return divisor[0, 0] * divisor[1, 0] * divisor[2, 0]


def _global_avg(plan):
    # one pass per contiguous plane, with the sum's latency hidden
    return lambda x, y, divisor: sum_pool.global_avg_forward(
        _planes(x), _one_divisor(divisor), y.reshape(-1))


def _global_avg_back(plan):
    return lambda dy, divisor, dx: sum_pool.global_avg_backward(
        np.ascontiguousarray(dy).reshape(-1), _one_divisor(divisor), _planes(dx))


def _global_avg_back_cl(plan):
    def run(dy, divisor, dx):
        n, c = dx.shape[:2]
        cl.global_avg_backward(np.ascontiguousarray(dy).reshape(n, c), _one_divisor(divisor),
                               _cl(dx).reshape(n, math.prod(dx.shape[2:]), c))
    return run


# ------------------------------------------------------------------------- lp, unpool


def _lp_power(p, dtype) -> tuple:
    """``(p, whole)`` as Lp's kernels take them for results of ``dtype``: float64, and
    the power's compile-time form."""
    return float(p), powers.power_form(p, dtype)


def _lp(plan):
    return lambda x, y, p: sum_pool.lp_pool_forward(x, plan.table, plan.dilation,
                                                    *_lp_power(p, y.dtype), y)


def _lp_back(plan):
    ptr, outs, _ = plan.cover
    return lambda x, y, dy, p, dx: sum_pool.lp_pool_backward(
        x, y, dy, *_lp_power(p, y.dtype), ptr, outs, dx)


def _lp_as_gem(bind, direction):
    """``bind``, which binds a GeM rows kernel, for Lp: its ``eps`` None (``|x|``, the
    sum not divided; :mod:`.powers`), with Lp's ``run`` arguments."""
    def lp(plan):
        run = bind(plan)
        if direction == "forward":
            return lambda x, y, p: run(x, None, *_lp_power(p, y.dtype), y)
        return lambda x, y, dy, p, dx: run(x, y, dy, None, *_lp_power(p, y.dtype), dx)
    return lp


def _unpool(plan):
    return unpool_kernels.max_unpool_forward


def _unpool_back(plan):
    return unpool_kernels.max_unpool_backward


# ---------------------------------------------------------------------------- rules


def _is_cl(plan, operand, record):
    return operand.layout == "channels_last"


def _on(layout, geometry):
    return lambda plan, operand, record: operand.layout == layout and geometry(plan)


def _cl_tiling(*extents):
    """Channels-last windows that tile the input, of one of these ``(D, H, W)`` extents."""
    return lambda plan, operand, record: (_is_cl(plan, operand, record) and plan.tiles
                                          and tuple(plan.extent) in extents)


def _fast(geometry):
    """The fast NCHW kernels' test: an operand they take and a plan ``geometry`` accepts."""
    return lambda plan, operand, record: operand.fast and geometry(plan)


def _rows_serve(plan):
    return row_interior(plan) is not None


_AVG_FORWARD = [
    _Rule("sum_pool.global_avg_forward", _on("nchw", whole_planes), _global_avg),
    _Rule("channels_last_tiles.avg_pool_forward_quads", _cl_tiling((1, 2, 2)), lambda plan:
          lambda x, y, d: cl_tiles.avg_pool_forward_quads(_cl(x), plan.extent, d,
                                                          _zero(x.dtype), _cl(y))),
    _Rule("channels_last.avg_pool_forward", _is_cl, _avg_cl),
    _Rule("tiled.avg_pool_forward_tiled", _fast(_tiled_forward), _avg_tiled),
    _Rule("blocks.avg_pool_forward_blocks", _fast(_stride2_blocks), _avg_blocks),
    _Rule("row_passes.avg_pool_forward_rows", _fast(_rows_serve), _avg_rows),
    _Rule("sum_pool.avg_pool_forward", _always, _avg_general),
]
_AVG_BACKWARD = [
    _Rule("sum_pool.global_avg_backward", _on("nchw", whole_planes), _global_avg_back),
    _Rule("channels_last.global_avg_backward", _on("channels_last", whole_planes),
          _global_avg_back_cl),
    _Rule("channels_last.avg_pool_backward", _is_cl, _avg_back_cl),
    _Rule("gather_rows.avg_pool_backward_rows", _fast(_rows_serve), _avg_back_rows),
    _Rule("sum_pool.avg_pool_backward", _always, _avg_back_general),
]

_RULES = {
    ("max", "forward"): [
        _Rule("max_pool.global_max_forward", _fast(whole_planes), lambda plan: lambda x, y,
              pos: general_max.global_max_forward(_planes(x), y.reshape(-1), pos.reshape(-1)),
              records=True),
        _Rule("channels_last_tiles.max_values_forward", _values(_cl_tiling(
            *cl_tiles.MAX_EXTENTS)), lambda plan: lambda x, y, pos:
            cl_tiles.max_values_forward(_cl(x), plan.extent, _cl(y))),
        _Rule("channels_last.max_values_forward", _values(_is_cl), lambda plan: lambda x, y,
              pos: cl.max_values_forward(_cl(x), plan.table, plan.dilation, _cl(y))),
        _Rule("channels_last.max_pool_forward", _is_cl, _max_cl, records=True),
        _Rule("tiled.max_values_forward_tiled", _values(_fast(_tiled_forward)),
              lambda plan: _max_tiled(plan, values_only=True)),
        _Rule("tiled.max_pool_forward_tiled", _fast(_tiled_forward), _max_tiled,
              records=True),
        _Rule("blocks.max_values_forward_blocks", _values(_fast(_stride2_blocks)),
              _max_values_blocks),
        _Rule("row_passes.max_values_forward_rows", _values(_fast(_rows_serve)), _max_values_rows),
        _Rule("blocks.max_pool_forward_blocks", _fast(_recorded_stride2_blocks), _max_blocks,
              records=True),
        _Rule("row_passes.max_pool_forward_rows", _fast(_rows_serve), _max_rows, records=True),
        _Rule("max_pool.max_pool_forward_wide", _fast(wide_rows), lambda plan: lambda x, y,
              pos: general_max.max_pool_forward_wide(x, plan.table, plan.dilation,
                                                     plan.extent, y, pos), records=True),
        _Rule("max_pool.max_pool_forward", _always, _max_general, records=True),
    ],
    ("max", "indices"): [
        _Rule("max_pool.window_positions_to_indices", _always, _max_indices),
    ],
    ("max", "backward"): [
        _Rule("channels_last.max_pool_backward", _is_cl, _max_back_cl),
        # any W width: dy and dx reach it C-contiguous
        _Rule("tiled.max_pool_backward_tiled", _fast(lambda plan: plan.tiles), _max_back_tiled),
        _Rule("gather_rows.max_pool_backward_rows", _fast(_rows_serve), _max_back_rows),
        _Rule("max_pool.max_pool_backward", _always, _max_back_general),
    ],
    ("max", "tie_count"): [_Rule("max_pool.max_pool_tie_count", _always, _tie_count)],
    ("max", "split"): [_Rule("max_pool.max_pool_backward_split", _always, _split)],
    ("avg", "forward"): _AVG_FORWARD,
    ("avg", "backward"): _AVG_BACKWARD,
    ("global_avg", "forward"): _AVG_FORWARD,  # the same rules: the plan says it is global
    ("global_avg", "backward"): _AVG_BACKWARD,
    # windows inside x without dilation: GeM's rows kernels, with the general ones' bits
    ("lp", "forward"): [
        _Rule("power_quads.gem_quads_forward", paired_quads,
              _lp_as_gem(kind_rules.gem_quads, "forward")),
        _Rule("power_mean.gem_rows_forward", full_windows, _lp_as_gem(
            kind_rules.gem_rows(power_mean.gem_rows_forward, "forward"), "forward")),
        _Rule("sum_pool.lp_pool_forward", _always, _lp)],
    ("lp", "backward"): [
        _Rule("power_mean.gem_rows_backward", apart, _lp_as_gem(
            kind_rules.gem_rows(power_mean.gem_rows_backward, "backward"), "backward")),
        _Rule("sum_pool.lp_pool_backward", _always, _lp_back)],
    ("circular", "pad"): [
        _Rule("layouts.circular_pad_rows", layouts.pads_by_rows,
              lambda plan: layouts.circular_pad),
        _Rule("numpy.slices", _always, lambda plan: layouts.circular_pad_by_slices)],
    ("unpool", "forward"): [_Rule("unpool.max_unpool_forward", _always, _unpool)],
    ("unpool", "backward"): [_Rule("unpool.max_unpool_backward", _always, _unpool_back)],
}


_RULES.update(kind_rules.RULES)


def _rules(op: str, direction: str):
    return rules_of(_RULES, op, direction, "Numba")


def _kernel(rule: _Rule, plan, operand: Operand) -> Kernel:
    return Kernel(rule.name, rule.bind(plan), rule.records,
                  operand.layout == "channels_last", rule.needs_outputs)


def choose(op: str, direction: str, plan, operand: Operand, *, record: bool = False) -> Kernel:
    """The kernel for one pass of one call.

    Args:
        op: ``"max"``, ``"avg"``, ``"global_avg"``, ``"lp"``, ``"unpool"``,
            ``"blur"``, ``"weighted"``, ``"stochastic"``, ``"blend"``, ``"attention"``,
            ``"fractional"``, ``"gem"`` or ``"gem_global"``.
        direction: ``"forward"`` or ``"backward"`` (max also ``"indices"``,
            ``"tie_count"`` and ``"split"``; weighted also ``"mean_backward"``).
        plan: the call's :class:`~poolgrad.geometry.WindowPlan` (None for unpool).
        operand: :func:`operand` of the array the pass reads (forward) or writes
            (backward).
        record: a max forward must write each window's winner (for a pullback or for
            indices); without it a kernel that folds values only may serve.
    """
    return _choose(op, direction, plan, operand, bool(record))


@functools.lru_cache(maxsize=2048)
def _choose(op, direction, plan, operand, record) -> Kernel:
    # a plan is immutable and (from geometry's caches) one object per geometry, so the
    # choice is kept: a pooling op's fixed cost is tens of microseconds, a choice ~15
    for rule in _rules(op, direction):
        if rule.serves(plan, operand, record):
            return _kernel(rule, plan, operand)
    raise AssertionError("the last rule of every list serves every call")


def general(op: str, direction: str, plan, operand: Operand, *, record: bool = False) -> Kernel:
    """The general kernel of ``(op, direction)``, which serves every call: the reference
    the fast kernels are tested against (a test replaces :func:`choose` by this)."""
    rule = _rules(op, direction)[-1]
    return _kernel(rule, plan, Operand(operand.dtype, "strided", operand.writeable))


def names(op: str, direction: str) -> list[str]:
    """Every kernel that may serve ``(op, direction)``, in the order they are tried."""
    return [rule.name for rule in _rules(op, direction)]
