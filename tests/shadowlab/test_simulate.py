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
import random
import sys
from dataclasses import replace
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


def shape_misses(realised: dict) -> list[str]:
    """Where a realised shape (traffic.realised_shape) is off the case study's measured one
    (traffic.CASE_STUDY), beyond the tolerance stated here: sizes within 10-15 %, the low mode
    of the shared prefix (min, p10, p25, median: the template header) exact, p75 / p90 within
    25 %, the largest shared prefix (one sample) within a factor of 2, the shares within 3
    points and the reusable share within 2."""
    want, misses = traffic.CASE_STUDY, []

    def near(name: str, got: float, target: float, rel: float = 0.0, points: float = 0.0, factor: float = 0.0):
        ok = (target / factor <= got <= target * factor) if factor else abs(got - target) <= rel * target + points
        if not ok:
            misses.append(f"{name}: {got:,.3f} vs {target:,.3f}")

    near("requests", realised["requests"], want["requests"], rel=0.10)
    near("prompt_tokens", realised["prompt_tokens"], want["prompt_tokens"], rel=0.15)
    near("prompt median", realised["prompt_size"]["median"], want["prompt_size"]["median"], rel=0.15)
    near("prompt max", realised["prompt_size"]["max"], want["prompt_size"]["max"], rel=0.05)
    shared, target = realised["shared_with_previous"], want["shared_with_previous"]
    for key in ("min", "p10", "p25", "median"):
        near(f"shared {key}", shared[key], target[key])
    for key in ("p75", "p90"):
        near(f"shared {key}", shared[key], target[key], rel=0.25)
    near("shared max", shared["max"], target["max"], factor=2.0)
    near("share < 512", realised["share_near_zero_overlap"], want["share_near_zero_overlap"], points=0.03)
    near("share 4,096+", realised["share_4096_or_more"], want["share_4096_or_more"], points=0.03)
    near("reusable share", realised["reusable_with_previous"] / realised["prompt_tokens"], want["reusable_share"],
         points=0.02)
    return misses


CASE_POLICIES = ("baseline", "policy0", "affinity", "affinity+policy0", "retention+policy0")


@pytest.fixture(scope="module")
def case_study() -> tuple[list[Request], dict]:
    requests = traffic.generate(TrafficShape.case_study())
    loaded = traffic.Loaded(tuple(requests), (), "case-study", "shape")
    return requests, simulate.run_policies(loaded, [parse_policy(p) for p in CASE_POLICIES], 2200.0)


def test_the_case_study_shape_is_realised(case_study):
    _, doc = case_study
    assert shape_misses(doc["shape"]) == []
    assert doc["shape"]["divergence_depth"]["median"] >= 2048  # a conversation diverges deep in its prompt


def test_a_shape_off_the_case_study_misses():
    """The tolerance can fail: the earlier preset (interlopers sharing system prompts, no template
    header) realised 89 % of turns under 512 tokens and no 3-token low mode."""
    off = TrafficShape(conversations=30, turns=50, concurrent=3, system_tokens=Dist("uniform", 3000, 6000),
                       turn_tokens=Dist("lognormal", 450, 0.6, 50, 4000), volatile_tokens=Dist("uniform", 1500, 9000),
                       user_tokens=Dist("uniform", 50, 400), interloper_share=0.57,
                       interloper_tokens=Dist("lognormal", 8500, 1.0, 99, 258_037),
                       interloper_kinds=(("zero", 0.8), ("system", 0.15), ("near_duplicate", 0.05)), arrival="random")
    misses = shape_misses(traffic.realised_shape(traffic.generate(off)))
    assert any(m.startswith("share < 512") for m in misses) and any(m.startswith("shared p25") for m in misses)


def test_a_preamble_reads_from_a_shape_file():
    shape = traffic.shape_from_dict({"preamble": {32: 0.55, 3: 0.4, 1: 0.05}, "seed": 3})
    requests = traffic.generate(shape)
    assert {r.segments[0].length for r in requests} <= {1, 3, 32}
    assert len({r.segments[0].block for r in requests}) == 1  # one header block shared by all
    for bad in ({"preamble": [32]}, {"preamble": {0: 1.0}}, {"preamble": {"x": 1.0}}, {"preamble": {8: 0.0}}):
        with pytest.raises(traffic.TrafficError, match="preamble"):
            traffic.shape_from_dict(bad)


