"""The decision section of report.html / report.md: per candidate, gains, costs, traffic, verdict,
revisit conditions (the case study's DECISION block), only where the matrix names a baseline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synthetic_runs import ckpt_verdict, write_run
from test_budgets import CASE_STUDY_BUDGET, _matrix

from shadowlab import report
from shadowlab.report import decision
from shadowlab.judge import gate
from shadowlab.judge.verdicts import RunVerdict


def _decisions(run_dir: Path) -> dict[str, decision.Decision]:
    inputs = gate.load_run(run_dir)
    return {d.configuration: d for d in decision.decisions(inputs, gate.evaluate_inputs(inputs))}


def test_policy0_gains_only_in_isolation_fails_its_budget_and_says_when_to_revisit(tmp_path):
    found = _decisions(write_run(tmp_path / "run", ckpt_verdict(), matrix_path=_matrix(tmp_path, CASE_STUDY_BUDGET)))
    assert "defaults" not in found and set(found) == {"policy0", "prompt_end", "policy0_prompt_end"}
    policy0 = found["policy0"]
    assert policy0.verdict == "fail" and policy0.scale == "35B"
    isolated, interleaved = policy0.lines
    assert (isolated.traffic, isolated.gains, interleaved.gains) == ("A → C", True, False)
    assert isolated.gain.startswith("reuses +2,048 tokens")
    assert "15 per turn, 943 MiB, 945 ms at 35B" in interleaved.cost
    assert any("net benefit −840 ms" in m for m in policy0.condemned)
    assert policy0.revisit[0].startswith("gains appear only on A → C (none on A → B → C)")
    assert found["prompt_end"].revisit[0].startswith("no reuse gained on any sequence")


def test_a_gain_inside_the_noise_band_is_said_not_significant(tmp_path):
    verdict = ckpt_verdict()
    slower = [dataclasses.replace(c, cell_id=c.cell_id + ".r2", turns=tuple(
                  dataclasses.replace(t, prefill_ms=t.prefill_ms * 1.5) for t in c.turns))
              for c in verdict.cells if c.cell_id in ("reference.defaults.A-C", "reference.policy0.A-C")]
    run = write_run(tmp_path / "run", RunVerdict(run_id="r", cells=verdict.cells + tuple(slower)),
                    matrix_path=_matrix(tmp_path, CASE_STUDY_BUDGET))
    isolated = _decisions(run)["policy0"].lines[0]
    assert "prefill −" in isolated.gain and "ms (not significant)" in isolated.gain


def test_report_md_and_html_carry_the_section_only_with_a_baseline(tmp_path):
    plain = write_run(tmp_path / "plain", ckpt_verdict())
    report.render_run(plain)
    assert "Decision" not in (plain / "report.md").read_text() and 'id="decision"' not in (plain / "report.html").read_text()
    run = write_run(tmp_path / "run", ckpt_verdict(), matrix_path=_matrix(tmp_path, CASE_STUDY_BUDGET))
    report.render_run(run)
    md, html = (run / "report.md").read_text(), (run / "report.html").read_text()
    assert "**policy0** vs baseline **defaults** — verdict: **fail** (costs at 35B scale)" in md
    assert "- revisit: gains appear only on A → C" in md
    assert 'id="decision"' in html and "vs baseline <code>defaults</code>" in html
