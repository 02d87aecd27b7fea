"""The import graph of the project (shadowlab/ and the reference engine): no cycles, and the
stages import one another one way only (the house of docs/DESIGN.md §0).

A cycle hides a missing seam: two modules that need each other are one module split in the
wrong place, and whichever is imported first sees the other half-initialised. The graph is
read from the source with `ast`: every `import` and `from ... import`, also inside functions (a
deferred import that closes a cycle is still a cycle, only a hidden one) and under `if
TYPE_CHECKING:` (a type the module cannot name without the other is the same dependency; no
exemption). A cycle is any strongly connected component of more than one module.

The layers are the second half (`LAYERS`, `ALLOWED`, below): every import between two layers
must be an edge of the table, and the table itself has no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = {"shadowlab": REPO / "shadowlab", "shadowlab_engine": REPO / "engine" / "shadowlab_engine",
         "shadowlab_cache": REPO / "shadowlab_cache"}


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
    for node in ast.walk(tree):
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
    # a type-only import is an import: e <-> f is a cycle too
    assert sorted(found) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.e", "pkg.f"]]


# ---------------------------------------------------------------- layers: data flows one way

# Each module belongs to the layer of its longest prefix here. The stages are named after their
# packages; `format` is the run directory's record format (the layout, bounded I/O, the version
# chain, the codec, meta.json's and verdicts.json's schemas): what every stage reads and writes,
# below all of them. A new top-level module falls into `base` and may import only `base`.
LAYERS = {
    "shadowlab": "base",  # errors, escape, bounds, exitcodes and the package itself
    "shadowlab_engine": "engine",  # the reference engine under test: imports nothing of the harness
    "shadowlab_cache": "cache",  # the cache mechanics the engine and the simulator share: imports nothing
    "shadowlab.results.codec": "format", "shadowlab.results.files": "format",
    "shadowlab.results.layout": "format", "shadowlab.results.versions": "format",
    "shadowlab.results.records": "format", "shadowlab.results.verdict_schema": "format",
    "shadowlab.results": "results",  # the one reader (rundir) and the merge of shards
    "shadowlab.logs": "logs", "shadowlab.traffic": "traffic", "shadowlab.engines": "engines",
    "shadowlab.matrix": "matrix", "shadowlab.plan": "plan", "shadowlab.run": "run",
    "shadowlab.judge": "judge",  # verdicts, metrics, budgets, expectations, gate
    "shadowlab.simulate": "simulate", "shadowlab.report": "report", "shadowlab.capture": "capture",
    "shadowlab.commands": "commands", "shadowlab.cli": "commands", "shadowlab.__main__": "commands",
    "shadowlab.compare": "commands",  # the compare command's refusals and output, over judge.metrics
}

# The house: which layers each layer may import (besides itself). Read along the flow
#     matrix → plan → run → results → judge → report / gate
# every stage imports only earlier ones, with one exception: the runner writes its records through
# results (the one reader serves its --resume), and results never imports the runner. logs,
# traffic and engines sit beside the flow (each stage may read logs; nothing of theirs imports a
# stage; judging reads a kind's log family and batch flags through its adapter); the cache
# mechanics sit below the engine and the simulator alike, so the harness never imports the engine
# under test; simulate reads results and judge like the report; commands may import anything.
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "format": frozenset({"base"}),
    "cache": frozenset(),
    "engine": frozenset({"cache"}),
    "logs": frozenset({"base", "format"}),
    "traffic": frozenset({"base", "format"}),
    "engines": frozenset({"base", "format", "logs", "engine"}),  # the reference kind starts the engine
    "matrix": frozenset({"base", "format", "logs", "traffic", "engines"}),
    "plan": frozenset({"base", "format", "traffic", "engines", "matrix"}),
    "results": frozenset({"base", "format", "logs", "matrix", "plan"}),
    "run": frozenset({"base", "format", "logs", "traffic", "engines", "matrix", "plan", "results"}),
    "judge": frozenset({"base", "format", "logs", "traffic", "cache", "engines", "matrix", "plan", "run", "results"}),
    "simulate": frozenset({"base", "format", "logs", "traffic", "cache", "results", "judge"}),
    "report": frozenset({"base", "format", "logs", "traffic", "matrix", "results", "judge"}),
    "capture": frozenset({"base", "format", "traffic"}),
    "commands": frozenset({"base", "format", "logs", "traffic", "engines", "matrix", "plan", "results", "run",
                           "judge", "simulate", "report", "capture"}),
}

# Edges a later change will remove (each says which); they are no part of the house above, whose
# acyclicity is checked without them. Empty: every step of issue 22 has landed.
PENDING: dict[tuple[str, str], str] = {}

FLOW = ("matrix", "plan", "run", "results", "judge", "report")


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise KeyError(f"{module}: in no layer (add its package to LAYERS)")


def layer_violations(graph: Mapping[str, Iterable[str]],
                     pending: Mapping[tuple[str, str], str] = PENDING) -> list[str]:
    """Every import between two layers that the table does not allow, as `a (layer) imports b
    (layer)`."""
    out = []
    for importer in sorted(graph):
        a = layer_of(importer)
        for imported in sorted(graph[importer]):
            b = layer_of(imported)
            if a != b and b not in ALLOWED[a] and (a, b) not in pending:
                out.append(f"{importer} ({a}) imports {imported} ({b})")
    return out


def test_every_import_between_layers_is_an_edge_of_the_table() -> None:
    graph = import_graph(ROOTS)
    assert {layer_of(m) for m in graph} >= set(FLOW) | {"format", "logs", "traffic", "simulate"}
    found = layer_violations(graph)
    assert not found, "imports against the layers (tests/test_import_cycles.py ALLOWED):\n" + "\n".join(found)


def test_the_table_is_one_way() -> None:
    """The allowed layer edges form no cycle, and along the flow only the runner imports a later
    stage (results, the record format's reader it writes for)."""
    table = {layer: set(imports) for layer, imports in ALLOWED.items()}
    assert set().union(*table.values()) <= set(table)
    assert cycles(table) == [] and all(layer not in imports for layer, imports in table.items())
    forward = [(a, b) for a in FLOW for b in ALLOWED[a] if b in FLOW and FLOW.index(b) > FLOW.index(a)]
    assert forward == [("run", "results")]
    assert not [edge for edge in PENDING if edge[1] in ALLOWED[edge[0]]], "a pending edge the house allows anyway"


def test_an_upward_import_planted_in_a_copy_of_the_tree_is_caught(tmp_path: Path) -> None:
    """The layer check and the cycle check fail on a tree that breaks them: a copy of the
    project's sources with one upward import added (results importing the report) and one
    type-only back edge (the record format naming a judge type)."""
    import shutil

    copies = {name: tmp_path / name for name in ROOTS}
    for name, root in ROOTS.items():
        shutil.copytree(root, copies[name], ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    assert layer_violations(import_graph(copies)) == []  # the copy as it is passes
    rundir = copies["shadowlab"] / "results" / "rundir.py"
    rundir.write_text(rundir.read_text() + "\n\ndef _planted():\n    from shadowlab.report import render_run\n")
    schema = copies["shadowlab"] / "results" / "verdict_schema.py"
    schema.write_text(schema.read_text() + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                      "    from shadowlab.judge.verdicts import compute\n")
    graph = import_graph(copies)
    found = layer_violations(graph)
    assert "shadowlab.results.rundir (results) imports shadowlab.report (report)" in found
    assert "shadowlab.results.verdict_schema (format) imports shadowlab.judge.verdicts (judge)" in found
    assert any("shadowlab.judge.verdicts" in c and "shadowlab.results.verdict_schema" in c for c in cycles(graph))
