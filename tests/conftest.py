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
