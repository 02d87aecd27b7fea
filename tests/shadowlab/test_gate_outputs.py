"""What the gate says, and that it says it once: per-candidate verdicts, `--gate-candidate`,
`gate --json`, the gate line without its subject twice, one count of failures (gate line, report,
junit.xml), and `compare` on a one-cell run printing its table once.

Each verdict is shown failing on a broken engine: the synthetic case-study run with the reference
engine's `stale-restore` fault (synthetic_runs.py: restored turns differ from cold), the stored
traffic run (tests/fixtures/runs/docs/traffic: POLICY=0 fails its budget on the real reference
engine), and, marked slow, a real run in which one candidate's engine carries the fault.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from shadowlab import cli, compare, present
from shadowlab.exitcodes import EXIT_CHECK_FAILED, EXIT_QUALIFIED, EXIT_USAGE
from shadowlab.judge import gate
from shadowlab.report import CELL_ERRORS, render_run
from shadowlab.results import rundir

from synthetic_runs import ckpt_verdict, write_run

REPO = Path(__file__).resolve().parents[2]

STORED = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "runs" / "docs"


@pytest.fixture()
def stale(tmp_path) -> Path:
    """The case study's run on an engine that restores one token late (policy0 and
    policy0_prompt_end restore, so their warm turns differ from cold; prompt_end never restores)."""
    return write_run(tmp_path / "stale", ckpt_verdict(stale_restore=True))


@pytest.fixture()
def traffic(tmp_path) -> Path:
    run = tmp_path / "traffic"
    run.mkdir()
    for piece in (STORED / "traffic").iterdir():
        if piece.suffix == ".gz":
            (run / piece.stem).write_bytes(gzip.decompress(piece.read_bytes()))
        else:
            shutil.copy(piece, run / piece.name)
    return run


def _verdicts(result: gate.GateResult) -> dict[str, str]:
    return {c.configuration: c.status for c in result.candidates}


def test_each_candidate_gets_its_own_verdict(stale, tmp_path):
    result = gate.evaluate(stale)
    assert result.exit_code == EXIT_CHECK_FAILED
    assert _verdicts(result) == {"defaults": "fail", "policy0": "fail", "prompt_end": "pass",
                                 "policy0_prompt_end": "fail"}
    good = gate.evaluate(write_run(tmp_path / "good", ckpt_verdict()))
    assert set(_verdicts(good).values()) == {"pass"}
    policy0 = next(c for c in result.candidates if c.configuration == "policy0")
    verdict = gate.load_run(stale).verdict
    shared = gate.shared_sequences(verdict)  # policy0's first-round probe is its own: left out
    assert shared == ("A-C", "A-B-C")
    later = [t for c in verdict.cells if c.kind == "warm" and c.configuration == "policy0" and c.sequence in shared
             for t in c.turns[1:]]
    assert policy0.saved == pytest.approx(sum(t.reused_tokens for t in later) / sum(t.prompt_tokens for t in later))
    assert policy0.saved > 0 and {c.check for c in policy0.failed} == {"identity"}


def test_the_report_leads_with_the_verdict_per_configuration(stale):
    paths = render_run(stale)
    page = paths.html.read_text()
    table = page[page.index('id="verdicts"'):page.index("</table>", page.index('id="verdicts"'))]
    assert page.index('id="verdicts"') < page.index("<h2>Matrix</h2>") < page.index('id="tables"')
    for name, status in _verdicts(gate.evaluate(stale)).items():
        row = table[table.index(f"<b>{name}</b>"):]
        row = row[:row.index("</tr>")]
        assert f'v-{status}">{status}' in row, (name, row)
    assert "--gate-candidate NAME" in page  # the run fails, one candidate passes: say how to gate it


def test_qualified_says_what_was_qualified(stale, tmp_path):
    good = render_run(write_run(tmp_path / "good", ckpt_verdict())).html.read_text()
    banner = good[good.index('class="banner ok"'):good.index("</div>\n\n", good.index('class="banner ok"'))]
    assert "QUALIFIED" in banner and ("Qualified: configurations defaults, policy0, prompt_end, policy0_prompt_end "
                                      "× sequences A-C, A-B-C, append, first-round on engine reference") in banner
    assert "24 cells ran to the end" in banner and "warm turns compared byte for byte with their cold run" in banner
    bad = render_run(stale).html.read_text()
    assert "Qualified:" not in bad and "Judged: configurations" in bad  # a failing run says what it judged
    assert "QUALIFIED — candidate prompt_end" in render_run(stale, candidate="prompt_end").html.read_text()


def test_gate_candidate_gates_only_what_would_ship(stale, capsys):
    assert cli.main(["gate", str(stale), "--gate-candidate", "prompt_end"]) == EXIT_QUALIFIED
    out = capsys.readouterr().out
    assert "qualified — gating candidate prompt_end" in out and "not gated:" in out
    assert cli.main(["gate", str(stale), "--gate-candidate", "policy0"]) == EXIT_CHECK_FAILED
    assert "identity" in capsys.readouterr().out
    assert cli.main(["gate", str(stale), "--gate-candidate", "nope"]) == EXIT_USAGE
    assert "name one of: defaults, policy0, prompt_end, policy0_prompt_end" in capsys.readouterr().out


def test_gate_candidate_keeps_the_baseline_gated(traffic):
    """traffic.yaml names `baseline`: gating a candidate gates the baseline's checks too."""
    whole = gate.evaluate(traffic)
    assert whole.exit_code == EXIT_CHECK_FAILED and _verdicts(whole)["policy0"] == "fail"
    assert {k: v for k, v in _verdicts(whole).items() if k != "policy0"} == dict.fromkeys(
        ("baseline", "affinity", "retention", "both"), "pass")
    affinity = gate.evaluate(traffic, "affinity")
    assert affinity.exit_code == EXIT_QUALIFIED
    gated = {c.configuration for c in affinity.candidates if c.gated}
    assert gated == {"baseline", "affinity"}
    assert any(c.status.failed for c in affinity.not_gated)  # policy0's budget: shown, not gated
    assert gate.evaluate(traffic, "policy0").exit_code == EXIT_CHECK_FAILED


