"""poolgrad: pooling layers with exact gradients, fast Numba kernels on the CPU.

Operators take NumPy arrays ``(N, C, *spatial)`` with 1 to 3 spatial dims; gradients
come from ``vjp(op, x, ...) -> (y, pullback)``.
"""

from . import ops
from .ops import *  # the operators and vjp: exactly ops.__all__

__version__ = "0.1.0"

__all__ = list(ops.__all__)  # the public names are listed once, in ops
