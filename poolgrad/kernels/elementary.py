"""``exp`` and ``log`` in float64, and ``exp`` in float32, that loops can vectorize: no
calls, no branches.

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
* :func:`exp32` and :func:`log32`: the same in float32 arithmetic, ``e^r`` to degree 7
  summed as ``1 + (r + r^2 q)`` (over 88.73 gives inf, under -103.98 gives 0), ``log
  m`` arranged around ``f = m - 1``, exact. :func:`exp_in` and :func:`log_in` pick the
  float32 or the float64 function by the argument's type.
* :func:`log2_for_float32` and :func:`exp2_for_float32`: base-2 ``log`` and ``exp``
  in float64 arithmetic, accurate enough for a result that is rounded to float32 and
  about half the work of :func:`log` and :func:`exp`: ``log2 m = s P(s^2)`` to
  ``s^9`` and ``2^r`` (``|r| <= 1/2``, the whole part exact) to ``r^8``, both
  weighted minimax fits (``experiments/elementary_fits.py``: a term fewer each than
  their Taylor series, which cost the 2x2 GeM forward a tenth more time) evaluated by
  Estrin's scheme, whose short chains keep more vectors in flight than Horner's. GeM
  and Lp raise a float32 input to a power that is not whole with them.

Where the result is a normal number, :func:`exp` and :func:`log` are within ``5e-16``
relative of NumPy's, and :func:`exp32` and :func:`log32` within one unit in the last
place of the exact result (tests hold them to it over the whole range); subnormal
results carry the error in fewer bits. :func:`log2_for_float32` is within ``2**-35``
absolute of ``log2`` and :func:`exp2_for_float32` within ``2**-35`` relative of
``exp2`` where the result is a normal float64, so ``exp2(p log2 z)`` is within about
``p 2**-35`` relative of ``z^p``: a small fraction of float32's ``2**-24``. Their results
are the same on every x86-64 machine: the kernels' fast-math flags allow neither fused
multiply-adds nor reordering.
"""

import math

import numpy as np
from numba import types
from numba.extending import intrinsic, overload

from . import JIT_OPTIONS
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
    """The int64 with the bits of a float64, or the int32 with those of a float32."""
    if value not in (types.float64, types.float32):
        return None
    integer = types.int64 if value == types.float64 else types.int32

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(integer))
    return integer(value), codegen


@intrinsic
def from_bits(typingctx, value):
    """The float64 with the bits of an int64, or the float32 with those of an int32."""
    if value not in (types.int64, types.int32):
        return None
    real = types.float64 if value == types.int64 else types.float32

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(real))
    return real(value), codegen


