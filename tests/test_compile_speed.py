"""poolgrad.kernels.compile_speed: the faster deepcopy returns what copy.deepcopy returns,
and Numba compiles the same machine code with it."""

import collections
import copy
import random
import re

import numba
import numpy as np
import pytest
from numba.core import ir_utils

import poolgrad.kernels  # noqa: F401  (installs the faster deepcopy)
from poolgrad.kernels import compile_speed


def _table(rng: random.Random, blocks: int, names: int) -> dict:
    """A copy-propagation table: block labels to sets of (name, name) copies."""
    pool = [f"v{i}.{j}" for i in range(names) for j in range(2)]
    return {label: {(rng.choice(pool), rng.choice(pool)) for _ in range(rng.randrange(8))}
            for label in range(blocks)}


@pytest.mark.parametrize("seed", range(5))
def test_a_table_copies_as_deepcopy_copies_it(seed):
    table = _table(random.Random(seed), 40, 30)
    table["names"] = {"a", ("b", "c")}  # str keys and bare names too
    copied, expected = compile_speed.deepcopy(table), copy.deepcopy(table)
    assert copied == expected
    assert list(copied) == list(table)  # the same key order
    for key in table:  # and each set iterates in deepcopy's order
        assert list(copied[key]) == list(expected[key])
    for key, items in table.items():
        assert copied[key] is not items  # new sets: the copy's changes stay its own
        copied[key].add(("new", "copy"))
        assert ("new", "copy") not in items


def test_a_set_under_two_keys_is_copied_once_as_deepcopy_copies_it():
    shared = {("a", "b")}
    copied = compile_speed.deepcopy({1: shared, 2: shared, 3: {("c", "d")}})
    expected = copy.deepcopy({1: shared, 2: shared, 3: {("c", "d")}})
    assert (copied[1] is copied[2]) and (expected[1] is expected[2])
    assert copied[1] is not shared and copied == expected


class _Name(str):
    pass


@pytest.mark.parametrize("value", [
    {1: {"x"}, 2: {_Name("x")}},  # equal to a str, yet deepcopy copies it
    {1: {("a", "b")}, 2: {collections.namedtuple("Pair", "a b")("a", "b")}},
    {1: {("a", "b")}, 2: {(_Name("a"), "b")}},
])
def test_an_item_equal_to_a_name_but_of_another_type_is_deepcopied(value):
    """Every set's items are checked, not their union, where an equal item of another
    type would hide behind a plain one."""
    copied = compile_speed.deepcopy(value)
    (item,), (original,) = copied[2], value[2]
    assert item == original and item is not original  # a copy, as deepcopy makes


class _Mutable:
    def __init__(self, value):
        self.value = value


@pytest.mark.parametrize("value", [
    {1: [("a", "b")]},  # not a set
    {1: {("a", 2)}},  # a tuple of something other than names
    {1: {_Mutable(3)}},  # an object deepcopy copies
    {(1, 2): {"a"}},  # a tuple key
    [{"a"}],  # not a dict
])
def test_anything_else_is_deepcopy(value):
    copied = compile_speed.deepcopy(value)
    assert type(copied) is type(value)
    if isinstance(value, dict) and any(isinstance(i, _Mutable) for i in value.get(1, ())):
        (item,) = copied[1]
        assert isinstance(item, _Mutable) and item not in value[1]  # a copy, as deepcopy
    else:
        assert copied == copy.deepcopy(value)


def test_a_memo_goes_to_deepcopy():
    memo = {}
    table = {1: {("a", "b")}}
    copied = compile_speed.deepcopy(table, memo)
    assert copied == table and id(table) in memo  # deepcopy's own memo was used


def _normalized_asm(dispatcher) -> str:
    """The machine code, without the addresses and the version counters (``B2v1``)
    that Numba puts in its functions' names."""
    (library,) = [cres.library for cres in dispatcher.overloads.values()]
    return re.sub(r"0x[0-9a-f]+|B\d+v\d+", "N", library.get_asm_str())


def _branchy(x, out):
    for i in numba.prange(x.shape[0]):
        total = 0.0
        for j in range(x.shape[1]):
            v = x[i, j]
            if v > 1.0:
                total += v * v
            elif v < -1.0:
                total -= v
            else:
                total += 0.5 * v
        out[i] = total


