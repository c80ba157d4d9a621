"""The memory roofline of the speed suite: the least time a pass can take on this
machine, measured, not assumed.

A pooling pass reads some bytes (``x``; or ``dy`` and the saved winners) and writes
others (``y``; or ``dx``). Its time is at least the larger of

- the time the fastest streaming kernel we have takes to **read** that many bytes that
  are already in memory: a Numba ``prange`` sum, or a copy out of them, whichever is
  faster; and
- the time it takes to **write** that many bytes into memory written before: a
  ``prange`` fill, a copy into it, or zeroing it (memset, on each thread's share),
  whichever is faster. Zeroing wins: its stores do not read the lines they
  overwrite, as a kernel's non-temporal stores into memory written before do (into
  fresh pages they measured 2x slower than plain stores), and compiled PyTorch's
  global-average backward wrote its 25.7 MB faster than the fill (0.66-0.81 ms against
  0.79-1.0 ms in the same runs).

Both are measured at the benchmark's thread count, on buffers of exactly the bytes of
the pass (the cache level a pass's operands live in depends on their size). The bench
times these probes (:meth:`Roofline.probes`) in the same rounds as the pass they bound
and takes the fastest round of each (:meth:`Roofline.bound`), so that a slow spell of
a shared machine does not lower the bound. A copy is its own tightest bound, so the
copy reaches 100% by construction.

Every pass returns a new array, and the first write to a fresh page makes the
operating system map and zero it: above glibc's 32 MiB mmap threshold that cost
1.6-4.4x the write into memory written before, here. An earlier model charged it to the
bound (a fill of a fresh ``np.empty``), but its cost drifts with the state of the
machine, and passes beat that bound by up to 1.5x even when it was timed beside them:
it was not a bound. So the bound leaves it out, the fraction of a pass that writes a
large fresh array cannot reach 100%, and :meth:`Roofline.bandwidths` reports the fresh
write's bandwidth beside the others, for the table's header. ``docs/performance.md``
has the figures.
"""

from __future__ import annotations

import numba
import numpy as np

from ..kernels import jit
from .timing import timed_samples

_ALIGN = 64  # round every size up to whole cache lines of float32
READ_PROBES = ("read by sum", "read by copy")
WRITE_PROBES = ("write by fill", "write by copy", "write by zeroing")


@jit(parallel=True, fastmath=True)
def _stream_sum(a):
    # fastmath lets LLVM reassociate the sum into vector partial sums: a strict
    # left-to-right float sum is bound by the add's latency, not by memory
    total = np.float32(0)
    for i in numba.prange(a.size):
        total += a[i]
    return total


@jit(parallel=True)
def _stream_fill(a, value):
    for i in numba.prange(a.size):
        a[i] = value


@jit(parallel=True)
def _stream_zero(a):
    # a constant zero: LLVM turns each thread's share into a call of memset, whose
    # stores skip reading the lines they overwrite, 2-3x faster than the fill's
    for i in numba.prange(a.size):
        a[i] = 0


@jit(parallel=True)
def _stream_copy(source, target):
    for i in numba.prange(source.size):
        target[i] = source[i]


class Roofline:
    """The probes that bound a pass (:meth:`probes`, :meth:`bound`), and the
    bandwidths of the run's header (:meth:`bandwidths`); ``repeats``: the rounds of
    probes timed on their own."""

    def __init__(self, repeats: int = 7):
        self.repeats = repeats

    @staticmethod
    def _elements(nbytes: int) -> int:
        return max(1, -(-nbytes // _ALIGN) * _ALIGN // 4)

    def probes(self, read_bytes: int, write_bytes: int) -> dict:
        """The five probes of a pass, functions of no arguments to be timed beside it:
        reading ``read_bytes`` of resident memory (sum, copy out) and writing
        ``write_bytes`` into memory written before (fill, copy in, zeroing)."""
        read_n, write_n = self._elements(read_bytes), self._elements(write_bytes)
        source = np.ones(read_n, np.float32)
        target = np.ones_like(source)
        written = np.ones(write_n, np.float32)
        destination = np.ones_like(written)
        return {"read by sum": lambda: _stream_sum(source),
                "read by copy": lambda: _stream_copy(source, target),
                "write by fill": lambda: _stream_fill(destination, np.float32(1)),
                "write by copy": lambda: _stream_copy(written, destination),
                "write by zeroing": lambda: _stream_zero(destination)}

    @staticmethod
    def _fastest(samples: dict) -> tuple[float, float]:
        """The fastest read and the fastest write among the probes' samples (name:
        seconds per round)."""
        return (min(min(samples[name]) for name in READ_PROBES),
                min(min(samples[name]) for name in WRITE_PROBES))

    @staticmethod
    def bound(samples: dict) -> float:
        """The least seconds of a pass from its probes' samples: the larger of the
        fastest read and the fastest write seen."""
        return max(Roofline._fastest(samples))

    def seconds(self, read_bytes: int, write_bytes: int) -> float:
        """The bound of a pass from probes timed on their own (``repeats`` rounds)."""
        probes = self.probes(read_bytes, write_bytes)
        return self.bound(timed_samples(probes, self.repeats))

    def _fresh_write_seconds(self, nbytes: int) -> float:
        n = self._elements(nbytes)
        source = np.ones(n, np.float32)
        fill = timed_samples({"fill": lambda: _stream_fill(np.empty(n, np.float32),
                                                      np.float32(1)),
                         "copy": lambda: _stream_copy(source, np.empty(n, np.float32))},
                        self.repeats)
        return min(min(fill["fill"]), min(fill["copy"]))

    def bandwidths(self, nbytes: int) -> dict:
        """GB/s of reading, of writing memory written before and of writing a fresh
        array, at ``nbytes`` (for the JSON and the table's header), as measured: the
        header rounds them."""
        probes = self.probes(nbytes, nbytes)
        read, write = self._fastest(timed_samples(probes, self.repeats))
        return {"bytes": nbytes, "read_GBps": nbytes / read / 1e9,
                "write_GBps": nbytes / write / 1e9,
                "fresh_write_GBps": nbytes / self._fresh_write_seconds(nbytes) / 1e9}
