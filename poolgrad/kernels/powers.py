"""Whole and real powers, and the roots of power means, as GeM's kernels
(:mod:`.power_mean`) take them: without calls or branches, so that the loops around
them vectorize (:mod:`.elementary`'s ``exp`` and ``log`` for the others, or, where
the results are float32, its ``exp2_for_float32`` and ``log2_for_float32``, about half
the work).

``whole`` is the power's compile-time form (:func:`power_form`): a
:func:`~poolgrad.kernels.constant` of a whole ``p``, None for another ``p`` and float64
results, or :data:`FOR_FLOAT32` for another ``p`` and float32 results.

The same kernels pool Lp norms (:mod:`.sum_pool`'s general ones share their arithmetic)
when their ``eps`` is None, a compile-time choice: then ``z = |x|`` (:func:`clamped`),
the sum is not divided by the count (:func:`divisor`), and a tap's gradient is
``sign(x)`` times GeM's, 0 at ``x = 0`` (:func:`passes`, :func:`sign_of`)."""

import numpy as np
from numba import types, uint64
from numba.extending import overload

from . import JIT_OPTIONS, constant, elementary, jit
from .walk import helper, inlined

# subtracted from the bits of the estimate of mean^(-1/p) (a whole p from 3 to 8):
# 0.06 of an octave, which roughly halves its largest error (a numerical search)
_ESTIMATE_OFFSET = int(0.06 * 2**52)

MULTIPLIED_UP_TO = 8  # a whole power up to this is raised by multiplying
LN2 = 0.6931471805599453
FOR_FLOAT32 = np.empty(0, np.float32)
"""The form of a ``p`` that is not whole where the results are float32 (or float16):
their dtype as an empty array (the kernels' convention for a dtype), which compiles
the kernels with :mod:`.elementary`'s ``exp2_for_float32`` and ``log2_for_float32``."""


def power_form(p: float, dtype) -> np.ndarray | None:
    """The kernels' ``whole`` for the power ``p`` and results of ``dtype``: ``p`` as a
    :func:`~poolgrad.kernels.constant` if it is whole, 1 to :data:`MULTIPLIED_UP_TO`;
    else None for float64 results, :data:`FOR_FLOAT32` for narrower ones."""
    if float(p).is_integer() and 1 <= p <= MULTIPLIED_UP_TO:
        return constant(int(p))
    return None if np.dtype(dtype).itemsize == 8 else FOR_FLOAT32


def for_float32(whole):
    """Whether ``whole`` is :data:`FOR_FLOAT32`, a compile-time constant (compiled code
    only)."""
    raise NotImplementedError("only for Numba-compiled kernels")


def _is_for_float32(whole) -> bool:
    """Whether the Numba type ``whole`` is :data:`FOR_FLOAT32`'s (at typing time)."""
    return isinstance(whole, types.Array) and whole.dtype == types.float32


@overload(for_float32, inline="always", jit_options=JIT_OPTIONS)
def _for_float32(whole):
    answer = _is_for_float32(whole)
    return lambda whole: answer