def test_the_case_study_conclusion(case_study):
    """What the mechanism says on the case study's shape, each bound derived, not fitted:

    - one slot: a turn can reuse at most what it shares with the request before it, so POLICY=0
      reuses at most `reusable_with_previous`, and on a conversation turn that follows an
      interloper at most what it shares with that interloper (the template header, <= 32 tokens):
      under interleaving POLICY=0 recovers near zero (below 1 % of those turns' ceiling);
    - but where a turn follows its own conversation's previous turn, POLICY=0 keeps a checkpoint
      every -b batch (2,048 tokens), so it loses at most 2,047 tokens of that shared prefix: on
      the case study's OWN prefix statistics (24 % of turns sharing 4,096+ with the request
      before them) POLICY=0 alone recovers most of the reusable share, not zero;
    - affinity (+POLICY=0), a slot per live conversation, loses at most one batch per turn of the
      whole consecutive-turn ideal, interleaved turns included;
    - POLICY=0's cost: one checkpoint per -b batch processed, two or three at the tail."""
    requests, doc = case_study
    s = doc["shape"]
    by = {p["policy"]: p for p in doc["policies"]}
    base, p0, aff0 = by["baseline"], by["policy0"], by["affinity+policy0"]
    consecutive = doc["ideal"]["consecutive"]
    reused = p0["turns"]["reused"]
    assert p0["reused_tokens"] <= s["reusable_with_previous"]
    interleaved = [i for i in range(1, len(requests))
                   if requests[i].conversation is not None and requests[i - 1].conversation is None]
    with_interloper = sum(traffic.common_prefix(requests[i - 1].segments, requests[i].segments) for i in interleaved)
    assert sum(reused[i] for i in interleaved) <= with_interloper <= 32 * len(interleaved)
    lost_to_interleaving = sum(consecutive[i] for i in interleaved)
    assert with_interloper < 0.01 * lost_to_interleaving
    followers = [i for i in range(1, len(requests))
                 if requests[i].conversation is not None and requests[i].conversation == requests[i - 1].conversation]
    assert all(reused[i] >= consecutive[i] - 2047 for i in followers)
    assert p0["reused_tokens"] > 0.5 * s["reusable_with_previous"]  # most of it, as derived above
    assert base["reused_tokens"] < 0.01 * s["reusable_with_previous"]  # tail-only: the case study's forced turns
    n_conv_turns = s["requests"] - s["interlopers"]
    assert aff0["reused_tokens"] >= s["consecutive_ideal_tokens"] - 2048 * n_conv_turns
    assert aff0["share_of_consecutive_ideal"] > p0["share_of_consecutive_ideal"] + 0.2
    batches = p0["processed_tokens"] / s["requests"] / 2048
    assert batches <= p0["creations_per_turn"] <= batches + 3
    assert p0["creations_per_turn"] > 3 * base["creations_per_turn"]


def test_interlopers_placed_before_turns_sit_between_every_pair():
    """`before_turns` puts a job in front of every turn that continues its conversation when
    there are enough jobs; `random` leaves many turns right after their own previous one."""
    base = TrafficShape(conversations=3, turns=5, concurrent=1, interloper_share=0.5, seed=2)
    placed = traffic.generate(replace(base, interloper_placement="before_turns"))
    classes = [simulate.turn_class(placed, i) for i in range(len(placed))]
    assert "after_own_turn" not in classes and classes.count("interloper") == sum(r.conversation is None for r in placed)
    anywhere = traffic.generate(base)
    assert [simulate.turn_class(anywhere, i) for i in range(len(anywhere))].count("after_own_turn") > 0
    # Fewer jobs than continuing turns: each one still goes in front of such a turn.
    few = traffic.generate(replace(base, interloper_share=0.2, interloper_placement="before_turns"))
    for i, r in enumerate(few):
        if r.conversation is None:
            assert i + 1 < len(few) and few[i + 1].conversation is not None and i > 0
    with pytest.raises(traffic.TrafficError, match="interloper_placement"):
        traffic.shape_from_dict({"interloper_placement": "somewhere"})


