"""The plausibility rules: each impossible figure is refused with a sentence naming it, and the
figures of real engines (the case study's turns, llama.cpp's shapes) pass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shadowlab.judge.plausibility import turn_problems
from shadowlab.judge.verdicts import CheckpointRef, Outcome, TurnVerdict

from synthetic_runs import ckpt_verdict


def ck(n_tokens: int, **changes) -> CheckpointRef:
    return dataclasses.replace(CheckpointRef(pos_min=n_tokens - 1, pos_max=n_tokens - 1, n_tokens=n_tokens,
                                             size_mib=0.032, took_ms=0.4), **changes)


# A restored turn as the reference engine reports it (POLICY=0, A→C): every figure possible.
HONEST = TurnVerdict(
    index=1, prompt_id="C", outcome=Outcome.RESTORED, prompt_tokens=4947, cached_tokens=4576,
    divergence_point=2531, re_entry_point=2048, re_entry_source="restore", reused_tokens=2048,
    processed_tokens=2899, reused_api=2048, processed_api=2899, reused_log=2048, processed_log=2899,
    saved_fraction=2048 / 4947, prefill_ms=230.0, restored=ck(2048), created=(ck(4431), ck(4943)),
    erased_cascade=(ck(4096),))
COLD = TurnVerdict(index=0, prompt_id="A", outcome=Outcome.COLD, prompt_tokens=300, divergence_point=0,
                   re_entry_point=0, reused_tokens=0, processed_tokens=300, reused_api=0, processed_api=300,
                   reused_log=0, processed_log=300, prefill_ms=20.0, created=(ck(296),))
TIMINGS = {"cache_n": 2048, "prompt_n": 2899, "prompt_ms": 230.0, "predicted_ms": float("inf")}


def test_honest_turns_have_no_impossible_figure():
    assert turn_problems(HONEST, TIMINGS) == ()
    assert turn_problems(COLD, {"cache_n": 0, "prompt_n": 300, "prompt_ms": 20.0}) == ()


def test_every_turn_of_the_case_study_is_possible():
    turns = [t for c in ckpt_verdict().cells for t in c.turns]
    assert len(turns) > 30
    assert [(t.prompt_id, turn_problems(t)) for t in turns if turn_problems(t)] == []


LIES = {
    "reused more than the prompt": (dict(reused_api=900, processed_api=300, prompt_tokens=300,
                                         divergence_point=None, restored=None, re_entry_point=None, created=()),
                                    "900 tokens reused of a 300-token prompt"),
    "processed more than the prompt": (dict(processed_log=6000), "6,000 tokens processed of a 4,947"),
    "reused + processed is not the prompt": (dict(processed_api=2000), "but the prompt has 4,947 tokens"),
    "negative log count": (dict(processed_log=-4), "-4 tokens processed: a negative count"),
    "negative prefill time": (dict(prefill_ms=-5.0), "prefill time -5 ms"),
    "negative restore time": (dict(restored=ck(2048, took_ms=-1.0)), "took -1 ms: a negative duration"),
    "negative checkpoint size": (dict(created=(ck(4431, size_mib=-0.5),)), "negative size"),
    "re-entry above the divergence point": (dict(re_entry_point=2600, restored=None),
                                            "re-entry point 2,600 lies above the divergence point 2,531"),
    "re-entry beyond the prompt": (dict(re_entry_point=5000, restored=None), "beyond the 4,947-token prompt"),
    "negative re-entry": (dict(re_entry_point=-3, restored=None), "re-entry point -3 is negative"),
    "restore past the divergence point": (dict(restored=ck(2540), re_entry_point=2500),
                                          "covers 2,540 tokens, past the divergence point"),
    "restore beyond the prompt": (dict(restored=ck(6000), re_entry_point=2500), "beyond the 4,947-token prompt"),
    "checkpoint created beyond the prompt": (dict(created=(ck(4947 + 10),)), "lies beyond the 4,947-token prompt"),
    "checkpoint with negative positions": (dict(erased_cascade=(ck(-3),)), "not a span of token positions"),
    "checkpoint with pos_min above pos_max": (dict(created=(ck(100, pos_min=200),)), "not a span"),
}


@pytest.mark.parametrize("name", sorted(LIES))
def test_an_impossible_figure_is_named(name):
    changes, words = LIES[name]
    problems = turn_problems(dataclasses.replace(HONEST, **changes), TIMINGS)
    assert any(words in p for p in problems), problems


@pytest.mark.parametrize("timings, words", [
    ({"cache_n": -5, "prompt_n": 300}, "timings.cache_n = -5 is not a token count"),
    ({"cache_n": "12", "prompt_n": 300}, "timings.cache_n = '12'"),
    ({"prompt_n": True}, "timings.prompt_n = True"),
    ({"prompt_ms": None}, "timings.prompt_ms is null, not a finite number"),
    ({"prompt_ms": float("nan")}, "not a finite number"),
    ({"prompt_ms": -5.0}, "timings.prompt_ms = -5 ms is negative"),
])
def test_raw_api_timings_that_are_no_figures(timings, words):
    problems = turn_problems(COLD, timings)
    assert any(words in p for p in problems), problems


def test_timings_shadowlab_does_not_use_are_not_judged():
    # predicted_ms Infinity, a 10^30 field: not believed, not used, so not the cell's failure
    assert turn_problems(COLD, {"cache_n": 0, "prompt_n": 300, "predicted_ms": float("inf"), "huge": 10**30}) == ()


@pytest.mark.parametrize("changes, words", [
    (dict(reused_api=299, processed_api=1), "the API says 299 tokens reused"),
    (dict(reused_log=120), "the log says 120 tokens reused"),
    (dict(restored=ck(100)), "the log restores a checkpoint at pos_max 99"),
    (dict(re_entry_point=64), "prefill re-enters at 64"),
])
def test_reuse_on_the_first_turn_of_a_fresh_process(changes, words):
    problems = turn_problems(dataclasses.replace(COLD, **changes))
    assert any("first turn of a fresh engine process" in p and words in p for p in problems), problems


def test_a_lower_bound_divergence_allows_a_re_entry_above_it():
    # ik_llama.cpp returns no completion token ids: the LCP may run on into the completion
    turn = dataclasses.replace(HONEST, re_entry_point=2600, restored=None, divergence_lower_bound=True)
    assert turn_problems(turn, TIMINGS) == ()


def test_a_fresh_slot_after_the_first_turn_may_reuse():
    # a later turn on another slot is "cold" to the verdicts, yet -cram may load a saved entry
    turn = dataclasses.replace(COLD, index=2, reused_api=100, processed_api=200, re_entry_point=100,
                               reused_log=100, processed_log=200)
    assert turn_problems(turn) == ()


def test_each_figure_is_said_once():
    turn = dataclasses.replace(HONEST, re_entry_point=2600, restored=None)
    problems = turn_problems(turn, TIMINGS)
    assert len(problems) == len(set(problems)) == 1


def test_a_checkpoint_may_cover_the_generated_tokens_but_no_more():
    # ik_llama.cpp checkpoints during generation: pos_max 4,961 after a 4,947-token prompt and
    # 16 generated tokens (tests/fixtures/runs/ik_llama.cpp-0.1.5); one more is impossible.
    timings = {**TIMINGS, "predicted_n": 16}
    inside = dataclasses.replace(HONEST, created=(ck(4947 + 16),))
    assert turn_problems(inside, timings) == ()
    beyond = dataclasses.replace(HONEST, created=(ck(4947 + 17),))
    assert any("beyond the 4,947-token prompt and its 16 generated tokens" in p
               for p in turn_problems(beyond, timings))


def test_every_captured_real_engine_run_is_plausible(tmp_path):
    # Real llama.cpp and ik_llama.cpp captures: a rule that flags them is a false accusation.
    import shutil

    from shadowlab.judge import verdicts

    runs = Path(__file__).resolve().parent.parent / "fixtures" / "runs"
    for name in ("llama.cpp-b9093", "ik_llama.cpp-0.1.5"):
        copy = tmp_path / name
        shutil.copytree(runs / name, copy)
        run = verdicts.compute(copy)
        flagged = [(c.cell_id, t.index, t.implausible) for c in run.cells for t in c.turns if t.implausible]
        assert not flagged, (name, flagged)
