"""Timing for the speed suites: functions timed in turn, round after round, so that a
slow spell of a shared machine falls on all of them alike, each after a settle; and the
thread counts of Numba and PyTorch for a run."""

from __future__ import annotations

import contextlib
import statistics
import time

# how long each function runs untimed before each of its timed calls (see timed_samples)
SETTLE_SECONDS = 0.02


def timed_samples(functions: dict, repeats: int, calls: int = 1,
                  settle: bool = True) -> dict[str, list[float]]:
    """Seconds per call of each of ``functions`` (name: function of no arguments), one
    sample per round. Each is called once to warm up (compilation, caches, page faults
    of the first allocation), then ``repeats`` rounds run each function ``calls`` times
    in turn, so that a slow spell of a shared machine falls on all of them alike.

    With ``settle``, each function runs untimed for :data:`SETTLE_SECONDS` (at least
    once) before its timed calls: the cost of switching from another function (caches
    holding its data, another library's threads) is then not charged to it. One untimed
    call was not enough here: after 10 ms or more of other work, or of sleep, the next
    three or four calls of AlexNet's NCHW forward took 2.2-2.5 ms against 1.4 ms, and
    the bench charged that to whichever implementation was timed."""
    for function in functions.values():
        function()
    settle = settle and len(functions) > 1
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            if settle:
                start = time.perf_counter()
                function()
                while time.perf_counter() - start < SETTLE_SECONDS:
                    function()
            start = time.perf_counter()
            for _ in range(calls):
                function()
            samples[name].append((time.perf_counter() - start) / calls)
    return samples


def median_seconds(functions: dict, repeats: int, calls: int = 1,
                   settle: bool = True) -> dict[str, float]:
    """Median seconds per call of each of ``functions``, timed by
    :func:`timed_samples`."""
    return {name: statistics.median(times)
            for name, times in timed_samples(functions, repeats, calls, settle).items()}


@contextlib.contextmanager
def thread_count(threads: int | None, torch=None):
    """Run Numba's kernels (and PyTorch's, when given) on ``threads`` threads (default:
    Numba's, all cores), restoring both after; yields the count."""
    import numba
    threads = threads or numba.config.NUMBA_NUM_THREADS
    previous = numba.get_num_threads()
    previous_torch = torch.get_num_threads() if torch is not None else None
    numba.set_num_threads(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        numba.set_num_threads(previous)
        if torch is not None:
            torch.set_num_threads(previous_torch)
