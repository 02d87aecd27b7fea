"""The seed's shadow experiment, reproduced through HTTP on a fresh engine process per case.

A = 4,560 tokens; C = A[:2531] + other tokens (4,947 in all); B = 99 tokens sharing nothing with
A or C. Production cache flags `-b 2048 -ub 512 --ctx-checkpoints 64 -cram 0 -np 1`, greedy
decoding, the tiny preset. Each warm completion is compared byte for byte with a cold one (a
fresh process fed the same prompt); the stale-restore fault shows that comparison failing.

The whole module starts 12 engine processes (about 100 s on a busy 2-core machine): it is
marked `slow`, and runs unless deselected with `-m "not slow"`.
"""

from __future__ import annotations

import random

import pytest

from engine_process import fields, running, tiny_model

pytestmark = pytest.mark.slow

SEED_FLAGS = ["-b", "2048", "-ub", "512", "--ctx-checkpoints", "64", "-cram", "0", "-np", "1",
              "--kv-unified", "-lv", "4"]
CONFIGS = {
    "defaults": {},
    "policy0": {"PXA_CKPT_PROMPT_POLICY": "0"},
    "prompt_end": {"PXA_CKPT_PROMPT_END": "1"},
    "both": {"PXA_CKPT_PROMPT_POLICY": "0", "PXA_CKPT_PROMPT_END": "1"},
}
N_PREDICT = 16
N_PROBS = 4  # top logprobs are compared too, bit for bit

_rng = random.Random(20261020)
A = [_rng.randrange(256) for _ in range(4560)]
C = A[:2531] + [(A[2531] + 1) % 256] + [_rng.randrange(256) for _ in range(4947 - 2532)]
B = [_rng.randrange(256) for _ in range(99)]
B[0] = (A[0] + 7) % 256  # zero overlap with A and C
EXT = A + [_rng.randrange(256) for _ in range(206)]  # the append-only probe


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return tmp_path_factory.mktemp("case-study")


def run_sequence(model, logdir, prompts, env=None, flags=(), name="cell"):
    """Fresh process, one completion per prompt; returns (responses, engine)."""
    with running(model, [*SEED_FLAGS, *flags], logdir, env=env, name=name) as engine:
        responses = [engine.complete(p, n_predict=N_PREDICT, n_probs=N_PROBS) for p in prompts]
        return responses, engine


def created(engine, task):
    return [fields(l)["n_tokens"] for l in engine.task_lines(task, "created context checkpoint")]


def output(response):
    """Everything a warm turn must reproduce: text bytes, token ids, top logprobs."""
    return response["content"].encode("utf-8"), response["tokens"], response["completion_probabilities"]


@pytest.fixture(scope="module")
def cold(model, logdir):
    """Cold reference outputs: each prompt as the first request of a fresh process."""
    out = {}
    for name, prompt in (("C", C), ("EXT", EXT)):
        (response,), _ = run_sequence(model, logdir, [prompt], name=f"cold-{name}")
        assert response["timings"]["cache_n"] == 0
        out[name] = output(response)
    return out


def test_defaults_a_to_c_is_forced(model, logdir, cold):
    (a, c), engine = run_sequence(model, logdir, [A, C], name="defaults-AC")
    assert created(engine, 0) == [4044, 4556]
    assert len(engine.task_lines(1, "forcing full prompt re-processing due to lack of cache data")) == 1
    assert engine.task_lines(1, "restored context checkpoint") == []
    erased = engine.task_lines(1, "erased invalidated context checkpoint")
    assert [fields(l)["pos_next"] for l in erased] == [0, 0]
    assert (c["timings"]["cache_n"], c["timings"]["prompt_n"]) == (0, 4947)
    assert output(c) == cold["C"]


def test_policy0_a_to_c_restores_2048_tokens(model, logdir, cold):
    (a, c), engine = run_sequence(model, logdir, [A, C], env=CONFIGS["policy0"], name="policy0-AC")
    assert created(engine, 0) == [2048, 4044, 4096, 4556]
    pos_max = [fields(l)["pos_max"] for l in engine.task_lines(0, "created context checkpoint")]
    assert 2047 in pos_max and 4095 in pos_max
    (restored,) = engine.task_lines(1, "restored context checkpoint")
    assert fields(restored)["n_tokens"] == 2048 and "took" in restored and "MiB" in restored
    assert engine.task_lines(1, "forcing") == []
    assert (c["timings"]["cache_n"], c["timings"]["prompt_n"]) == (2048, 2899)
    assert output(c) == cold["C"]


def test_prompt_end_adds_a_checkpoint_and_changes_nothing_for_a_to_c(model, logdir, cold):
    (a, c), engine = run_sequence(model, logdir, [A, C], env=CONFIGS["prompt_end"], name="end-AC")
    assert created(engine, 0) == [4044, 4556, 4560]
    assert len(engine.task_lines(1, "forcing full prompt re-processing")) == 1
    assert (c["timings"]["cache_n"], c["timings"]["prompt_n"]) == (0, 4947)
    assert output(c) == cold["C"]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_a_b_c_re_prefills_c_in_full(model, logdir, cold, config):
    (a, b, c), engine = run_sequence(model, logdir, [A, B, C], env=CONFIGS[config], name=f"{config}-ABC")
    assert engine.lines("forcing") == []  # B and C both reset silently
    assert len(engine.task_lines(1, "erased invalidated")) == len(created(engine, 0))
    assert engine.task_lines(2, "restored") == []
    assert (b["timings"]["cache_n"], c["timings"]["cache_n"], c["timings"]["prompt_n"]) == (0, 0, 4947)
    assert output(c) == cold["C"]


def test_append_only_turn_restores_under_defaults(model, logdir, cold):
    (a, ext), engine = run_sequence(model, logdir, [A, EXT], name="append")
    assert a["tokens"][0] != EXT[len(A)], "the probe must diverge right after A"
    (restored,) = engine.task_lines(1, "restored context checkpoint")
    assert fields(restored)["n_tokens"] == 4556
    assert (ext["timings"]["cache_n"], ext["timings"]["prompt_n"]) == (4556, 210)
    assert output(ext) == cold["EXT"]


@pytest.mark.parametrize("sequence", ["A-C", "append"])
def test_stale_restore_fault_breaks_identity(model, logdir, cold, sequence):
    """The restored turns again, with the fault: re-entry one token after the checkpoint."""
    prompts, env, n_tokens, key = {
        "A-C": ([A, C], CONFIGS["policy0"], 2048, "C"),
        "append": ([A, EXT], {}, 4556, "EXT"),
    }[sequence]
    (a, warm), engine = run_sequence(model, logdir, prompts, env=env, flags=["--fault", "stale-restore"],
                                     name=f"stale-{sequence}")
    (restored,) = engine.task_lines(1, "restored context checkpoint")
    assert (fields(restored)["n_tokens"], fields(restored)["n_past"]) == (n_tokens, n_tokens + 1)
    assert warm["timings"]["cache_n"] == n_tokens + 1
    assert output(warm) != cold[key]


def test_cram_rescues_a_b_a(model, logdir):
    (a1, b, a2), engine = run_sequence(model, logdir, [A, B, A], flags=["-cram", "8192"], name="cram-ABA")
    assert engine.task_lines(2, "prompt cache: loaded")
    assert a2["timings"]["cache_n"] == 4556
    assert output(a2) == output(a1)
