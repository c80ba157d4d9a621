"""LLVM IR helpers for the kernels' vector intrinsics (:mod:`.simd`): arguments as
their code uses them, vectors loaded and stored at an element's alignment, lane picks."""

from llvmlite import ir
from numba.core import types


def lane_numbers(picks):
    """A constant vector of lane numbers, a shuffle's mask."""
    return ir.Constant(ir.VectorType(ir.IntType(32), len(picks)), list(picks))


def contiguous_1d(ty, dtype=None):
    return (isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C"
            and (dtype is None or ty.dtype == dtype))


def integer_1d(ty):
    return contiguous_1d(ty) and isinstance(ty.dtype, types.Integer)


def arguments(context, builder, signature, args):
    """An intrinsic's arguments as its code uses them: integers widened to int64, arrays
    as the address of their first element, anything else as it is."""
    values = []
    for value, ty in zip(args, signature.args, strict=True):
        if isinstance(ty, types.Integer):
            value = context.cast(builder, value, ty, types.int64)
        elif isinstance(ty, types.Array):
            value = context.make_array(ty)(context, builder, value).data
        values.append(value)
    return values


def vector_load(context, builder, data, index, element, count):
    """``count`` elements from ``data[index]`` as one vector (aligned to an element)."""
    pointer = builder.bitcast(builder.gep(data, [index]),
                              ir.VectorType(element, count).as_pointer())
    return builder.load(pointer, align=context.get_abi_sizeof(element))


def vector_store(context, builder, vector, data, index):
    """Store ``vector`` at ``data[index]`` (aligned to an element)."""
    pointer = builder.bitcast(builder.gep(data, [index]), vector.type.as_pointer())
    builder.store(vector, pointer, align=context.get_abi_sizeof(vector.type.element))


def resize_lanes(builder, integers, width):
    """A vector of unsigned integers (tap numbers) as ``width``-bit lanes: widened with
    zeros or cut (the numbers fit either width: they are below the window size)."""
    lanes = ir.VectorType(ir.IntType(width), integers.type.count)
    have = integers.type.element.width
    return (builder.zext(integers, lanes) if have < width else
            builder.trunc(integers, lanes) if have > width else integers)


def splat(builder, scalar, count):
    """A vector of ``count`` copies of ``scalar``."""
    vector = ir.VectorType(scalar.type, count)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.IntType(32)(0))
    return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined),
                                  lane_numbers([0] * count))
