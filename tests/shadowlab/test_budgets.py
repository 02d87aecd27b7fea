"""Budgets in the gate: a candidate's checkpoint cost against its measured benefit, vs the baseline.

The run is the synthetic one of synthetic_runs.py (matrices/ckpt.yaml on the reference engine's
placement, reduced to verdicts.json), judged under a matrix derived from ckpt.yaml that names the
production defaults as baseline and declares the case study's 35B scale."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from synthetic_runs import CKPT_MATRIX, ckpt_verdict, write_run

from shadowlab.judge import budgets, gate
from shadowlab.results import rundir
from shadowlab.errors import MatrixError
from shadowlab.matrix import loads
from shadowlab.judge.verdicts import RunVerdict

SCALE_35B = ("scale: {name: 35B, checkpoint_mib: 62.9, checkpoint_ms: 63, prompt_length_factor: 10, "
             "prefill_ms_per_token: 0.476}\n")


def _matrix(tmp_path: Path, budget: str, scale: str = SCALE_35B) -> Path:
    path = tmp_path / "budgeted.yaml"
    path.write_text(CKPT_MATRIX.read_text(encoding="utf-8") + "\nbaseline: defaults\nbudgets:\n" + budget + scale,
                    encoding="utf-8")
    return path


def _gate(tmp_path: Path, budget: str, verdict: RunVerdict | None = None, scale: str = SCALE_35B) -> gate.GateResult:
    run = write_run(tmp_path / "run", verdict or ckpt_verdict(), matrix_path=_matrix(tmp_path, budget, scale))
    return gate.evaluate(run)


def _budget_checks(result: gate.GateResult) -> dict[str, object]:
    return {c.subject: c for c in result.checks if c.check == "budget"}


CASE_STUDY_BUDGET = "  - {max_created_per_turn: 2, min_net_benefit_ms: 0}\n"


def test_policy0_fails_the_budget_naming_its_figures_while_the_defaults_pass(tmp_path):
    assert gate.evaluate(write_run(tmp_path / "plain", ckpt_verdict())).exit_code == 0  # no budget: qualified
    result = _gate(tmp_path, CASE_STUDY_BUDGET)
    assert result.exit_code == 1
    found = _budget_checks(result)
    assert all(found[s].passed for s in ("defaults A→C", "defaults A→B→C", "defaults A→A_append"))
    condemned = found["policy0 A→B→C"]
    assert not condemned.passed
    assert condemned.message == (
        "policy0 A→B→C: 3 checkpoints created per turn > budget 2; net benefit −840 ms per turn "
        "(saved 0 ms, spent 840 ms more than the baseline at 35B scale) < budget 0")
    assert "3.5 checkpoints created per turn > budget 2" in found["policy0 A→C"].message
    assert "policy0 C_first_round" not in " ".join(found)  # the baseline never runs first-round


def test_the_baseline_alone_under_the_same_budget_qualifies(tmp_path):
    result = _gate(tmp_path, "  - {configuration: defaults, max_created_per_turn: 2, min_net_benefit_ms: 0}\n")
    assert result.exit_code == 0
    assert len(_budget_checks(result)) == 3


def test_net_benefit_pays_for_policy0_in_isolation_but_not_behind_an_interloper(tmp_path):
    found = _budget_checks(_gate(tmp_path, "  - {configuration: policy0, min_net_benefit_ms: 0}\n"))
    isolated, interleaved = found["policy0 A→C"], found["policy0 A→B→C"]
    # A→C: 2,048 tokens over 2 turns × 10 × 0.476 ms saved; 1.5 extra checkpoints × 10 × 63 ms spent
    assert isolated.passed and "net benefit 3,929 ms per turn (saved 4,874 ms, spent 945 ms" in isolated.message
    assert not interleaved.passed and "net benefit −840 ms" in interleaved.message


def test_costs_at_scale_extrapolate_the_extra_checkpoints_and_without_a_scale_are_as_measured(tmp_path):
    run = rundir.load(write_run(tmp_path / "run", ckpt_verdict(), matrix_path=_matrix(tmp_path, CASE_STUDY_BUDGET)))
    cost = next(c for c in budgets.costs(run, gate.judge(run)) if c.label == "policy0 A→B→C")
    assert (cost.created, cost.baseline_created) == (3.0, 5 / 3)
    assert cost.created_at_scale == pytest.approx(5 / 3 + (3 - 5 / 3) * 10)
    assert cost.mib_at_scale == pytest.approx(cost.created_at_scale * 62.9)
    measured = rundir.load(write_run(tmp_path / "m", ckpt_verdict(), matrix_path=_matrix(tmp_path, CASE_STUDY_BUDGET, "")))
    plain = next(c for c in budgets.costs(measured, gate.judge(measured)) if c.label == "policy0 A→B→C")
    assert plain.scale is None and plain.created_at_scale == 3.0
    assert plain.ms_at_scale == pytest.approx(3.0 * 0.4) and plain.mib_at_scale == pytest.approx(3.0 * 0.032)


def test_a_cost_that_cannot_be_known_fails_the_budget(tmp_path):
    verdict = ckpt_verdict()
    blind = tuple(dataclasses.replace(c, reuse_source="api") if c.configuration == "policy0" else c
                  for c in verdict.cells)
    found = _budget_checks(_gate(tmp_path, CASE_STUDY_BUDGET, dataclasses.replace(verdict, cells=blind)))
    assert not found["policy0 A→C"].passed
    assert "? checkpoints created per turn" in found["policy0 A→C"].message
    assert budgets.UNKNOWN in found["policy0 A→C"].message


def test_a_saving_inside_the_noise_band_pays_for_nothing(tmp_path):
    verdict = ckpt_verdict()
    extra = []
    for cell in verdict.cells:
        if cell.cell_id in ("reference.defaults.A-C", "reference.policy0.A-C"):
            # a second repeat of each: policy0's reuses nothing this time (as the defaults')
            defaults = next(c for c in verdict.cells if c.cell_id == "reference.defaults.A-C")
            turns = tuple(dataclasses.replace(t, processed_tokens=o.processed_tokens)
                          for t, o in zip(cell.turns, defaults.turns))
            extra.append(dataclasses.replace(cell, cell_id=cell.cell_id + ".r2", turns=turns))
    noisy = RunVerdict(run_id="noisy", cells=verdict.cells + tuple(extra))
    result = _gate(tmp_path, "  - {configuration: policy0, min_net_benefit_ms: 0}\n", noisy)
    run = rundir.load(result.run_dir)
    cost = next(c for c in budgets.costs(run, gate.judge(run)) if c.label == "policy0 A→C")
    assert cost.repeats == (2, 2)  # median saving 1,024 tokens, band [-2,048, 0]: not significant
    assert cost.saved_tokens == 0
    found = _budget_checks(result)
    assert "saved 0 ms" in found["policy0 A→C"].message and not found["policy0 A→C"].passed


@pytest.mark.parametrize("tail, path, message", [
    ("baseline: nope\n", "baseline", "unknown configuration 'nope'"),
    ("budgets: [{max_created_per_turn: 2}]\n", "budgets", "none is named"),
    ("baseline: defaults\nbudgets: [{description: x}]\n", "budgets[0]", "at least one check"),
    ("baseline: defaults\nbudgets: [{max_created_per_turn: -1}]\n", "budgets[0].max_created_per_turn", "≥ 0"),
    ("scale: {checkpoint_ms: 63, checkpoint_ms_factor: 2}\n", "scale.checkpoint_ms_factor", "both given"),
    ("scale: {prompt_length_factor: 0}\n", "scale.prompt_length_factor", "expected a number > 0, got 0"),
])
def test_a_bad_budget_or_scale_is_named(tail, path, message):
    with pytest.raises(MatrixError) as err:
        loads(CKPT_MATRIX.read_text(encoding="utf-8") + tail, file="m.yaml")
    assert err.value.key_path == path and message in err.value.message
