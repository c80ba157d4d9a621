"""Test-session setup shared by every test module."""

import os

# pytest-xdist runs one worker per core: each worker gets its own share of the cores
# (on 2 cores, one each), and the tools size their thread pools from it
# (processes.cores() reads the affinity). Otherwise each worker's training and studies
# would wake a PyTorch and a Numba thread per core, and the two workers would spend
# their time waiting on each other's spinning threads (the quick study: 7.6 s alone,
# 49 s beside another worker). Numba's pool keeps the size of all the cores
# (NUMBA_NUM_THREADS, which Numba would otherwise take from the pinned affinity), so
# the tests about thread counts still run the threads they ask for.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKERS > 1 and _WORKER.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _allowed = sorted(os.sched_getaffinity(0))
    if len(_allowed) >= _WORKERS:
        _share = _allowed[int(_WORKER[2:]) % _WORKERS::_WORKERS]
        os.environ.setdefault("NUMBA_NUM_THREADS", str(len(_allowed)))
        os.sched_setaffinity(0, _share)
        os.environ.setdefault("OMP_NUM_THREADS", str(len(_share)))  # read by PyTorch's import
        import numba
        numba.set_num_threads(min(len(_share), numba.config.NUMBA_NUM_THREADS))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Without a GPU, the Triton kernels run under Triton's interpreter on CPU tensors
# (tests/test_triton.py). The variable must be set before Triton is first imported.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The longest files first, by their seconds in a cold run on 2 cores (2026-12-02, a
# fresh clone at 1ce0bf2, compiles included: torch ops 138, kernel paths 137, Triton
# 130, torch kinds 92, torch train 47, explain 38, bad input 34, torch parity 29, study
# 27, train 24, kinds 18, channels-last 15, bench 15, explain network 13): pytest-xdist
# hands whole files to its workers in collection order, so a long file collected last
# would leave one worker running it alone at the end.
_LONGEST_FIRST = ("test_torch_ops.py", "test_kernel_paths.py", "test_triton.py",
                  "test_torch_kinds.py", "test_train_torch.py", "test_explain.py",
                  "test_bad_input.py", "test_torch_parity.py", "test_study.py",
                  "test_train.py", "test_kinds.py", "test_channels_last.py",
                  "test_bench.py", "test_explain_network.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)
    items.sort(key=rank)  # stable: each file keeps its own order
