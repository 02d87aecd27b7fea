"""Faults survived by the gate, the verdicts and the report (issue 9).

Items covered:
  1. an engine that reports impossible figures (reused 900 of a 300-token prompt, a negative
     prompt_ms, a re-entry above the divergence point) is not qualified: the gate fails its cell
     as an infrastructure failure (exit 3) and says why in the terminal summary, report.html,
     report.md, junit.xml and verdicts.json;
  8. engine text with bidirectional controls (U+202E, isolates, marks) reaches no output raw:
     html, md, junit and the terminal show the escaped form.
  (and: every engine process's command line and environment delta is in report.html and
  report.md, since a matrix is trusted code.)

Each test starts tests/shadowlab/hostile_engine.py as a real engine process through the real
command line (`python -m shadowlab run`), then reads what a user would read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from shadowlab.judge.verdicts import VERDICTS_SCHEMA_VERSION

HOSTILE = Path(__file__).resolve().parents[1] / "shadowlab" / "hostile_engine.py"
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

MATRIX = """\
version: 1
name: hostile-gate
engines:
  bad:
    kind: llama-server
    binary: {python}
    model: {{path: {script}}}
    command: ['{{binary}}', {script}, --port, '{{port}}'{modes}]
    log_family: llama.cpp
    ready_timeout_s: 10
    threads: 1
    env: {{HOSTILE_MARK: "x"}}
prompts:
  A: {{kind: random, tokens: 300, seed: 1}}
  C: {{kind: diverge, from: A, shared: 120, tokens: 300, seed: 2}}
sequences:
  A-C: [A, C]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
"""


def run_shadowlab(tmp_path: Path, modes: list[str]) -> tuple[int, str, Path]:
    """`python -m shadowlab run` on a hostile engine; (exit code, terminal output, run dir)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(MATRIX.format(python=json.dumps(sys.executable), script=json.dumps(str(HOSTILE)),
                                    modes="".join(f", --mode, {m}" for m in modes)))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(matrix), "--out", str(out),
                           "--request-timeout", "5"], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = (proc.stdout + proc.stderr).decode("utf-8", "backslashreplace")
    assert "Traceback" not in text, text[-3000:]
    return proc.returncode, text, out


def gate(out: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "gate", str(out)], capture_output=True, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).decode("utf-8", "backslashreplace")


def implausible(out: Path) -> list[str]:
    data = json.loads((out / "verdicts.json").read_text(encoding="utf-8"))
    assert data["schema_version"] == VERDICTS_SCHEMA_VERSION  # `implausible` since version 3
    return [p for c in data["cells"] for t in c["turns"] for p in t["implausible"]]


def junit_cell_errors(out: Path) -> list[str]:
    root = ET.parse(out / "junit.xml").getroot()
    suite = next(s for s in root if s.get("name") == "cells")
    return [e.get("message") or "" for case in suite for e in case.findall("error")]


@pytest.mark.parametrize("mode, words", [
    ("lie-reuse", "900 tokens reused of a 300-token prompt"),
    ("negative-timing", "timings.prompt_ms = -5 ms is negative"),
    ("reentry-above-divergence", "lies above the divergence point 120"),
])
def test_survives_an_engine_that_reports_impossible_figures(tmp_path, mode, words):
    code, terminal, out = run_shadowlab(tmp_path, [mode])
    assert code == 3, terminal[-3000:]
    # every output says so, in words, not only as a warning
    assert "impossible figures" in terminal and words in terminal, terminal[-3000:]
    assert any(words in p for p in implausible(out)), implausible(out)
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'class="banner impossible"' in html and "IMPOSSIBLE FIGURES" in html and words in html
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Impossible figures" in md and words in md
    assert any("impossible figures" in m and words in m for m in junit_cell_errors(out)), junit_cell_errors(out)
    # the gate re-judges the directory the same way
    gate_code, summary = gate(out)
    assert gate_code == 3 and "ERROR" in summary and "plausible" in summary and words in summary, summary


def test_survives_an_honest_engine_on_the_same_matrix(tmp_path):
    # the control for the test above: the same engine and matrix without a lie qualifies as far
    # as plausibility goes (no impossible figure, no `plausible` error)
    code, terminal, out = run_shadowlab(tmp_path, [])
    assert implausible(out) == []
    assert "impossible" not in (out / "report.md").read_text(encoding="utf-8")
    assert code in (0, 1), terminal[-3000:]


def test_survives_bidirectional_overrides_in_engine_text(tmp_path):
    # a completion that differs (the mismatch is expanded in report.html), and an error message
    # (quoted as the cell's reason by the terminal, report.md and junit.xml)
    code, terminal, out = run_shadowlab(tmp_path / "mismatch", ["bidi-content"])
    assert code == 1, terminal[-3000:]
    code2, terminal2, out2 = run_shadowlab(tmp_path / "error", ["bidi-content", "error-200"])
    assert code2 == 3, terminal2[-3000:]
    outputs = {"terminal": terminal + terminal2 + gate(out)[1] + gate(out2)[1]}
    for run in (out, out2):
        for name in ("report.html", "report.md", "junit.xml"):
            outputs[f"{run.parent.name}/{name}"] = (run / name).read_text(encoding="utf-8")
    for name, text in outputs.items():
        raw = sorted({f"U+{ord(ch):04X}" for ch in text if ch in BIDI_CONTROLS})
        assert not raw, f"{name} holds raw bidirectional controls {raw}"
        assert "\x1b" not in text, f"{name} holds a raw ANSI escape"
        if name != "terminal":  # a terminal renders no markup
            assert "<script>alert" not in text, f"{name} holds engine markup"
    # shown, escaped, where a reader looks
    escaped = "safe\\u202egnp.exe\\u202c \\u2066iso\\u2069"
    for name in ("terminal", "mismatch/report.html", "error/report.html", "error/report.md", "error/junit.xml"):
        assert escaped in outputs[name], f"{name} does not show the engine text escaped"


def test_survives_a_matrix_that_runs_any_program_by_showing_what_ran(tmp_path):
    code, terminal, out = run_shadowlab(tmp_path, [])
    html = (out / "report.html").read_text(encoding="utf-8")
    md = (out / "report.md").read_text(encoding="utf-8")
    meta = json.loads(next((out / "cells").glob("*/meta.json")).read_text(encoding="utf-8"))
    assert str(HOSTILE) in " ".join(meta["command"])
    for text in (html, md):
        assert "Engine processes" in text
        assert str(HOSTILE) in text and "--port" in text
        assert "HOSTILE_MARK=x" in text