def real_power(whole):
    """Whether ``whole`` is the form of a ``p`` that is not whole (None or
    :data:`FOR_FLOAT32`), raised by exp and log: a compile-time constant (compiled code
    only)."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(real_power, inline="always", jit_options=JIT_OPTIONS)
def _real_power(whole):
    answer = isinstance(whole, types.NoneType) or _is_for_float32(whole)
    return lambda whole: answer


def raised(base, p, whole):
    """``base ** p`` for ``base >= 0`` (or NaN): by ``whole.ndim`` multiplications when
    ``whole`` is a whole power, else by :mod:`.elementary`'s ``exp`` and ``log`` (for
    :data:`FOR_FLOAT32`, ``exp2`` and ``log2``), which give 0 for 0 and NaN for NaN."""
    raise NotImplementedError("only for Numba-compiled kernels")


# base ** k by k multiplications, for k 0 to MULTIPLIED_UP_TO, in the order of a loop
# from 1.0 (the bits of the loop they replace): no loop, so no SSA work when inlined
_PRODUCTS = tuple(inlined(product) for product in (
    lambda base: 1.0,
    lambda base: 1.0 * base,
    lambda base: 1.0 * base * base,
    lambda base: 1.0 * base * base * base,
    lambda base: 1.0 * base * base * base * base,
    lambda base: 1.0 * base * base * base * base * base,
    lambda base: 1.0 * base * base * base * base * base * base,
    lambda base: 1.0 * base * base * base * base * base * base * base,
    lambda base: 1.0 * base * base * base * base * base * base * base * base))


def _inline_where_real(expr, caller, callee):
    """Whether Numba inlines a call of :func:`raised`, :func:`raised_less_one` or
    :func:`root` (``whole`` their third argument): only where ``p`` is real and the
    arithmetic float64 (``whole`` None). Elsewhere they, and the small helpers below,
    are plain calls that LLVM inlines: inlined by Numba, each call site was typed anew,
    and GeM's and Lp's kernels compiled for up to twice as long (docs/performance.md).
    A float64 ``exp(p log(z))`` is too large for LLVM to inline through a call: its
    loops would stay scalar."""
    return isinstance(caller.typemap[expr.args[2].name], types.NoneType)


@overload(raised, inline=_inline_where_real, jit_options=JIT_OPTIONS)
def _raised(base, p, whole):
    # one implementation per form, chosen by type: an inlined function whose branches
    # were all typed made every kernel that raises compile for longer
    if isinstance(whole, types.NoneType):
        return lambda base, p, whole: elementary.exp(p * elementary.log(base))
    if _is_for_float32(whole):
        return lambda base, p, whole: elementary.exp2_for_float32(
            p * elementary.log2_for_float32(base))
    product = _PRODUCTS[whole.ndim]
    return lambda base, p, whole: product(base)


def raised_less_one(base, p, whole):
    """``base ** (p - 1)``, as :func:`raised` raises."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(raised_less_one, inline=_inline_where_real, jit_options=JIT_OPTIONS)
def _raised_less_one(base, p, whole):
    if isinstance(whole, types.NoneType):
        return lambda base, p, whole: elementary.exp((p - 1.0) * elementary.log(base))
    if _is_for_float32(whole):
        return lambda base, p, whole: elementary.exp2_for_float32(
            (p - 1.0) * elementary.log2_for_float32(base))
    product = _PRODUCTS[whole.ndim - 1]
    return lambda base, p, whole: product(base)


def raised_tap(v, p, whole, eps):
    """``clamped(v, eps) ** p``, as :func:`raised` raises: a tap's term of a window's
    sum. For Lp (``eps`` None) and an even whole ``p``, ``v ** p`` itself, which has
    the same bits (the products' roundings do not depend on the signs). LLVM moved
    the ``|v|`` of a float32 tap before its conversion to float64, and the loop
    then shuffled halves of vectors."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(raised_tap, inline=_inline_where_real, jit_options=JIT_OPTIONS)
def _raised_tap(v, p, whole, eps):
    even = isinstance(whole, types.Array) and not _is_for_float32(whole) and whole.ndim % 2 == 0
    if isinstance(eps, types.NoneType) and even:
        return lambda v, p, whole, eps: raised(v, p, whole)
    return lambda v, p, whole, eps: raised(clamped(v, eps), p, whole)


@inlined
def natural_log(v, whole):
    """``log v`` for ``dp``'s terms, in the precision :func:`raised` takes for ``whole``
    (for :data:`FOR_FLOAT32`, from the ``log2`` that raising ``v`` takes too)."""
    if for_float32(whole):
        return elementary.log2_for_float32(v) * LN2
    return elementary.log(v)


# a sum below this may have lost terms to underflow: it is summed again relative to its
# largest term
TINY = 2.0 ** -960


@helper
def clamped(v, eps):
    """GeM's ``max(v, eps)`` (NaN kept), or with ``eps`` None Lp's ``|v|``."""
    if eps is None:
        return abs(v)
    return eps if v < eps else v


@helper
def divisor(count, eps):
    """What a window's sum of ``z^p`` is divided by: its count (GeM's mean), or 1 (Lp)."""
    if eps is None:
        return 1.0
    return np.float64(count)


@helper
def passes(v, eps):
    """Whether a tap passes a gradient: above GeM's clamp (not NaN), or, for Lp, not 0."""
    if eps is None:
        return v != 0
    return v >= eps


