"""`shadowlab run --gate-candidate NAME` on the real llama-server b11434 (seeded GGUF): the run's
own exit code gates what would ship. init's matrix plus a third configuration, `trimmed`, that
adds `--ctx-checkpoints 0`: the engine then creates no checkpoint and fails init's append
expectation. The same matrix, run through the command line, exits 1 without the option, 0
gating `candidate` (trimmed's failure shown, not gated) and 1 gating `trimmed`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TRIMMED = """\
  trimmed:
    description: fewer checkpoints to save memory
    flags: [--ctx-checkpoints, '0']
baseline: current"""


def shadowlab(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shadowlab", *argv], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=900)


@pytest.mark.llama
def test_the_run_exit_code_is_the_gated_candidate_s(tmp_path, llama_binary, tiny_gguf):
    init = shadowlab("init", "--model", str(tiny_gguf), "--binary", str(llama_binary), "--tokens", "1200",
                     "--threads", "1", cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    matrix = tmp_path / "my-change.yaml"
    text = matrix.read_text()
    assert text.count("\nbaseline: current") == 1
    matrix.write_text(text.replace("\nbaseline: current", "\n" + TRIMMED, 1))
    env = {"SHADOWLAB_BINARY": "", "SHADOWLAB_MODEL": ""}
    codes = {}
    for name, extra in (("all", []), ("candidate", ["--gate-candidate", "candidate"]),
                        ("trimmed", ["--gate-candidate", "trimmed"])):
        done = shadowlab("run", "my-change.yaml", "--out", name, "-k", "append", *extra, cwd=tmp_path, env=env)
        codes[name] = done.returncode
        assert done.returncode in (0, 1), done.stdout + done.stderr[-3000:]
        verdicts = {c["configuration"]: (c["status"], c["gated"]) for c in json.loads(
            shadowlab("gate", name, "--json", *extra, cwd=tmp_path).stdout)["candidates"]}
        assert verdicts["trimmed"][0] == "fail" and verdicts["candidate"][0] == "pass", verdicts
        if name == "candidate":
            assert verdicts["trimmed"] == ("fail", False) and "not gated:" in done.stdout
    assert codes == {"all": 1, "candidate": 0, "trimmed": 1}
