"""`repeat: N`: every warm cell N times in fresh processes, ids suffixed only when N > 1, and the
repeats are what `shadowlab compare` takes its noise band from."""

from __future__ import annotations

import dataclasses

import pytest
from synthetic_runs import CKPT_MATRIX, ckpt_verdict, write_run

from shadowlab import compare
from shadowlab.results import rundir
from shadowlab.errors import MatrixError
from shadowlab.matrix import load, loads
from shadowlab.plan import build_plan
from shadowlab.judge.verdicts import RunVerdict

TEXT = CKPT_MATRIX.read_text(encoding="utf-8")


def test_repeat_1_plans_and_dumps_exactly_as_a_matrix_without_it():
    plain = load(CKPT_MATRIX)
    once = loads(TEXT + "repeat: 1\n", file=str(CKPT_MATRIX), base_dir=CKPT_MATRIX.parent)
    assert build_plan(once).to_dict() == build_plan(plain).to_dict()
    assert "repeat" not in plain.to_dict() and "repeat" not in once.to_dict()


def test_repeat_3_runs_each_warm_cell_three_times_and_each_reference_once():
    plain, thrice = build_plan(load(CKPT_MATRIX)), build_plan(loads(TEXT + "repeat: 3\n", file="m.yaml"))
    warm = [c.id for c in plain.cells if c.kind.value == "warm"]
    assert [c.id for c in thrice.cells if c.kind.value == "warm"] == [f"{w}.r{k}" for w in warm for k in (1, 2, 3)]
    others = [c for c in plain.cells if c.kind.value != "warm"]
    assert [c for c in thrice.cells if c.kind.value != "warm"] == others
    assert all(t.cold_cell in {c.id for c in others} for c in thrice.cells for t in c.turns if t.cold_cell)


@pytest.mark.parametrize("value, message", [(0, "≥ 1"), (101, "too large"), ("two", "expected an integer")])
def test_a_bad_repeat_is_named(value, message):
    with pytest.raises(MatrixError) as err:
        loads(TEXT + f"repeat: {value}\n", file="m.yaml")
    assert err.value.key_path == "repeat" and message in err.value.message


def test_compare_takes_the_repeats_of_a_repeated_plan_as_one_figure(tmp_path):
    """Cells `<id>.r1` … `<id>.rN` key alike: N repeats a side, and a timed delta inside their
    band is not significant while the exact reuse count stays a gain."""
    verdict = ckpt_verdict()
    cells = []
    for cell in verdict.cells:
        if cell.kind != "warm":
            cells.append(cell)
            continue
        for k, factor in enumerate((1.0, 1.4, 0.7), start=1):
            turns = tuple(dataclasses.replace(t, prefill_ms=t.prefill_ms * factor) for t in cell.turns)
            cells.append(dataclasses.replace(cell, cell_id=f"{cell.cell_id}.r{k}", turns=turns))
    run = rundir.load(write_run(tmp_path / "rep", RunVerdict(run_id="rep", cells=tuple(cells))))
    row = compare.compare(run, run, baseline_configuration="defaults", candidate_configuration="policy0",
                          allow=("unverified",)).row("cell", "reference.A-C (A → C)")
    assert row.repeats == (3, 3)
    assert row.delta("prefill_ms").judgement == "not significant"
    assert row.delta("reused_tokens").judgement == "gain"