def test_numba_uses_it_and_compiles_the_same_code(monkeypatch):
    calls = []

    def counted(value, memo=None):
        calls.append(type(value))
        return compile_speed.deepcopy(value, memo)

    assert isinstance(ir_utils.copy, compile_speed._CopyModule)
    monkeypatch.setattr(ir_utils.copy, "deepcopy", counted)
    x, out = np.linspace(-3, 3, 40).reshape(5, 8), np.empty(5)
    faster = numba.njit(parallel=True)(_branchy)
    faster(x, out)
    # a Numba whose copy propagation no longer deep-copies makes this module dead code
    assert dict in calls, "Numba's copy propagation no longer calls copy.deepcopy"
    monkeypatch.setattr(ir_utils, "copy", copy)
    plain = numba.njit(parallel=True)(_branchy)
    expected = np.empty(5)
    plain(x, expected)
    np.testing.assert_array_equal(out, expected)
    assert _normalized_asm(faster) == _normalized_asm(plain)


@numba.njit(inline="always")
def _clipped_square(v, low):
    if v < low:
        v = low
    elif v > 2.0:
        v = 2.0 + 0.5 * (v - 2.0)
    return v * v


def _with_inlined_helpers(x, out):
    for i in numba.prange(x.shape[0]):
        total = 0.0
        for j in range(x.shape[1]):
            total += _clipped_square(x[i, j], -1.0) + _clipped_square(-x[i, j], 0.5)
        out[i] = total


def test_inlining_copies_each_scope_once_and_compiles_the_same_code(monkeypatch):
    """The blocks of an inlined helper share one copy of its scope (every block copied
    once, in order), and the machine code is what Numba's own copies give."""
    from numba.core import inline_closurecall, ir

    module = inline_closurecall.copy
    assert isinstance(module, compile_speed._InlineCopyModule)
    assert inline_closurecall.InlineWorker.inline_ir.shares_scope_copies
    copied = []

    def recorded(value, memo=None):
        result = compile_speed._InlineCopyModule.deepcopy(module, value, memo)
        if type(value) is ir.Block:
            copied.append((module.memos, value, result))  # the memos of one inlining
        return result

    monkeypatch.setattr(module, "deepcopy", recorded)
    x, out = np.linspace(-3, 3, 40).reshape(5, 8), np.empty(5)
    faster = numba.njit(parallel=True)(_with_inlined_helpers)
    faster(x, out)
    assert copied, "Numba's inliner no longer copies blocks with copy.deepcopy"
    assert all(memos is not None for memos, _, _ in copied)
    copies = collections.defaultdict(set)  # per inlining and scope, the scopes of the copies
    for memos, source, result in copied:
        copies[id(memos), id(source.scope)].add(id(result.scope))
    assert all(len(scopes) == 1 for scopes in copies.values())
    assert len(copies) < len(copied)  # blocks did share a copy

    monkeypatch.setattr(inline_closurecall, "copy", copy)
    monkeypatch.setattr(inline_closurecall.InlineWorker, "inline_ir",
                        inline_closurecall.InlineWorker.inline_ir.__wrapped__)
    plain = numba.njit(parallel=True)(_with_inlined_helpers)
    expected = np.empty(5)
    plain(x, expected)
    np.testing.assert_array_equal(out, expected)
    assert _normalized_asm(faster) == _normalized_asm(plain)


def test_a_block_copied_again_gets_a_copy_of_its_own():
    """Within one inlining, a block copied a second time is a new copy (deepcopy's
    answer), not the first copy again."""
    from numba.core import inline_closurecall, ir

    module = inline_closurecall.copy
    scope = ir.Scope(None, ir.Loc("f", 1))
    block = ir.Block(scope, ir.Loc("f", 1))
    block.append(ir.Assign(ir.Const(1, ir.Loc("f", 1)), scope.define("a", ir.Loc("f", 1)),
                           ir.Loc("f", 1)))
    other = ir.Block(scope, ir.Loc("f", 2))
    module.memos = {}
    try:
        first, second, again = (module.deepcopy(block), module.deepcopy(other),
                                module.deepcopy(block))
    finally:
        module.memos = None
    assert first.scope is second.scope and first.scope is not scope
    assert again is not first and again.scope is not first.scope
    assert str(again.body[0]) == str(first.body[0]) == "a = const(int, 1)"
