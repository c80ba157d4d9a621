"""The house in layers: poolgrad's modules import each other without cycles, the Numba
kernels import neither torch nor Triton, the library imports no tool, and no module
is longer than a newcomer can read (docs/architecture.md).

The import graph is read from the source with :mod:`ast`, so imports inside functions
count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "poolgrad"

# The tools: they import the library, never the reverse (docs/architecture.md).
TOOLS = ("poolgrad.bench", "poolgrad.train", "poolgrad.explain", "poolgrad.study",
         "poolgrad.tools", "poolgrad.cli", "poolgrad.__main__")
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name an ``ImportFrom`` starts from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known) -> set[str]:
    """Every module ``module`` imports (poolgrad's by their module name, others by their
    top-level package), wherever in the file the import stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            # ``from . import x`` names a module when x is one, else a name in base
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("poolgrad"):
                while name not in known and "." in name:
                    name = name.rsplit(".", 1)[0]
                found.add(name)
            else:
                found.add(name.split(".")[0])
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {i for i in imports_of(m, p, modules) if i in modules}
            | {i for i in imports_of(m, p, modules) if not i.startswith("poolgrad")}
            for m, p in modules.items()}


def _internal(graph):
    return {m: {i for i in deps if i in graph} for m, deps in graph.items()}


def _ancestors(module: str) -> set[str]:
    """A package's ``__init__`` runs before any module inside it: importing
    ``poolgrad.a.b`` imports ``poolgrad.a``, which is no cycle of the code's making."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(graph) -> list[list[str]]:
    """The import cycles among poolgrad's modules (Tarjan's strongly connected
    components of more than one module), ignoring the edges from a module to the
    packages that contain it."""
    edges = {m: {d for d in deps if d not in _ancestors(m)}
             for m, deps in _internal(graph).items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _is_tool(module: str) -> bool:
    return any(module == t or module.startswith(t + ".") for t in TOOLS)


def test_the_checker_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "poolgrad" / "a.py"
    source.parent.mkdir()
    source.write_text("def f():\n    from . import b\n    import torch\n")
    known = {"poolgrad.a": source, "poolgrad.b": source}
    assert imports_of("poolgrad.a", source, known) == {"poolgrad.b", "torch"}


def test_the_checker_finds_a_cycle():
    graph = {"poolgrad.a": {"poolgrad.b"}, "poolgrad.b": {"poolgrad.c"},
             "poolgrad.c": {"poolgrad.a", "numpy"}, "poolgrad.d": {"poolgrad.a"}}
    assert cycles(graph) == [["poolgrad.a", "poolgrad.b", "poolgrad.c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_numba_kernels_import_neither_torch_nor_triton():
    offenders = {m: sorted(deps & {"torch", "triton"}) for m, deps in import_graph().items()
                 if m.startswith("poolgrad.kernels") and deps & {"torch", "triton"}}
    assert offenders == {}


def test_the_library_imports_no_tool():
    graph = _internal(import_graph())
    offenders = {m: sorted(d for d in deps if _is_tool(d))
                 for m, deps in graph.items()
                 if not _is_tool(m) and any(_is_tool(d) for d in deps)}
    assert offenders == {}


def test_no_module_imports_another_modules_private_names():
    """``from poolgrad.x import _name`` across modules: a helper two modules need
    belongs in one public place. A package may use its own private modules."""
    offenders = []
    modules = _modules()
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for alias in node.names:
                    if (base.startswith("poolgrad") and alias.name.startswith("_")
                            and not alias.name.startswith("__")
                            and f"{base}.{alias.name}" not in modules):
                        offenders.append(f"{module}: from {base} import {alias.name}")
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                  and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                  and node.value.id in _imported_modules(module, path, modules)):
                offenders.append(f"{module}: {node.value.id}.{node.attr}")
    assert offenders == []


def _imported_modules(module, path, modules) -> set[str]:
    """The local names under which ``module`` holds other poolgrad modules."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    names.add(alias.asname or alias.name)
    return names


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_is_over_600_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES
