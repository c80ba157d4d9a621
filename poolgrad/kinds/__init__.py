"""The pooling kinds beyond max, average and Lp, as NumPy operators with exact
gradients through :func:`poolgrad.vjp`.

Each module holds one family and its ``VJP_RULES`` (public operator -> the private
``_op(..., want_pullback)`` that :func:`poolgrad.vjp` calls):

* :mod:`.blur`: anti-aliased pooling, ``blur_pool``, ``max_blur_pool`` and
  ``avg_blur_pool`` (Zhang 2019).
"""

from . import blur
from .blur import avg_blur_pool, blur_pool, max_blur_pool

__all__ = ["avg_blur_pool", "blur_pool", "max_blur_pool"]

VJP_RULES = {**blur.VJP_RULES}
