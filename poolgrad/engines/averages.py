"""Window sums: the average engine (average, global average and adaptive average
pooling) and its pullback, which keeps nothing but the plan."""

from __future__ import annotations

import numpy as np

from .. import _inputs as inputs
from ..kernels import dispatch
from .pullback import Pullback, empty, routing


def avg_engine(x, layout, plan, *, divisor_mode, divisor_override, want_pullback, op,
               kind="avg"):
    """``(y, pullback or None)``: the window means of the checked ``x`` along ``plan``
    (``kind`` "avg", or "global_avg" for the one-window plan of a global average)."""
    xk = inputs.compute_view(x, layout)
    divisor = plan.divisor_table(divisor_mode, divisor_override, xk.dtype)
    forward = dispatch.choose(kind, "forward", plan, dispatch.operand(xk))
    yk = empty(layout.kernel_shape(plan.out_spatial), xk.dtype, forward.channels_last)
    forward(xk, yk, divisor)
    y = yk.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return y, None
    return y, avg_pullback(plan, layout, x.dtype, channels_last=forward.channels_last,
                           divisor_mode=divisor_mode, divisor_override=divisor_override,
                           op=op, forward_name=forward.name, kind=kind)


def avg_pullback(plan, layout, x_dtype, *, channels_last, divisor_mode, divisor_override,
                 op="avg_pool", forward_name="", kind="avg") -> Pullback:
    """The pullback of an average pooling (``kind`` "avg" or "global_avg"), which keeps
    nothing: ``dx`` is stored channels-last or C-contiguous as asked."""
    compute = inputs.COMPUTE_DTYPE[np.dtype(x_dtype)]
    divisor = plan.divisor_table(divisor_mode, divisor_override, compute)
    kernel = dispatch.choose(kind, "backward", plan, dispatch.stored_as(channels_last, compute))
    backward = routing(kernel, layout, plan, divisor)
    return Pullback(op, backward, layout.user_shape(plan.out_spatial),
                    layout.user_shape(plan.in_spatial), x_dtype, {},
                    (forward_name, kernel.name))
