"""A partial run (`run -k`) says how many planned cells it left out, in every output: the run's
own lines, `gate` (text and --json), report.html, report.md and junit.xml (plan/select.py's
`Partial.left_out`, counted from the plans of the part and of the whole matrix)."""

from __future__ import annotations

import json
from html import unescape
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from shadowlab import plan as plan_module
from shadowlab.matrix import load

REPO = Path(__file__).resolve().parents[2]

SMALL = """\
version: 1
name: small
engines:
  ref: {kind: reference, model: {preset: tiny, seed: 0}, threads: 1}
configurations:
  current: {flags: [-cram, 0]}
  candidate: {flags: [-cram, 8192]}
baseline: current
prompts:
  A: {kind: random, tokens: 100, seed: 1}
  C: {kind: diverge, from: A, shared: 50, tokens: 120, seed: 2}
  B: {kind: unrelated, tokens: 20, seed: 3}
sequences: {A-C: [A, C], A-B: [A, B]}
isolation: {cores_per_cell: 1}
"""


def shadowlab(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shadowlab", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


def test_every_output_of_a_partial_run_counts_the_planned_cells_left_out(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    whole = len(plan_module.build_plan(load(path)).cells)
    done = shadowlab("run", str(path), "--out", "part", "-k", "candidate", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = tmp_path / "part"
    selection = json.loads((out / "plan.json").read_text())["selection"]
    ran = len(json.loads((out / "plan.json").read_text())["cells"])
    assert (selection["planned_cells"], selection["of_planned_cells"]) == (ran, whole) and 0 < ran < whole
    words = f"{whole - ran} of the matrix's {whole} planned cells left out"
    # The run says it before its first cell starts, and again in its summary.
    assert done.stderr.index(words) < done.stderr.index("start ref.candidate"), done.stderr
    assert words in done.stdout
    gate = shadowlab("gate", "part", cwd=tmp_path)
    gate_json = json.loads(shadowlab("gate", "part", "--json", cwd=tmp_path).stdout)
    html = unescape((out / "report.html").read_text())
    junit = ET.parse(out / "junit.xml").getroot()
    skipped = [s.get("message", "") for s in junit.iter("skipped")]
    assert words in gate.stdout and words in gate_json["partial"]
    assert words in (out / "report.md").read_text()
    assert "Not the whole matrix:" in html and "QUALIFIED — partial run" in html
    assert html.index(words) < html.index('<h2 id="verdicts">')  # in the banner, before any table
    assert any(p.get("name") == "shadowlab.partial" and words in p.get("value", "") for p in junit.iter("property"))
    assert any(words in m for m in skipped)
    dry = shadowlab("run", str(path), "--dry-run", "-k", "A-C", cwd=tmp_path)
    assert dry.returncode == 0 and f"of the matrix's {whole} planned cells left out" in dry.stdout, dry.stderr
