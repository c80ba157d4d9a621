"""poolgrad.torch's operators as standard ONNX nodes, for ``torch.onnx.export``.

A model whose pooling :func:`~poolgrad.torch.replace_pooling` swapped holds
``torch.ops.poolgrad.*`` operators, which ONNX does not know. :func:`translations`
gives the exporter (``torch.onnx.export(..., dynamo=True)``, the default) one
translation per operator, into the nodes torch's own pooling exports to:

=======================  ===================================================================
operator                 ONNX
=======================  ===================================================================
max pooling              ``MaxPool`` (``GlobalMaxPool``), its pads, ``ceil_mode`` and
                         dilations; bfloat16 through float32, int16/int32 through float64
                         (exact); global integer maxima as ``ReduceMax``
indices                  a ``Gather`` of the window taps and ``ArgMax``, then the tap's
                         flat position in its ``(n, c)`` plane (PyTorch's indices)
average pooling          ``AveragePool`` (``GlobalAveragePool``), ``count_include_pad``;
                         ``divisor_override`` as a window sum over the divisor
Lp pooling               ``LpPool`` (``GlobalLpPool``) for an integer ``p``, else ``Abs``,
                         ``Pow``, a window sum and ``Pow`` again
adaptive pooling         the pool of equal windows where the sizes divide
unpooling                ``MaxUnpool`` (indices made flat over the whole tensor, as ONNX's)
anti-aliased pooling     the stride-1 ``MaxPool`` (its winners as max pooling's) or
                         ``AveragePool``; ``Pad`` (zeros) or a ``Gather`` per axis
                         (reflect, replicate, circular); the binomial filter as one
                         ``Conv`` over every ``(n, c)`` plane at the stride
GeM                      ``Max`` with eps, ``Pow`` by ``p`` (a graph input when learned), a
                         window mean (``AveragePool``, ``GlobalAveragePool``), ``Pow`` by
                         ``1/p``
what no node takes       a pad as large as the kernel (ONNX Runtime refuses it), unequal
                         adaptive bins, int64 maxima: a ``Gather`` of each window's taps
                         and its reduction (static spatial sizes needed)
=======================  ===================================================================

Every translation is the operator's own semantics: outputs equal torch's (max bit for
bit, the rest to float rounding), tested with ONNX Runtime. GeM is exported without
the per-window scaling by the maximum that poolgrad computes with, so in float32 a
``max(x)^p`` beyond 3.4e38 overflows there (x above 6.9e12 at p = 3). The ``abs`` of poolgrad's Lp
pooling is ONNX LpPool's own. What cannot be exported is refused with
:class:`ExportRefused` (a ValueError) that says what to change: a Gather form with
dynamic spatial sizes, and the kinds that draw at random (``stochastic_pool``,
``fractional_max_pool``). The other kinds export as their compositions of standard
nodes. Opset 19 or newer is needed (dilated ``AveragePool``). ONNX Runtime's MaxPool
skips NaN where torch propagates it, for torch's own pooling as for poolgrad's; its CPU
provider has no float64 ``AveragePool``, ``GlobalAveragePool``, ``GlobalMaxPool``,
``LpPool`` or ``MaxUnpool``.

Example::

    import poolgrad.torch as pt
    pt.replace_pooling(model)
    pt.onnx.export(model.eval(), (x,), "model.onnx")      # or:
    torch.onnx.export(model, (x,), "model.onnx", custom_translation_table=pt.onnx.translations())

``torch.jit.trace`` records the operators themselves (``poolgrad::max_pool_values`` and
so on), so a traced model runs where poolgrad is imported; ``torch.jit.script`` cannot
compile the functions' keyword-only arguments; export with ``torch.export`` or ONNX
instead.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import geometry
from ._kind_ops import MIXED, SOFT, blur_args, blur_max_window
from ._ops import ADAPTIVE, plan_of, sliding_args, window_ndim

__all__ = ["MIN_OPSET", "ExportRefused", "export", "translations"]

MIN_OPSET = 19  # AveragePool's dilations


class ExportRefused(ValueError):
    """What an export cannot express: a translation's refusal, or a kind that cannot be
    exported (random draws, a check on the data), with what to do instead."""


def refuse_export(message: str) -> None:
    """Raise :class:`ExportRefused` while ``torch.export`` (so ONNX export) traces."""
    if torch.compiler.is_exporting():
        raise ExportRefused(message)


def _onnxscript():
    try:
        import onnx_ir
        import onnxscript
    except ImportError:
        raise ImportError("exporting poolgrad.torch's operators to ONNX needs onnxscript "
                          "(pip install onnxscript onnx), as torch.onnx.export does") from None
    return onnxscript.opset19, onnx_ir


def export(model, args=(), f=None, **kwargs):
    """``torch.onnx.export(model, args, f, **kwargs)`` with poolgrad's translations
    (merged under any ``custom_translation_table`` given), the dynamo exporter and an
    opset of at least 19. The export runs under ``torch.no_grad()``: an ONNX graph is
    for inference, and max pooling then needs no winners. Returns the ONNXProgram."""
    if kwargs.pop("dynamo", True) is not True:
        raise ValueError("poolgrad.torch.onnx.export needs the dynamo exporter (dynamo=True, "
                         "the default): TorchScript's exporter cannot translate custom ops")
    opset = kwargs.pop("opset_version", None)
    if opset is not None and opset < MIN_OPSET:
        raise ValueError(f"poolgrad's ONNX translations need opset_version >= {MIN_OPSET}, "
                         f"got {opset}")
    table = {**translations(), **(kwargs.pop("custom_translation_table", None) or {})}
    try:
        with torch.no_grad():
            return torch.onnx.export(model, args, f, dynamo=True, opset_version=opset,
                                     custom_translation_table=table, **kwargs)
    except Exception as error:
        refusal = _refusal(error)
        if refusal is None:
            raise
        raise refusal from None


def _refusal(error: BaseException) -> ExportRefused | None:
    """poolgrad's refusal inside the exporter's chain of errors, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ExportRefused):
            return ExportRefused(str(error))
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def translations() -> dict:
    """``{torch.ops.poolgrad.<op>.default: translation}`` for ``torch.onnx.export``'s
    ``custom_translation_table``: every forward operator of poolgrad.torch."""
    _onnxscript()  # a clear error now rather than inside the exporter
    ops = torch.ops.poolgrad
    return {ops.max_pool.default: _max_pool, ops.max_pool_values.default: _max_pool_values,
            ops.max_pool_indices.default: _max_pool_indices, ops.avg_pool.default: _avg_pool,
            ops.lp_pool.default: _lp_pool, ops.max_unpool.default: _max_unpool,
            ops.gem_pool.default: _gem_pool, ops.weighted_pool.default: _weighted_pool,
            ops.weighted_pool_values.default: _weighted_pool_values,
            ops.blur_pool.default: _blur_pool,
            ops.blur_pool_values.default: _blur_pool_values,
            ops.blend_pool.default: _blend_pool}


# ----------------------------------------------------------------------- the windows


def _static_spatial(shape, what: str) -> tuple[int, ...]:
    """The spatial sizes of an input of ``shape`` (its ONNX shape), which the Gather
    forms need as numbers."""
    dims = tuple(shape)[2:] if shape is not None else ()
    if not dims or not all(isinstance(d, int) for d in dims):
        raise ExportRefused(f"poolgrad.torch.onnx: {what} needs static spatial sizes, got "
                            f"{shape}; export without dynamic spatial dims")
    return dims


def _is_global(window) -> bool:
    return window[0] == ADAPTIVE and all(o == 1 for o in window[1:])


def _native(shape, window) -> dict | None:
    """``window`` as the attributes of an ONNX pooling node, where one takes it: a
    sliding window whose pads are each smaller than the kernel (ONNX Runtime refuses
    larger ones), or adaptive bins of equal sizes (``kernel = stride = in / out``);
    else None, for the Gather forms."""
    if window[0] == ADAPTIVE:
        in_spatial = _static_spatial(shape, "adaptive pooling")
        outs = window[1:]
        if any(length % out for length, out in zip(in_spatial, outs, strict=True)):
            return None
        kernel = [length // out for length, out in zip(in_spatial, outs, strict=True)]
        n = len(kernel)
        return dict(kernel_shape=kernel, strides=kernel, pads=[0] * 2 * n, dilations=[1] * n,
                    ceil_mode=0)
    kernel, stride, pads, dilation, ceil_mode = sliding_args(window)
    if any(lo >= k or hi >= k for (lo, hi), k in zip(pads, kernel, strict=True)):
        return None
    return dict(kernel_shape=list(kernel), strides=list(stride), pads=_onnx_pads(pads),
                dilations=list(dilation), ceil_mode=int(ceil_mode))


def _onnx_pads(pads) -> list[int]:
    """``(before, after)`` pairs as ONNX's ``pads``: every before, then every after."""
    return [lo for lo, _ in pads] + [hi for _, hi in pads]


def _plane_strides(plan) -> list[int]:
    """Each spatial axis's step in a flat input plane (row-major)."""
    return [math.prod(a.length for a in plan.axes[d + 1:]) for d in range(len(plan.axes))]


def _tap_table(plan) -> tuple[np.ndarray, np.ndarray]:
    """Each output position's window taps (numbered row-major, as the winners are): the
    tap's flat position in the input plane (clipped into it) and whether the tap lies
    inside the input, as two ``(*out, taps)`` arrays."""
    ndim = len(plan.axes)
    out = tuple(axis.count for axis in plan.axes)
    taps = tuple(axis.extent for axis in plan.axes)
    position = np.zeros(out + taps, np.int64)
    inside = np.ones(out + taps, bool)
    for d, (axis, plane_stride) in enumerate(zip(plan.axes, _plane_strides(plan),
                                                  strict=True)):
        shape = [1] * (2 * ndim)
        shape[d], shape[ndim + d] = axis.count, axis.extent
        j = np.arange(axis.extent)[None, :]
        coordinate = axis.start[:, None] + j * axis.dilation
        position = position + np.clip(coordinate, 0, axis.length - 1).reshape(shape) * (
            plane_stride)
        inside = inside & ((j >= axis.first[:, None]) & (j < axis.end[:, None])).reshape(shape)
    return position.reshape(*out, -1), inside.reshape(*out, -1)


def _divisors(plan, count_include_pad: bool) -> np.ndarray:
    """Each window's divisor, ``(*out)``: its taps inside the padded input
    (``count_include_pad``) or inside the input."""
    ndim = len(plan.axes)
    divisor = np.ones(tuple(axis.count for axis in plan.axes), np.int64)
    for d, axis in enumerate(plan.axes):
        count = axis.padded if count_include_pad else axis.end - axis.first
        divisor = divisor * count.reshape([-1 if e == d else 1 for e in range(ndim)])
    return divisor


def _gathered(op, ir, x, plan):
    """``x``'s window taps as ``(N, C, *out, taps)`` (a ``Gather`` from the flat planes),
    and the constant mask of those inside the input."""
    position, inside = _tap_table(plan)
    planes = op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))
    taps = op.Gather(planes, op.Constant(value=ir.tensor(position)), axis=2)
    return taps, op.Constant(value=ir.tensor(inside))


def _spatial_axes(window) -> list[int]:
    return list(range(2, 2 + window_ndim(window)))


# ---------------------------------------------------------------------------- dtypes


def _in_float32(op, ir, x):
    """Half precisions are computed in float32, as poolgrad computes them. Returns ``x``
    to compute with, its NumPy dtype and the cast back."""
    if x.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        dtype = x.dtype
        return (op.Cast(x, to=ir.DataType.FLOAT), np.dtype(np.float32),
                lambda y: op.Cast(y, to=dtype))
    return x, x.dtype.numpy(), lambda y: y


def _scalar(op, ir, value, dtype):
    return op.Constant(value=ir.tensor(np.array(value, dtype)))


def _lowest(dtype) -> float | int:
    """The fill no element beats: -inf, or an integer type's minimum."""
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# ------------------------------------------------------------------------ max pooling


def _max_values(op, ir, x, window):
    """The maxima, and ``x`` as compared (its dtype) for the winners. ONNX MaxPool takes
    float16/32/64, int8 and uint8: bfloat16 goes through float32, int16 and int32 through
    float64 (both exact); int64 and what a pooling node cannot take (large pads, unequal
    bins) take the Gather form, and global integer maxima ``ReduceMax``."""
    shape, dtype = x.shape, x.dtype
    if dtype == ir.DataType.BFLOAT16:
        pooled, compared, back = _in_float32(op, ir, x)
    else:
        pooled, compared, back = x, dtype.numpy(), lambda y: y
    if _is_global(window):
        if compared.kind == "f":
            return back(op.GlobalMaxPool(pooled)), pooled, compared
        wide = op.Cast(x, to=ir.DataType.INT32) if compared.itemsize < 4 else x
        y = op.ReduceMax(wide, op.Constant(value_ints=_spatial_axes(window)), keepdims=1)
        return op.CastLike(y, x), x, compared
    native = _native(shape, window) if compared != np.int64 else None
    if native is not None:
        if compared in (np.int16, np.int32):
            y = op.MaxPool(op.Cast(x, to=ir.DataType.DOUBLE), **native)[0]
            return op.Cast(y, to=dtype), x, compared
        return back(op.MaxPool(pooled, **native)[0]), pooled, compared
    plan = plan_of(window, _static_spatial(shape, "this max pooling (large pads, unequal "
                                                  "bins or int64)"))
    taps, inside = _gathered(op, ir, pooled, plan)
    y = op.ReduceMax(op.Where(inside, taps, _scalar(op, ir, _lowest(compared), compared)),
                     op.Constant(value_ints=[-1]), keepdims=0)
    return back(y), pooled, compared


