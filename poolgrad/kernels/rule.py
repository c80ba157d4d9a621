"""A dispatch rule and the predicates every family's rule table uses
(:mod:`.dispatch` tries a ``(op, direction)``'s rules in order)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Rule:
    name: str
    serves: Callable  # (plan, operand, record) -> bool
    bind: Callable  # plan -> run
    records: bool = False


def always(plan, operand, record):
    return True


def values_only(serves):
    """``serves``, for a forward that need not record the winners."""
    return lambda plan, operand, record: not record and serves(plan, operand, record)
