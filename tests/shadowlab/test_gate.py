"""The gate's exit codes: on synthetic run directories, and end to end on the reference engine."""

from __future__ import annotations

import fnmatch
import io
import json
import os
from pathlib import Path

import pytest
import yaml

from shadowlab.judge import gate
from shadowlab.judge.expectations import CheckStatus
from shadowlab.judge.gate import EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE

from synthetic_runs import CKPT_MATRIX, ckpt_verdict, write_run


def test_reference_behaviour_qualifies(tmp_path):
    result = gate.evaluate(write_run(tmp_path / "run", ckpt_verdict()))
    assert result.exit_code == EXIT_QUALIFIED and int(result) == 0 and result.qualified
    assert result.failures == ()
    assert len(result.checks) > 50


def test_stale_restore_fails_on_identity_only(tmp_path):
    result = gate.evaluate(write_run(tmp_path / "run", ckpt_verdict(stale_restore=True)))
    assert result.exit_code == EXIT_CHECK_FAILED
    assert {c.check for c in result.failures} == {"identity"}


def test_skip_cascade_fails_on_the_cascade(tmp_path):
    result = gate.evaluate(write_run(tmp_path / "run", ckpt_verdict(skip_cascade=True)))
    assert result.exit_code == EXIT_CHECK_FAILED
    assert {c.check for c in result.failures} == {"cascade"}
    # ckpt.yaml declares the cascade: its expectations fail, not only the default rule
    assert ("reference.defaults.A-B-C", 1) in _declared_cascade_failures(result)


def _declared_cascade_failures(result: gate.GateResult) -> set[tuple[str, int]]:
    """(cell, turn) of each failed `cascade: true` expectation of the matrix."""
    return {(c.cell_id, c.turn) for c in result.failures
            if c.check == "cascade" and c.source.startswith("expectation ")}


def test_a_waived_cascade_is_not_a_failure(tmp_path):
    """The same broken engine, with the matrix's `cascade: true` turned to `false` everywhere
    and a waiver for the remaining turns: the gate has nothing left to fail on."""
    data = yaml.safe_load(CKPT_MATRIX.read_text())
    for x in data["expectations"]:
        x.pop("cascade", None)
    data["expectations"].append({"cascade": False, "description": "this fork keeps its checkpoints"})
    matrix = tmp_path / "ckpt-waived.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    run = write_run(tmp_path / "run", ckpt_verdict(skip_cascade=True), matrix_path=matrix)
    result = gate.evaluate(run)
    assert result.exit_code == EXIT_QUALIFIED, result.summary()
    assert not [c for c in result.checks if c.check == "cascade"]


def test_control_mismatch_fails_as_inconclusive(tmp_path):
    result = gate.evaluate(write_run(tmp_path / "run", ckpt_verdict(control_mismatch=True)))
    assert result.exit_code == EXIT_CHECK_FAILED
    assert {c.status for c in result.failures} == {CheckStatus.INCONCLUSIVE}


def test_a_cell_that_never_started_is_an_infrastructure_failure(tmp_path):
    result = gate.evaluate(write_run(tmp_path / "run", ckpt_verdict(failed_cell="reference.defaults.A-C")))
    assert result.exit_code == EXIT_INFRASTRUCTURE
    assert "infrastructure" in result.summary()


def test_infrastructure_failure_takes_precedence_over_a_failed_check(tmp_path):
    verdict = ckpt_verdict(stale_restore=True, failed_cell="reference.defaults.A-C")
    result = gate.evaluate(write_run(tmp_path / "run", verdict))
    assert result.exit_code == EXIT_INFRASTRUCTURE
    assert {c.check for c in result.failures if c.status is CheckStatus.FAIL} == {"identity"}


def test_a_planned_cell_missing_from_the_records_is_an_infrastructure_failure(tmp_path):
    verdict = ckpt_verdict()
    run = write_run(tmp_path / "run", verdict)
    data = json.loads((run / "verdicts.json").read_text())
    data["cells"] = data["cells"][:-1]
    (run / "verdicts.json").write_text(json.dumps(data))
    assert gate.evaluate(run).exit_code == EXIT_INFRASTRUCTURE