def _max_pool_values(x, window):
    op, ir = _onnxscript()
    return _max_values(op, ir, x, window)[0]


def _max_pool(x, window, ties):
    """Values, and each window's winning tap: the first tap inside the input equal to
    the maximum (a NaN matching a NaN), for either tie rule (``"split"`` shares the
    gradient, not the winner)."""
    op, ir = _onnxscript()
    plan = plan_of(window, _static_spatial(x.shape, "max pooling's indices"))
    y, pooled, dtype = _max_values(op, ir, x, window)
    taps, inside = _gathered(op, ir, pooled, plan)
    maximum = op.Unsqueeze(op.CastLike(y, pooled), op.Constant(value_ints=[-1]))
    hit = op.Equal(taps, maximum)
    if dtype.kind == "f":
        hit = op.Or(hit, op.And(op.IsNaN(taps), op.IsNaN(maximum)))
    tap = op.ArgMax(op.Cast(op.And(hit, inside), to=ir.DataType.INT32), axis=-1, keepdims=0)
    tap_dtype = ir.DataType.from_numpy(np.dtype(geometry.position_dtype(plan.window_size)))
    return y, op.Cast(tap, to=tap_dtype)


def _max_pool_indices(winners, window, x_size):
    """Each winning tap's flat position in its input plane (PyTorch's indices)."""
    op, ir = _onnxscript()
    plan = plan_of(window, tuple(x_size[2:]))
    ndim = len(plan.axes)
    tap = op.Cast(winners, to=ir.DataType.INT64)
    start = np.zeros((1, 1, *plan.out_spatial), np.int64)
    index = None
    for d, (axis, plane_stride) in enumerate(zip(plan.axes, _plane_strides(plan),
                                                  strict=True)):
        shape = [1] * (2 + ndim)
        shape[2 + d] = axis.count
        start = start + axis.start.reshape(shape) * plane_stride
        taps_after = math.prod(a.extent for a in plan.axes[d + 1:])
        along = op.Mod(op.Div(tap, _scalar(op, ir, taps_after, np.int64)),
                       _scalar(op, ir, axis.extent, np.int64))
        step = op.Mul(along, _scalar(op, ir, axis.dilation * plane_stride, np.int64))
        index = step if index is None else op.Add(index, step)
    return op.Add(index, op.Constant(value=ir.tensor(start)))


