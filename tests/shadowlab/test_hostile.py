"""Hostile engines: nothing an engine does may crash shadowlab, hang it, corrupt a record,
inject into the report or outlive its cell.

Each test starts tests/shadowlab/hostile_engine.py (stdlib, ~50 ms start) on 127.0.0.1
through the `openai` adapter with an explicit command, runs `shadowlab run` in-process
through the CLI (run, verdicts, report, gate) and checks the aftermath.
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
import repo_scripts

from shadowlab import cli
from shadowlab.results import records, rundir
from shadowlab.results.records import CellStatus

HOSTILE = Path(__file__).resolve().parent / "hostile_engine.py"

MATRIX = """\
version: 1
name: hostile
engines:
  bad:
    kind: openai
    binary: {python}
    command: ['{{binary}}', {script}, --port, '{{port}}', --pidfile, {pidfile}{modes}]
    log_family: llama.cpp
    ready_timeout_s: {ready}
    threads: 1
prompts:
  A: {{kind: random, tokens: 24, seed: 1}}
sequences:
  A: [A]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
"""


def write_matrix(tmp_path: Path, modes: list[str], ready: float = 10) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(
        python=json.dumps(sys.executable), script=json.dumps(str(HOSTILE)),
        pidfile=json.dumps(str(tmp_path / "grandchildren.pid")), ready=ready,
        modes="".join(f", --mode, {m}" for m in modes)))
    return path


def run_cli(tmp_path: Path, modes: list[str], capsys, *, ready: float = 10,
            timeout: float = 2.0) -> tuple[int, Path, str]:
    matrix = write_matrix(tmp_path, modes, ready)
    out = tmp_path / "run"
    t0 = time.monotonic()
    code = cli.main(["run", str(matrix), "--out", str(out), "--request-timeout", str(timeout)])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert elapsed < 30, f"run took {elapsed:.1f} s"
    assert "Traceback" not in err, err
    return code, out, err


def strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def cell_metas(out: Path) -> dict[str, records.CellMeta]:
    for path in [*(out / "cells").glob("*/meta.json"), out / "verdicts.json"]:
        if path.exists():
            strict_json(path.read_text(encoding="utf-8"))  # always valid, strict JSON
    return rundir.read_cell_metas(out)


def engine_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "grandchildren.pid"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def assert_nothing_survives(tmp_path: Path, metas: dict[str, records.CellMeta]) -> None:
    pids = engine_pids(tmp_path) + [m.pid for m in metas.values() if m.pid is not None]
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
                proc.kill()  # do not leave it to the next test
        except psutil.NoSuchProcess:
            continue
    assert not alive, f"engine processes survived: {alive}"
    for child in psutil.Process().children(recursive=True):
        assert child.status() == psutil.STATUS_ZOMBIE, f"leftover child {child.pid} {child.cmdline()}"


def assert_report_safe(out: Path) -> None:
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert "<img src=x" not in html.lower() and "</svg><img" not in html
    assert "\x00" not in html and "\x1b" not in html
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "<script" not in md.lower() and "<img" not in md.lower() and "</svg>" not in md
    assert "\x00" not in md and "\x1b" not in md
    ET.parse(out / "junit.xml")


def check(tmp_path: Path, out: Path, *, status: CellStatus | tuple[CellStatus, ...],
          reason: str | None = None) -> dict[str, records.CellMeta]:
    metas = cell_metas(out)
    assert metas, "no cell recorded"
    statuses = status if isinstance(status, tuple) else (status,)
    for meta in metas.values():
        assert meta.status in statuses, (meta.status, meta.reason)
        if reason is not None:
            assert meta.reason and reason in meta.reason, meta.reason
    assert_nothing_survives(tmp_path, metas)
    assert_report_safe(out)
    return metas


FAILING_ANSWERS = {
    "not-json": "not JSON",
    "json-list": "error answer",
    "error-200": "HTTP 200",
    "truncated": "turn 0 failed",
    "close-mid": "turn 0 failed",
    "slow-loris": "request timeout",
    "slow-headers": "request timeout",
}


@pytest.mark.parametrize("mode", sorted(FAILING_ANSWERS))
def test_a_broken_answer_fails_the_cell_with_its_reason(tmp_path, capsys, mode):
    code, out, _ = run_cli(tmp_path, [mode], capsys)
    check(tmp_path, out, status=CellStatus.FAILED, reason=FAILING_ANSWERS[mode])
    assert code == 3


def test_wrong_shape_json_is_recorded_without_a_crash(tmp_path, capsys):
    code, out, _ = run_cli(tmp_path, ["wrong-shape"], capsys)
    metas = check(tmp_path, out, status=(CellStatus.OK, CellStatus.FAILED))
    turn = next(iter(metas.values())).turns[0]
    assert turn.reused_tokens is None or turn.reused_tokens >= 0
    assert code in (1, 3)


def test_log_garbage_and_evil_content_are_escaped(tmp_path, capsys):
    code, out, _ = run_cli(tmp_path, ["log-garbage", "evil-content", "nan-timings"], capsys)
    check(tmp_path, out, status=(CellStatus.OK, CellStatus.FAILED))
    assert code in (0, 1, 3)


def test_timings_that_disagree_with_the_log_are_flagged(tmp_path, capsys):
    code, out, _ = run_cli(tmp_path, ["lie-timings"], capsys)
    check(tmp_path, out, status=CellStatus.OK)
    verdict = json.loads((out / "verdicts.json").read_text())
    text = json.dumps(verdict)
    assert "disagree" in text or "API" in text, text[:2000]
    turns = [t for c in verdict["cells"].values() for t in c["turns"]] if isinstance(
        verdict.get("cells"), dict) else [t for c in verdict["cells"] for t in c["turns"]]
    assert any(t.get("disagreements") for t in turns), turns
    # the API's reuse on the first turn of a fresh process is impossible: not believable, exit 3
    assert any("first turn of a fresh engine process" in p for t in turns for p in t["implausible"]), turns
    assert code == 3


@pytest.mark.parametrize("mode", ["setsid-child", "double-fork"])
def test_a_grandchild_that_escapes_the_group_is_killed(tmp_path, capsys, mode):
    code, out, _ = run_cli(tmp_path, [mode], capsys)
    metas = cell_metas(out)
    assert engine_pids(tmp_path), "the hostile engine did not fork"
    assert_nothing_survives(tmp_path, metas)
    assert_report_safe(out)
    assert code in (0, 1, 3)


def test_an_engine_listening_beyond_loopback_is_refused(tmp_path, capsys):
    code, out, _ = run_cli(tmp_path, ["bind-all"], capsys)
    check(tmp_path, out, status=(CellStatus.FAILED, CellStatus.SKIPPED), reason="loopback")
    assert code == 3


def test_an_engine_ignoring_sigterm_is_killed(tmp_path, capsys):
    code, out, _ = run_cli(tmp_path, ["ignore-term"], capsys)
    metas = check(tmp_path, out, status=CellStatus.OK)
    assert next(iter(metas.values())).stop.signal == "KILL"
    assert code in (0, 1)


@pytest.mark.parametrize("mode, reason", [("exit-after-health", ""),
                                          ("other-port", "not ready"),
                                          ("bad-tokenize", "not token ids"),
                                          ("slow-health", "not ready"),
                                          ("slow-tokenize", "did not end in time")])
def test_an_engine_that_never_serves_properly_fails_or_skips(tmp_path, capsys, mode, reason):
    code, out, _ = run_cli(tmp_path, [mode], capsys, ready=2)
    check(tmp_path, out, status=(CellStatus.FAILED, CellStatus.SKIPPED), reason=reason)
    assert code == 3


def test_resume_refuses_another_engine_binary(tmp_path, capsys):
    # The binary is a wrapper script; editing it keeps the matrix identical but not the engine.
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HOSTILE} \"$@\"\n")
    wrapper.chmod(0o755)
    matrix = tmp_path / "m.yaml"
    text = MATRIX.format(python=json.dumps(str(wrapper)), script="SCRIPT", ready=10,
                         pidfile=json.dumps(str(tmp_path / "p")), modes=", --mode, truncated")
    matrix.write_text(text.replace(" SCRIPT,", ""))
    out = tmp_path / "run"
    assert cli.main(["run", str(matrix), "--out", str(out), "--request-timeout", "2"]) == 3
    wrapper.write_text(wrapper.read_text() + "# another build\n")
    code = cli.main(["run", str(matrix), "--out", str(out), "--resume", "--request-timeout", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "binary changed since this run started" in err and "Traceback" not in err


def test_an_openai_server_without_tokenize_serves_chat_prompts(tmp_path, capsys):
    # Readiness for kind openai is /health + /v1/models; chat prompts need no /tokenize.
    matrix = write_matrix(tmp_path, ["no-tokenize", "evil-content"])
    text = matrix.read_text()
    head, _, _ = text.partition("prompts:")
    matrix.write_text(head + """prompts:
  t1:
    kind: chat
    messages: [{role: user, content: "hello <script>x</script>"}]
  t2:
    kind: chat
    messages:
      - {role: user, content: "hello <script>x</script>"}
      - {role: assistant, content: {from_turn: 0}}
      - {role: user, content: "and then?"}
