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

The second change is to inlining (``inline="always"``, which the kernels' helpers
use). To inline a call, Numba's ``InlineWorker.inline_ir`` deep-copies the callee's
IR block by block, each block with a memo of its own. Every block refers to the
function's one ``Scope``, which holds every variable of the function, so each block
copied the whole scope again: blocks times variables. The GeM 2x2 forward spent a
fifth of its compile there. Here the blocks that one untyped inlining copies share a
memo per scope, so the scope is copied once and every copied block refers to that
copy, as the blocks it was copied from all refer to one scope. Numba then gives every
block the caller's scope and renames every callee variable to a caller variable, so
no copy of the callee's scope is left in the code it compiles (the tests compare the
machine code). A typed inlining (of ``@overload``s), which reruns SSA on the copy, is
left as it was.
"""

from __future__ import annotations

import copy
import functools
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

    deepcopy = staticmethod(deepcopy)

    def __init__(self):
        super().__init__("copy", copy.__doc__)

    def __getattr__(self, name):  # copy.copy, copy.Error, ...
        return getattr(copy, name)


class _InlineCopyModule(_CopyModule):
    """The ``copy`` module for Numba's inliner: while :attr:`memos` is a dict (during
    one untyped ``inline_ir``), the IR blocks it copies share one memo per scope;
    anything else goes to ``copy.deepcopy``."""

    def __init__(self):
        from numba.core import ir

        super().__init__()
        self.memos = None
        self._block = ir.Block

    def deepcopy(self, value, memo=None):
        if memo is not None or self.memos is None or type(value) is not self._block:
            return copy.deepcopy(value, memo)
        scope = value.scope
        entry = self.memos.get(id(scope))
        if entry is None or entry[0] is not scope or id(value) in entry[1]:
            # a new scope, or a block copied again: a new copy, as deepcopy would make
            entry = self.memos[id(scope)] = (scope, {})
        return copy.deepcopy(value, entry[1])

    def __getattr__(self, name):
        return getattr(copy, name)


def _share_scope_copies(inline_ir, module):
    """``InlineWorker.inline_ir`` whose untyped inlinings copy each scope once."""
    @functools.wraps(inline_ir)
    def inline_ir_sharing_scopes(self, *args, **kwargs):
        if (getattr(self, "_permit_update_type_and_call_maps", True)
                or module.memos is not None):
            return inline_ir(self, *args, **kwargs)
        module.memos = {}
        try:
            return inline_ir(self, *args, **kwargs)
        finally:
            module.memos = None

    inline_ir_sharing_scopes.shares_scope_copies = True
    return inline_ir_sharing_scopes


def install() -> None:
    """Give Numba's IR utilities the faster ``deepcopy``, and its inliner the shared
    scope copies (once each; a Numba whose modules do not use ``copy`` as expected is
    left as it is)."""
    from numba.core import inline_closurecall, ir_utils

    if getattr(ir_utils, "copy", None) is copy:
        ir_utils.copy = _CopyModule()
    worker = getattr(inline_closurecall, "InlineWorker", None)
    if (getattr(inline_closurecall, "copy", None) is copy and worker is not None
            and hasattr(worker, "inline_ir")
            and not getattr(worker.inline_ir, "shares_scope_copies", False)):
        module = _InlineCopyModule()
        inline_closurecall.copy = module
        worker.inline_ir = _share_scope_copies(worker.inline_ir, module)
