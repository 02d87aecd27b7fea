"""No import cycles among the project's modules (shadowlab/ and the reference engine).

A cycle hides a missing seam: two modules that need each other are one module split in the
wrong place, and whichever is imported first sees the other half-initialised. The graph is
read from the source with `ast` (every `import` and `from ... import`, also inside functions:
a deferred import that closes a cycle is still a cycle, only a hidden one; imports under
`if TYPE_CHECKING:` are left out: they never run), and a cycle is any strongly connected
component of more than one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = {"shadowlab": REPO / "shadowlab", "shadowlab_engine": REPO / "engine" / "shadowlab_engine"}


def module_files(roots: Mapping[str, Path]) -> dict[str, Path]:
    modules = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules one file imports (a `from pkg import mod` counts as pkg.mod)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                   for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_package, node)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known)
    found.discard(name)
    return found


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(roots: Mapping[str, Path]) -> dict[str, set[str]]:
    files = module_files(roots)
    known = set(files)
    return {name: imported_modules(name, path, known) for name, path in files.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_in_the_project() -> None:
    graph = import_graph(ROOTS)
    assert "shadowlab.run" in graph and graph["shadowlab.run"], "the scan found no imports"
    found = cycles(graph)
    detail = "; ".join(" <-> ".join(c) + " (" + ", ".join(
        f"{a} imports {b}" for a in c for b in sorted(graph[a]) if b in c) + ")" for c in found)
    assert not found, f"import cycles: {detail}"


def test_the_check_sees_a_cycle_even_through_a_deferred_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from . import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from pkg import a\n")
    (package / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import f\n")
    (package / "f.py").write_text("from pkg import e\n")
    found = cycles(import_graph({"pkg": package}))
    assert found == [["pkg.a", "pkg.b", "pkg.c"]]