RANDOM_SHAPES = range(16)


@pytest.mark.parametrize("seed", RANDOM_SHAPES)
def test_policy0_keeps_what_the_request_before_shared(seed):
    """docs/DESIGN.md §10, the bound the case study's conclusion is checked with: on one slot,
    POLICY=0 (a checkpoint in every -b batch processed; the cascade erases only above re-entry)
    reuses at least L − (n_batch − 1) of the L tokens a request shares with the one before it,
    whatever the traffic, while the ring holds a prompt's checkpoints. The default policy does
    not (its tail checkpoints sit above a mid-prompt divergence)."""
    rng = random.Random(seed)
    shape = TrafficShape(conversations=rng.randint(2, 8), turns=rng.randint(3, 12), concurrent=rng.randint(1, 3),
                         system_tokens=Dist("uniform", 100, 6000), turn_tokens=Dist("uniform", 50, 3000),
                         volatile_tokens=Dist("uniform", 0, 4000), interloper_share=rng.choice([0.0, 0.2, 0.5]),
                         interloper_kinds=(("zero", 1.0), ("system", 1.0), ("near_duplicate", 1.0)),
                         arrival=rng.choice(TrafficShape.ARRIVALS),
                         interloper_placement=rng.choice(TrafficShape.PLACEMENTS), seed=seed)
    requests = traffic.generate(shape)
    shared = [0] + [traffic.common_prefix(a.segments, b.segments) for a, b in zip(requests, requests[1:])]
    p0 = parse_policy("policy0")
    assert max(r.prompt_tokens for r in requests) < p0.ctx_checkpoints * p0.n_batch  # the ring holds them
    turns = simulate.simulate(requests, p0)
    assert all(t.reused >= s - (p0.n_batch - 1) for t, s in zip(turns, shared))
    base = simulate.simulate(requests, parse_policy("baseline"))
    if any(s >= 2 * p0.n_batch for s in shared):
        assert sum(t.reused for t in base) < sum(t.reused for t in turns)


@pytest.fixture(scope="module")
def interleaved() -> tuple[list[Request], dict]:
    loaded = traffic.load("shape:case-study-interleaved")
    return list(loaded.requests), simulate.run_policies(loaded, [parse_policy(p) for p in CASE_POLICIES], 2200.0)


def test_the_case_study_conclusion_on_its_interleaved_lane(interleaved):
    """The lane the case study's mechanism describes (a job in front of every continuing turn)
    at its scale: POLICY=0 alone recovers near zero, affinity with POLICY=0 most, and POLICY=0's
    cost exceeds its benefit at the 35B costs. Each bound derived from the traffic, not fitted:

    - one slot: a conversation turn reuses at most what it shares with the job before it (the
      header, or the system prompt for a job on the conversation's template);
    - affinity+POLICY=0 loses at most one -b batch per conversation turn of the consecutive ideal."""
    requests, doc = interleaved
    s = doc["shape"]
    assert 3000 <= s["requests"] <= 4000 and 50e6 <= s["prompt_tokens"] <= 80e6  # the case study's scale
    assert s["share_near_zero_overlap"] > 0.5 and s["shared_with_previous"]["max"] >= 4096  # bimodal
    by = {p["policy"]: p for p in doc["policies"]}
    p0, aff0 = by["policy0"], by["affinity+policy0"]
    assert p0["by_turn_class"]["after_own_turn"]["turns"] == 0  # no turn follows its own previous one
    reused = p0["turns"]["reused"]
    with_job = sum(traffic.common_prefix(requests[i - 1].segments, r.segments)
                   for i, r in enumerate(requests) if i and r.conversation is not None)
    conv_reused = sum(reused[i] for i, r in enumerate(requests) if r.conversation is not None)
    assert conv_reused <= with_job < 0.1 * s["consecutive_ideal_tokens"]
    assert p0["share_of_ideal"] < 0.1  # near zero: at most what the jobs shared, derived above
    n_conv = s["requests"] - s["interlopers"]
    assert aff0["reused_tokens"] >= s["consecutive_ideal_tokens"] - 2048 * n_conv
    assert aff0["share_of_ideal"] > 0.5  # most of it
    assert p0["creations_per_turn"] > 3 * by["baseline"]["creations_per_turn"]  # the cost, reported
    assert p0["versus_first"]["net_ms_per_turn"] < 0 < aff0["versus_first"]["net_ms_per_turn"]
    assert "after another request" in simulate.summary(doc)


