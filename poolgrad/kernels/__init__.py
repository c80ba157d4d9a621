"""Private Numba kernels. They take only arrays and numbers, never Python objects.

Every kernel works on 5-d arrays ``(N, C, D, H, W)``: 1-d and 2-d inputs arrive
with leading spatial axes of size 1 (see :mod:`poolgrad.geometry`). Window
geometry comes as the int64 tables of a :class:`~poolgrad.geometry.WindowPlan`.

Parallel loops own whole output rows (forward) or whole input rows (backward,
which gathers through the plan's cover tables), so there are no races and no
atomics, and every sum has a fixed order: the same bits at any thread count.
"""

import functools

import numba
import numpy as np

# Set in one place. Never "nnan"/"ninf": max pooling must see and propagate NaN and
# -inf. No "reassoc" (sums keep their order) and no "contract" (no fused multiply-add,
# whose use would depend on the CPU): results are the same on every x86-64 machine
# except where libm's pow differs (Lp pooling with p other than 1 or 2).
# Numba's disk cache is keyed on each kernel file's timestamp, not on these flags or
# JIT_OPTIONS: after changing them, delete the caches (__pycache__/*.nbi, *.nbc) so
# every kernel recompiles.
FASTMATH = frozenset({"nsz"})

# How every kernel and helper compiles: cached on disk next to the package, without the
# GIL, and with NumPy's error model, under which a float division is just a division.
# Python's model tests every divisor for zero and raises: a branch that keeps a loop
# scalar. No kernel divides by zero (divisors are window sizes or overrides >= 1).
JIT_OPTIONS = {"cache": True, "nogil": True, "fastmath": set(FASTMATH),
               "error_model": "numpy"}

# Below this many elements in its largest array, a kernel runs on the calling thread
# alone. Waking the thread pool costs more than it saves on small arrays, and in a
# training loop BLAS's threads are still spinning from the last matrix product: both
# pools then fight over the cores and a 100 us pooling call takes milliseconds.
SERIAL_BELOW = 2**18


def parallel_kernel(fn):
    """Compile ``fn`` with ``parallel=True`` (once per signature, cached on disk next to
    the package); calls on small arrays run it on one thread."""
    compiled = numba.njit(parallel=True, **JIT_OPTIONS)(fn)

    @functools.wraps(fn)
    def call(*args):
        work = max(a.size for a in args if isinstance(a, np.ndarray))
        if work >= SERIAL_BELOW:
            return compiled(*args)
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            return compiled(*args)
        finally:
            numba.set_num_threads(threads)

    call.compiled = compiled
    return call


@numba.njit(inline="always", **JIT_OPTIONS)
def beats(v, best):
    """Whether a later tap ``v`` replaces the running maximum ``best`` under the exact
    rule: it is larger, or it is the first NaN (once ``best`` is NaN nothing replaces
    it). Bitwise & and |, never the short-circuit and/or, whose branch would keep a
    loop scalar and mispredict on random data."""
    return (best == best) & ((v > best) | (v != v))
