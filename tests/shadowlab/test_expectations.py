"""Expectations and default checks judged against verdicts (no files, no engines)."""

from __future__ import annotations

import dataclasses

import pytest

from shadowlab.judge.expectations import CheckStatus, evaluate
from shadowlab.matrix import load, loads
from shadowlab.judge.verdicts import IdentityCheck, IdentityStatus, Outcome

from synthetic_runs import CKPT_MATRIX, ckpt_verdict, with_turn

MATRIX = load(CKPT_MATRIX)


def failed(results, check=None):
    return [r for r in results if r.status.failed and (check is None or r.check == check)]


def declared(results):
    return [r for r in results if r.source != "default"]


def test_reference_behaviour_meets_every_expectation_of_ckpt_yaml():
    results = evaluate(MATRIX, ckpt_verdict())
    assert failed(results) == []
    # every expectation entry produced at least one result, and none is vacuous
    sources = {r.source.split(" (")[0] for r in declared(results)}
    assert sources == {f"expectation {i}" for i in range(1, len(MATRIX.expectations) + 1)}


def test_outcome_expectation_fails_with_the_turn_context():
    verdict = with_turn(ckpt_verdict(), "reference.defaults.A-C", 1, outcome=Outcome.RESTORED)
    (bad,) = failed(evaluate(MATRIX, verdict))
    assert (bad.check, bad.cell_id, bad.turn, bad.status) == ("outcome", "reference.defaults.A-C", 1,
                                                              CheckStatus.FAIL)
    assert bad.expected == "forced" and bad.actual == "restored"
    assert "divergence 2531" in bad.message and "expectation 1" in bad.source


def test_min_reused_and_saved_fraction_fail_below_the_threshold():
    verdict = with_turn(ckpt_verdict(), "reference.policy0.A-C", 1, reused_tokens=1024, saved_fraction=0.207)
    bad = {r.check: r for r in failed(evaluate(MATRIX, verdict))}
    assert set(bad) == {"min_reused", "min_saved_fraction"}
    assert bad["min_reused"].actual == "1024" and bad["min_reused"].expected == "≥ 2048"
    assert bad["min_saved_fraction"].actual == "20.7%"


def test_unknown_reuse_is_a_failure_not_a_pass():
    verdict = with_turn(ckpt_verdict(), "reference.policy0.A-C", 1, reused_tokens=None, saved_fraction=None)
    assert {r.check for r in failed(evaluate(MATRIX, verdict))} == {"min_reused", "min_saved_fraction"}


def test_checkpoints_created_at_names_the_missing_positions():
    verdict = ckpt_verdict()
    turn = verdict.cell("reference.policy0.A-C").turns[0]
    kept = tuple(c for c in turn.created if c.pos_max != 2047)
    (bad,) = failed(evaluate(MATRIX, with_turn(verdict, "reference.policy0.A-C", 0, created=kept)))
    assert bad.check == "checkpoints_created_at" and "2047" in bad.message


def _small_matrix(expectations: str, identity: str = "") -> object:
    text = f"""
version: 1
name: small
engines:
  ref: {{kind: reference, model: {{preset: tiny, seed: 0}}}}
configurations: {{defaults: {{}}}}
prompts:
  A: {{kind: random, tokens: 4560, seed: 1}}
  C: {{kind: diverge, from: A, shared: 2531, tokens: 4947, seed: 2}}
sequences:
  A-C: [A, C]
{identity}
expectations:
{expectations}
"""
    return loads(text, check_files=False)


def _small_verdict(**faults):
    """ckpt's defaults A-C cell renamed to the small matrix's engine."""
    verdict = ckpt_verdict(**faults)
    cells = tuple(dataclasses.replace(c, cell_id=c.cell_id.replace("reference.", "ref."), engine="ref")
                  for c in verdict.cells if c.configuration == "defaults" and c.sequence in ("A-C", ""))
    return dataclasses.replace(verdict, cells=cells)


def test_max_forced_counts_forced_turns_of_the_cell():
    matrix = _small_matrix("  - {sequence: A-C, max_forced: 0}")
    (bad,) = failed(evaluate(matrix, _small_verdict()))
    assert (bad.check, bad.actual, bad.turn) == ("max_forced", "1", None)
    assert "turn 1 (C)" in bad.message
    matrix = _small_matrix("  - {sequence: A-C, max_forced: 1}")
    assert failed(evaluate(matrix, _small_verdict())) == []


def test_expectation_selection_globs_match_several_cells():
    results = evaluate(MATRIX, ckpt_verdict())
    policy0 = [r for r in declared(results) if r.source.startswith("expectation 5 ")]
    assert {r.cell_id for r in policy0} == {"reference.policy0.A-C", "reference.policy0_prompt_end.A-C"}


# ---------------------------------------------------------------- identity, control, cascade


def test_a_mismatch_after_reuse_fails_identity():
    results = evaluate(MATRIX, ckpt_verdict(stale_restore=True))
    bad = failed(results)
    assert bad and {r.check for r in bad} == {"identity"}
    assert {r.cell_id for r in bad} == {"reference.policy0.A-C", "reference.policy0_prompt_end.A-C",
                                        "reference.defaults.append"}
    assert all(r.status is CheckStatus.FAIL and "first differing token #3" in r.message for r in bad)


def test_identical_without_reuse_passes_but_says_it_proves_nothing():
    results = evaluate(MATRIX, ckpt_verdict())
    (r,) = [r for r in results if r.check == "identity" and r.cell_id == "reference.defaults.A-C"]
    assert r.passed and r.actual == "identical_no_reuse" and "no evidence" in r.message


def test_a_reused_turn_without_a_cold_reference_fails():
    ident = IdentityCheck(IdentityStatus.NO_REFERENCE, reused_tokens=2048)
    verdict = with_turn(ckpt_verdict(), "reference.policy0.A-C", 1, identity=ident)
    (bad,) = failed(evaluate(MATRIX, verdict))
    assert bad.check == "identity" and "no cold reference" in bad.message


def test_identity_not_required_drops_the_default_rule():
    matrix = dataclasses.replace(MATRIX, identity=dataclasses.replace(MATRIX.identity, required=False))
    results = evaluate(matrix, ckpt_verdict(stale_restore=True))
    assert failed(results) == [] and not [r for r in results if r.check == "identity"]


def test_identity_false_on_an_expectation_waives_those_turns_only():
    matrix = _small_matrix("  - {sequence: A-C, turn: C, identity: false}")
    verdict = _small_verdict()
    ident = IdentityCheck(IdentityStatus.MISMATCH, reference_cell="ref.defaults.cold.C", reused_tokens=0,
                          first_diff_token=0)
    broken = with_turn(verdict, "ref.defaults.A-C", 1, identity=ident)
    assert failed(evaluate(matrix, broken)) == []
    strict = _small_matrix("  - {sequence: A-C, turn: C, outcome: forced}")
    assert [r.check for r in failed(evaluate(strict, broken))] == ["identity"]


def test_identity_true_on_an_expectation_fails_without_a_comparison():
    matrix = _small_matrix("  - {sequence: A-C, turn: C, identity: true}")
    verdict = with_turn(_small_verdict(), "ref.defaults.A-C", 1, identity=None)
    (bad,) = failed(evaluate(matrix, verdict))
    assert bad.check == "identity" and bad.source.startswith("expectation 1")


def test_identity_true_over_every_turn_leaves_out_the_cold_first_turn_only():
    """`identity: true` without `turn`: the fresh process's cold first turn is the reference, not
    a turn to compare (it once failed every such expectation with "no cold reference"); every
    later turn is still held to it, and naming turn 0 explicitly still asks for a comparison."""
    matrix = _small_matrix("  - {sequence: A-C, identity: true}")
    verdict = _small_verdict()
    results = [r for r in evaluate(matrix, verdict) if r.source.startswith("expectation 1")]
    assert [r.turn for r in results] == [1] and failed(results) == []
    ident = IdentityCheck(IdentityStatus.MISMATCH, reference_cell="ref.defaults.cold.C", reused_tokens=10,
                          first_diff_token=0)
    broken = with_turn(verdict, "ref.defaults.A-C", 1, identity=ident)
    assert [(r.check, r.turn) for r in failed(evaluate(matrix, broken)) if r.source.startswith("expectation 1")] \
        == [("identity", 1)]
    explicit = _small_matrix("  - {sequence: A-C, turn: 0, identity: true}")
    (bad,) = failed(evaluate(explicit, verdict))
    assert (bad.check, bad.turn) == ("identity", 0) and "no cold reference" in bad.message


