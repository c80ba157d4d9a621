"""poolgrad: pooling layers with exact gradients, fast Numba kernels on the CPU.

Operators take NumPy arrays ``(N, C, *spatial)`` with 1 to 3 spatial dims; gradients
come from ``vjp(op, x, ...) -> (y, pullback)``.
"""

from .ops import (
    Pullback,
    adaptive_avg_pool,
    adaptive_max_pool,
    avg_pool,
    global_avg_pool,
    global_lp_pool,
    global_max_pool,
    lp_pool,
    max_pool,
    max_unpool,
    vjp,
)

__version__ = "0.1.0"

__all__ = [
    "Pullback",
    "adaptive_avg_pool",
    "adaptive_max_pool",
    "avg_pool",
    "global_avg_pool",
    "global_lp_pool",
    "global_max_pool",
    "lp_pool",
    "max_pool",
    "max_unpool",
    "vjp",
]
