"""Split controls on the real llama-server b11434 (issue 16): a request sequence reproduces a
restored warm turn's batch schedule without any restore.

`splits.request_sequence` derives, from the warm cell's `-lv 4` checkpoint lines, one request per
batch break, sent to a fresh server with `--ctx-checkpoints 0`. Shown here on the append probe
(A, then A + 206; the warm turn restores A's L−4 checkpoint): the fresh server's prompt batches,
read from its `-lv 5` `main/do_checkpoint ... pos_max` lines (one per prompt batch, before it is
decoded), are the warm turn's, and its top logprobs equal the warm turn's exactly — where a
control that sends the prompt alone differs in both, so neither check passes by accident. Then
`shadowlab run` plans, sends and judges such a control itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from shadowlab.logs import parse as logparse
from shadowlab.judge import splits

from .conftest import L_A, LlamaServer, run_matrix

pytestmark = pytest.mark.llama

EXTRA, N_PREDICT = 206, 8
DEBUG = ("-lv", "5", "-cram", "0")  # -lv 5: a DBG line per prompt batch
_BATCH = re.compile(r"main/do_checkpoint = \w+, pos_min = -?\d+, pos_max = (-?\d+)")


def _append(prompts: dict[str, list[int]]) -> list[int]:
    return prompts["A"] + prompts["C"][-EXTRA:]  # A, then 206 more tokens (an append continuation)


def _send(server: LlamaServer, prompt: list[int], n_predict: int = N_PREDICT) -> tuple[dict, list[int]]:
    """(answer, start of each prompt batch this request computed, from its log lines)."""
    response = server.complete(prompt, n_predict=n_predict, n_probs=3, id_slot=0)
    assert response.status_code == 200, response.text
    with open(server.log_path, "rb") as fh:
        fh.seek(server.log_start)
        text = fh.read().decode(errors="replace")
    return response.json(), [int(m.group(1)) + 1 for m in _BATCH.finditer(text)]


def _probs(body: dict) -> list[list[tuple[int, float]]]:
    return [[(p["id"], p["logprob"]) for p in step["top_logprobs"]] for step in body["completion_probabilities"]]


def _reuse(body: dict) -> tuple[int, int]:
    return body["timings"]["cache_n"], body["timings"]["prompt_n"]


def test_request_sequence_reproduces_the_warm_batches_and_logprobs(llama, prompts):
    prompt = _append(prompts)
    with llama(DEBUG) as warm:
        _, a_batches = _send(warm, prompts["A"])
        body, suffix_batches = _send(warm, prompt)
        events = logparse.parse(warm.log_path, "llama.cpp").events
    tasks = sorted({e.task for e in events if e.task is not None})
    schedule = splits.warm_schedule(events, tasks[0], tasks[-1], L_A, len(prompt), 512)
    assert schedule is not None and schedule.re_entry == L_A - 4 and _reuse(body)[0] == L_A - 4
    lengths, why = splits.request_sequence(schedule, "llama.cpp")
    assert why == "" and lengths == (L_A - 4 - 512, L_A - 4, len(prompt) - 4, len(prompt))
    warm_batches = [b for b in a_batches if b < schedule.re_entry] + suffix_batches

    with llama((*DEBUG, "--ctx-checkpoints", "0")) as control:
        batches, cached = [], 0
        for length in lengths[:-1]:
            part, starts = _send(control, prompt[:length], n_predict=1)  # as the runner sends it
            assert _reuse(part) == (cached, length - cached)  # plain reuse: no restore, no rewind
            batches += starts
            cached = length
        split, starts = _send(control, prompt)
        assert _reuse(split) == (cached, len(prompt) - cached)
        batches += starts
    assert batches == warm_batches == [0, L_A - 4 - 512, L_A - 4, len(prompt) - 4]
    assert split["tokens"] == body["tokens"] and _probs(split) == _probs(body)

    # The same prompt alone in a fresh server with checkpoints off: one -b batch, another
    # schedule, and logprobs that move (~5e-3 on this model) — what both checks above exclude.
    with llama((*DEBUG, "--ctx-checkpoints", "0")) as alone:
        naive, starts = _send(alone, prompt)
    assert starts == [0] != warm_batches
    assert _probs(naive) != _probs(body)


@pytest.mark.parametrize("configuration, sequence", [("cram0", "append"), ("cram0_step256", "msgs-A-C")])
def test_shadowlab_run_sends_the_split_control_of_a_healthy_restored_turn(
        tmp_path, model_cache, llama_binary, configuration, sequence):
    """`identity: {split_controls: all}` on the append probe (re-entry at A's L−4) and on message
    delimiters (re-entry at a user-message start, breaks at the later ones): shadowlab plans the
    control as the request sequence, sends it, and it equals the warm turn: no mismatch, no class."""
    from shadowlab import cli
    from shadowlab.results import records
    from shadowlab.judge import verdicts
    from shadowlab import plan as plan_module

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "matrices" / "ckpt-llama.yaml").read_text())
    data["engines"]["llama"]["binary"] = str(llama_binary)
    data["sequences"] = {sequence: data["sequences"][sequence]}
    data["prompts"] = {k: data["prompts"][k] for k in data["sequences"][sequence]}
    if "A" in data["prompts"]:
        data["prompts"]["A"]["tokens"] = L_A
    data["cells"] = {"include": [{"configuration": configuration, "sequence": sequence}]}
    data["identity"] = {"required": True, "control": False, "split_controls": "all"}
    data["expectations"] = []
    path = tmp_path / "split-llama.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = run_matrix(path, tmp_path / "run", model_cache)

    plan = plan_module.Plan.from_dict(records.read_json(run_dir / "plan.json"))
    (cell,) = plan.of_kind(plan_module.CellKind.SPLIT_CONTROL)
    warm_id = f"llama.{configuration}.{sequence}"
    warm = records.read_meta(run_dir / "cells" / warm_id / "meta.json").turns[1]
    points = cell.turns[-1].split_points  # a turn per request, turn k the first k + 1 lengths
    assert [t.split_points for t in cell.turns] == [points[:k + 1] for k in range(len(points))]
    assert cell.id == f"{warm_id}.split.1" and cell.flags[-2:] == ("--ctx-checkpoints", "0")
    assert warm.reused_tokens in points and points[-2:] == (warm.prompt_tokens - 4, warm.prompt_tokens)
    if sequence == "append":
        assert points == (L_A - 4 - 512, L_A - 4, L_A + EXTRA - 4, L_A + EXTRA)
    meta = records.read_meta(run_dir / "cells" / cell.id / "meta.json")
    assert meta.status is records.CellStatus.OK, meta.reason
    assert [(t.reused_tokens, t.processed_tokens) for t in meta.turns] == [
        (a, b - a) for a, b in zip((0, *points), points)]
    assert meta.turns[-1].completion.tokens == warm.completion.tokens
    verdict = verdicts.compute(run_dir)
    (checked,) = [t for c in verdict.cells if c.cell_id == warm_id for t in c.turns if t.index == 1]
    assert checked.identity.status.value == "identical" and checked.triage is None
    assert not [t.implausible for c in verdict.cells for t in c.turns if t.implausible]
    assert cli.main(["gate", str(run_dir)]) == 0  # each request judged as a turn: qualified