def test_junit_under_gate_candidate_counts_what_the_gate_counts(stale):
    paths = render_run(stale, candidate="prompt_end")
    result = gate.evaluate(stale, "prompt_end")
    root = ET.parse(paths.junit).getroot()
    assert int(root.get("failures")) + int(root.get("errors")) == len(result.failures) == 0
    skipped = [c for c in root.iter("testcase") if c.find("skipped") is not None]
    # `ran` and `plausible` are the cell's own case (report.CELL_ERRORS), not cases of `checks`
    assert len(skipped) == len(result.not_gated) - sum(1 for c in result.not_gated if c.check in CELL_ERRORS) + 1
    assert "QUALIFIED — candidate prompt_end" in paths.html.read_text()


def test_the_gate_line_names_its_subject_once(traffic, capsys):
    assert cli.main(["gate", str(traffic)]) == EXIT_CHECK_FAILED
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("FAIL") and "budget" in x)
    assert line.count("policy0 traffic") == 1 and "policy0 traffic: net benefit" in line, line
    budget = next(c for c in gate.evaluate(traffic).failures if c.check == "budget")
    assert budget.message.startswith(budget.subject + ": ")  # the repeat came from the message


def test_gate_json_says_what_the_summary_says(stale, tmp_path, capsys):
    for run, code in ((stale, EXIT_CHECK_FAILED), (write_run(tmp_path / "good", ckpt_verdict()), EXIT_QUALIFIED)):
        assert cli.main(["gate", str(run), "--json"]) == code
        doc = json.loads(capsys.readouterr().out)
        result = gate.evaluate(run)
        assert doc["version"] == gate.JSON_VERSION and doc["exit_code"] == code == result.exit_code
        assert doc["counts"] == result.counts and doc["counts"]["failed"] == len(result.failures)
        assert len(doc["checks"]) == len(result.checks)
        assert sum(1 for c in doc["checks"] if c["status"] != "pass") == doc["counts"]["failed"]
        assert {c["configuration"]: c["status"] for c in doc["candidates"]} == _verdicts(result)
    assert cli.main(["gate", str(tmp_path / "missing"), "--json"]) == EXIT_USAGE
    assert json.loads(capsys.readouterr().out)["error"]