sequences:
  chat: [t1, t2]
generation: {n_predict: 4, temperature: 0}
isolation: {cores_per_cell: 1}
""")
    out = tmp_path / "run"
    code = cli.main(["run", str(matrix), "--out", str(out), "--request-timeout", "2"])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    metas = check(tmp_path, out, status=CellStatus.OK)
    assert all(t.endpoint == "/v1/chat/completions" for m in metas.values() for t in m.turns)
    assert code in (0, 1), err


def test_the_terminal_gets_no_engine_control_bytes(tmp_path):
    # The real command line, as CI runs it: progress, errors and the gate summary quote engine
    # text (reasons, log tails), which must reach a terminal or CI log without ANSI escapes.
    import os
    import subprocess

    matrix = write_matrix(tmp_path, ["log-garbage", "error-200"])
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(matrix), "--out",
                           str(tmp_path / "run"), "--request-timeout", "2"],
                          capture_output=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output[-2000:]
    assert b"boom" in output and b"Traceback" not in output
    assert b"\x1b" not in output and b"\x00" not in output
    assert_nothing_survives(tmp_path, cell_metas(tmp_path / "run"))


# ---------------------------------------------------------------- hostile inputs (scripts/fuzz_inputs.py)


@pytest.mark.parametrize("kind, rounds", [
    # matrices 21, 163, 166, 274 drop `version` (an internal error once); runs 599 holds a planned
    # turn of the wrong type (`shadowlab report` failed in triage)
    ("matrices", [*range(40), 21, 163, 166, 274]), ("traces", range(60)), ("runs", [*range(40), 599]),
])
def test_edited_matrices_traces_and_run_directories_end_in_a_documented_exit(kind, rounds, tmp_path):
    """Seeded rounds of scripts/fuzz_inputs.py: every edited input ends in an exit code its
    command documents (a refusal names the file and key), never an internal error; simulate's
    figures stay consistent and the report escapes what the records hold."""
    fuzz = repo_scripts.load("fuzz_inputs")
    seeds = fuzz.Seeds(tmp_path)
    for n in rounds:
        problem = fuzz.one_round(kind, n, seeds, 4, tmp_path / f"{kind}-{n}")
        assert problem is None, (kind, n, problem)