def test_control_mismatch_is_inconclusive_and_fails():
    bad = failed(evaluate(MATRIX, ckpt_verdict(control_mismatch=True)))
    assert bad and {(r.check, r.status) for r in bad} == {("control", CheckStatus.INCONCLUSIVE)}


def test_mismatch_flagged_inconclusive_by_verdicts_is_inconclusive():
    ident = IdentityCheck(IdentityStatus.MISMATCH, reference_cell="x", reused_tokens=2048, first_diff_token=1,
                          inconclusive=True)
    verdict = with_turn(ckpt_verdict(), "reference.policy0.A-C", 1, identity=ident)
    (bad,) = failed(evaluate(MATRIX, verdict))
    assert bad.status is CheckStatus.INCONCLUSIVE and "inconclusive" in bad.message


def test_skip_cascade_fails_the_cascade_check_per_cell():
    bad = failed(evaluate(MATRIX, ckpt_verdict(skip_cascade=True)))
    assert bad and {r.check for r in bad} == {"cascade"}
    by_cell = {r.cell_id: r for r in bad}
    assert "reference.policy0.A-C" in by_cell
    assert "turn 1: pos_max 4043, 4095, 4555" in by_cell["reference.policy0.A-C"].message
    # the append cell restores at the L-4 checkpoint and has nothing above it to erase
    assert "reference.defaults.append" not in by_cell


def _cascade(results):
    return [r for r in declared(results) if r.check == "cascade"]


def test_declared_cascade_passes_on_every_turn_ckpt_yaml_names():
    results = _cascade(evaluate(MATRIX, ckpt_verdict()))
    # 4 configurations x (A-C C, A-B-C B, A-B-C C) + first-round C_first_round
    assert len(results) == 13 and all(r.passed for r in results)
    assert {(r.cell_id, r.turn) for r in results} >= {("reference.policy0.A-C", 1), ("reference.defaults.A-B-C", 1),
                                                      ("reference.policy0.first-round", 1)}
    b = next(r for r in results if (r.cell_id, r.turn) == ("reference.defaults.A-B-C", 1))
    assert b.expected == "no stale checkpoint kept" and b.actual == "none kept"
    assert "2 checkpoint(s) erased by the cascade, none missed (re-entry point 0)" in b.message
    assert "its cascade erases every checkpoint of A" in b.description


def test_declared_cascade_fails_per_turn_with_the_kept_checkpoints():
    bad = _cascade(failed(evaluate(MATRIX, ckpt_verdict(skip_cascade=True))))
    by = {(r.cell_id, r.turn): r for r in bad}
    c = by["reference.policy0.A-C", 1]
    assert c.status is CheckStatus.FAIL and c.actual == "3 kept" and c.subject == "reference.policy0.A-C turn 1 (C)"
    assert "turn 1: pos_max 4043, 4095, 4555" in c.message
    number = 1 + next(i for i, x in enumerate(MATRIX.expectations)
                      if x.cascade and x.selection.configuration == "policy0*")
    assert c.source == f"expectation {number} (matrix line {MATRIX.expectations[number - 1].line})"
    b = by["reference.defaults.A-B-C", 1]
    assert b.actual == "2 kept" and "turn 1: pos_max 4043, 4555" in b.message
    # A-B-C turn C: B's checkpoint (and A's, never erased) kept as well
    assert ("reference.defaults.A-B-C", 2) in by
    # the append probe declares no cascade and has nothing to erase
    assert not any(cell == "reference.defaults.append" for cell, _ in by)


