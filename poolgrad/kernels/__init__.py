"""Private Numba kernels. They take only arrays and numbers, never Python objects.

Every kernel works on 5-d arrays ``(N, C, D, H, W)``: 1-d and 2-d inputs arrive
with leading spatial axes of size 1 (see :mod:`poolgrad.geometry`). Window
geometry comes as the int64 tables of a :class:`~poolgrad.geometry.WindowPlan`.

Parallel loops own whole output rows (forward) or whole input rows (backward,
which gathers through the plan's cover tables), so there are no races and no
atomics, and every sum has a fixed order: the same bits at any thread count.

Which kernel serves a call is decided in one place, :mod:`.dispatch`. The families:
:mod:`.max_pool` and :mod:`.sum_pool` (the general kernels: any geometry, dtype and
layout), :mod:`.row_passes`, :mod:`.blocks`, :mod:`.tiled` and :mod:`.gather_rows` (NCHW
fast paths; their shared walking code in :mod:`.walk`, their vector blocks in
:mod:`.simd`), :mod:`.channels_last` and :mod:`.unpool`.

Contracts every kernel keeps, whatever its path (the fast kernels are tested against
the general ones, bit for bit):

* **Max**: the winner of a window is its first maximum in row-major window order (a
  later tap wins only if strictly larger), or its first NaN (:func:`beats`); padding
  never wins. A vector pass that cannot order NaNs reports them, and the kernel redoes
  that row window by window.
* **Sums** (average, Lp, gathered gradients) add their terms in row-major window
  order, or, in a gather, in increasing output order. A sum that starts from its first
  term adds a ``plus_zero`` before dividing, so a window of -0s gives +0, the result
  of a sum that starts from 0.
* **Max gradients** are ``0 + dy`` at the winner: a -0 arrives as +0, a signalling
  NaN quieted, exactly as the general gather gives them.

Arguments that are not plain arrays and numbers follow two conventions:

* A **compile-time constant** travels in the *type* of an argument, so that Numba
  compiles the kernel once per value and the loops that depend on it have no branch:
  a small int ``k`` as :func:`constant` (an empty array with ``k`` dims; the kernel
  reads ``arg.ndim``), a dtype as an empty array of that dtype (``tap_like``), and an
  optional output as ``None`` (typed ``none``: its code is compiled out).
* A **runtime value the compiler must not fold** (the +0 that turns a sum's -0 into
  +0, the bit masks of a float type) travels in a small array (``plus_zero``,
  ``float_bits``): fast-math may ignore the sign of a literal zero, not of a load.
"""

import functools

import numba
import numpy as np

from . import compile_speed
from .disk_cache import ProcessSafeCache

compile_speed.install()  # before any kernel compiles

# Set in one place. Never "nnan"/"ninf": max pooling must see and propagate NaN and
# -inf. No "reassoc" (sums keep their order) and no "contract" (no fused multiply-add,
# whose use would depend on the CPU): results are the same on every x86-64 machine
# (real powers and roots are :mod:`.elementary`'s own exp and log, not libm's pow).
# Numba's disk cache is keyed on each kernel file's timestamp, not on these flags or
# JIT_OPTIONS: after changing them, delete the caches (__pycache__/*.nbi, *.nbc) so
# every kernel recompiles.
FASTMATH = frozenset({"nsz"})

# How every kernel and helper compiles: without the GIL, and with NumPy's error model,
# under which a float division is just a division. Python's model tests every divisor
# for zero and raises: a branch that keeps a loop scalar. No kernel divides by zero
# (divisors are window sizes or overrides >= 1). :func:`jit` adds the disk cache.
JIT_OPTIONS = {"nogil": True, "fastmath": set(FASTMATH), "error_model": "numpy"}

# Below this many elements in its largest array, a kernel runs its serial build on the
# calling thread alone (:func:`parallel_kernel`). Waking the thread pool costs more than
# it saves on small arrays, and in a training loop BLAS's threads are still spinning from
# the last matrix product: both pools then fight over the cores and a short pooling call
# takes many times as long.
SERIAL_BELOW = 2**18


def jit(*, cache: bool = True, variant: str = "", **options):
    """A decorator that compiles with :data:`JIT_OPTIONS` (``options`` added or
    overriding), once per signature, cached on disk next to the package (unless
    ``cache=False``) by a cache that processes compiling at the same time share safely
    (:mod:`.disk_cache`). ``variant`` names the cache files of a second build of one
    function (Numba's cache keys do not tell builds with other options apart)."""
    def compile_cached(fn):
        dispatcher = numba.njit(**{**JIT_OPTIONS, **options})(fn)
        if cache:  # what numba.njit(cache=True) does, with the process-safe cache
            dispatcher._cache = ProcessSafeCache(dispatcher.py_func, variant)
        return dispatcher
    return compile_cached


