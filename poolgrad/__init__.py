"""poolgrad: pooling layers with exact gradients, fast Numba kernels on the CPU.

Operators take NumPy arrays ``(N, C, *spatial)`` with 1 to 3 spatial dims; gradients
come from ``vjp(op, x, ...) -> (y, pullback)``.
"""

from . import kinds, ops
from .kinds import *  # the other pooling kinds: exactly kinds.__all__
from .ops import *  # the operators and vjp: exactly ops.__all__

__version__ = "0.1.0"

__all__ = list(ops.__all__) + list(kinds.__all__)  # listed once, in ops and kinds
