"""The new user's path, as the README's first screen gives it: `shadowlab init` on my build and my
GGUF, `run`, `report`, `gate` — on the real llama-server b11434 with a seeded GGUF (issue 24).

Safe: `current` (-cram 0) against `candidate` (-cram 8192) on llama-server: every check passes,
exit 0 from run and gate. Unsafe, on the same engine and nothing standing in for it: a candidate
that adds `--ctx-checkpoints 0` (a memory trim a user might try). llama-server then creates no
context checkpoint, so the append probe's second turn, which `current` serves from the
checkpoint at the end of A, is re-processed in full; init's matrix declares that a conversation
that only grows must reuse at least half of A, so run and gate exit 1 naming the candidate's
append cell while `current` passes. (No llama-server flag makes a restored state differ from a
cold run — its restores copy the state exactly — so it is lost reuse, not a wrong answer, that
the engine is caught at.) Both halves go through the command line a user types, in
subprocesses; the build is chosen by llama.cpp's own `$LLAMA_SERVER_BIN_PATH` (init writes
`binary: auto`), which plan.json records.
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


@pytest.mark.llama
def test_init_run_report_gate_refuses_a_candidate_the_engine_makes_lose_its_checkpoints(tmp_path, llama_binary,
                                                                                          tiny_gguf):
    init = shadowlab("init", "--model", str(tiny_gguf), "--current", "-cram 0", "--candidate", "--ctx-checkpoints 0",
                     "--tokens", TOKENS, "--threads", "1", cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    env = {"LLAMA_SERVER_BIN_PATH": str(llama_binary), "SHADOWLAB_BINARY": "", "SHADOWLAB_MODEL": ""}
    run = shadowlab("run", "my-change.yaml", "--out", "run", cwd=tmp_path, env=env)
    assert run.returncode == 1, run.stdout + run.stderr[-4000:]
    out = tmp_path / "run"
    # What the engine did, from its own records: the candidate's process was started with the
    # flag last (llama.cpp takes the last value), created no checkpoint and re-processed A_more.
    meta = json.loads((out / "cells" / "mine.candidate.append" / "meta.json").read_text())
    assert meta["command"][-2:] == ["--ctx-checkpoints", "0"]
    assert "created context checkpoint" not in (out / "cells" / "mine.candidate.append" / "engine.log").read_text()
    assert "created context checkpoint" in (out / "cells" / "mine.current.append" / "engine.log").read_text()
    turns = {c["cell_id"]: c["turns"] for c in json.loads((out / "verdicts.json").read_text())["cells"]}
    assert turns["mine.candidate.append"][1]["outcome"] == "forced"
    assert turns["mine.current.append"][1]["outcome"] == "restored"
    assert turns["mine.current.append"][1]["reused_tokens"] >= int(TOKENS) // 2
    report = shadowlab("report", "run", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "mine.candidate.append" in (out / "report.md").read_text()
    gate = shadowlab("gate", "run", cwd=tmp_path)
    assert gate.returncode == 1, gate.stdout + gate.stderr
    failed = [line for line in gate.stdout.splitlines() if line.lstrip().startswith(("FAIL", "ERROR"))]
    assert len(failed) == 1 and "min_reused" in failed[0] and "mine.candidate.append" in failed[0], gate.stdout
    assert "reused only 0 of" in failed[0]
    verdicts = {c["configuration"]: c["status"] for c in json.loads(
        shadowlab("gate", "run", "--json", cwd=tmp_path).stdout)["candidates"]}
    assert verdicts == {"current": "pass", "candidate": "fail"}
