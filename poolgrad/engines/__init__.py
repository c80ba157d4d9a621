"""How each pooling family runs: an *engine* pools a checked input along its plan
(choosing kernels through :mod:`poolgrad.kernels.dispatch`) and, when asked, builds its
:class:`Pullback`; the *pullbacks* can also be rebuilt from what a forward kept, which is
how poolgrad.torch's backward operators run.

- :mod:`.pullback`: :class:`Pullback` and what every family shares;
- :mod:`.maxima`: max pooling, its winners and their indices;
- :mod:`.averages`: average pooling;
- :mod:`.lp`: Lp pooling;
- :mod:`.blur`: anti-aliased pooling (blur, max-blur, avg-blur);
- :mod:`.fractional`: fractional max pooling, given each plane's windows;
- :mod:`.power_mean`: GeM pooling (global and windowed);
- :mod:`.weighted`: SoftPool and stochastic pooling;
- :mod:`.blend`: mixed and gated pooling;
- :mod:`.attention`: attention pooling over all positions.

:mod:`poolgrad.ops` validates the public arguments and calls the engines; so does
:mod:`poolgrad.torch`, on ``tensor.numpy()`` views.
"""

from .attention import attention_backward, attention_forward, attention_kernels
from .averages import avg_engine, avg_pullback
from .blend import blend_backward, blend_forward, blend_kernels
from .blur import blur_backward, blur_forward, blur_kernels
from .fractional import (
    fractional_backward,
    fractional_forward,
    fractional_forward_stored,
    fractional_indices,
    fractional_indices_stored,
    fractional_planes,
    fractional_routing,
    planes_in_layout,
)
from .lp import lp_engine, lp_pullback
from .maxima import TIE_RULES, max_engine, max_forward, max_gather, max_pullback, winner_indices
from .power_mean import gem_backward, gem_forward, gem_kernels, p_gradient
from .pullback import Pullback
from .weighted import (
    backward_needs_outputs,
    require_probabilities,
    sample_kernel,
    stochastic_sample,
    weighted_backward,
    weighted_forward,
    weighted_kernels,
)

__all__ = ["TIE_RULES", "Pullback", "attention_backward", "attention_forward",
           "attention_kernels", "avg_engine", "avg_pullback", "backward_needs_outputs",
           "blend_backward", "blend_forward", "blend_kernels", "blur_backward",
           "blur_forward", "blur_kernels", "fractional_backward", "fractional_forward",
           "fractional_forward_stored", "fractional_indices", "fractional_indices_stored",
           "fractional_planes", "fractional_routing", "gem_backward", "gem_forward",
           "gem_kernels", "lp_engine", "lp_pullback", "max_engine", "max_forward",
           "max_gather", "max_pullback", "p_gradient", "planes_in_layout",
           "require_probabilities", "sample_kernel", "stochastic_sample",
           "weighted_backward", "weighted_forward", "weighted_kernels", "winner_indices"]
