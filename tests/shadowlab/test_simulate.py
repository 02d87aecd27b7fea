"""`shadowlab simulate`: the model reproduces the case study's cells, agrees turn by turn with
the live reference engine under every policy, reproduces the case study's conclusion on its
traffic shape, and refuses bad input without a traceback.

The exactness tests replay seeded traffic (token-id prompts on `/completion`, n_predict 1 so a
slot caches exactly its prompt) on a fresh reference engine per (seed, policy) and compare each
turn's `timings.cache_n` and slot with the simulator's prediction: equal, turn for turn. Small
batches (-b 256 -ub 64) and a small ring (--ctx-checkpoints 8) make a few hundred tokens
exercise POLICY=0's batch checkpoints, ring eviction and every outcome.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shadowlab import simulate, traffic
from shadowlab.simulate import Policy, parse_policy
from shadowlab.traffic import Dist, Request, Segment, TrafficShape

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
import engine_process  # noqa: E402

MIB = 1024 * 1024
VOCAB = range(32, 127)  # printable bytes: plain tokens for both engines
SEEDS = (1, 2, 3)


def exactness_shape(seed: int) -> TrafficShape:
    """Interleaved conversations whose re-rendered block puts the divergence below the tail
    checkpoints, with all three interloper kinds."""
    return TrafficShape(conversations=3, turns=4, concurrent=2, system_tokens=Dist("uniform", 100, 300),
                        turn_tokens=Dist("uniform", 60, 260), volatile_tokens=Dist("uniform", -100, 200, low=0),
                        user_tokens=Dist("uniform", 10, 40), interloper_share=0.3,
                        interloper_tokens=Dist("uniform", 30, 400),
                        interloper_kinds=(("zero", 1.0), ("system", 1.0), ("near_duplicate", 1.0)),
                        arrival="random", gap_s=111.0, seed=seed)  # 3,500 turns over ~4.5 days


def test_traffic_for_the_engines_is_materialised_exactly():
    for seed in SEEDS:
        requests = traffic.generate(exactness_shape(seed))
        m = traffic.Materialiser(VOCAB, seed)
        traffic.check_materialised(requests, [m.prompt(r) for r in requests])


# --------------------------------------------------------------------------- case study cells

A = (Segment(1, 0, 2531), Segment(2, 0, 4560 - 2531))
C = (Segment(1, 0, 2531), Segment(3, 0, 4947 - 2531))
B = (Segment(4, 0, 99),)


def _reused(policy: str, *prompts: tuple[Segment, ...]) -> list[int]:
    requests = [Request(float(i), None, p) for i, p in enumerate(prompts)]
    return [t.reused for t in simulate.simulate(requests, parse_policy(policy))]


def test_the_case_study_cells():
    assert _reused("baseline", A, C) == [0, 0]  # tail-only checkpoints all above 2,531
    assert _reused("policy0", A, C) == [0, 2048]  # the 41.4 % cell
    assert _reused("prompt-end", A, C) == [0, 0]  # inert for a mid-prompt divergence
    for policy in ("baseline", "policy0", "prompt-end", "llama-1slot"):
        assert _reused(policy, A, B, C)[-1] == 0  # B's cascade erased A's checkpoints
    assert _reused("cram", A, B, A)[-1] == 4556  # -cram rescues A-B-A, not A-B-C
    assert _reused("cram", A, B, C)[-1] == 0
    assert _reused("retention+policy0", A, B, C)[-1] == 2048  # retention rescues A-B-C


def test_affinity_keeps_a_conversation_on_its_slot():
    requests = [Request(0, "c", A), Request(1, None, B), Request(2, "c", C)]
    plain = simulate.simulate(requests, parse_policy("slots4:prompt_policy=0"))
    kept = simulate.simulate(requests, parse_policy("affinity+policy0"))
    assert kept[2].reused == 2048 and kept[1].slot != kept[0].slot == kept[2].slot
    assert plain[2].reused == 2048  # 4 slots and LRU: B took an empty slot anyway
    one = simulate.simulate(requests, parse_policy("affinity+policy0:slots=1"))
    assert one[2].reused == 0  # one slot: nothing to route to


# --------------------------------------------------------------------------- live reference engine

ENGINE_FLAGS = ["-b", "256", "-ub", "64", "--ctx-checkpoints", "8", "-cram", "0"]
CKPT_MIB, KV_MIB = 363264 / MIB, 128 / MIB  # /props checkpoint_bytes, kv_bytes_per_token (checked below)

# name: (engine flags, engine env, the simulator's policy)
REFERENCE = {
    "baseline": ([], {}, "baseline"),
    "policy0": ([], {"PXA_CKPT_PROMPT_POLICY": "0"}, "policy0"),
    "prompt-end": ([], {"PXA_CKPT_PROMPT_END": "1"}, "prompt-end"),
    "cram": (["-cram", "8192"], {}, "cram"),
    "slots3": (["-np", "3"], {"PXA_CKPT_PROMPT_POLICY": "0"}, "slots4:slots=3,prompt_policy=0"),
    "affinity": (["-np", "2"], {"SHADOWLAB_SLOT_AFFINITY": "1", "PXA_CKPT_PROMPT_POLICY": "0"},
                 "affinity+policy0:slots=2"),
    "retention": ([], {"SHADOWLAB_CKPT_RETAIN_MIB": "2", "PXA_CKPT_PROMPT_POLICY": "0"},
                  "retention+policy0:retain_mib=2"),
}


def reference_policy(text: str) -> Policy:
    p = parse_policy(text + ("," if ":" in text else ":") + "n_batch=256,n_ubatch=64,ctx_checkpoints=8")
    return Policy(**{**p.__dict__, "checkpoint_mib": CKPT_MIB, "kv_mib_per_token": KV_MIB, "state_mib": 0.0})


def replay(engine, requests: list[Request], seed: int, key: str = "prompt_cache_key") -> list[tuple[int, int]]:
    """(reused, slot) per request, as the engine reports them."""
    m = traffic.Materialiser(VOCAB, seed)
    out = []
    for r in requests:
        body = {"prompt": m.prompt(r), "n_predict": r.output_length, "temperature": 0, "cache_prompt": True}
        if r.conversation is not None and key:
            body[key] = r.conversation
        resp = engine.post("/completion", body)
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        out.append((doc["timings"]["cache_n"], doc["id_slot"]))
    return out


def predicted(requests: list[Request], policy: Policy) -> list[tuple[int, int]]:
    return [(t.reused, t.slot) for t in simulate.simulate(requests, policy)]


@pytest.fixture(scope="module")
def model() -> Path:
    return engine_process.tiny_model()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", list(REFERENCE))
def test_reference_engine_reuses_exactly_what_the_simulator_predicts(config, seed, model, tmp_path):
    flags, env, policy = REFERENCE[config]
    requests = traffic.generate(exactness_shape(seed))
    with engine_process.running(model, [*ENGINE_FLAGS, *flags], tmp_path, env=env) as engine:
        props = engine.client.get("/props").json()
        assert (props["checkpoint_bytes"], props["kv_bytes_per_token"]) == (363264, 128)
        measured = replay(engine, requests, seed)
    want = predicted(requests, reference_policy(policy))
    assert measured == want
    assert any(reused for reused, _ in measured)  # the traffic reuses something to agree on


def test_a_broken_engine_disagrees_with_the_simulator(model, tmp_path):
    """The comparison can fail: a stale restore (re-enters one token late) is caught."""
    requests = traffic.generate(exactness_shape(1))
    flags, env, policy = REFERENCE["policy0"]
    with engine_process.running(model, [*ENGINE_FLAGS, "--fault", "stale-restore"], tmp_path, env=env) as engine:
        measured = replay(engine, requests, 1)
    assert measured != predicted(requests, reference_policy(policy))


# --------------------------------------------------------------------------- the case study's shape


def case_study_shape(seed: int = 0, scale: int = 1) -> TrafficShape:
    """~3,500 turns, ~66M prompt tokens, one shared lane: long-lived conversations with a
    re-rendered block deep in the prompt, and low-overlap interloper jobs (57 % of turns share
    < 512 tokens with the request before them in the case study)."""
    return TrafficShape(
        conversations=30 * scale, turns=50, concurrent=3,
        system_tokens=Dist("uniform", 3000, 6000), turn_tokens=Dist("lognormal", 450, 0.6, 50, 4000),
        volatile_tokens=Dist("uniform", 1500, 9000), user_tokens=Dist("uniform", 50, 400),
        interloper_share=0.57, interloper_tokens=Dist("lognormal", 8500, 1.0, 99, 258_037),
        interloper_kinds=(("zero", 0.8), ("system", 0.15), ("near_duplicate", 0.05)),
        arrival="random", gap_s=111.0, seed=seed)  # 3,500 turns over ~4.5 days


@pytest.fixture(scope="module")
def case_study() -> dict:
    requests = traffic.generate(case_study_shape())
    loaded = traffic.Loaded(tuple(requests), (), "case-study", "shape")
    policies = [parse_policy(p) for p in ("baseline", "policy0", "affinity", "affinity+policy0", "retention+policy0")]
    return simulate.run_policies(loaded, policies, 2200.0, per_turn=False)


def test_the_case_study_shape_is_realised(case_study):
    s = case_study["shape"]
    assert 3300 <= s["requests"] <= 3700
    assert 50e6 <= s["prompt_tokens"] <= 80e6
    assert s["share_near_zero_overlap"] >= 0.5  # bimodal: most turns near zero ...
    assert s["share_4096_or_more"] >= 0.05  # ... and a heavy upper mode
    assert s["shared_with_previous"]["p90"] >= 2048


def test_the_case_study_conclusion(case_study):
    """POLICY=0 alone recovers near zero; affinity (with POLICY=0, the pre-validated companion)
    recovers most of the reusable share; POLICY=0's cost is reported. Thresholds from the
    mechanism: with one slot, a turn can reuse at most what it shares with the request before
    it, so POLICY=0's reuse is bounded by the shape's prefix shared with the previous request;
    with affinity and a slot per live conversation, each conversation turn loses at most one
    -b batch (2,048 tokens) below its divergence point."""
    s = case_study["shape"]
    by = {p["policy"]: p for p in case_study["policies"]}
    base, p0, aff0 = by["baseline"], by["policy0"], by["affinity+policy0"]
    assert p0["reused_tokens"] <= s["reusable_with_previous"]
    # the shape interleaves: what a turn shares with the request before it is a small part of
    # what it shares with its own conversation's previous turn
    assert s["reusable_with_previous"] < 0.25 * s["consecutive_ideal_tokens"]
    assert p0["share_of_consecutive_ideal"] < 0.25
    n_conv_turns = s["requests"] - s["interlopers"]
    floor = s["consecutive_ideal_tokens"] - 2048 * n_conv_turns
    assert aff0["reused_tokens"] >= floor
    assert aff0["share_of_consecutive_ideal"] > 0.5  # most of it
    assert aff0["share_of_consecutive_ideal"] > 4 * p0["share_of_consecutive_ideal"]
    # the cost side: POLICY=0 creates a checkpoint per -b batch, tail-only about two per turn
    assert p0["creations_per_turn"] > 3 * base["creations_per_turn"]
    assert p0["checkpoint_ms_per_turn"] > base["checkpoint_ms_per_turn"]


# --------------------------------------------------------------------------- the command


def run_cli(*argv: str) -> int:
    return simulate.main(list(argv))


def test_cli_table_json_and_html(tmp_path, capsys):
    shape = tmp_path / "shape.yaml"
    shape.write_text("conversations: 2\nturns: 3\ninterloper_share: 0.3\nseed: 4\n")
    assert run_cli(str(shape), "--policy", "baseline", "--policy", "policy0:n_batch=128") == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "policy0:n_batch=128" in out
    assert run_cli(str(shape), "--json", "--out", str(tmp_path / "o")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == 1 and len(doc["policies"]) == len(simulate.DEFAULT_POLICIES)
    assert "<svg" in (tmp_path / "o" / "simulate.html").read_text()


@pytest.mark.parametrize("policy", ["nope", "baseline:slots=0", "baseline:colour=red", "baseline:slots=two",
                                    "llama-1slot:affinity=1"])
def test_cli_refuses_a_bad_policy(policy, tmp_path, capsys):
    shape = tmp_path / "shape.yaml"
    shape.write_text("conversations: 1\n")
    assert run_cli(str(shape), "--policy", policy) == 2
    assert "shadowlab simulate:" in capsys.readouterr().err


def test_cli_names_the_bad_line(tmp_path, capsys):
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": []}\n')
    assert run_cli(str(bad)) == 2
    assert f"{bad}:2: 'input_length' must be >= 1" in capsys.readouterr().err
