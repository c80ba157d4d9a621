"""A dispatch rule, the kernel a rule binds, and the predicates every family's rule
table uses. Pure Python: the Numba dispatch (:mod:`.dispatch`) and the Triton one
(:mod:`poolgrad.torch.triton.dispatch`) share them, each trying a ``(op, direction)``'s
rules in order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
