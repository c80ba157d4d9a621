"""The pooling kinds beyond max, average and Lp, as NumPy operators with exact
gradients through :func:`poolgrad.vjp`.

Each module holds one family and registers it with :func:`poolgrad.vjp`
(:func:`poolgrad.autodiff.register`: public operator -> the private
``_op(..., want_pullback)`` that ``vjp`` calls):

* :mod:`.attention`: ``attention_pool``, a readout head (learned queries over all
  positions).
* :mod:`.blur`: anti-aliased pooling, ``blur_pool``, ``max_blur_pool`` and
  ``avg_blur_pool`` (Zhang 2019).
* :mod:`.weighted`: weighted window averages, ``soft_pool`` (Stergiou et al. 2021) and
  ``stochastic_pool`` (Zeiler & Fergus 2013).
* :mod:`.fractional`: ``fractional_max_pool`` (Graham 2014).
* :mod:`.polyphase`: ``aps_pool``, adaptive polyphase sampling (Chaman & Dokmanic
  2021), downsampling that is exactly invariant to circular shifts, and
  ``max_aps_pool``, max pooling made so, and ``lps_pool``, the choice learned
  (Rojas-Gomez et al. 2022).
* :mod:`.learned`: kinds with learnable parameters, built from the core's operators:
  ``gem_pool`` (Radenovic et al. 2019), ``mixed_pool`` and ``gated_pool`` (Lee et al.
  2016).
"""

from .attention import attention_pool
from .blur import avg_blur_pool, blur_pool, max_blur_pool
from .fractional import fractional_max_pool
from .learned import gated_pool, gem_pool, mixed_pool
from .polyphase import aps_pool, lps_pool, max_aps_pool
from .weighted import soft_pool, stochastic_pool

__all__ = ["aps_pool", "attention_pool", "avg_blur_pool", "blur_pool", "fractional_max_pool",
           "gated_pool", "gem_pool", "lps_pool", "max_aps_pool", "max_blur_pool",
           "mixed_pool", "soft_pool", "stochastic_pool"]
