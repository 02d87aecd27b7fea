"""A matrix with several mistakes reports all of them at once (issue 24), each with its file,
line, key path and hint, at most MAX_ERRORS_SHOWN then how many more; an entry built on one
that failed is not reported again (its error would only echo the first)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from shadowlab.errors import MatrixError
from shadowlab.matrix import loads
from shadowlab.matrix.validate import MAX_ERRORS_SHOWN, MatrixErrors

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
version: 1
name: ok
engines:
  ref: {kind: reference, model: {preset: tiny, seed: 0}}
configurations:
  current: {flags: [-cram, 0]}
  candidate: {flags: [-cram, 8192]}
baseline: current
prompts:
  A: {kind: random, tokens: 100, seed: 1}
  C: {kind: diverge, from: A, shared: 50, tokens: 120, seed: 2}
sequences: {A-C: [A, C]}
"""

SEVERAL = """\
version: 1
name: several
engnes: {}
engines:
  ref: {kind: reference, model: {preset: tiny, seed: 0}, threads: two}
  other: {kind: llama-servr}
configurations:
  current: {flags: [-cram, 0], colour: red}
prompts:
  A: {kind: random, tokens: -5, seed: 1}
  C: {kind: diverge, from: A, shared: 50, tokens: 120, seed: 2}
  B: {kind: unrelated, tokens: 9, seed: 3, unrelated_too: [A]}
sequences: {A-C: [A, C], B-A: [B], X: [Z]}
generation: {n_predict: many}
"""


def _errors(text: str) -> MatrixErrors:
    with pytest.raises(MatrixErrors) as info:
        loads(text, file="m.yaml")
    return info.value


def test_independent_errors_are_all_reported_in_line_order():
    found = _errors(SEVERAL)
    assert [(e.line, e.key_path) for e in found.errors] == [
        (3, "engnes"),
        (5, "engines.ref.threads"),
        (6, "engines.other.kind"),
        (8, "configurations.current.colour"),
        (10, "prompts.A.tokens"),
        (12, "prompts.B.unrelated_too"),
        (13, "sequences.X[0]"),
        (14, "generation.n_predict"),
    ]
    text = str(found)
    assert text.startswith("m.yaml: 8 errors\n")
    assert "  m.yaml:6: engines.other.kind: expected one of" in text
    assert "    hint: did you mean 'llama-server'?" in text
    assert "hint: known prompts: A, B, C" in text  # a failed prompt is still a name the matrix declares
    # The first error stands for all to a caller that reads one.
    assert (found.file, found.line, found.key_path) == ("m.yaml", 3, "engnes")
    assert isinstance(found, MatrixError)


def test_what_is_built_on_a_failed_entry_is_not_reported_again():
    """C is built from A and sequence A-C names both; only A's own error is shown."""
    found = _errors(SEVERAL)
    assert not [e for e in found.errors if e.key_path.startswith(("prompts.C", "sequences.A-C"))]


def test_a_typo_of_a_required_key_is_one_error_not_two():
    text = GOOD.replace("engines:", "enignes:")
    with pytest.raises(MatrixError) as info:
        loads(text, file="m.yaml")
    assert not isinstance(info.value, MatrixErrors)
    assert (info.value.line, info.value.key_path, info.value.hint) == (3, "enignes", "did you mean 'engines'?")


def test_one_error_reads_as_it_always_did():
    with pytest.raises(MatrixError) as info:
        loads(GOOD.replace("tokens: 100", "tokens: -1"), file="m.yaml")
    assert not isinstance(info.value, MatrixErrors)
    assert str(info.value).startswith("m.yaml:10: prompts.A.tokens: expected an integer")


def test_cross_section_checks_run_once_the_sections_load():
    """baseline names a configuration: judged after every section loaded, with the others."""
    text = GOOD.replace("baseline: current", "baseline: curent") + (
        "expectations:\n  - {configuration: nope, outcome: restored}\n")
    found = _errors(text)
    assert [(e.line, e.key_path) for e in found.errors] == [(8, "baseline"), (14, "expectations[0].configuration")]


def test_many_errors_are_bounded():
    prompts = "".join(f"  P{i}: {{kind: random, tokens: -1, seed: {i}}}\n" for i in range(45))
    text = GOOD.replace("prompts:\n", "prompts:\n" + prompts)
    found = _errors(text)
    assert len(found.errors) == 45
    lines = str(found).splitlines()
    assert lines[0] == "m.yaml: 45 errors"
    assert sum(1 for line in lines if ": prompts.P" in line) == MAX_ERRORS_SHOWN
    assert lines[-1] == f"  ... and {45 - MAX_ERRORS_SHOWN} more (fix these and load again)"


def test_the_cli_prints_them_all_with_exit_2(tmp_path):
    path = tmp_path / "several.yaml"
    path.write_text(SEVERAL)
    done = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(path), "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"shadowlab: {path}: 8 errors\n")
    assert f"  {path}:14: generation.n_predict:" in done.stderr and "Traceback" not in done.stderr


def _without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`shadowlab ARGS` in a Python where torch cannot be imported (as on a machine without the
    engine extra)."""
    code = ("import sys; sys.modules['torch'] = None\n"  # find_spec('torch') then fails, as for a missing one
            "from shadowlab.cli import main\n"
            f"raise SystemExit(main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_missing_engine_module_refuses_the_run_and_only_warns_in_a_dry_run(tmp_path):
    """The reference engine's processes import torch: without it a run is refused before anything
    starts (the engine's `kind` line, the install command), and a dry run still prints the plan
    with the same words as a warning. An engine no selected cell uses needs nothing."""
    matrix = REPO / "matrices" / "ckpt.yaml"
    out = tmp_path / "run"
    refused = _without_torch("run", str(matrix), "--out", str(out), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    line = next(i for i, text in enumerate(matrix.read_text().splitlines(), 1) if text.strip() == "kind: reference")
    assert refused.stderr.startswith(f"shadowlab: {matrix}:{line}: engines.reference.kind: the reference engine "
                                     "needs torch, not installed in this Python"), refused.stderr
    assert "pip install torch==2.13.0" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists()
    dry = _without_torch("run", str(matrix), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "reference.prompt_end.A-C" in dry.stdout
    assert dry.stderr.startswith(f"shadowlab: warning: {matrix}:{line}: engines.reference.kind: the reference "
                                 "engine needs torch"), dry.stderr


def test_only_the_engines_of_the_selected_cells_must_be_runnable_here(monkeypatch):
    """check_machine asks for the Python modules of the engines the selected cells use: a
    reference engine that cells.include leaves out needs no torch; both problems are reported
    (cores, and each engine), with the line of the engine's kind."""
    from shadowlab.matrix.validate import check_machine

    two = GOOD.replace("engines:\n", "engines:\n  ref2: {kind: reference, model: {preset: tiny, seed: 0}}\n")
    monkeypatch.setitem(sys.modules, "torch", None)
    only_ref = loads(two + "cells: {include: [{engine: ref}]}\n", file="m.yaml", check_files=False)
    with pytest.raises(MatrixError) as one:
        check_machine(only_ref, cores=64)
    assert (one.value.line, one.value.key_path) == (5, "engines.ref.kind") and "needs torch" in one.value.message
    both = loads(two, file="m.yaml", check_files=False)
    with pytest.raises(MatrixErrors) as several:
        check_machine(both, cores=0)
    assert [e.key_path for e in several.value.errors] == ["engines.ref2.kind", "engines.ref.kind",
                                                          "isolation.cores_per_cell"]
    warned: list[str] = []
    check_machine(both, cores=0, warn=warned.append)
    assert len(warned) == 3 and all(w.startswith("shadowlab: warning: m.yaml") for w in warned)
    monkeypatch.delitem(sys.modules, "torch")
    if importlib.util.find_spec("torch") is not None:  # where the engine extra is installed
        check_machine(only_ref, cores=64)
