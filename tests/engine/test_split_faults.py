"""Explicit split points and the numerics faults (issue 16), on real engine processes.

The case study's append probe: A (4,560 tokens), then EXT = A + 206 tokens, which restores
A's checkpoint at 4,556 and so is prefilled through another batch schedule than a cold EXT.
With `split-noise` that schedule change alone changes the output; a fresh process told the
warm turn's split points reproduces the warm output exactly. `nondeterministic` makes two
cold runs differ. A healthy engine gives one output for every schedule.
"""

from __future__ import annotations

import random

import pytest

from engine_process import running, tiny_model
from shadowlab.logs import parse as logparse
from shadowlab.judge import splits
from shadowlab.judge.identity import Output, TriageClass, triage
from shadowlab_engine.checkpoints import batch_ends
from shadowlab_engine.faults import FaultError, parse_faults

pytestmark = pytest.mark.slow

UB = 512
FLAGS = ["-b", "2048", "-ub", str(UB), "--ctx-checkpoints", "64", "-cram", "0", "-np", "1", "-lv", "4"]
N_PREDICT, N_PROBS = 16, 4

_rng = random.Random(20261020)  # the prompts of tests/engine/test_case_study.py
A = [_rng.randrange(256) for _ in range(4560)]
_C = [_rng.randrange(256) for _ in range(4947 - 2532)]
B = [_rng.randrange(256) for _ in range(99)]
EXT = A + [_rng.randrange(256) for _ in range(206)]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _out(response: dict) -> tuple:
    return response["tokens"], response["completion_probabilities"]


def _complete(engine, prompt, **extra) -> dict:
    return engine.complete(prompt, n_predict=N_PREDICT, n_probs=N_PROBS, **extra)


def warm_schedule(engine) -> tuple[list[int], int]:
    """The split points of the warm EXT (task 1), derived from the live log by shadowlab's own
    `splits.warm_schedule` (A's batches up to the restored checkpoint, then EXT's)."""
    events = logparse.parse(engine.log_file, "reference").events
    s = splits.warm_schedule(events, 0, 1, len(A), len(EXT), UB)
    return list(s.split_points), s.re_entry


def _append_probe(model, tmp_path, fault: list[str], name: str) -> dict:
    with running(model, [*FLAGS, *fault], tmp_path, name=f"{name}-warm") as warm:
        _complete(warm, A)
        warm_out = _out(_complete(warm, EXT))
        schedule, re_entry = warm_schedule(warm)
    with running(model, [*FLAGS, *fault], tmp_path, name=f"{name}-cold") as cold:
        cold_out = _out(_complete(cold, EXT))
        control_out = _out(_complete(cold, EXT, cache_prompt=False, split_points=schedule))
        assert cold.task_lines(1, "cached n_tokens = 0")  # the control computed all of EXT
        # split points on a warm slot (cache_prompt true): they apply above the re-entry point
        _complete(cold, A)
        warm_split_out = _out(_complete(cold, EXT, split_points=schedule))
        assert cold.task_lines(3, "restored context checkpoint")
    with running(model, [*FLAGS, *fault], tmp_path, name=f"{name}-cold2") as cold2:
        cold2_out = _out(_complete(cold2, EXT))
    return {"warm": warm_out, "cold": cold_out, "control": control_out, "cold2": cold2_out,
            "warm_split": warm_split_out,
            "schedule": schedule, "re_entry": re_entry}


def _output(out: tuple) -> Output:
    tokens, probs = out
    top = tuple(tuple((p["id"], p["logprob"]) for p in entry["top_logprobs"]) for entry in probs)
    return Output("", tuple(tokens), top)


def _triage(r: dict):
    return triage(_output(r["warm"]), _output(r["cold"]), split_control=_output(r["control"]),
                  control=_output(r["cold2"]))


def test_numerics_faults_parse():
    assert parse_faults(["split-noise"], "nondeterministic").names() == ["split-noise", "nondeterministic"]
    with pytest.raises(FaultError):
        parse_faults(["split-noise=1"], None)


def test_batch_ends():
    assert batch_ends(0, {4044, 4556, 4560}, 512)[-4:] == [3584, 4044, 4556, 4560]
    assert batch_ends(4556, {4762, 4766}, 512) == [4762, 4766]
    assert batch_ends(10, {5, 10}, 4) == []


def test_split_noise_warm_differs_from_cold_and_equals_its_split_control(model, tmp_path):
    r = _append_probe(model, tmp_path, ["--fault", "split-noise"], "split-noise")
    assert r["re_entry"] == 4556 and 4044 in r["schedule"] and 4556 in r["schedule"]
    assert r["warm"][0] != r["cold"][0], "split-noise must flip greedy tokens of the append probe"
    assert r["control"] == r["warm"] == r["warm_split"]
    t = _triage(r)
    assert t.cls is TriageClass.SPLIT_SENSITIVITY, t.detail


def test_stale_restore_is_classed_corrupted_state(model, tmp_path):
    r = _append_probe(model, tmp_path, ["--fault", "stale-restore"], "stale")
    assert r["warm"] != r["cold"] and r["cold"] == r["cold2"]
    t = _triage(r)
    assert t.cls is TriageClass.CORRUPTED_STATE, t.detail
    assert t.warm_vs_split is not None and t.warm_vs_split.first_token is not None


def test_nondeterministic_engine_is_classed_nondeterminism(model, tmp_path):
    r = _append_probe(model, tmp_path, ["--fault", "nondeterministic"], "nondet-probe")
    t = _triage(r)
    assert t is not None and t.cls is TriageClass.NONDETERMINISM, t and t.detail


def test_healthy_engine_one_output_for_every_schedule(model, tmp_path):
    r = _append_probe(model, tmp_path, [], "healthy")
    assert r["warm"] == r["cold"] == r["control"] == r["cold2"] == r["warm_split"]
    assert _triage(r) is None  # no mismatch, so no class at all


def test_nondeterministic_cold_runs_differ(model, tmp_path):
    with running(model, [*FLAGS, "--fault", "nondeterministic"], tmp_path, name="nondet") as e:
        first, second = (_out(_complete(e, EXT, cache_prompt=False)) for _ in range(2))
    # tokens flip only sometimes (the noise is tiny); the top logprobs move every time
    assert first != second, "two cold runs under the nondeterministic fault must differ"


def test_split_points_refused_when_not_increasing_positions_inside_the_prompt(model, tmp_path):
    with running(model, FLAGS, tmp_path, name="bad-splits") as e:
        for bad in ([0], [5, 5], [4, 3], [len(B)], ["1"], [True], 7):
            r = e.post("/completion", {"prompt": B, "n_predict": 1, "split_points": bad})
            assert r.status_code == 400, (bad, r.text)
            assert "split_points" in r.json()["error"]["message"]
        assert e.complete(B, n_predict=1, split_points=[1, 50])["tokens"] is not None