@helper
def sign_of(v, eps):
    """The factor ``dz/dx`` adds to a passing tap's gradient: Lp's sign of ``v``."""
    if eps is None:
        return 1.0 if v > 0 else -1.0
    return 1.0


@helper
def in_range(total):
    """Whether an unscaled sum is exact enough to use (NaN passes: it is the answer)."""
    return not (total < TINY or total == np.inf)


def may_leave_range(taps, whole, eps):
    """Whether a window's sum may fail :func:`in_range` in a way whose redo (relative
    to the largest tap) changes the result: a compile-time constant, False for Lp
    (``eps`` None) of float32 ``taps`` (an array) and a whole ``p`` of 1 or 2. There
    a term ``|x|^p`` of a nonzero tap is at least ``2^-298`` and at most
    ``2^256``, so a sum leaves the range only when every tap is 0 (the root of the
    sum, 0, is the redo's) or one is infinite (the root is +inf, as the redo's), and
    the loop that sums need not count them."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(may_leave_range, inline="always", jit_options=JIT_OPTIONS)
def _may_leave_range(taps, whole, eps):
    narrow = isinstance(taps, types.Array) and taps.dtype in (types.float32, types.float16)
    low_power = (isinstance(whole, types.Array) and not _is_for_float32(whole)
                 and whole.ndim in (1, 2))
    answer = not (narrow and low_power and isinstance(eps, types.NoneType))
    return lambda taps, whole, eps: answer


# the scale of a sum taken as it is (:func:`scaled`)
UNSCALED = (1.0, 1.0)
# below this, 1 / largest may overflow: the taps are lifted by 2^600 first (exactly)
_LIFT_BELOW, _LIFT = 2.0 ** -600, 2.0 ** 600


@helper
def relative_scale(largest):
    """The scale of a sum taken relative to ``largest``, for :func:`scaled`:
    ``(1, 1 / largest)``, or where ``largest`` is below ``2^-600``, ``(2^600, 1 /
    (largest 2^600))``. ``1 / largest`` overflows below about ``5.6e-309`` (float64
    subnormals), and the sum of a window of them was inf or NaN; lifting by a power
    of two is exact, and elsewhere it leaves the bits as they were."""
    up = _LIFT if largest < _LIFT_BELOW else 1.0
    return up, 1.0 / (largest * up)


def lifts(y):
    """Whether a backward takes ``r = z / y`` lifted (:func:`relative_scale`) for the
    power mean ``y`` (in its own dtype): a positive ``y`` below ``2^-600``, for which
    ``1 / y`` may overflow (every ``r`` was then inf or NaN). Never for a float32 or
    float16 ``y`` (at least ``2^-149``): a compile-time False, so that their kernels
    keep none of it. The vectorized backwards multiply by ``1 / y`` and redo such
    windows after (:func:`rows_relifted`, :func:`plane_relifted`), as a second factor
    per tap cost them up to a third of their time (compiled code only)."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(lifts, inline="always", jit_options=JIT_OPTIONS)
def _lifts(y):
    if isinstance(y, types.Float) and y.bitwidth < 64:
        return lambda y: False
    return lambda y: (y > 0.0) & (y < _LIFT_BELOW)  # no branch: the loops vectorize


@helper
def scaled(z, scale):
    """``z`` relative to a window's largest term: ``z * up * inverse`` for ``scale``
    :func:`relative_scale`'s ``(up, inverse)`` (or :data:`UNSCALED`)."""
    up, inverse = scale
    return (z * up) * inverse


@inlined
def relative_mean(largest, total, count, p, whole, precise):
    """The power mean of a sum taken relative to its ``largest`` term: an infinite one
    makes the mean infinite (relative to it, the sum is NaN), and all zeros (Lp's) 0."""
    if largest == np.inf or largest == 0:
        return largest
    return largest * root(total / count, p, whole, precise)


