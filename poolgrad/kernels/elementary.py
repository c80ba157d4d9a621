"""``exp`` and ``log`` in float64 that loops can vectorize: no calls, no branches.

Numba compiles ``np.exp`` and ``np.log`` to calls into the C library, one element at
a time, and a loop that makes such a call stays scalar. These are built from
multiplications, additions, one division, rounding and bit moves, all of which LLVM
vectorizes, with special values chosen by selects.

* :func:`exp`: ``x = n ln2 + r`` with ``n`` the nearest integer to ``x / ln2`` and
  ``|r| <= ln2 / 2``, ``ln2`` split in two (Cody & Waite) so that ``n * LN2_HIGH`` is
  exact; ``e^r`` by its Taylor series to degree 13 (the next term is below
  ``2**-57``); the result scaled by ``2^n`` as two powers of two built from their bits,
  so that no exponent field overflows. Over 709.78 gives inf, under -745.2 gives 0,
  NaN stays NaN.
* :func:`log`: ``x = 2^e m`` with ``m`` in ``[sqrt(2)/2, sqrt(2))`` (subnormals scaled
  by ``2^54`` first), ``log m = 2 atanh(s)`` with ``s = (m - 1) / (m + 1)``,
  ``|s| <= 0.172``, by its series to ``s^23`` (the next term is below ``2**-60``), and
  ``e ln2`` added in two parts. 0 gives -inf, a negative number NaN, inf inf.

Where the result is a normal number, both are within ``5e-16`` relative of NumPy's (a
test holds them to it over the whole range); ``exp``'s subnormal results carry its
error in fewer bits. Their results are the
same on every x86-64 machine: the kernels' fast-math flags allow neither fused
multiply-adds nor reordering.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .walk import helper, inlined

LN2_HIGH = 0.6931471803691238  # ln 2 with its last 32 bits zero: n * LN2_HIGH is exact
LN2_LOW = 1.9082149292705877e-10  # ln 2 - LN2_HIGH
ONE_BITS = 0x3FF0000000000000  # the bits of 1.0
_ROUND = 6755399441055744.0  # 1.5 * 2**52: x + _ROUND - _ROUND rounds x to an integer
# 1/k!: the even and the odd powers' coefficients of e^r to r^13
_EXP_EVEN = tuple(1.0 / math.factorial(k) for k in range(0, 14, 2))
_EXP_ODD = tuple(1.0 / math.factorial(k) for k in range(1, 14, 2))
_LOG_TERMS = 11  # odd powers s^3 ... s^23


@intrinsic
def bits(typingctx, value):
    """The int64 with the bits of a float64."""
    if value != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def from_bits(typingctx, value):
    """The float64 with the bits of an int64."""
    if value != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@inlined
def _power_of_two(n):
    """``2.0 ** n`` for an integer ``n`` from -1022 to 1023, from its bits."""
    return from_bits((n + np.int64(1023)) << np.int64(52))


@helper
def exp(x):
    """``e ** x`` for a float64 (the module docstring)."""
    bounded = min(max(x, -1100.0), 1100.0)  # NaN becomes a bound here, and NaN below
    n = (bounded * 1.4426950408889634 + _ROUND) - _ROUND
    r = (bounded - n * LN2_HIGH) - n * LN2_LOW
    # Horner on r's powers, paired (Estrin's first step) so that two chains run at once
    r2 = r * r
    even, odd = _EXP_EVEN[-1], _EXP_ODD[-1]
    for k in range(len(_EXP_EVEN) - 2, -1, -1):
        even = even * r2 + _EXP_EVEN[k]
        odd = odd * r2 + _EXP_ODD[k]
    term = even + r * odd
    whole = np.int64(n)
    half = whole >> np.int64(1)
    value = term * _power_of_two(half) * _power_of_two(whole - half)
    return x if x != x else value


@helper
def log(x):
    """The natural logarithm of a float64 (the module docstring)."""
    small = x < 2.2250738585072014e-308
    scaled = x * 18014398509481984.0 if small else x  # subnormals: times 2**54
    pattern = bits(scaled)
    exponent = ((pattern >> np.int64(52)) & np.int64(0x7FF)) - np.int64(1023)
    m = from_bits((pattern & np.int64(0x000FFFFFFFFFFFFF)) | np.int64(0x3FF0000000000000))
    high = m > 1.4142135623730951
    m = m * 0.5 if high else m
    e = np.float64(exponent + (np.int64(1) if high else np.int64(0))
                   - (np.int64(54) if small else np.int64(0)))
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    series = 0.0
    for k in range(_LOG_TERMS, 0, -1):  # s^2/3 + s^4/5 + ... by Horner
        series = s2 * (1.0 / (2 * k + 1) + series)
    value = e * LN2_HIGH + (e * LN2_LOW + (s + s) * (1.0 + series))
    value = -np.inf if x == 0.0 else value
    value = np.nan if x < 0.0 else value
    return x if (x != x) | (x == np.inf) else value