def test_cascade_false_waives_the_default_check_on_those_turns_only():
    broken = _small_verdict(skip_cascade=True)
    strict = _small_matrix("  - {sequence: A-C, turn: C, outcome: forced}")
    assert [(r.check, r.source) for r in failed(evaluate(strict, broken))] == [("cascade", "default")]
    waived = _small_matrix("  - {sequence: A-C, turn: C, outcome: forced, cascade: false}")
    results = evaluate(waived, broken)
    assert failed(results) == []
    (default,) = [r for r in results if r.check == "cascade"]  # still run on turn A, which kept nothing
    assert default.passed and default.source == "default" and default.message.startswith("0 checkpoint(s)")
    # waiving another turn leaves the default check on turn C
    other = _small_matrix("  - {sequence: A-C, turn: A, cascade: false}")
    (bad,) = failed(evaluate(other, broken))
    assert (bad.check, bad.source, bad.cell_id) == ("cascade", "default", "ref.defaults.A-C")


def test_cascade_true_on_a_turn_that_could_not_be_judged_fails():
    """The default rule passes quietly when the verdicts could not judge the cascade (no log,
    unknown re-entry); a declared `cascade: true` does not."""
    matrix = _small_matrix("  - {sequence: A-C, cascade: true}")  # every turn, the cold one included
    unjudged = with_turn(_small_verdict(), "ref.defaults.A-C", 1, cascade_checked=False, re_entry_point=None)
    (bad,) = failed(evaluate(matrix, unjudged))
    assert (bad.check, bad.turn, bad.actual) == ("cascade", 1, "unknown")
    assert bad.source.startswith("expectation 1") and "could not be judged" in bad.message
    results = _cascade(evaluate(matrix, _small_verdict()))
    assert [(r.turn, r.passed) for r in results] == [(0, True), (1, True)]
    assert "fresh slot" in results[0].message
    errored = with_turn(_small_verdict(), "ref.defaults.A-C", 1, outcome=Outcome.ERROR, cascade_checked=False,
                        error="HTTP 500: boom")
    assert "the turn failed: HTTP 500: boom" in next(r for r in _cascade(evaluate(matrix, errored))
                                                    if r.turn == 1).message


# ---------------------------------------------------------------- infrastructure


def test_a_failed_cell_is_an_error_for_its_run_and_its_expectations():
    results = evaluate(MATRIX, ckpt_verdict(failed_cell="reference.policy0.A-C"))
    bad = failed(results)
    assert {r.status for r in bad} == {CheckStatus.ERROR}
    assert {r.check for r in bad} >= {"ran", "outcome", "min_reused", "checkpoints_created_at"}
    assert all(r.cell_id == "reference.policy0.A-C" for r in bad)


def test_a_planned_cell_without_a_record_is_an_error():
    verdict = ckpt_verdict()
    partial = dataclasses.replace(verdict, cells=verdict.cells[1:])
    planned = [c.cell_id for c in verdict.cells]
    bad = failed(evaluate(MATRIX, partial, planned))
    missing = [r for r in bad if r.check == "ran"]
    assert len(missing) == 1 and missing[0].status is CheckStatus.ERROR
    assert missing[0].cell_id == verdict.cells[0].cell_id


def test_a_turn_answered_with_an_error_fails():
    verdict = with_turn(ckpt_verdict(), "reference.defaults.A-B-C", 1, outcome=Outcome.ERROR,
                        error="HTTP 400: invalid UTF-8 byte")
    bad = failed(evaluate(MATRIX, verdict))
    assert {r.check for r in bad} == {"answered", "outcome"}
    assert "invalid UTF-8" in next(r for r in bad if r.check == "answered").message


@pytest.mark.parametrize("status", [CheckStatus.FAIL, CheckStatus.INCONCLUSIVE, CheckStatus.ERROR])
def test_only_pass_is_not_failed(status):
    assert status.failed and not CheckStatus.PASS.failed
