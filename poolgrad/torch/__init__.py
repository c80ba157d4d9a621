"""poolgrad.torch: PyTorch's pooling layers on poolgrad's kernels.

``poolgrad.torch.max_pool2d(x, 2)`` and ``poolgrad.torch.MaxPool2d(2)`` are drop-in
replacements for ``torch.nn.functional.max_pool2d`` and ``torch.nn.MaxPool2d`` (and so on
for average, Lp, adaptive pooling and unpooling, in 1-3 dims), and
:func:`replace_pooling` swaps them into an existing model. Every operation is a
``torch.library.custom_op`` in the ``poolgrad`` namespace (``torch.ops.poolgrad.*``), so
autograd, gradients of gradients, ``torch.compile`` and deterministic mode work, on
CPU tensors (poolgrad's Numba kernels) and CUDA tensors (its Triton kernels). The
other pooling kinds (``blur_pool``, ``soft_pool``, ``GeMPool``, ``AttentionPool`` and
the rest, :mod:`poolgrad.torch.kinds`; adaptive polyphase sampling,
:mod:`poolgrad.torch.polyphase`) are operators of their own or compositions of these
operators and torch's own. :mod:`poolgrad.torch.onnx` exports them as standard ONNX
nodes. Needs PyTorch: ``pip install -e ".[torch]"``.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        'poolgrad.torch needs PyTorch; install it with pip install -e ".[torch]" (or see '
        "pytorch.org for a CPU or CUDA build)"
    ) from error

# define torch.ops.poolgrad.*, then register their CPU and CUDA kernels and autograd
from . import _autograd, _cpu, _cuda, _kind_autograd, _ops, onnx  # noqa: F401
from .functional import *  # noqa: F401,F403
from .functional import __all__ as _functional_all
from .kinds import *  # noqa: F401,F403
from .kinds import __all__ as _kinds_all
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from .polyphase import *  # noqa: F401,F403
from .polyphase import __all__ as _polyphase_all

__all__ = [*_functional_all, *_modules_all, *_kinds_all, *_polyphase_all]
