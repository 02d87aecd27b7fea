"""llama-server's split control as a request sequence, end to end without the real binary
(issue 16, DESIGN §5): tests/shadowlab/hostile_engine.py played as kind `llama-server`, with
llama.cpp's checkpoint lines. The runner plans the control from the warm log, sends one request
per batch break to a fresh process started with `--ctx-checkpoints 0`, and checks that each
extends the cache exactly; the verdict classes the mismatch from it, or says why it cannot.
(The real b11434 server: tests/llama/test_split_control_llama.py.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shadowlab import cli
from shadowlab.results import records, rundir
from shadowlab.judge import verdicts
from shadowlab.judge.gate import EXIT_CHECK_FAILED

HOSTILE = Path(__file__).resolve().parent / "hostile_engine.py"

MATRIX = """\
version: 1
name: split-requests
engines:
  ll:
    kind: llama-server
    binary: {python}
    model: {{path: {model}}}
    command: ['{{binary}}', {script}, --port, '{{port}}', --mode, {mode}]
    log_family: llama.cpp
    threads: 1
prompts:
  A: {{kind: random, tokens: 24, seed: 1}}
  EXT: {{kind: append, from: A, extra: 6, seed: 2}}
sequences:
  append: [A, EXT]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
identity: {{required: true, control: true}}
"""


def _run(tmp_path: Path, mode: str) -> tuple[int, rundir.RunDir]:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"not read by the hostile engine")
    matrix = tmp_path / "m.yaml"
    matrix.write_text(MATRIX.format(python=json.dumps(sys.executable), model=json.dumps(str(model)),
                                    script=json.dumps(str(HOSTILE)), mode=mode))
    code = cli.main(["run", str(matrix), "--out", str(tmp_path / "run")])
    return code, rundir.load(tmp_path / "run")


def _split_cell(run: rundir.RunDir) -> records.CellMeta:
    return run.metas["ll.default.append.split.1"]


def _triage(run: rundir.RunDir):
    verdict = verdicts.compute(run, write=False)
    return verdict.cell("ll.default.append").turns[1].triage


def test_a_restored_state_that_differs_from_the_same_schedule_is_corrupted_state(tmp_path):
    code, run = _run(tmp_path, "restore-differs")
    meta = _split_cell(run)
    # A (24) checkpointed at 20, restored there by EXT (30), which checkpointed at 26: one
    # request (and turn) per break, the last the prompt
    assert [t["split_points"] for t in meta.cell["turns"]] == [[20], [20, 26], [20, 26, 30]]
    assert meta.cell["flags"][-2:] == ["--ctx-checkpoints", "0"]
    assert meta.status is records.CellStatus.OK, meta.reason
    assert [(t.prompt_tokens, t.reused_tokens, t.processed_tokens) for t in meta.turns] == [
        (20, 0, 20), (26, 20, 6), (30, 26, 4)]
    assert meta.turns[-1].completion.text == "ab c"  # no restore: the cold answer
    t = _triage(run)
    assert t.cls == "corrupted_state" and t.split_control_cell == "ll.default.append.split.1"
    verdict = verdicts.compute(run, write=False)
    assert not [t.implausible for c in verdict.cells for t in c.turns if t.implausible]
    assert code == EXIT_CHECK_FAILED


def test_survives_an_engine_that_does_not_extend_its_cache_without_checkpoints(tmp_path):
    code, run = _run(tmp_path, "no-reuse-without-checkpoints")
    meta = _split_cell(run)
    assert meta.status is records.CellStatus.FAILED
    assert "turn 1 failed: split control: the 26-token request reused 0 and processed 26 tokens, not 20 and 6" \
        in meta.reason
    t = _triage(run)
    assert t.cls == "undetermined" and t.split_control_cell is None
    assert "did not extend its cache as the warm batch schedule needs" in t.detail
    assert code != 0
