"""The memory roofline of the speed suite: the least time a pass can take on this
machine, measured, not assumed.

A pooling pass reads some bytes (``x``; or ``dy`` and the saved winners) and writes
others (``y``; or ``dx``) into a freshly allocated array, since every pass returns a
new one. Its time is at least the larger of

- the time the fastest streaming kernel we have takes to **read** that many bytes that
  are already in memory: a Numba ``prange`` sum, or a copy out of them, whichever is
  faster; and
- the time it takes to **write** that many bytes into a **fresh** array: ``np.empty``
  (NumPy asks the kernel for huge pages above 4 MiB) and a ``prange`` fill, or a copy
  into it, whichever is faster. The first write to a fresh page makes the operating
  system map and zero it: for arrays of tens of MiB and more this roughly doubles the
  cost of writing compared with a buffer written before, and a pass cannot avoid it.

Both are measured at the benchmark's thread count, on buffers of exactly the bytes of
the pass (the cache level a pass's operands live in depends on their size). The bench
times the probes (:meth:`Roofline.probes`) in the same rounds as the pass they bound,
and takes the fastest round of each (:meth:`Roofline.bound`): on a shared machine the
cost of fresh memory drifts by 2x within minutes, and a probe measured once, at another
moment, was beaten by a kernel by up to 1.5x. A copy is its own tightest bound, so the
copy reaches 100% by construction; why the simpler model of a sum and a fill of a
buffer written before is not a bound is in ``docs/performance.md``.
"""

from __future__ import annotations

import numba
import numpy as np

_ALIGN = 64  # round every size up to whole cache lines of float32


@numba.njit(parallel=True, fastmath=True, cache=True)
def _stream_sum(a):
    # fastmath lets LLVM reassociate the sum into vector partial sums: a strict
    # left-to-right float sum is bound by the add's latency, not by memory
    total = np.float32(0)
    for i in numba.prange(a.size):
        total += a[i]
    return total


@numba.njit(parallel=True, cache=True)
def _stream_fill(a, value):
    for i in numba.prange(a.size):
        a[i] = value


@numba.njit(parallel=True, cache=True)
def _stream_copy(source, target):
    for i in numba.prange(source.size):
        target[i] = source[i]


def _median(function, repeats: int) -> float:
    from .bench import median_seconds  # imported here: poolgrad.bench imports this module
    return median_seconds({"probe": function}, repeats)["probe"]


class Roofline:
    """Measures, once per size, the least seconds to read ``n`` resident bytes and to
    write ``n`` bytes into a fresh array; :meth:`seconds` bounds a pass."""

    def __init__(self, repeats: int = 7):
        self.repeats = repeats
        self._read: dict[int, float] = {}
        self._write: dict[int, float] = {}

    @staticmethod
    def _elements(nbytes: int) -> int:
        return max(1, -(-nbytes // _ALIGN) * _ALIGN // 4)

    def read_seconds(self, nbytes: int) -> float:
        n = self._elements(nbytes)
        if n not in self._read:
            source = np.ones(n, np.float32)
            target = np.empty_like(source)
            self._read[n] = min(_median(lambda: _stream_sum(source), self.repeats),
                                _median(lambda: _stream_copy(source, target), self.repeats))
        return self._read[n]

    def write_seconds(self, nbytes: int) -> float:
        n = self._elements(nbytes)
        if n not in self._write:
            source = np.ones(n, np.float32)
            fill = _median(lambda: _stream_fill(np.empty(n, np.float32), np.float32(1)),
                           self.repeats)
            copy = _median(lambda: _stream_copy(source, np.empty(n, np.float32)),
                           self.repeats)
            self._write[n] = min(fill, copy)
        return self._write[n]

    def probes(self, read_bytes: int, write_bytes: int) -> dict:
        """The four probes of a pass, functions of no arguments to be timed beside it:
        reading ``read_bytes`` of resident memory (sum, copy out) and writing
        ``write_bytes`` into a fresh array (fill, copy in)."""
        read_n, write_n = self._elements(read_bytes), self._elements(write_bytes)
        source = np.ones(read_n, np.float32)
        target = np.empty_like(source)
        written = np.ones(write_n, np.float32)
        return {"read by sum": lambda: _stream_sum(source),
                "read by copy": lambda: _stream_copy(source, target),
                "write by fill": lambda: _stream_fill(np.empty(write_n, np.float32),
                                                      np.float32(1)),
                "write by copy": lambda: _stream_copy(written, np.empty(write_n, np.float32))}

    @staticmethod
    def bound(samples: dict) -> float:
        """The least seconds of a pass from its probes' samples (name: seconds per
        round): the larger of the fastest read and the fastest write seen."""
        read = min(min(samples["read by sum"]), min(samples["read by copy"]))
        write = min(min(samples["write by fill"]), min(samples["write by copy"]))
        return max(read, write)

    def seconds(self, read_bytes: int, write_bytes: int) -> float:
        """The least time of a pass that reads ``read_bytes`` and writes ``write_bytes``
        into fresh memory: the larger of the two streaming times."""
        return max(self.read_seconds(read_bytes), self.write_seconds(write_bytes))

    def bandwidths(self, nbytes: int) -> dict:
        """GB/s of reading and of fresh writing at ``nbytes`` (for the JSON)."""
        return {"bytes": nbytes,
                "read_GBps": round(nbytes / self.read_seconds(nbytes) / 1e9, 2),
                "fresh_write_GBps": round(nbytes / self.write_seconds(nbytes) / 1e9, 2)}
