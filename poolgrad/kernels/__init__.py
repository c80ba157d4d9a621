"""Private Numba kernels. They take only arrays and numbers, never Python objects.

Every kernel works on 5-d arrays ``(N, C, D, H, W)``: 1-d and 2-d inputs arrive
with leading spatial axes of size 1 (see :mod:`poolgrad.geometry`). Window
geometry comes as the int64 tables of a :class:`~poolgrad.geometry.WindowPlan`.

Parallel loops own whole output rows (forward) or whole input rows (backward,
which gathers through the plan's cover tables), so there are no races and no
atomics, and every sum has a fixed order: the same bits at any thread count.
"""

import numba

# Set in one place. Never "nnan"/"ninf": max pooling must see and propagate NaN and
# -inf. No "reassoc" (sums keep their order) and no "contract" (no fused multiply-add,
# whose use would depend on the CPU): results are the same on every x86-64 machine
# except where libm's pow differs (Lp pooling with p other than 1 or 2).
# Numba's disk cache is keyed on each kernel file's timestamp, not on these flags: after
# changing them, delete the caches (__pycache__/*.nbi, *.nbc) so every kernel recompiles.
FASTMATH = frozenset({"nsz"})

# Compiled once per signature and cached on disk next to the package.
parallel_kernel = numba.njit(parallel=True, cache=True, nogil=True, fastmath=set(FASTMATH))