def unsigned_bits(value):
    """The bits of a float32 as a uint32, or of a float64 as a uint64 (compiled code
    only). In that order every finite number >= +0 lies below the bits of +inf, and
    +inf, NaNs, the negative numbers and -0.0 at or above them: one integer maximum
    checks floats that loops vectorize with no float compares or masks."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(unsigned_bits, inline="always", jit_options=JIT_OPTIONS)
def _unsigned_bits(value):
    if value == types.float32:
        return lambda value: np.uint32(bits(value))
    if value == types.float64:
        return lambda value: np.uint64(bits(value))
    return None


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


# float32: ln 2 with its last 8 bits zero (n * LN2_HIGH32 exact for |n| < 2**8), and
# e^r's Taylor coefficients to r^7 (the next term is below 2**-29 for |r| <= ln2 / 2)
LN2_HIGH32 = np.float32(0.693145751953125)
LN2_LOW32 = np.float32(1.4286068203094172e-06)
_ROUND32 = np.float32(12582912.0)  # 1.5 * 2**23
_EXP32 = tuple(np.float32(1.0 / math.factorial(k)) for k in range(8))


@inlined
def _power_of_two32(n):
    """``2.0 ** n`` as a float32 for an integer ``n`` from -126 to 127, from its bits."""
    return from_bits(np.int32((n + np.int32(127)) << np.int32(23)))


@helper
def exp32(x):
    """``e ** x`` for a float32, in float32 arithmetic: as :func:`exp` (the reduction
    ``x = n ln2 + r`` with ``ln2`` in two parts, ``2^n`` as two powers of two), ``e^r``
    to degree 7. Over 88.73 gives inf, under -103.98 gives 0, NaN stays NaN."""
    bounded = min(max(x, np.float32(-110.0)), np.float32(100.0))
    n = (bounded * np.float32(1.4426950408889634) + _ROUND32) - _ROUND32
    r = (bounded - n * LN2_HIGH32) - n * LN2_LOW32
    # e^r = 1 + (r + r^2 q): the small part summed first, so that its rounding errors
    # are scaled down by the final addition
    q = _EXP32[7]
    for k in range(6, 1, -1):
        q = q * r + _EXP32[k]
    whole = np.int32(n)
    half = whole >> np.int32(1)
    value = ((np.float32(1.0) + (r + (r * r) * q)) * _power_of_two32(half)
             * _power_of_two32(whole - half))
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


@helper
def log32(x):
    """The natural logarithm of a float32, in float32 arithmetic: ``x = 2^e m`` as in
    :func:`log`, ``log m`` by its series in ``s`` to ``s^9`` (the next term is below
    ``2**-28``), arranged around ``f = m - 1`` (below)."""
    small = x < np.float32(1.1754943508222875e-38)
    scaled = x * np.float32(16777216.0) if small else x  # subnormals: times 2**24
    pattern = bits(scaled)
    exponent = ((pattern >> np.int32(23)) & np.int32(0xFF)) - np.int32(127)
    m = from_bits(np.int32((pattern & np.int32(0x007FFFFF)) | np.int32(0x3F800000)))
    high = m > np.float32(1.4142135623730951)
    m = m * np.float32(0.5) if high else m
    e = np.float32(exponent + (np.int32(1) if high else np.int32(0))
                   - (np.int32(24) if small else np.int32(0)))
    # log m = f - f^2/2 + s (f^2/2 + R), f = m - 1 (exact), s = f / (2 + f), R the
    # series' tail 2 s^2/3 + ... + 2 s^8/9: f carries the leading bits exactly, so that
    # the result is within one unit in the last place where |log x| is small
    f = m - np.float32(1.0)
    s = f / (np.float32(2.0) + f)
    s2 = s * s
    tail = np.float32(0.0)
    for k in range(4, 0, -1):
        tail = s2 * (np.float32(2.0 / (2 * k + 1)) + tail)
    half_f2 = np.float32(0.5) * f * f
    value = e * LN2_HIGH32 - ((half_f2 - (s * (half_f2 + tail) + e * LN2_LOW32)) - f)
    value = np.float32(-np.inf) if x == np.float32(0.0) else value
    value = np.float32(np.nan) if x < np.float32(0.0) else value
    return x if (x != x) | (x == np.float32(np.inf)) else value



def _in_its_precision(name, single, double):
    """A function of one float that compiled code calls as ``single`` for a float32 and
    ``double`` for a float64."""
    def stub(x):
        raise NotImplementedError("only for Numba-compiled kernels")
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = (f"``{double.__name__}`` in the precision of ``x``: :func:`{single.__name__}`"
                    f" for a float32, :func:`{double.__name__}` for a float64 (compiled code"
                    " only).")

    @overload(stub, inline="always", jit_options=JIT_OPTIONS)
    def pick(x):
        if x == types.float32:
            return lambda x: single(x)
        if x == types.float64:
            return lambda x: double(x)
        return None
    return stub


exp_in = _in_its_precision("exp_in", exp32, exp)
log_in = _in_its_precision("log_in", log32, log)


# log2 m = s * sum_k LOG2_SERIES[k] s^(2k), s = (m - 1) / (m + 1), |s| <= 0.1716: its
# first term 2 / ln 2, the rest a minimax fit of 2 atanh(s) / ln 2 to s^9, within
# 2**-39.3 absolute; 2^r = sum_k EXP2_SERIES[k] r^k, |r| <= 1/2: 1, then a minimax fit
# to r^8, within 2**-40.1 relative (both in float64 as evaluated below; fitted and
# checked by experiments/elementary_fits.py)
_LOG2_SERIES = (2.8853900817779268, 0.9617966711115719, 0.5770842757967942,
                0.41163071481999086, 0.34146842550530015)
_EXP2_SERIES = (1.0, 0.6931471805482126, 0.24022650698110623, 0.055504109352660425,
                0.009618128616121916, 0.0013333454860722247, 0.00015403825462421118,
                1.530915613491958e-05, 1.3178933785178548e-06)
_SMALLEST_NORMAL = 2.2250738585072014e-308


@helper
def log2_for_float32(z):
    """``log2 z`` of a float64 ``z >= 0`` (or NaN) to within ``2**-35`` (the module
    docstring): 0 gives -inf, inf inf, a negative number NaN. A subnormal ``z`` is taken
    as ``2**-1022``: its callers' ``z`` are float32 values and their ratios, never that
    small, and a ``max`` costs less than rescaling."""
    pattern = bits(max(z, _SMALLEST_NORMAL))
    exponent = ((pattern >> np.int64(52)) & np.int64(0x7FF)) - np.int64(1023)
    m = from_bits((pattern & np.int64(0x000FFFFFFFFFFFFF)) | np.int64(ONE_BITS))
    high = m > 1.4142135623730951
    m = m * 0.5 if high else m
    e = np.float64(exponent + (np.int64(1) if high else np.int64(0)))
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    s4 = s2 * s2
    c = _LOG2_SERIES
    series = (c[0] + c[1] * s2) + s4 * ((c[2] + c[3] * s2) + s4 * c[4])
    value = e + s * series
    value = -np.inf if z == 0.0 else value
    value = np.nan if z < 0.0 else value
    return z if (z != z) | (z == np.inf) else value


@helper
def exp2_for_float32(t):
    """``2 ** t`` of a float64 to within ``2**-35`` relative (the module docstring):
    ``t = n + r`` with ``n`` the nearest integer (``r`` exact), ``2^r`` by its polynomial,
    scaled by ``2^n`` as two powers of two. Over 1024 gives inf, under -1075 gives 0,
    NaN stays NaN."""
    bounded = min(max(t, -1100.0), 1100.0)  # NaN becomes a bound here, and NaN below
    n = (bounded + _ROUND) - _ROUND
    r = bounded - n
    r2 = r * r
    r4 = r2 * r2
    c = _EXP2_SERIES
    series = (((c[0] + c[1] * r) + r2 * (c[2] + c[3] * r))
              + r4 * (((c[4] + c[5] * r) + r2 * (c[6] + c[7] * r)) + r4 * c[8]))
    whole = np.int64(n)
    half = whole >> np.int64(1)
    value = series * _power_of_two(half) * _power_of_two(whole - half)
    return t if t != t else value