class _AnyLayout:
    """Calls a dispatcher through one signature per argument types, every array in it
    typed as any layout ("A") and writeable, whatever its layout and write flag.

    Numba compiles a kernel anew for each layout (C or strided) and each write flag of
    its arrays: a kernel that takes NCHW arrays and channels-last views, read-only
    inputs and writeable ones compiled up to four times what one signature serves. For
    a kernel whose loops are scalar, a compile for C-contiguous arrays gains nothing
    (each kernel given ``any_layout`` was timed both ways on C-contiguous arrays). An
    array in another byte order goes to the dispatcher as it is. A read-only array is
    typed writeable: a kernel never writes its inputs (the contract of every kernel;
    tests/test_bad_input.py checks it)."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        self.entries = {}

    def __call__(self, *args):
        key = []
        for a in args:
            if type(a) is np.ndarray:
                if not a.dtype.isnative:
                    return self.dispatcher(*args)
                key.append((a.dtype, a.ndim))
            elif a is None or type(a) in (int, float, bool):
                key.append(type(a))
            else:
                key.append(numba.typeof(a))
        key = tuple(key)
        entry = self.entries.get(key)
        if entry is None:
            signature = tuple(numba.types.Array(numba.from_dtype(a.dtype), a.ndim, "A")
                              if type(a) is np.ndarray else numba.typeof(a) for a in args)
            entry = self.entries[key] = self.dispatcher.compile(signature)
        return entry(*args)


def parallel_kernel(fn=None, *, any_layout: bool = False):
    """Compile ``fn`` twice: with ``parallel=True`` (see :func:`jit`) for calls on large
    arrays, and without (``prange`` then runs as ``range``) for calls whose arrays all
    have fewer than :data:`SERIAL_BELOW` elements. Each build compiles on its first call,
    so a program that only pools small arrays (tests, explanations, small models) never
    pays for the parallel one, which takes two to three times as long to compile, and
    its calls skip the thread pool. The builds give the same bits: every kernel's
    parallel loop owns its outputs and sums in a fixed order (the module docstring).
    ``any_layout``: one compile for arrays of every layout and write flag
    (:class:`_AnyLayout`), for kernels that read by strides anyway, where a
    C-contiguous array gains nothing from a compile of its own (measured per kernel)."""
    if fn is None:
        return functools.partial(parallel_kernel, any_layout=any_layout)
    compiled = jit(parallel=True)(fn)
    serial = jit(variant="serial")(fn)
    run, run_serial = ((_AnyLayout(compiled), _AnyLayout(serial)) if any_layout
                       else (compiled, serial))

    @functools.wraps(fn)
    def call(*args):
        for a in args:  # (a loop: a generator's frames cost more than small calls)
            if type(a) is np.ndarray and a.size >= SERIAL_BELOW:
                return run(*args)
        return run_serial(*args)

    call.compiled, call.serial = compiled, serial
    return call


# Compile-time constants are for the few values a kernel is specialised for; anything
# larger is a runtime argument (and an array has at most 64 dims).
_MAX_CONSTANT = 8


def constant(value: int) -> np.ndarray:
    """``value`` (1 to 8) as a compile-time constant: an empty uint8 array with ``value``
    dims, whose type, and so the kernel compiled for it, differs for each value. The
    kernel reads it as ``arg.ndim``."""
    if not 1 <= value <= _MAX_CONSTANT:
        raise ValueError(f"a compile-time constant is 1 to {_MAX_CONSTANT}, got {value}: "
                         f"pass it as a runtime argument")
    return np.empty((0,) * value, np.uint8)


@jit(inline="always")
def beats(v, best):
    """Whether a later tap ``v`` replaces the running maximum ``best`` under the exact
    rule: it is larger, or it is the first NaN (once ``best`` is NaN nothing replaces
    it). Bitwise & and |, never the short-circuit and/or, whose branch would keep a
    loop scalar and mispredict on random data."""
    return (best == best) & ((v > best) | (v != v))


@jit(inline="always")
def larger(v, best):
    """``v`` if it is larger than ``best``, else ``best``: a tie or a NaN keeps
    ``best``. The first maximum where no tap is a NaN (or the first is): half of
    :func:`beats`' rule, for folds that find a NaN another way or need none."""
    return v if v > best else best