def test_a_planned_run_without_any_cell_record_is_an_infrastructure_failure(tmp_path):
    run = write_run(tmp_path / "run", ckpt_verdict())
    (run / "verdicts.json").unlink()
    result = gate.evaluate(run)
    assert result.exit_code == EXIT_INFRASTRUCTURE
    assert {c.status for c in result.failures} == {CheckStatus.ERROR}
    assert len([c for c in result.failures if c.check == "ran"]) == 24


def test_usage_errors_exit_2(tmp_path):
    assert gate.evaluate(tmp_path / "missing").exit_code == EXIT_USAGE
    (tmp_path / "empty").mkdir()
    result = gate.evaluate(tmp_path / "empty")
    assert result.exit_code == EXIT_USAGE and "matrix.yaml" in result.error


def test_an_unreadable_matrix_exits_2(tmp_path):
    run = write_run(tmp_path / "run", ckpt_verdict())
    (run / "matrix.yaml").write_text("version: 1\nname: [unclosed\n")
    result = gate.evaluate(run)
    assert result.exit_code == EXIT_USAGE and "matrix.yaml" in result.error


def test_an_invalid_matrix_exits_2(tmp_path):
    run = write_run(tmp_path / "run", ckpt_verdict())
    text = (run / "matrix.yaml").read_text().replace("min_reused: 2048", "min_reused: lots")
    (run / "matrix.yaml").write_text(text)
    result = gate.evaluate(run)
    assert result.exit_code == EXIT_USAGE and "min_reused" in result.error


def test_a_newer_verdicts_schema_exits_2(tmp_path):
    run = write_run(tmp_path / "run", ckpt_verdict())
    data = json.loads((run / "verdicts.json").read_text())
    data["schema_version"] = 99
    (run / "verdicts.json").write_text(json.dumps(data))
    assert gate.evaluate(run).exit_code == EXIT_USAGE


def test_a_corrupt_cell_record_exits_2(tmp_path):
    run = write_run(tmp_path / "run", ckpt_verdict())
    cell = run / "cells" / "reference.defaults.A-C"
    cell.mkdir(parents=True)
    (cell / "meta.json").write_text("{not json")
    result = gate.evaluate(run)
    assert result.exit_code == EXIT_USAGE and "meta.json" in result.error


def test_main_prints_a_compact_summary(tmp_path):
    out = io.StringIO()
    code = gate.main(write_run(tmp_path / "run", ckpt_verdict(stale_restore=True)), out)
    text = out.getvalue()
    assert code == 1
    assert "not qualified" in text and "FAIL" in text and "reference.policy0.A-C turn 1 (C)" in text
    assert len(text.splitlines()) <= 25


def test_help_documents_every_exit_code():
    for code in ("0  qualified", "1  a check failed", "2  usage or matrix error", "3  infrastructure failure"):
        assert code in gate.GATE_HELP
        assert code in gate.__doc__


# ---------------------------------------------------------------- end to end on real engines


def _narrowed_matrix(tmp_path: Path, configuration: str) -> Path:
    """matrices/ckpt.yaml restricted to one configuration (and its expectations), to save CPU."""
    data = yaml.safe_load(CKPT_MATRIX.read_text())
    data["cells"] = {"include": [{"configuration": configuration, "sequence": s}
                                 for s in ("A-C", "A-B-C", "first-round") if
                                 configuration == "policy0" or s != "first-round"]}
    data["expectations"] = [x for x in data["expectations"]
                            if fnmatch.fnmatchcase(configuration, x.get("configuration", "*"))]
    path = tmp_path / f"ckpt-{configuration}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(matrix: Path, out: Path, *faults: str) -> int:
    from shadowlab.cli import main

    jobs = min(2, len(os.sched_getaffinity(0)))  # one core per cell; halves CI wall time on 2 cores
    args = ["run", str(matrix), "--out", str(out), "--jobs", str(jobs)]
    for fault in faults:
        args += ["--fault", fault]
    return main(args)


