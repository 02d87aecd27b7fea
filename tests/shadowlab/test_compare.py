"""shadowlab compare: deltas judged against the run-to-run noise, matching, and refusals.

Run directories are the synthetic ones of synthetic_runs.py (matrices/ckpt.yaml on the reference
engine's placement, reduced to verdicts.json: no cell records)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from synthetic_runs import CKPT_MATRIX, ckpt_verdict, write_run

from shadowlab import cli, compare
from shadowlab.results import rundir
from shadowlab.errors import CompareRefused
from shadowlab.judge.verdicts import RunVerdict

PREFILL = next(m for m in compare.METRICS if m.name == "prefill_ms")
CREATED = next(m for m in compare.METRICS if m.name == "created")


def test_a_delta_inside_the_noise_band_is_not_significant():
    d = compare.judge(PREFILL, [100.0, 140.0, 120.0], [90.0, 130.0, 110.0])
    # Welch: standard error √(400/3 + 400/3) = 16.33 with 4 degrees of freedom, t(99 %) = 4.604
    assert d.delta == -10.0 and d.band == pytest.approx((-10 - 75.19, -10 + 75.19), abs=0.01)
    assert d.judgement == "not significant"


def test_a_delta_inside_the_band_is_never_a_gain_or_a_loss_whatever_its_size():
    for shift in (-30.0, -10.0, 0.5, 25.0):
        base = [100.0, 140.0, 120.0, 95.0]
        cand = [v + shift for v in (130.0, 90.0, 125.0, 100.0)]
        d = compare.judge(PREFILL, base, cand)
        assert d.band[0] <= 0 <= d.band[1] and d.delta != 0
        assert d.judgement == "not significant"


def test_the_band_narrows_as_the_repeats_grow():
    """The same noise (a repeating ±10 % pattern) around a 5 % saving: the band shrinks as 1/√N,
    and only enough repeats make the saving a gain."""
    pattern = (1.10, 0.90, 1.05, 0.95, 1.0)
    widths, judgements = [], []
    for n in (2, 3, 5, 10, 40):
        base = [100.0 * pattern[i % 5] for i in range(n)]
        cand = [95.0 * pattern[(i + 2) % 5] for i in range(n)]
        d = compare.judge(PREFILL, base, cand)
        widths.append(d.band[1] - d.band[0])
        judgements.append(d.judgement)
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0] / 10
    assert judgements[0] == "not significant" and judgements[-1] == "gain"


def test_a_delta_outside_the_noise_band_is_a_gain_or_a_loss():
    assert compare.judge(PREFILL, [100.0, 102.0, 101.0], [50.0, 51.0, 50.5]).judgement == "gain"
    assert compare.judge(PREFILL, [50.0, 51.0, 50.5], [100.0, 102.0, 101.0]).judgement == "loss"
    # two repeats a side leave one degree of freedom (t = 63.7): the same halving is not yet shown
    assert compare.judge(PREFILL, [100.0, 102.0], [50.0, 51.0]).judgement == "not significant"


def test_one_repeat_of_a_timed_figure_has_no_noise_band():
    d = compare.judge(PREFILL, [100.0], [10.0])
    assert d.band is None and d.judgement == compare.NO_BAND


def test_an_exact_count_is_judged_without_repeats():
    assert compare.judge(CREATED, [2.0], [3.5]).judgement == "loss"
    assert compare.judge(CREATED, [2.0], [2.0]).judgement == "same"
    assert compare.judge(CREATED, [2.0, None], [2.0]).judgement == "unknown"


@pytest.fixture()
def reduced(tmp_path: Path) -> Path:
    return write_run(tmp_path / "ckpt", ckpt_verdict())


def _policy0_vs_defaults(path: Path, **kw) -> compare.Comparison:
    run = rundir.load(path)
    return compare.compare(run, run, baseline_configuration="defaults", candidate_configuration="policy0",
                           allow=("unverified",), **kw)


def _value(row: compare.Row, metric: str) -> compare.Delta:
    return next(d for d in row.deltas if d.metric == metric)


def test_policy0_gains_in_isolation_nothing_under_an_interloper_and_costs_checkpoints(reduced):
    result = _policy0_vs_defaults(reduced)
    isolated = result.row("cell", "reference.A-C (A → C)")
    assert _value(isolated, "reused_tokens").delta == 2048
    assert _value(isolated, "reused_tokens").judgement == "gain"
    interleaved = result.row("cell", "reference.A-B-C (A → B → C)")
    assert _value(interleaved, "reused_tokens").judgement == "same"
    assert _value(interleaved, "created").judgement == "loss"  # policy0's extra checkpoints
    assert [r.name for r in result.rows if r.scope != "cell"] == ["ordered", "overall"]
    assert "reference.defaults.append (A → A_append)" not in result.unmatched  # keyed without configuration
    assert "reference.append (A → A_append)" in result.unmatched


def test_repeats_give_a_band_that_keeps_a_small_timing_difference_not_significant(tmp_path):
    verdict = ckpt_verdict()
    extra = []
    for cell in verdict.cells:
        if cell.cell_id in ("reference.defaults.A-C", "reference.policy0.A-C"):
            # a second repeat whose prefill took 30 % longer: noise larger than policy0's saving
            slower = tuple(dataclasses.replace(t, prefill_ms=t.prefill_ms * 1.3) for t in cell.turns)
            extra.append(dataclasses.replace(cell, cell_id=cell.cell_id + ".r2", turns=slower))
    path = write_run(tmp_path / "rep", RunVerdict(run_id="rep", cells=verdict.cells + tuple(extra)))
    row = _policy0_vs_defaults(path).row("cell", "reference.A-C (A → C)")
    assert row.repeats == (2, 2)
    assert _value(row, "prefill_ms").judgement == "not significant"
    assert _value(row, "reused_tokens").judgement == "gain"  # the same in every repeat: band [0, 0] excluded


def test_a_run_without_records_is_refused_until_told_naming_why(reduced, capsys):
    code = cli.main(["compare", str(reduced), str(reduced), "--baseline-config", "defaults",
                     "--candidate-config", "policy0"])
    assert code == 2
    assert "no cell records" in capsys.readouterr().err
    assert cli.main(["compare", str(reduced), str(reduced), "--baseline-config", "defaults",
                     "--candidate-config", "policy0", "--allow", "unverified", "--json"]) == 0
    assert '"judgement": "gain"' in capsys.readouterr().out


def test_runs_of_different_prompts_are_refused_naming_the_prompt(tmp_path, capsys):
    base = write_run(tmp_path / "base", ckpt_verdict())
    other = tmp_path / "other.yaml"
    text = CKPT_MATRIX.read_text(encoding="utf-8")
    assert "    seed: 2\n" in text
    other.write_text(text.replace("    seed: 2\n", "    seed: 7\n"), encoding="utf-8")
    cand = write_run(tmp_path / "cand", ckpt_verdict(), matrix_path=other)
    args = ["compare", str(base), str(cand), "--allow", "unverified"]
    assert cli.main(args) == 2
    assert "prompt 'C'" in capsys.readouterr().err
    assert cli.main([*args, "--allow", "prompts"]) == 0


def _with_build(binary: str) -> rundir.RunDir:
    meta = SimpleNamespace(engine=SimpleNamespace(name="reference", binary_sha256=binary, model_sha256="m" * 64),
                           turns=[])
    return rundir.RunDir(root=Path("run"), matrix=None, metas={"c": meta})


def test_runs_of_different_engine_builds_are_refused_naming_the_engine():
    found = compare.differences(_with_build("a" * 64), _with_build("b" * 64))
    assert found == [("engine", "engine 'reference': binary aaaaaaaaaaaa, model mmmmmmmmmmmm "
                                "vs binary bbbbbbbbbbbb, model mmmmmmmmmmmm")]
    assert compare.differences(_with_build("a" * 64), _with_build("a" * 64)) == []
    with pytest.raises(CompareRefused, match="engine 'reference'"):
        compare.compare(_with_build("a" * 64), _with_build("b" * 64))


def test_an_unknown_allow_is_a_usage_error(reduced, capsys):
    assert cli.main(["compare", str(reduced), str(reduced), "--allow", "everything"]) == 2
    assert "--allow 'everything'" in capsys.readouterr().err


def test_checkpoints_of_a_cell_without_its_log_are_unknown_not_zero(reduced):
    verdict = ckpt_verdict()
    cell = next(c for c in verdict.cells if c.cell_id == "reference.policy0.A-C")
    figures = compare.cell_figures(dataclasses.replace(cell, reuse_source="api"), None)
    assert figures.value(CREATED) is None
    assert figures.value(PREFILL) == compare.cell_figures(cell, None).value(PREFILL)
    assert compare.cell_figures(cell, None).value(CREATED) == 3.5
