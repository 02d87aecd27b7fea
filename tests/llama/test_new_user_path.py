"""The new user's path, as the README's first screen gives it: `shadowlab init` on my build and my
GGUF, `run`, `report`, `gate` — on the real llama-server b11434 with a seeded GGUF (issue 24).

Safe: `current` (-cram 0) against `candidate` (-cram 8192) on llama-server: every check passes,
exit 0 from run and gate. Unsafe: llama-server has no flag that corrupts a restored state (its
restores are exact), so the unsafe half uses the reference engine's `stale-restore` fault, set
on the candidate alone through `init --candidate-env` (the fault's environment variable): its
restored append turn re-enters one token late, the warm output differs from the cold run, and
run and gate exit 1 naming the candidate's cell while `current` passes. Both halves go through
the command line a user types, in subprocesses; the build is chosen by llama.cpp's own
`$LLAMA_SERVER_BIN_PATH` (init writes `binary: auto`), which plan.json records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOKENS = "1200"  # prompt A (C shares 666, traffic turns of 300-400): a quarter of the case study's


def shadowlab(*argv: str, cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shadowlab", *argv], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.mark.llama
def test_init_run_report_gate_qualifies_a_safe_llama_server_candidate(tmp_path, llama_binary, tiny_gguf):
    init = shadowlab("init", "--model", str(tiny_gguf), "--current", "-cram 0", "--candidate", "-cram 8192",
                     "--tokens", TOKENS, "--threads", "1", cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    matrix = (tmp_path / "my-change.yaml").read_text()
    assert "binary: auto" in matrix and str(tiny_gguf) in matrix
    env = {"LLAMA_SERVER_BIN_PATH": str(llama_binary), "SHADOWLAB_BINARY": "", "SHADOWLAB_MODEL": ""}
    run = shadowlab("run", "my-change.yaml", "--out", "run", cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    out = tmp_path / "run"
    plan = json.loads((out / "plan.json").read_text())
    assert plan["overrides"] == [{"key": "engines.mine.binary", "value": str(llama_binary),
                                  "from": "$LLAMA_SERVER_BIN_PATH"}]
    assert "selection" not in plan  # the whole matrix ran
    warm = [c["id"] for c in plan["cells"] if c["kind"] == "warm"]
    assert warm == [f"mine.{c}.{s}" for c in ("current", "candidate")
                    for s in ("A-C", "A-B-C", "A-B-A", "append", "traffic")]
    meta = json.loads((out / "cells" / "mine.candidate.A-B-A" / "meta.json").read_text())
    assert json.dumps(meta).count(str(llama_binary)) >= 1  # the build that ran, in the cell's provenance
    # Worth it, not only safe: the RAM prompt cache brings A back after B; -cram 0 cannot.
    turns = {c["cell_id"]: c["turns"] for c in json.loads((out / "verdicts.json").read_text())["cells"]}
    assert turns["mine.current.A-B-A"][2]["reused_tokens"] == 0
    assert turns["mine.candidate.A-B-A"][2]["reused_tokens"] > 1000
    (out / "report.html").unlink()
    report = shadowlab("report", "run", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "candidate" in (out / "report.html").read_text()
    gate = shadowlab("gate", "run", cwd=tmp_path)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "not qualified" not in gate.stdout
    assert not [line for line in gate.stdout.splitlines() if line.lstrip().startswith(("FAIL", "ERROR"))]


@pytest.mark.slow
def test_init_run_report_gate_refuses_a_candidate_the_engine_fault_makes_unsafe(tmp_path):
    init = shadowlab("init", "--engine", "reference", "--candidate-env", "SHADOWLAB_ENGINE_FAULTS=stale-restore",
                     "--tokens", TOKENS, "--threads", "1", cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    # The append probe is the one that restores under the engine's default placement.
    run = shadowlab("run", "my-change.yaml", "--out", "run", "-k", "append", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr[-4000:]
    report = shadowlab("report", "run", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    gate = shadowlab("gate", "run", cwd=tmp_path)
    assert gate.returncode == 1, gate.stdout + gate.stderr
    failed = [line for line in gate.stdout.splitlines() if line.lstrip().startswith("FAIL")]
    assert failed and all("mine.candidate.append" in line for line in failed), gate.stdout
    assert any("identity" in line and "corrupted_state" in line for line in failed), gate.stdout
    assert "mine.current.append" not in "\n".join(failed)
