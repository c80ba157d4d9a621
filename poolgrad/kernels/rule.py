"""A dispatch rule, the kernel a rule binds, and the predicates the rule tables share
(among them the windows the rows and 2x2 kernels serve). Pure Python: the Numba
dispatch (:mod:`.dispatch`) and the Triton one (:mod:`poolgrad.torch.triton.dispatch`)
share them, each trying a ``(op, direction)``'s rules in order."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Kernel:
    """A chosen kernel: ``name`` (``family.function``), whether it records what its
    pass may also write (the winners of max forwards, where the general one always
    does; dp's terms of GeM's rows backward), the memory layout its outputs take,
    whether it reads the forward's outputs (a backward that recomputes them takes None
    for them, so that a pullback need not keep them), and ``run``, which takes the
    arguments of its ``(op, direction)``."""

    name: str
    run: Callable
    records: bool = False
    channels_last: bool = False
    needs_outputs: bool = True  # a backward that reads the forward's outputs

    def __call__(self, *args, **keywords):
        return self.run(*args, **keywords)


@dataclass(frozen=True)
class Rule:
    name: str
    serves: Callable  # (plan, operand, record) -> bool
    bind: Callable  # plan -> run
    records: bool = False
    needs_outputs: bool = True


def rules_of(table: dict, op: str, direction: str, backend: str) -> list[Rule]:
    """``table``'s rules of ``(op, direction)``, or a ValueError naming the passes the
    ``backend`` (a word for the message) knows."""
    try:
        return table[op, direction]
    except KeyError:
        known = ", ".join(f"{o}/{d}" for o, d in table)
        raise ValueError(f"no {backend} kernel for op {op!r}, pass {direction!r}; "
                         f"known: {known}") from None


def always(plan, operand, record):
    return True


def values_only(serves):
    """``serves``, for a forward that need not record the winners."""
    return lambda plan, operand, record: not record and serves(plan, operand, record)


def full_windows(plan, operand, record) -> bool:
    """The rows kernels (GeM's, the weighted averages'): a contiguous layout, and
    windows that are all inside x, with no dilation (what gem_pool's plans are)."""
    return operand.layout in ("nchw", "channels_last") and all(
        a.rule[0] == "sliding" and a.rule[2] == 0 and a.dilation == 1
        and bool(np.all(a.first == 0)) and bool(np.all(a.end == a.extent))
        for a in plan.kernel_axes)


def quads(plan, operand, record) -> bool:
    """Full 2x2 windows (stochastic pooling's 2x2 draw; the one-loop forwards take
    :func:`paired_quads`)."""
    return full_windows(plan, operand, record) and tuple(
        a.extent for a in plan.kernel_axes) == (1, 2, 2)


def quads_apart(plan, operand, record) -> bool:
    """Full 2x2 windows that do not overlap."""
    return quads(plan, operand, record) and apart(plan, operand, record)


def paired_quads(plan, operand, record) -> bool:
    """The 2x2 one-loop forwards' windows (GeM's and Lp's, the weighted averages', the
    blends'): full 2x2 windows, NCHW ones at stride 2 along W. At another stride an NCHW
    row of windows did not vectorize, and the rows kernels were up to 10x faster
    (docs/performance.md, "2x2 windows on NCHW at other strides")."""
    return quads(plan, operand, record) and (
        operand.layout == "channels_last" or plan.kernel_axes[-1].rule[1] == 2)


def apart(plan, operand, record) -> bool:
    """Full windows that do not overlap (stride >= kernel on every axis)."""
    return full_windows(plan, operand, record) and all(
        a.rule[1] >= a.extent for a in plan.kernel_axes)


def whole_planes(plan) -> bool:
    """One window per plane, the plane itself (a global pooling, however asked for), of
    fewer than 2^31 taps (:func:`~.lanes.lane_max` numbers them in int32)."""
    return (all(a.count == 1 and a.extent == a.length and a.tiles for a in plan.axes)
            and math.prod(plan.in_spatial) < 2**31)


def wide_rows(plan) -> bool:
    """Windows of two or more tap rows of 5 or more taps, undilated along W, numbered
    under 2^31 (:func:`~.lanes.window_max` numbers taps in int32, padding included).
    One row alone ran slower than the general kernel's fold."""
    d, h, w = plan.kernel_axes
    return (w.dilation == 1 and w.extent >= 5 and d.extent * h.extent >= 2
            and math.prod(plan.extent) < 2**31 and math.prod(plan.in_spatial) < 2**31)