# -------------------------------------------------------------------- average pooling


def _window_sum(op, ir, x, dtype, window, shape):
    """The sum over each window of the input elements (padding adds nothing): a
    reduction for a global window, a pooling node's average times the window's size
    where every window lies inside the padded input (no ``ceil_mode``), else the Gather
    form (``shape``: the original input's)."""
    if _is_global(window):
        return op.ReduceSum(x, op.Constant(value_ints=_spatial_axes(window)), keepdims=1)
    native = _native(shape, window)
    if native is not None and not native["ceil_mode"]:
        size = math.prod(native["kernel_shape"])
        return op.Mul(op.AveragePool(x, count_include_pad=1, **native),
                      _scalar(op, ir, size, dtype))
    plan = plan_of(window, _static_spatial(shape, "this window sum (ceil_mode, large "
                                                  "pads or unequal bins)"))
    taps, inside = _gathered(op, ir, x, plan)
    return op.ReduceSum(op.Where(inside, taps, _scalar(op, ir, 0, dtype)),
                        op.Constant(value_ints=[-1]), keepdims=0)


def _avg_pool(x, window, count_include_pad, divisor_override):
    op, ir = _onnxscript()
    shape = x.shape
    x, dtype, cast_back = _in_float32(op, ir, x)
    if divisor_override is not None:
        return cast_back(op.Div(_window_sum(op, ir, x, dtype, window, shape),
                                _scalar(op, ir, divisor_override, dtype)))
    if _is_global(window):
        return cast_back(op.GlobalAveragePool(x))
    native = _native(shape, window)
    if native is not None:
        return cast_back(op.AveragePool(x, count_include_pad=int(count_include_pad),
                                        **native))
    plan = plan_of(window, _static_spatial(shape, "this average (large pads or unequal "
                                                  "bins)"))
    divisors = _divisors(plan, count_include_pad and window[0] != ADAPTIVE).astype(dtype)
    return cast_back(op.Div(_window_sum(op, ir, x, dtype, window, shape),
                            op.Constant(value=ir.tensor(divisors))))


# ------------------------------------------------------------------------- Lp pooling


def _lp_pool(x, p, window):
    op, ir = _onnxscript()
    shape = x.shape
    x, dtype, cast_back = _in_float32(op, ir, x)
    if float(p).is_integer():
        if _is_global(window):
            return cast_back(op.GlobalLpPool(x, p=int(p)))
        native = _native(shape, window)
        if native is not None:
            return cast_back(op.LpPool(x, p=int(p), **native))
    powered = op.Pow(op.Abs(x), _scalar(op, ir, p, dtype))
    return cast_back(op.Pow(_window_sum(op, ir, powered, dtype, window, shape),
                            _scalar(op, ir, 1 / p, dtype)))


# -------------------------------------------------------------------------------- GeM


