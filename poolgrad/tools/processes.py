"""Cores, threads and spawned processes, for the tools that train with PyTorch
(``poolgrad train --engine torch``, ``poolgrad study``): how many cores this process
may use, Numba's and PyTorch's thread counts for a block, and the environment that
spawned processes running Numba kernels start with."""

from __future__ import annotations

import contextlib
import os

# Numba's threading layer in spawned processes (the ranks of a data-parallel run, the
# study's workers). Without TBB, Numba would pick OpenMP: a second OpenMP runtime (the
# system's libgomp) beside the one PyTorch ships, two thread pools fighting over each
# process's share of the cores. "workqueue" is Numba's own pool; spawned processes start
# as fresh interpreters, so none inherits a pool's state from the parent; and its one
# limit, no parallel kernels launched from two threads at once, holds: each process
# calls the kernels from its main thread (autograd runs CPU backward passes on the
# calling thread; gloo's threads only move gradients).
SPAWNED_THREADING_LAYER = "workqueue"


def cores() -> int:
    """The cores this process may run on (its affinity where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@contextlib.contextmanager
def threads(count: int):
    """Numba and PyTorch each use ``count`` threads inside the block (Numba at most its
    ``NUMBA_NUM_THREADS``); both counts are restored after it. Needs PyTorch."""
    import numba
    import torch
    previous = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(count)
    try:
        yield
    finally:
        numba.set_num_threads(previous[0])
        torch.set_num_threads(previous[1])


@contextlib.contextmanager
def spawning():
    """``os.environ`` for spawning processes inside the block (they inherit it): a Numba
    threading layer the user chose stays; otherwise :data:`SPAWNED_THREADING_LAYER`."""
    layer = os.environ.get("NUMBA_THREADING_LAYER") or SPAWNED_THREADING_LAYER
    with _environment(NUMBA_THREADING_LAYER=layer):
        yield


@contextlib.contextmanager
def _environment(**values):
    """``os.environ`` with ``values`` inside the block."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