def test_versus_first_weighs_prefill_saved_against_checkpoint_time(case_study):
    _, doc = case_study
    first, p0 = doc["policies"][0], {p["policy"]: p for p in doc["policies"]}["policy0"]
    assert first["versus_first"]["net_ms_per_turn"] == 0
    v = p0["versus_first"]
    n = p0["requests"]
    assert v["prefill_ms_saved_per_turn"] == pytest.approx(p0["reused_tokens"] / 2200.0 * 1000 / n)
    spent = (p0["checkpoints_created"] - first["checkpoints_created"]) * 63.0 + p0["restored"] * 24.5
    assert v["checkpoint_ms_more_per_turn"] == pytest.approx(spent / n)
    assert v["net_ms_per_turn"] == pytest.approx(v["prefill_ms_saved_per_turn"] - v["checkpoint_ms_more_per_turn"])


def test_a_named_shape_is_a_source(capsys):
    assert traffic.load("shape:case-study:3").requests != traffic.load("shape:case-study").requests
    for bad in ("shape:nope", "shape:case-study:x"):
        with pytest.raises(traffic.TrafficError, match="shape:"):
            traffic.load(bad)
    assert run_cli("shape:nope") == 2
    assert "shape:case-study-interleaved" in capsys.readouterr().err


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


@pytest.mark.parametrize("policy, says", [
    ("nope", "unknown"), ("baseline:slots=0", "outside its bounds [1, 256]"), ("baseline:colour=red", "known key"),
    ("baseline:slots=two", "slots='two' is not an integer"), ("baseline:cache_ram_mib=lots", "cache_ram_mib='lots' is not a number"),
    ("baseline:affinity=maybe", "is not true or false (1 or 0)"), ("llama-1slot:affinity=1", "reference engine"),
])
def test_cli_refuses_a_bad_policy(policy, says, tmp_path, capsys):
    shape = tmp_path / "shape.yaml"
    shape.write_text("conversations: 1\n")
    assert run_cli(str(shape), "--policy", policy) == 2
    err = capsys.readouterr().err
    assert err.startswith("shadowlab simulate:") and says in err, err


def test_cli_names_the_bad_line(tmp_path, capsys):
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": []}\n')
    assert run_cli(str(bad)) == 2
    assert f"{bad}:2: 'input_length' must be >= 1" in capsys.readouterr().err


def test_claims_beyond_any_context_are_refused_by_line(tmp_path, capsys):
    """A trace line claiming 10^12 tokens would have the simulator walk 5·10^8 batches: refused,
    naming the line; a shape whose prompts outgrow any context, or whose requests number in the
    billions, is refused before it is simulated."""
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n'
                    '{"timestamp": 5, "input_length": 1000000000000, "output_length": 1, "hash_ids": [1]}\n')
    assert run_cli(str(huge), "--policy", "policy0") == 2
    assert f"{huge}:2: 'input_length' is 1,000,000,000,000, beyond" in capsys.readouterr().err
    big = tmp_path / "big.yaml"
    big.write_text("conversations: 2\nturns: 3\nsystem_tokens: {kind: fixed, a: 100000000, high: 100000000}\n")
    assert run_cli(str(big)) == 2
    assert f"{big}: request 0 (conversation c0) would be 100,000," in capsys.readouterr().err
    many = tmp_path / "many.yaml"
    many.write_text("conversations: 100000000\nturns: 300\n")
    assert run_cli(str(many)) == 2
    assert "more than 10,000,000 requests" in capsys.readouterr().err
    at_bound = traffic.shape_from_dict({"conversations": 1, "turns": 1,
                                        "system_tokens": {"kind": "fixed", "a": 1000, "high": 1000}})
    assert traffic.generate(at_bound)[0].prompt_tokens < traffic.MAX_PROMPT_TOKENS  # ordinary sizes pass