def _gem_pool(x, p, eps, window):
    """``mean(max(x, eps)^p)^(1/p)``: a window's mean as an average over its taps (GeM's
    windows lie inside the input), ``p`` cast to the computing dtype."""
    op, ir = _onnxscript()
    shape = x.shape
    x, dtype, cast_back = _in_float32(op, ir, x)
    power = op.Reshape(op.CastLike(p, x), op.Constant(value_ints=[]))
    raised = op.Pow(op.Max(x, _scalar(op, ir, eps, dtype)), power)
    if _is_global(window):
        mean = op.GlobalAveragePool(raised)
    else:
        mean = op.AveragePool(raised, count_include_pad=0, **_native(shape, window))
    return cast_back(op.Pow(mean, op.Reciprocal(power)))


# ------------------------------------------------------------ blends of max and mean


def _blend_pool(x, weights, kind, window):
    """``s max + (1 - s) mean`` from the max and average pooling translations (the mean
    counts padding); mixed: ``s = alpha``; gated: ``s = sigmoid(gate . taps)`` over the
    Gather form's taps, padding 0."""
    op, ir = _onnxscript()
    shape = x.shape
    top = _max_pool_values(x, window)
    mean = _avg_pool(x, window, True, None)
    x, dtype, cast_back = _in_float32(op, ir, x)
    top, mean = (op.CastLike(t, x) for t in (top, mean))
    if kind == MIXED:
        share = op.Reshape(op.CastLike(weights, x), op.Constant(value_ints=[]))
    else:
        plan = plan_of(window, _static_spatial(shape, "gated_pool"))
        taps, inside = _gathered(op, ir, x, plan)
        gate = op.Reshape(op.CastLike(weights, x), op.Constant(value_ints=[-1]))
        taps = op.Where(inside, taps, _scalar(op, ir, 0, dtype))
        share = op.Sigmoid(op.ReduceSum(op.Mul(taps, gate), op.Constant(value_ints=[-1]),
                                        keepdims=0))
    rest = op.Sub(_scalar(op, ir, 1, dtype), share)
    return cast_back(op.Add(op.Mul(share, top), op.Mul(rest, mean)))


# ------------------------------------------------------------------ weighted averages


def _weighted_pool(x, kind, window):
    """The Gather form: each window's real taps, weighted by ``exp(x - max)`` (SoftPool)
    or by ``x`` (stochastic pooling's mean; 0 where the window sums to 0); the second
    output is the backward's ``norm``."""
    op, ir = _onnxscript()
    shape = x.shape
    x, dtype, cast_back = _in_float32(op, ir, x)
    plan = plan_of(window, _static_spatial(shape, "soft_pool"))
    taps, inside = _gathered(op, ir, x, plan)
    last, zero = op.Constant(value_ints=[-1]), _scalar(op, ir, 0, dtype)
    if kind == SOFT:
        largest = op.ReduceMax(op.Where(inside, taps, _scalar(op, ir, -np.inf, dtype)), last,
                               keepdims=1)
        weights = op.Where(inside, op.Exp(op.Sub(taps, largest)), zero)
    else:
        weights = op.Where(inside, taps, zero)
    total = op.ReduceSum(weights, last, keepdims=0)
    weighted = op.ReduceSum(op.Mul(weights, op.Where(inside, taps, zero)), last, keepdims=0)
    if kind == SOFT:
        y = op.Div(weighted, total)
        norm = op.Add(op.Squeeze(largest, last), op.Log(total))
    else:
        some = op.Not(op.Equal(total, zero))
        y = op.Where(some, op.Div(weighted, op.Where(some, total, _scalar(op, ir, 1, dtype))),
                     zero)
        norm = total
    return cast_back(y), norm


def _weighted_pool_values(x, kind, window):
    return _weighted_pool(x, kind, window)[0]


# ----------------------------------------------------------------------- anti-aliased


def _blur_pool_values(x, blur):
    return _blur_pool(x, blur)[0]


def _pad_source(length: int, before: int, after: int, mode: str) -> np.ndarray:
    """Which element each position of an axis padded by ``(before, after)`` in ``mode``
    copies (reflect, replicate or circular; zeros pads with a Pad node)."""
    index = np.arange(-before, length + after)
    if mode == "reflect":
        index = np.abs(index)
        return np.where(index >= length, 2 * (length - 1) - index, index)
    if mode == "circular":
        return index % length
    return index.clip(0, length - 1)