def test_an_environment_record_of_the_wrong_shape_renders_its_fields_missing(tmp_path):
    """environment.json is read field by field with the types it is written with: a field of
    another type (a hand-edited or hostile file) reads as missing ('—'), the others as written;
    a merged run's shards keep theirs. A packages string once failed the report."""
    run = write_run(tmp_path / "env", ckpt_verdict())
    env = json.loads((run / "environment.json").read_text())
    good = {**env, "shards": [{"index": 0, "host": "node-a", "environment": env}]}
    hostile = {**env, "packages": "torch 2.4", "cpu": ["Test CPU"], "memory_bytes": "lots", "host": 7,
               "os": {"system": ["Linux"], "release": "6.1"}, "python": None, "extra": {"x": 1},
               "shards": [{"index": -1, "host": "node-b", "environment": {"host": ["h"]}}, "node-c"]}
    (run / "environment.json").write_text(json.dumps(hostile))
    read = rundir.load(run).environment
    assert read == {"captured_at": env["captured_at"], "os": {"release": "6.1"}, "shadowlab": env["shadowlab"],
                    "shards": [{"host": "node-b", "environment": {}}]}
    html = render_run(run).html.read_text()
    assert "<th>packages</th><td colspan=\"3\" class=\"small\"></td>" in html and "torch 2.4" not in html
    (run / "environment.json").write_text(json.dumps(good))
    assert rundir.load(run).environment == good


# ---------------------------------------------------------------- compare (text rendering only)


def _one_cell_run(tmp_path: Path) -> Path:
    verdict = ckpt_verdict()
    cells = tuple(c for c in verdict.cells if c.sequence == "A-C")
    return write_run(tmp_path / "one", dataclasses.replace(verdict, cells=cells))


def test_compare_on_a_one_cell_run_prints_its_table_once(tmp_path):
    run = rundir.load(_one_cell_run(tmp_path))
    result = compare.compare(run, run, baseline_configuration="defaults", candidate_configuration="policy0",
                             allow=("unverified",))
    assert len(result.rows) == 3  # the cell, its kind, overall: the same figures three times
    text = compare.render_text(result)
    metric_lines = [line for line in text.splitlines() if line.startswith("  ")]
    assert len(metric_lines) == len(set(metric_lines)) > 3, text  # each metric once
    assert "cell: reference.A-C (A → C)" in text and "= kind: ordered = overall: overall" in text
    whole = rundir.load(write_run(tmp_path / "whole", ckpt_verdict()))
    text = compare.render_text(compare.compare(whole, whole, baseline_configuration="defaults",
                                               candidate_configuration="policy0", allow=("unverified",)))
    # two cells: each its own table, their sum once (one kind: kind and overall are that sum)
    assert "\ncell: reference.A-C (A → C)   repeats 1 vs 1\n" in text
    assert "\ncell: reference.A-B-C (A → B → C)   repeats 1 vs 1\n" in text
    assert "\nkind: ordered   repeats 1 vs 1 = overall: overall\n" in text


def test_compare_shows_a_figure_one_side_lacks_as_every_page_does(tmp_path):
    run = rundir.load(_one_cell_run(tmp_path))
    result = compare.compare(run, run, baseline_configuration="defaults", candidate_configuration="policy0",
                             allow=("unverified",))
    row = result.rows[0]
    gone = [dataclasses.replace(d, baseline=None, delta=None, judgement="unknown") for d in row.deltas]
    text = compare.render_text(dataclasses.replace(result, rows=(dataclasses.replace(row, deltas=tuple(gone)),)))
    shown = [line for line in text.splitlines() if line.startswith("  ")]
    assert shown and all(f" {present.MISSING} → " in line for line in shown), text
    assert "?" not in text


# ---------------------------------------------------------------- end to end on the reference engine

CANDIDATES_MATRIX = """
version: 1
name: candidates
engines:
  reference: {kind: reference, model: {preset: tiny, seed: 0}, flags: [-c, 2048, -b, 128, -ub, 64, -np, 1, -cram, 0]}
configurations:
  current: {description: production defaults}
  candidate: {description: checkpoints at every -b boundary, env: {PXA_CKPT_PROMPT_POLICY: 0}}
  unsafe:
    description: the same placement on an engine that restores one token late
    env: {PXA_CKPT_PROMPT_POLICY: 0, SHADOWLAB_ENGINE_FAULTS: stale-restore}
baseline: current
prompts:
  A: {kind: random, tokens: 400, seed: 1}
  C: {kind: diverge, from: A, shared: 200, tokens: 420, seed: 2}
sequences:
  A-C: [A, C]
generation: {n_predict: 8}
identity: {control: false}
"""


