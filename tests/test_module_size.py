"""No module of the project over 600 lines (issue 22 step 6: "no module over ~600 lines doing
several jobs").

A module that long is several jobs in one file: a reader cannot see it whole, and its parts
import one another's privates. A new module over the limit fails here; split it by job (one
module per job, the package re-exporting what its importers use). The modules that were over
the limit when the guard came, owned by other work, are `KNOWN`, each with its line count then.
The list only shrinks: a listed module that grows past its count fails, and so does one now at
or under the limit (take it off the list), or one that no longer exists.

Lines are counted as `wc -l` counts them (newline characters).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("shadowlab", "shadowlab_cache", "engine/shadowlab_engine")
LIMIT = 600

# module (relative to the repository) -> its line count when this guard came; shrink-only.
KNOWN: dict[str, int] = {}  # empty since shadowlab/logs/ was split (issue 22 step 6)


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def modules(repo: Path, roots: Iterable[str] = ROOTS) -> dict[str, int]:
    """Every Python module under the roots, relative to `repo`, with its line count."""
    return {path.relative_to(repo).as_posix(): line_count(path)
            for root in roots for path in sorted((repo / root).rglob("*.py"))}


def size_problems(found: Mapping[str, int], known: Mapping[str, int] = KNOWN, limit: int = LIMIT) -> list[str]:
    """What breaks the rule, one line each (empty: every module fits)."""
    out = []
    for module, lines in sorted(found.items()):
        allowed = known.get(module)
        if allowed is None and lines > limit:
            out.append(f"{module}: {lines} lines, over {limit}: split it by job")
        elif allowed is not None and lines > allowed:
            out.append(f"{module}: {lines} lines, grown past the {allowed} it had (KNOWN only shrinks)")
        elif allowed is not None and lines <= limit:
            out.append(f"{module}: {lines} lines, within {limit} now: take it off KNOWN")
    out += [f"{module}: listed in KNOWN but gone: take it off" for module in sorted(set(known) - set(found))]
    return out


def test_no_module_is_over_the_limit_but_the_known_ones() -> None:
    found = modules(REPO)
    assert "shadowlab/traffic/__init__.py" in found and "engine/shadowlab_engine/httpd.py" in found
    problems = size_problems(found)
    assert not problems, "modules over the size limit (tests/test_module_size.py):\n" + "\n".join(problems)


def test_the_known_modules_are_over_the_limit_each() -> None:
    """The list holds only what it must: every entry is over the limit by its own count."""
    assert all(count > LIMIT for count in KNOWN.values())


def test_a_long_module_planted_in_a_copy_of_the_tree_is_caught(tmp_path: Path) -> None:
    """The guard fails on a tree that breaks it: a copy of the project's sources with a new module
    of 601 lines (one of 600 passes), a known module one line past its count, another cut to the
    limit, and a third removed. The three known ones are planted with their own `known` entries,
    so the test holds however short `KNOWN` gets."""
    for root in ROOTS:
        shutil.copytree(REPO / root, tmp_path / root, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    assert size_problems(modules(tmp_path)) == []  # the copy as it is passes
    grown, cut, removed = (f"shadowlab/traffic/planted_{name}.py" for name in ("grown", "cut", "removed"))
    known = {**KNOWN, grown: LIMIT + 100, cut: LIMIT + 100, removed: LIMIT + 100}
    for module in (grown, cut, removed):
        (tmp_path / module).write_text("x = 1\n" * (LIMIT + 100))
    assert size_problems(modules(tmp_path), known) == []  # each planted known module at its count
    planted = tmp_path / "shadowlab" / "traffic" / "planted.py"
    planted.write_text("x = 1\n" * (LIMIT + 1))
    at_limit = tmp_path / "shadowlab" / "matrix" / "at_limit.py"
    at_limit.write_text("x = 1\n" * LIMIT)
    (tmp_path / grown).write_text("x = 1\n" * (known[grown] + 1))  # one line past its count
    (tmp_path / cut).write_text("x = 1\n" * LIMIT)
    (tmp_path / removed).unlink()
    problems = size_problems(modules(tmp_path), known)
    assert sorted(problems) == sorted([
        f"{cut}: 600 lines, within 600 now: take it off KNOWN",
        f"{grown}: {known[grown] + 1} lines, grown past the {known[grown]} it had (KNOWN only shrinks)",
        "shadowlab/traffic/planted.py: 601 lines, over 600: split it by job",
        f"{removed}: listed in KNOWN but gone: take it off",
    ])
