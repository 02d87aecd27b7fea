"""Issue 14 on interleaved traffic, live: matrices/traffic.yaml's declared budgets and scale fail
POLICY=0 (extra checkpoints, nothing saved: every interloper erases them) and pass the affinity
fix, and `shadowlab compare` puts the recovered share of the ideal side by side.

The run is matrices/traffic.yaml itself (its traffic shape, engine flags, baseline, budgets and
scale as declared) on the reference engine, reduced for time to the three configurations the
claim is about and without the cold-vs-cold control (identity is not what is judged here).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from shadowlab import cli, compare
from shadowlab.judge import budgets, gate
from shadowlab.report import decision
from shadowlab.results import rundir
from shadowlab.judge.verdicts import traffic_summary

TRAFFIC = Path(__file__).resolve().parents[2] / "matrices" / "traffic.yaml"
KEPT = ("baseline", "policy0", "affinity")


def reduced_matrix(path: Path, budgets: list[dict] | None = None) -> Path:
    """traffic.yaml with only KEPT configurations (their expectations kept) and no control."""
    doc = yaml.safe_load(TRAFFIC.read_text(encoding="utf-8"))
    doc["configurations"] = {k: v for k, v in doc["configurations"].items() if k in KEPT}
    doc["expectations"] = [e for e in doc["expectations"] if e.get("configuration", "baseline") in KEPT]
    doc["identity"] = {**doc["identity"], "control": False}
    if budgets is not None:
        doc["budgets"] = budgets
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def traffic_run(tmp_path_factory) -> tuple[int, Path]:
    tmp = tmp_path_factory.mktemp("budgets-traffic")
    code = cli.main(["run", str(reduced_matrix(tmp / "traffic.yaml")), "--out", str(tmp / "run")])
    return code, tmp / "run"


def _budgets(result: gate.GateResult) -> dict[str, object]:
    return {c.subject: c for c in result.checks if c.check == "budget"}


def test_the_declared_budgets_fail_policy0_under_traffic_and_pass_the_affinity_fix(traffic_run):
    code, run = traffic_run
    result = gate.evaluate(run)
    assert code == result.exit_code == 1
    found = _budgets(result)
    assert set(found) == {"baseline traffic", "policy0 traffic", "affinity traffic"}
    assert found["baseline traffic"].passed  # against itself: nothing saved, nothing spent
    policy0, affinity = found["policy0 traffic"], found["affinity traffic"]
    assert not policy0.passed and "(saved 0 ms, spent" in policy0.message and "< budget 0" in policy0.message
    assert affinity.passed, affinity.message
    # Nothing but the budget condemns POLICY=0: the run is healthy otherwise.
    assert [c.subject for c in result.checks if not c.passed] == ["policy0 traffic"]
    costs = {c.configuration: c for c in budgets_costs(run)}
    # POLICY=0 adds checkpoints on one shared slot and saves nothing: the interlopers erase them.
    assert costs["policy0"].created > costs["policy0"].baseline_created and costs["policy0"].saved_tokens == 0
    assert costs["affinity"].saved_tokens > 0 and costs["affinity"].net_ms > 0


def budgets_costs(run: Path) -> tuple[budgets.Cost, ...]:
    loaded = rundir.load(run)
    return budgets.costs(loaded, gate.judge(loaded))


def test_the_same_run_passes_when_the_budget_selects_only_the_affinity_fix(traffic_run, tmp_path):
    """The failure above is the budget's doing: the same records, judged under a matrix whose
    budget covers only affinity, qualify (matrix.yaml of the run directory rewritten)."""
    _, run = traffic_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    reduced_matrix(copy / "matrix.yaml", budgets=[{"configuration": "affinity", "min_net_benefit_ms": 0}])
    result = gate.evaluate(copy)
    assert result.exit_code == 0, [c.message for c in result.checks if not c.passed]
    assert list(_budgets(result)) == ["affinity traffic"]


def test_compare_shows_the_recovered_share_of_the_ideal_with_its_delta(traffic_run, capsys):
    _, run = traffic_run
    loaded = rundir.load(run)
    verdict = gate.judge(loaded)
    shares = {c.configuration: traffic_summary(c)[3] for c in verdict.cells if c.kind == "warm"}
    result = compare.compare_configurations(loaded, verdict, "baseline", "affinity")
    d = result.row("cell", result.rows[0].name).delta("recovered_share")
    assert (d.baseline, d.candidate) == (pytest.approx(shares["baseline"]), pytest.approx(shares["affinity"]))
    assert d.delta == pytest.approx(shares["affinity"] - shares["baseline"]) and d.delta > 0
    assert d.judgement == "gain" and d.band is None  # one repeat: an exact count, no band
    assert result.row("kind", "traffic").delta("recovered_share").candidate == pytest.approx(shares["affinity"])
    # the time to first token per turn, from the records (streamed: timed at the first token)
    ttft = {m.cell["configuration"]: [t.ttft_ms for t in m.turns] for m in loaded.metas.values() if m.cell["kind"] == "warm"}
    assert result.rows[0].delta("ttft_ms").baseline == pytest.approx(sum(ttft["baseline"]) / len(ttft["baseline"]))
    assert cli.main(["compare", str(run), str(run), "--baseline-config", "baseline",
                     "--candidate-config", "policy0"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "recovered share of the ideal" in ln)
    assert f"{shares['baseline']:.1%}" in line and line.rstrip().endswith("same")


def test_a_cell_without_ideals_has_no_recovered_share():
    cell_row = compare.Figures({"reused_tokens": 5.0}, turns=2)
    share = next(m for m in compare.METRICS if m.name == "recovered_share")
    assert cell_row.value(share) is None
    assert compare.Figures({"recovered_share": 3.0, "ideal_tokens": 4.0}, turns=2).value(share) == 0.75
    assert compare.Figures({"recovered_share": 0.0, "ideal_tokens": 0.0}, turns=2).value(share) is None


def test_the_decision_names_the_traffic_and_its_recovered_share(traffic_run):
    _, run = traffic_run
    inputs = gate.load_run(run)
    found = {d.configuration: d for d in decision.decisions(inputs, gate.evaluate_inputs(inputs))}
    verdict = inputs.verdict
    share = {c.configuration: traffic_summary(c)[3] for c in verdict.cells if c.kind == "warm"}
    (line,) = found["affinity"].lines
    assert found["affinity"].verdict == "pass" and found["policy0"].verdict == "fail"
    assert line.traffic == "traffic (20 turns)" and line.gains
    assert f"recovers {share['affinity']:.1%} of the ideal (baseline {share['baseline']:.1%})" in line.gain
    assert "recovers 0.0% of the ideal" in found["policy0"].lines[0].gain and not found["policy0"].lines[0].gains