@pytest.mark.slow
def test_a_candidate_the_fault_makes_unsafe_fails_alone_and_gating_the_safe_one_passes(tmp_path, capsys):
    matrix = tmp_path / "candidates.yaml"
    matrix.write_text(CANDIDATES_MATRIX)
    out = tmp_path / "run"
    assert cli.main(["run", str(matrix), "--out", str(out)]) == EXIT_CHECK_FAILED
    capsys.readouterr()
    result = gate.evaluate(out)
    assert _verdicts(result) == {"current": "pass", "candidate": "pass", "unsafe": "fail"}, result.summary()
    unsafe = next(c for c in result.candidates if c.configuration == "unsafe")
    assert {c.check for c in unsafe.failed} == {"identity"} and unsafe.saved and unsafe.saved > 0
    candidate = next(c for c in result.candidates if c.configuration == "candidate")
    assert candidate.net_ms is not None  # measured against the baseline
    assert cli.main(["gate", str(out), "--gate-candidate", "candidate"]) == EXIT_QUALIFIED
    assert cli.main(["gate", str(out), "--gate-candidate", "unsafe"]) == EXIT_CHECK_FAILED
    capsys.readouterr()
    assert cli.main(["report", str(out), "--gate-candidate", "candidate"]) == EXIT_QUALIFIED
    root = ET.parse(out / "junit.xml").getroot()
    assert root.get("failures") == "0" and root.get("errors") == "0" and int(root.get("skipped")) > 0


@pytest.mark.slow
def test_run_gate_candidate_decides_the_run_s_own_exit_code(tmp_path, capsys):
    """`shadowlab run --gate-candidate NAME` through the real command line: the same matrix
    exits 1 without it (the unsafe candidate fails) and 0 gating the safe one, its report says
    what was not gated; a name the matrix does not run is exit 2 before any cell starts."""
    matrix = tmp_path / "candidates.yaml"
    matrix.write_text(CANDIDATES_MATRIX)

    def shadowlab(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shadowlab", *args], capture_output=True, text=True,
                              timeout=900, cwd=REPO)

    gated = shadowlab("run", str(matrix), "--out", str(tmp_path / "gated"), "--gate-candidate", "candidate")
    assert gated.returncode == EXIT_QUALIFIED, gated.stdout + gated.stderr[-3000:]
    assert "not gated:" in gated.stdout and "gating candidate candidate" in (tmp_path / "gated" / "report.md").read_text()
    whole = shadowlab("run", str(matrix), "--out", str(tmp_path / "whole"))
    assert whole.returncode == EXIT_CHECK_FAILED, whole.stdout + whole.stderr[-3000:]
    unknown = shadowlab("run", str(matrix), "--out", str(tmp_path / "unknown"), "--gate-candidate", "nope")
    assert unknown.returncode == 2 and "--gate-candidate 'nope'" in unknown.stderr, unknown.stderr
    assert "name one of: current, candidate, unsafe" in unknown.stderr
    assert not (tmp_path / "unknown").exists()  # nothing was started or written
    left_out = shadowlab("run", str(matrix), "--out", str(tmp_path / "part"), "-k", "current",
                         "--gate-candidate", "unsafe")
    assert left_out.returncode == 2 and "-k left it out" in left_out.stderr, left_out.stderr
    assert not (tmp_path / "part").exists()
    # and the gate of a run directory that holds no cell of it: refused, not qualified on nothing
    part = shadowlab("run", str(matrix), "--out", str(tmp_path / "part"), "-k", "current", "--no-report")
    assert part.returncode == 0, part.stderr
    refused = shadowlab("gate", str(tmp_path / "part"), "--gate-candidate", "unsafe")
    assert refused.returncode == 2 and "no cell of that configuration is in this run" in refused.stdout + refused.stderr