@pytest.mark.slow
def test_ckpt_yaml_on_the_reference_engine_qualifies(tmp_path):
    code = _run(CKPT_MATRIX, tmp_path / "run")
    result = gate.evaluate(tmp_path / "run")
    assert result.failures == (), result.summary()
    assert code == result.exit_code == EXIT_QUALIFIED
    assert (tmp_path / "run" / "report.html").is_file()
    # the declared cascade was judged on the real engine's log, and it erased something
    declared = [c for c in result.checks if c.check == "cascade" and c.source.startswith("expectation ")]
    assert len(declared) == 13 and all(c.passed for c in declared)
    b = next(c for c in declared if (c.cell_id, c.turn) == ("reference.policy0.A-B-C", 1))
    assert b.message.startswith("4 checkpoint(s) erased by the cascade, none missed"), b.message


@pytest.mark.slow
def test_stale_restore_engine_fails_the_gate_on_identity(tmp_path):
    code = _run(_narrowed_matrix(tmp_path, "policy0"), tmp_path / "run", "stale-restore")
    result = gate.evaluate(tmp_path / "run")
    assert code == result.exit_code == EXIT_CHECK_FAILED, result.summary()
    failed = {(c.check, c.cell_id) for c in result.failures}
    assert ("identity", "reference.policy0.A-C") in failed
    assert {c for c, _ in failed} <= {"identity", "cascade", "outcome", "min_reused", "min_saved_fraction"}


@pytest.mark.slow
def test_skip_cascade_engine_fails_the_gate_on_the_expectations(tmp_path):
    code = _run(_narrowed_matrix(tmp_path, "policy0"), tmp_path / "run", "skip-cascade")
    result = gate.evaluate(tmp_path / "run")
    assert code == result.exit_code == EXIT_CHECK_FAILED, result.summary()
    assert {c.check for c in result.failures} == {"cascade"}, result.summary()
    # the failing checks are the matrix's declared `cascade: true` expectations (per turn), not
    # only the built-in default rule (per cell)
    assert _declared_cascade_failures(result) == {("reference.policy0.A-C", 1), ("reference.policy0.A-B-C", 1),
                                                  ("reference.policy0.A-B-C", 2),
                                                  ("reference.policy0.first-round", 1)}, result.summary()
    c = next(c for c in result.failures if c.source.startswith("expectation ") and c.cell_id == "reference.policy0.A-C")
    assert "pos_max 4043, 4095, 4555" in c.message and c.description


TINY_MATRIX = """
version: 1
name: tiny
engines:
  reference: {kind: reference, model: {preset: tiny, seed: 0}, flags: [-c, 1024, -np, 1, -cram, 0]}
prompts:
  A: {kind: random, tokens: 96, seed: 1}
  C: {kind: diverge, from: A, shared: 48, tokens: 100, seed: 2}
sequences:
  A-C: [A, C]
generation: {n_predict: 4}
identity: {control: false}
"""


@pytest.mark.slow
def test_an_engine_that_dies_mid_cell_is_an_infrastructure_failure(tmp_path):
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(TINY_MATRIX)
    code = _run(matrix, tmp_path / "run", "crash-after-requests=1")
    result = gate.evaluate(tmp_path / "run")
    assert code == result.exit_code == EXIT_INFRASTRUCTURE, result.summary()
    assert ("ran", "reference.default.A-C") in {(c.check, c.cell_id) for c in result.failures
                                                 if c.status is CheckStatus.ERROR}


def test_the_exit_codes_have_one_home_and_the_gate_never_imports_the_command_line():
    import ast

    from shadowlab import cli, exitcodes

    tree = ast.parse(Path(gate.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "shadowlab.cli" not in imported and "shadowlab.exitcodes" in imported
    for name in ("EXIT_QUALIFIED", "EXIT_CHECK_FAILED", "EXIT_USAGE", "EXIT_INFRASTRUCTURE"):
        assert getattr(gate, name) is getattr(exitcodes, name) is getattr(cli, name)
    assert gate.GATE_HELP is exitcodes.GATE_HELP and cli.EPILOG is exitcodes.EPILOG