def root(mean, p, whole, precise):
    """``mean ** (1/p)`` for a normal ``mean > 0`` (or NaN): exact for ``p`` 1,
    ``sqrt`` for 2. For another whole ``p``, Newton steps towards ``mean^(-1/p)`` from
    an estimate read off the bits (within 3.5%; each step takes the error ``e`` to about
    ``(p + 1) e^2 / 2``), without a division: three for a float32 result and ``p`` 3 or
    4 (an error below ``2e-9``, so the result is within 0.53 units in the last place:
    the fourth step cost a channels-last 2x2 forward 0.3 ms of its 2.45), else four
    (near ``1e-15``); with ``precise`` (a float64 result) one Newton step on ``y^p =
    mean`` after them, which leaves only that step's rounding. Any other ``p`` by
    ``exp(log(mean) / p)`` (for :data:`FOR_FLOAT32`, ``exp2(log2(mean) / p)``)."""
    raise NotImplementedError("only for Numba-compiled kernels")


@overload(root, inline=_inline_where_real, jit_options=JIT_OPTIONS)
def _root(mean, p, whole, precise):
    # one implementation per form, chosen by type, as raised's
    if isinstance(whole, types.NoneType):
        return lambda mean, p, whole, precise: elementary.exp(
            elementary.log(mean) * (1.0 / p))
    if _is_for_float32(whole):
        return lambda mean, p, whole, precise: elementary.exp2_for_float32(
            elementary.log2_for_float32(mean) * (1.0 / p))
    if whole.ndim == 1:
        return lambda mean, p, whole, precise: mean
    if whole.ndim == 2:
        return lambda mean, p, whole, precise: np.sqrt(mean)
    return _newton_root


def _newton_root(mean, p, whole, precise):
    """:func:`root` for a whole ``p`` from 3."""
    one = np.int64(elementary.ONE_BITS)
    # the exponent's share of the root, from the bits (a float product: an integer
    # division keeps the loop scalar)
    inverse = elementary.from_bits(
        one - np.int64(np.float64(elementary.bits(mean) - one) * (1.0 / whole.ndim))
        - _ESTIMATE_OFFSET)
    for _ in range(3):
        inverse += inverse * ((1.0 - mean * raised(inverse, p, whole)) * (1.0 / p))
    if precise or whole.ndim > 4:  # both compile-time constants
        inverse += inverse * ((1.0 - mean * raised(inverse, p, whole)) * (1.0 / p))
    result = mean * raised_less_one(inverse, p, whole)
    if not precise:
        return result
    return result - (result - mean / raised_less_one(result, p, whole)) * (1.0 / p)


# ------------------------------------------------------------------- GeM's dp


@helper
def p_term(dy, y, p, s0, s1):
    """A window's term of GeM's ``dp``: ``dy (y / p) S1 / S0`` (:mod:`.power_mean`)."""
    return dy * (y / p) * (s1 / s0)


@inlined
def add_terms(r, share, whole, s0, s1, at):
    """A tap's share of ``S0`` and ``S1``, ``r^p`` and ``r^p log r``, added at ``at``:
    ``r^p`` as ``share r`` from the tap's ``share = r^(p-1)`` (:func:`raised_less_one`),
    which its gradient takes too. For a whole ``p`` that is ``r^p``'s product with its
    bits; for another, one exp fewer per tap (a second one cost a channels-last 2x2
    backward with ``dp`` a fifth of its time)."""
    power = share * r
    s0[at] += power
    s1[at] += power * natural_log(r, whole)


@inlined
def tap_dx(v, eps, scale, share):
    """A window tap's ``dx`` from ``dy / count`` and ``r^(p-1)``; 0 under the clamp."""
    return (0.0 + scale * share) * sign_of(v, eps) if passes(v, eps) else 0.0


@inlined
def write_terms(means, grads, p, s0, s1, out):
    """Each window's term of ``dp`` from its ``S0`` and ``S1``, which start again at 0."""
    for o in range(out.shape[0]):
        out[o] = p_term(np.float64(grads[o]), np.float64(means[o]), p, s0[o], s1[o])
        s0[o], s1[o] = 0.0, 0.0


# ------------------------------------------------------------------- rows


@inlined
def raised_row(src, eps, p, whole, powered):
    """``powered[i] = max(src[i], eps)^p`` along a contiguous row, in float64 (the rows
    kernels of :mod:`.power_mean` and the NCHW rows of :mod:`.power_quads`): a loop that vectorizes
    fully."""
    for i in range(src.shape[0]):
        at = uint64(i)
        powered[at] = raised_tap(np.float64(src[at]), p, whole, eps)


