"""Numba's parallel compiles made faster by one cheaper copy in its copy propagation.

Numba's parallel pass runs copy propagation (``numba.core.ir_utils.copy_propagate``)
several times per kernel. Each run iterates its data flow to a fixed point, and each
round compares the table it had with a ``copy.deepcopy`` of the new one. The table
maps block labels to sets of ``(name, name)`` copies. ``deepcopy`` visits every tuple
of every set in Python, and the table grows with blocks times copies. A kernel whose
parallel loop holds many branches spent more of its compile there than in LLVM. The
channels-last max forward took 17.5 s to compile, and 12.5 s with this module (see the
CHANGELOG).

:func:`install` gives ``ir_utils`` a ``copy`` module whose ``deepcopy`` copies such a
table as ``{label: set(copies)}``. That is a dict of int or str keys to sets of str and
tuples of str, and for it the result is exactly what ``copy.deepcopy`` returns:
``deepcopy`` returns a string, and a tuple of strings, as itself, rebuilds a set from
the list of its items (so the copy iterates in the same order), and copies a set seen
twice once (the memo), as here. Anything else goes to ``copy.deepcopy``. Numba
compiles the same code as before; only the time it takes changes.
"""

from __future__ import annotations

import copy
import types


def _names_only(items) -> bool:
    """Whether every item is a str or a tuple of str: what deepcopy returns as is."""
    for item in items:
        if type(item) is tuple:
            for part in item:
                if type(part) is not str:
                    return False
        elif type(item) is not str:
            return False
    return True


def deepcopy(value, memo=None):
    """``copy.deepcopy(value, memo)``, faster for a dict of int or str keys to sets of
    names (copy propagation's tables)."""
    if memo is not None or type(value) is not dict:
        return copy.deepcopy(value, memo)
    for key in value:
        if type(key) is not int and type(key) is not str:
            return copy.deepcopy(value)
    copies: dict[int, set] = {}  # by id: a set under two keys is copied once
    for items in value.values():
        if id(items) in copies:
            continue
        # every item checked (a union would keep one of two equal items, and a str
        # subclass equals its str)
        if type(items) is not set or not _names_only(items):
            return copy.deepcopy(value)
        # deepcopy rebuilds a set from a list of its items, as here: the same
        # iteration order (items.copy() would keep the old table's)
        copies[id(items)] = set(list(items))
    return {key: copies[id(items)] for key, items in value.items()}


class _CopyModule(types.ModuleType):
    """The ``copy`` module with :func:`deepcopy` in place of its own."""

    def __init__(self):
        super().__init__("copy", copy.__doc__)
        self.deepcopy = deepcopy

    def __getattr__(self, name):  # copy.copy, copy.Error, ...
        return getattr(copy, name)


def install() -> None:
    """Give Numba's IR utilities the faster ``deepcopy`` (once; a Numba whose
    ``ir_utils`` does not use the ``copy`` module is left as it is)."""
    from numba.core import ir_utils

    if getattr(ir_utils, "copy", None) is copy:
        ir_utils.copy = _CopyModule()
