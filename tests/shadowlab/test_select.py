"""`shadowlab run -k PATTERN`: part of a matrix, planned with what judging it needs, and a run
directory that says it is a part (plan/select.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shadowlab import plan as plan_module
from shadowlab.errors import MatrixError
from shadowlab.matrix import load, loads
from shadowlab.plan import select

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "matrices" / "ckpt.yaml"

BUDGETED = """\
version: 1
name: budgeted
engines:
  ref: {kind: reference, model: {preset: tiny, seed: 0}}
configurations:
  current: {flags: [-cram, 0]}
  candidate: {flags: [-cram, 8192]}
baseline: current
prompts:
  A: {kind: random, tokens: 100, seed: 1}
  C: {kind: diverge, from: A, shared: 50, tokens: 120, seed: 2}
  B: {kind: unrelated, tokens: 20, seed: 3}
sequences: {A-C: [A, C], A-B: [A, B]}
expectations:
  - {configuration: current, sequence: A-C, outcome: forced}
  - {configuration: candidate, sequence: A-B, identity: true}
budgets:
  - {configuration: candidate, max_created_per_turn: 10}
"""


def _warm(plan: plan_module.Plan) -> list[str]:
    return [c.id for c in plan.of_kind(plan_module.CellKind.WARM)]


def test_a_configuration_keeps_its_warm_cells_and_their_references():
    matrix, partial = select.narrow(load(CKPT), ["policy0"])
    plan = plan_module.build_plan(matrix)
    assert _warm(plan) == ["reference.policy0.A-C", "reference.policy0.A-B-C", "reference.policy0.first-round"]
    assert {c.configuration for c in plan.cells} == {"policy0"}
    # Every warm turn's cold reference is planned, and the control.
    cold = {c.id for c in plan.of_kind(plan_module.CellKind.COLD)}
    assert {t.cold_cell for c in plan.of_kind(plan_module.CellKind.WARM) for t in c.turns if t.cold_cell} <= cold
    assert plan.of_kind(plan_module.CellKind.CONTROL)
    assert partial.of_warm == len(load(CKPT).selected()) > len(partial.warm) == 3


def test_sequences_cell_ids_and_globs_select_and_add_up():
    full = load(CKPT)
    _, by_sequence = select.narrow(full, ["A-C"])
    assert by_sequence.warm == tuple(f"reference.{c}.A-C" for c in full.configurations
                                     if ("reference", c, "A-C") in full.selected())
    _, union = select.narrow(full, ["reference.defaults.append", "*.first-*"])
    assert union.warm == ("reference.defaults.append", "reference.policy0.first-round")


def test_a_pattern_matching_nothing_is_a_usage_error_naming_what_exists():
    with pytest.raises(MatrixError) as info:
        select.narrow(load(CKPT), ["polcy0"])
    assert "-k 'polcy0' matches no cell of the matrix" in str(info.value)
    assert "configurations: defaults, policy0" in info.value.hint and "e.g. -k reference.defaults.A-C" in info.value.hint


def test_expectations_and_budgets_of_cells_left_out_are_dropped_and_named():
    matrix, partial = select.narrow(loads(BUDGETED, file="b.yaml"), ["candidate"])
    # expectation 1 is on current; the budget needs the baseline's cells, which are left out.
    assert [x.selection.configuration for x in matrix.expectations] == ["candidate"]
    assert matrix.budgets == ()
    assert partial.dropped == ("expectation 1 (line 15)", "budget 1 (line 18)")
    assert "not judged: expectation 1 (line 15), budget 1 (line 18)" in partial.describe()
    with_baseline, partial = select.narrow(loads(BUDGETED, file="b.yaml"), ["A-B"])
    assert len(with_baseline.budgets) == 1 and partial.dropped == ("expectation 1 (line 15)",)


def test_the_narrowed_matrix_round_trips_and_says_it_is_a_part(tmp_path):
    """What the run directory's matrix.yaml holds loads back to the same cells, and its
    description begins with the partial-run line the report shows first."""
    import yaml

    matrix, partial = select.narrow(load(CKPT), ["A-C"])
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix.to_dict(), sort_keys=False))
    again = load(path, check_files=False)
    assert again.selected() == matrix.selected() and len(again.selected()) == len(partial.warm)
    assert again.description.startswith("partial run (-k A-C): ")


def test_plan_json_keeps_the_selection_and_the_dry_run_says_so():
    matrix, notes = select.prepare(load(CKPT), None, ["policy0"])
    plan = plan_module.build_plan(matrix)
    plan = plan_module.Plan(plan.cells, notes)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["selection"]["only"] == ["policy0"] and data["selection"]["of_warm_cells"] == len(load(CKPT).selected())
    assert plan_module.Plan.from_dict(data) == plan
    assert "selection" not in plan_module.build_plan(load(CKPT)).to_dict()  # a whole run's plan as before
    done = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(CKPT), "--dry-run", "-k", "policy0"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "partial run (-k policy0): 3 of" in done.stdout and "reference.defaults" not in done.stdout


@pytest.mark.slow
def test_a_partial_run_resumes_as_the_part_it_is(tmp_path):
    """A real run of one warm cell (the reference engine): plan.json and options.json say -k;
    --resume without -k keeps the part; --resume with another -k is refused."""
    out = tmp_path / "run"
    base = [sys.executable, "-m", "shadowlab", "run", str(CKPT), "--out", str(out)]
    first = subprocess.run([*base, "-k", "reference.defaults.append", "--no-report"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=900)
    assert first.returncode == 0, first.stderr
    planned = json.loads((out / "plan.json").read_text())
    assert planned["selection"]["warm_cells"] == ["reference.defaults.append"]
    assert {c["configuration"] for c in planned["cells"]} == {"defaults"}
    assert json.loads((out / "options.json").read_text())["only"] == ["reference.defaults.append"]
    resumed = subprocess.run([*base, "--resume"], capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert resumed.returncode == 0, resumed.stderr  # the same part, every cell already ok: judged
    assert "partial run (-k reference.defaults.append)" in (out / "report.html").read_text()
    other = subprocess.run([*base, "--resume", "-k", "policy0"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert other.returncode == 2
    assert "matrix changed" in other.stderr or "-k" in other.stderr


def test_every_output_of_a_partial_run_says_it_is_one(tmp_path):
    """A real run of one configuration of BUDGETED: the terminal summary, `gate` (text and
    --json), report.md, report.html and junit.xml each name the selection and what was left out;
    the whole matrix's run says nothing of the kind."""
    import xml.etree.ElementTree as ET

    matrix = tmp_path / "m.yaml"
    matrix.write_text(BUDGETED)
    words = "partial run (-k candidate): 2 of 4 warm cells"
    outputs = {}
    for name, extra in (("part", ["-k", "candidate"]), ("whole", [])):
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(matrix), "--out", str(out), *extra],
                              capture_output=True, text=True, cwd=REPO, timeout=900)
        assert done.returncode in (0, 1), done.stderr[-3000:]
        gate_text = subprocess.run([sys.executable, "-m", "shadowlab", "gate", str(out)], capture_output=True,
                                   text=True, timeout=120).stdout
        gate_json = json.loads(subprocess.run([sys.executable, "-m", "shadowlab", "gate", str(out), "--json"],
                                              capture_output=True, text=True, timeout=120).stdout)
        junit = ET.parse(out / "junit.xml").getroot()
        outputs[name] = {
            "terminal": done.stdout + done.stderr, "gate": gate_text, "json": gate_json["partial"] or "",
            "md": (out / "report.md").read_text(), "html": (out / "report.html").read_text(),
            "junit": " ".join([*(p.get("value", "") for p in junit.iter("property")),
                               *(s.get("message", "") for s in junit.iter("skipped"))]),
        }
    for where, text in outputs["part"].items():
        assert words.lower() in text.lower(), where
    for where, text in outputs["whole"].items():
        assert "partial run" not in text.lower(), where