@inlined
def _row_tap(od, oh, ow, a, b, t, steps, inner, c):
    """``(d, h, w)``: where tap ``(a, b, t)`` of the window ``ow`` (channel ``c``) of
    the row ``(od, oh)`` lies in a plane of the rows kernels' layout."""
    return od * steps[0] + a, oh * steps[1] + b, (ow * steps[2] + t) * inner + c


@jit()  # a call: the rare path, kept out of the kernels that inline the common one
def rows_rescaled(x, plane, c, inner, od, oh, ow, window, steps, count, eps, p, whole,
                  precise):
    """The power mean of the window ``ow`` (channel ``c``) of a row, as the rows
    kernels lay it out, summed relative to its largest ``z``: for a sum that left the
    range (the rows kernels of :mod:`.power_mean` and :mod:`.power_quads`)."""
    largest = 0.0
    for a in range(window[0]):
        for b in range(window[1]):
            for t in range(window[2]):
                d, h, w = _row_tap(od, oh, ow, a, b, t, steps, inner, c)
                z = clamped(np.float64(x[plane, d, h, w]), eps)
                largest = z if z > largest else largest
    scale, total = relative_scale(largest), 0.0
    for a in range(window[0]):
        for b in range(window[1]):
            for t in range(window[2]):
                d, h, w = _row_tap(od, oh, ow, a, b, t, steps, inner, c)
                total += raised(scaled(clamped(np.float64(x[plane, d, h, w]), eps), scale),
                                p, whole)
    return relative_mean(largest, total, divisor(count, eps), p, whole, precise)


@inlined
def _lifted_tap(v, eps, relative, scale, p, whole):
    """A tap's ``dx`` and its terms of ``S0`` and ``S1`` (:func:`add_terms`'), ``r``
    lifted by ``relative`` (:func:`relative_scale`)."""
    r = scaled(clamped(v, eps), relative)
    share = raised_less_one(r, p, whole)
    power = share * r
    return tap_dx(v, eps, scale, share), power, power * natural_log(r, whole)


@jit()  # the rare path, as rows_rescaled
def rows_relifted(x, dx, plane, c, inner, od, oh, ow, window, steps, mean, grad, count,
                  eps, p, whole):
    """The backward of the window ``ow`` (channel ``c``) of a row, laid out as for
    :func:`rows_rescaled`, whose ``y`` (``mean``) :func:`lifts`: each tap's ``dx``, into
    ``dx`` unless it is None, with ``r`` lifted as :func:`relative_scale` lifts it, and
    the window's ``(S0, S1)`` (:func:`add_terms`' sums), taps in the rows kernels'
    order."""
    relative, scale = relative_scale(mean), grad / divisor(count, eps)
    s0, s1 = 0.0, 0.0
    for a in range(window[0]):
        for b in range(window[1]):
            for t in range(window[2]):
                d, h, w = _row_tap(od, oh, ow, a, b, t, steps, inner, c)
                dx_tap, power, term = _lifted_tap(np.float64(x[plane, d, h, w]), eps,
                                                  relative, scale, p, whole)
                s0 += power
                s1 += term
                if dx is not None:
                    dx[plane, d, h, w] = dx_tap
    return s0, s1


@jit()  # the rare path, as rows_rescaled
def plane_relifted(row, dx, grad, mean, eps, p, whole, with_dp):
    """The backward of GeM over a whole plane (1-d views of any strides) whose ``y``
    (``mean``) :func:`lifts`: ``dx`` with ``r`` lifted as :func:`relative_scale` lifts
    it, and, with ``with_dp``, the plane's term of ``dp`` (0 without), its sums taken in
    order."""
    relative, scale = relative_scale(mean), grad / row.shape[0]
    s0, s1 = 0.0, 0.0
    for i in range(row.shape[0]):
        dx[i], power, term = _lifted_tap(np.float64(row[i]), eps, relative, scale, p, whole)
        s0 += power
        s1 += term
    return p_term(grad, mean, p, s0, s1) if with_dp else 0.0
