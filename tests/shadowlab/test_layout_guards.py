"""The layout's two guards (issue 22 steps 1 and 2, docs/DESIGN.md §3 and §4):

1. Nothing outside `shadowlab/engines/` names an engine kind, a log family or a kind's flag.
   What an engine kind does differently is asked of its adapter; a module that branches on
   `kind == "llama-server"` or writes `-ub` has kind knowledge the next kind will not find.
   Named: a kind or family name compared with something (`==`, `!=`, `in`, directly or inside
   a literal tuple/list/set), or standing as a constant (a module or class constant, a
   default); a kind's flag (its context, batch and split-control flags, its verbosity flags,
   the variables its engine reads) as any string. The kinds, families and flags are read from
   the registry, so a new kind is guarded as soon as it is registered.
2. The runner parses no log and asks no judge: no module of `shadowlab/run/` imports
   `shadowlab.logs` or `shadowlab.judge` (also inside a function: a deferred import still runs).

Each guard is shown failing on a copy of the package with one violation planted in it.
`KNOWN` lists what the guard finds today in other owners' modules, each with why it is there;
an entry that no longer matches fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadowlab import engines

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGE = REPO / "shadowlab"

# (file relative to shadowlab/, the name found): the simulator models two engines' cache
# mechanics by name (issue 22 step 4, helper D's); splits' batching is llama.cpp's; the log
# parsers are the families' readers (helper C's; LogFamily.parser names them from engines/).
KNOWN = {
    ("judge/splits.py", "llama.cpp"),
    ("logs/times.py", "ik_llama.cpp"),  # _Clock: ik_llama.cpp prints Unix times (moved out of logs/analysis.py)
    ("logs/analysis.py", "llama.cpp"),
    ("logs/analysis.py", "reference"),
    ("logs/analysis.py", "llama.cpp-legacy"),
    ("logs/reading.py", "llama.cpp"),  # ParseStats.family's default and FAMILIES (moved out of logs/parse.py)
    ("logs/reading.py", "llama.cpp-legacy"),
    ("logs/reading.py", "ik_llama.cpp"),
    ("logs/reading.py", "reference"),
    ("logs/parse.py", "llama.cpp"),
    ("simulate/model.py", "reference"),
    ("simulate/model.py", "llama.cpp"),
    # Outstanding (landed in the same merge, not yet asked of the adapter): `init` writes a
    # starter matrix per kind, and --binary/--model's overrides name the kind a binary selects.
}


def kind_names() -> set[str]:
    return {*engines.known_kinds(), *(f for f in engines.known_families() if f != engines.NO_LOG.name)}


def kind_flags() -> set[str]:
    """Every flag and variable some registered kind owns."""
    flags: set[str] = set()
    for kind in engines.known_kinds():
        adapter = engines.get_adapter(kind)
        flags.update(getattr(adapter, "context_flags", ()))
        flags.update(flag for flag, _ in getattr(adapter, "batch_flags", ()))
        flags.update(adapter.split_control_flags()[:1])
        flags.update(adapter.controlled_env)
        flags.update(f for f in adapter.verbosity_flags if f.startswith("-"))
    from shadowlab.engines.llama_server import VERBOSITY_FLAGS

    return flags | set(VERBOSITY_FLAGS)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _constants(node: ast.AST | None) -> Iterator[ast.Constant]:
    """A string constant, or those of a literal tuple/list/set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _constants(element)


def _named(tree: ast.AST) -> Iterator[ast.Constant]:
    """String constants that stand for a kind: compared, or a constant's or default's value."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from _constants(operand)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            yield from _constants(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for default in (*node.args.defaults, *node.args.kw_defaults):
                yield from _constants(default)


def kind_knowledge(root: Path) -> list[tuple[str, str, int]]:
    """(file, name or flag, line) for every module under `root` but engines/."""
    names, flags = kind_names(), kind_flags()
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("engines/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        docs = _docstrings(tree)
        for node in _named(tree):
            if node.value in names:
                found.append((rel, node.value, node.lineno))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and node.value in flags:
                found.append((rel, node.value, node.lineno))
    return found


def runner_imports(root: Path) -> list[tuple[str, str, int]]:
    """(file, module, line) for every import of shadowlab.logs or shadowlab.judge in run/."""
    found = []
    for path in sorted((root / "run").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                if target.split(".")[:2] in (["shadowlab", "logs"], ["shadowlab", "judge"]):
                    found.append((path.relative_to(root).as_posix(), target, node.lineno))
                    break
    return found


def test_nothing_outside_engines_names_a_kind_a_family_or_a_kinds_flag():
    found = kind_knowledge(PACKAGE)
    unexplained = [f for f in found if (f[0], f[1]) not in KNOWN]
    assert not unexplained, "kind knowledge outside shadowlab/engines/ (ask the adapter):\n" + "\n".join(
        f"  shadowlab/{rel}:{line}: {name!r}" for rel, name, line in unexplained)
    stale = KNOWN - {(f[0], f[1]) for f in found}
    assert not stale, f"KNOWN lists what is gone (remove it): {sorted(stale)}"


def test_the_runner_imports_no_log_parser_and_no_judge():
    assert runner_imports(PACKAGE) == []


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "shadowlab"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__", "templates"))
    return root


def _plant(root: Path, rel: str, code: str) -> None:
    path = root / rel
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + code + "\n", encoding="utf-8")


@pytest.mark.parametrize("rel, code, name", [
    ("run/turns.py", "def by_requests(kind):\n    return kind == 'llama-server'", "llama-server"),
    ("plan/__init__.py", "def split(kind):\n    return kind in ('reference', 'x')", "reference"),
    ("matrix/validate.py", "BATCH = ['-ub', '512']", "-ub"),
    ("commands/run.py", "def quiet(flags=('--ctx-checkpoints', '0')):\n    return flags", "--ctx-checkpoints"),
    ("run/engine.py", "FAULTS = 'SHADOWLAB_ENGINE_FAULTS'", "SHADOWLAB_ENGINE_FAULTS"),
    ("report/__init__.py", "FAMILY = 'ik_llama.cpp'", "ik_llama.cpp"),
])
def test_the_kind_guard_finds_a_planted_kind_name_or_flag(tmp_path, rel, code, name):
    root = _copy(tmp_path)
    assert [f for f in kind_knowledge(root) if (f[0], f[1]) not in KNOWN] == []  # the copy is clean
    _plant(root, rel, code)
    found = [f for f in kind_knowledge(root) if (f[0], f[1]) not in KNOWN]
    assert [(r, n) for r, n, _ in found] == [(rel, name)]


def test_the_kind_guard_leaves_engines_and_docstrings_alone(tmp_path):
    root = _copy(tmp_path)
    _plant(root, "engines/__init__.py", "def f(kind):\n    return kind == 'llama-server'")
    _plant(root, "run/cell.py", 'def f():\n    """Sent with -ub 512 to llama-server."""')
    assert [f for f in kind_knowledge(root) if (f[0], f[1]) not in KNOWN] == []


@pytest.mark.parametrize("code, package", [
    ("from shadowlab.logs import parse as logparse", "shadowlab.logs"),
    ("def later():\n    from shadowlab.judge import attribution", "shadowlab.judge"),
    ("import shadowlab.logs.lifecycle", "shadowlab.logs"),
])
def test_the_runner_guard_finds_a_planted_import(tmp_path, code, package):
    root = _copy(tmp_path)
    assert runner_imports(root) == []
    _plant(root, "run/scheduler.py", code)
    assert [(rel, target.startswith(package)) for rel, target, _ in runner_imports(root)] == [
        ("run/scheduler.py", True)]