def _blur_pool(x, blur):
    """The optional stride-1 max or mean, the padding, and the N-d binomial filter as a
    single-channel ``Conv`` over ``(N*C, 1, *padded)`` at the stride. The second output
    is a max-blur's winners (pruned from the graph when unused), else empty."""
    op, ir = _onnxscript()
    pre, kernel, stride, sizes, pads, mode = blur_args(blur)
    ones = [1] * len(kernel)
    spatial = _static_spatial(x.shape, "blur_pool")
    lead = op.Slice(op.Shape(x), op.Constant(value_ints=[0]), op.Constant(value_ints=[2]))
    source, winners = x.dtype, op.Constant(value=ir.tensor(np.zeros(0, np.uint8)))
    if pre == "max":  # max pooling's translation, in the input's dtype
        x, winners = _max_pool(x, blur_max_window(kernel), "first")
    half = source in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    x, dtype = (op.Cast(x, to=ir.DataType.FLOAT), np.float32) if half else (x, source.numpy())
    if pre == "avg":
        x = op.AveragePool(x, kernel_shape=list(kernel), strides=ones)
    lengths = [length - k + 1 for length, k in zip(spatial, kernel, strict=True)]
    if mode == "zeros":
        x = op.Pad(x, op.Constant(value_ints=[0, 0, *(lo for lo, _ in pads), 0, 0,
                                              *(hi for _, hi in pads)]))
    else:
        for axis, ((lo, hi), length) in enumerate(zip(pads, lengths, strict=True)):
            if lo or hi:
                copied = _pad_source(length, lo, hi, mode)
                x = op.Gather(x, op.Constant(value=ir.tensor(copied)), axis=2 + axis)
    padded = [length + lo + hi for length, (lo, hi) in zip(lengths, pads, strict=True)]
    weight = np.ones((), np.float64)
    for size in sizes:
        weight = np.multiply.outer(weight, geometry.binomial_filter(size))
    planes = op.Reshape(x, op.Constant(value_ints=[-1, 1, *padded]))
    y = op.Conv(planes, op.Constant(value=ir.tensor(weight.astype(dtype)[None, None])),
                strides=list(stride))
    out = [(p - f) // s + 1 for p, f, s in zip(padded, sizes, stride, strict=True)]
    y = op.Reshape(y, op.Concat(lead, op.Constant(value_ints=out), axis=0))
    return (op.Cast(y, to=source) if half else y), winners


# -------------------------------------------------------------------------- unpooling


def _max_unpool(y, indices, window, output_size):
    """ONNX MaxUnpool numbers positions over the whole output tensor, PyTorch within
    each ``(n, c)`` plane: each plane's offset is added first."""
    op, ir = _onnxscript()
    kernel, stride, pads, _, _ = sliding_args(window)
    ndim = len(kernel)
    lead = op.Slice(op.Shape(y), op.Constant(value_ints=[0]), op.Constant(value_ints=[2]))
    planes = op.ReduceProd(lead, keepdims=0)
    offsets = op.Mul(op.Range(_scalar(op, ir, 0, np.int64), planes,
                              _scalar(op, ir, 1, np.int64)),
                     _scalar(op, ir, math.prod(output_size), np.int64))
    offsets = op.Reshape(offsets, op.Concat(lead, op.Constant(value_ints=[1] * ndim), axis=0))
    flat = op.Add(op.Cast(indices, to=ir.DataType.INT64), offsets)
    shape = op.Concat(lead, op.Constant(value_ints=list(output_size)), axis=0)
    return op.MaxUnpool(y, flat, shape, kernel_shape=list(kernel), strides=list(stride),
                        pads=_onnx_pads(pads))
