"""Test-session setup shared by every test module."""

import os


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


# The longest files first (seconds in a cold run on 2 cores, 2026-11-24): pytest-xdist
# hands whole files to its workers in collection order, so a long file collected last
# would leave one worker running it alone at the end.
_LONGEST_FIRST = ("test_torch_ops.py", "test_triton.py", "test_study.py", "test_bad_input.py",
                  "test_explain.py", "test_kernel_paths.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)
    items.sort(key=rank)  # stable: each file keeps its own order
