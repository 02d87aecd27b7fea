"""Issue 12's candidate fixes on real engine processes: affinity and retention, each next to
today's behaviour (the knobs off), each warm output compared with a cold greedy recompute, and
every log line read back by shadowlab's own parser and checkpoint replay.

Small prompts and batches keep it quick: `-b 256 -ub 64`, so POLICY=0 places checkpoints at
n_tokens 256, 512, 768 and the tail ones at L-68 and L-4. A (800 tokens) and C (A's first 600,
then different) share 600 tokens: a restore from A's ring re-enters at 512.
"""

from __future__ import annotations

import random

import pytest

from engine_process import fields, greedy_reference, running, tiny_model
from shadowlab.logs import lifecycle, parse as logparse

FLAGS = ["-c", "2048", "-b", "256", "-ub", "64", "--ctx-checkpoints", "32", "-cram", "0", "-lv", "4"]
POLICY0 = {"PXA_CKPT_PROMPT_POLICY": "0"}
RETAIN = {**POLICY0, "SHADOWLAB_CKPT_RETAIN_MIB": "64"}
N_PREDICT = 8

_rng = random.Random(12)


def _random(n: int) -> list[int]:
    return [_rng.randrange(256) for _ in range(n)]


def _diverge(prompt: list[int], at: int, total: int) -> list[int]:
    return prompt[:at] + [(prompt[at] + 1) % 256] + _random(total - at - 1)


def _unrelated(n: int, *others: list[int]) -> list[int]:
    out = _random(n)
    out[0] = next(t for t in range(256) if all(t != o[0] for o in others))  # shares no prefix
    return out


A = _random(800)
C = _diverge(A, 600, 850)
B = _unrelated(100, A, C)
D1, D2 = _unrelated(780, A, C), _unrelated(760, A, C)
SYSTEM = _random(100)  # a system prompt two conversations share
A1 = SYSTEM + _random(700)
A2 = _diverge(A1, 600, 850)
B1 = SYSTEM + _random(700)
B2 = _diverge(B1, 600, 850)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def cold(model):
    """The cold greedy output of every prompt, from the model alone (no server, no cache)."""
    cache: dict[tuple[int, ...], list[int]] = {}

    def of(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in cache:
            cache[key] = greedy_reference(model, prompt, N_PREDICT)
        return cache[key]

    return of


def serve(model, tmp_path, env, turns, name, flags=()):
    """Fresh process; one greedy completion per (prompt, key); returns (responses, log text,
    /props)."""
    with running(model, [*FLAGS, *flags], tmp_path, env=env, name=name) as engine:
        responses = [engine.complete(p, n_predict=N_PREDICT, prompt_cache_key=key) for p, key in turns]
        return responses, engine.log(), engine.client.get("/props").json()


def read_back(log: str) -> tuple[logparse.ParsedLog, list[lifecycle.Request]]:
    """Parse the engine's log like `shadowlab logs` does: every line understood, and the
    checkpoint replay never meets a checkpoint it did not see created or saved."""
    parsed = logparse.parse(log.splitlines(), "reference")
    assert parsed.unknown_count == 0, parsed.unknown_samples
    requests = lifecycle.replay(parsed.events)
    assert [n for r in requests for n in r.notes] == []
    return parsed, requests


def reused(responses) -> list[int]:
    return [r["timings"]["cache_n"] for r in responses]


def entry_bytes(props: dict, n_checkpoints: int, n_tokens: int) -> int:
    """DESIGN §1 retention: what an entry counts against the budget."""
    return n_checkpoints * props["checkpoint_bytes"] + n_tokens * props["kv_bytes_per_token"]


# --- retention ------------------------------------------------------------------------------


def test_retention_rescues_a_b_c_and_off_is_todays_full_reprefill(model, tmp_path, cold):
    turns = [(A, None), (B, None), (C, None)]
    plain, plain_log, props = serve(model, tmp_path, POLICY0, turns, "retain-off")
    assert props["ckpt_retain_mib"] == 0 and reused(plain) == [0, 0, 0]
    assert "prompt cache" not in plain_log and "cache size limit" not in plain_log
    fixed, log, props = serve(model, tmp_path, RETAIN, turns, "retain-on")
    assert props["ckpt_retain_mib"] == 64
    assert reused(fixed) == [0, 0, 512]  # C restored A's retained mid-prompt checkpoint
    for r, (prompt, _) in zip(plain + fixed, turns * 2):
        assert r["tokens"] == cold(prompt)
    (saved_a, saved_b) = [l for l in log.splitlines() if "prompt cache: saved" in l]
    assert (fields(saved_a)["n_tokens"], fields(saved_a)["checkpoints"]) == (796, 5)
    size = float(saved_a.split("size = ")[1].split(" MiB")[0])
    assert size == round(entry_bytes(props, 5, 796) / 2**20, 3)
    parsed, requests = read_back(log)
    assert parsed.counts["cache_saved"] == 2 and parsed.counts["cache_loaded"] == 1
    c = requests[-1]
    assert (c.outcome, c.re_entry, c.cache_loaded) == ("restored", 512, 1)
    assert c.restored.n_tokens == 512


def test_retention_budget_evicts_the_oldest_entry(model, tmp_path, cold):
    """A, then three unrelated requests, then C. Each request saves the ring it displaces; at
    4 MiB two A-sized entries fit, so the third save evicts A's, the oldest."""
    turns = [(A, None), (D1, None), (D2, None), (B, None), (C, None)]
    roomy, _, props = serve(model, tmp_path, RETAIN, turns, "budget-64")
    assert 2 * entry_bytes(props, 5, 796) < 4 * 2**20 < 3 * entry_bytes(props, 5, 756)  # the premise
    tight, log, _ = serve(model, tmp_path, {**RETAIN, "SHADOWLAB_CKPT_RETAIN_MIB": "4"}, turns, "budget-4")
    assert reused(roomy)[-1] == 512 and reused(tight)[-1] == 0
    evicted = [l for l in log.splitlines() if "removing oldest entry" in l]
    # A's when B's request saved D2's ring; D1's when C's request saved B's
    assert [fields(l)["n_tokens"] for l in evicted] == [796, 776]
    assert "| task 3 |" in evicted[0] and "| task 4 |" in evicted[1]
    for r, (prompt, _) in zip(roomy + tight, turns * 2):
        assert r["tokens"] == cold(prompt)
    read_back(log)


def test_wrong_conversation_restore_fault_breaks_identity(model, tmp_path, cold):
    """The healthy fix is the test above; the fault restores A's tail checkpoint into C."""
    turns = [(A, None), (B, None), (C, None)]
    broken, log, props = serve(model, tmp_path, RETAIN, turns, "wrong-conv",
                               flags=["--fault", "wrong-conversation-restore"])
    assert props["faults"] == ["wrong-conversation-restore"]
    assert reused(broken)[-1] == 796  # positions trusted: A's 796 tokens, C diverged at 600
    assert broken[-1]["tokens"] != cold(C)
    read_back(log)


# --- affinity -------------------------------------------------------------------------------


def test_affinity_keeps_two_interleaved_conversations_on_their_slots(model, tmp_path, cold):
    """Two conversations that share a system prompt, interleaved on -np 2. Without affinity
    llama-server's similarity rule puts B1 on A1's slot (100 shared tokens are above the 0.1
    threshold), and each turn's cascade erases the other conversation's checkpoints."""
    turns = [(A1, "a"), (B1, "b"), (A2, "a"), (B2, "b")]
    plain, _, _ = serve(model, tmp_path, POLICY0, turns, "affinity-off", flags=["-np", "2"])
    fixed, log, props = serve(model, tmp_path, {**POLICY0, "SHADOWLAB_SLOT_AFFINITY": "1"}, turns,
                              "affinity-on", flags=["-np", "2"])
    assert props["slot_affinity"] == 1
    assert [r["id_slot"] for r in plain] == [0, 0, 0, 0] and reused(plain) == [0, 0, 0, 0]
    assert [r["id_slot"] for r in fixed] == [0, 1, 0, 1] and reused(fixed) == [0, 0, 512, 512]
    for r, (prompt, _) in zip(plain + fixed, turns * 2):
        assert r["tokens"] == cold(prompt)
    parsed, requests = read_back(log)
    methods = [e.method for e in parsed.of("slot_selected")]
    assert methods == ["lru", "lru", "affinity", "affinity"]
    assert [r.outcome for r in requests] == ["cold", "cold", "restored", "restored"]


def test_affinity_routes_chat_requests_by_prompt_cache_key(model, tmp_path):
    """The key works on /v1/chat/completions too: an interloper sharing the conversation's
    system prompt takes the unowned slot, and turn 2 reuses turn 1's cache."""
    from shadowlab_engine import tokenizer

    system = {"role": "system", "content": "You answer questions about recurrent state. " * 3}
    turn1 = [system, {"role": "user", "content": "What is a checkpoint? " * 4}]
    turn2 = [*turn1, {"role": "assistant", "content": "A snapshot."}, {"role": "user", "content": "And a cascade?"}]
    other = [system, {"role": "user", "content": "Unrelated job. " * 5}]
    env = {"SHADOWLAB_SLOT_AFFINITY": "1"}
    with running(model, [*FLAGS, "-np", "2", "-cms", "0"], tmp_path, env=env, name="affinity-chat") as engine:
        answers = [
            engine.post("/v1/chat/completions", {"messages": m, "max_tokens": 4, "temperature": 0, **key}).json()
            for m, key in ((turn1, {"prompt_cache_key": "a"}), (other, {}), (turn2, {"prompt_cache_key": "a"}))
        ]
        log = engine.log()
    slots = [l for l in log.splitlines() if "selected slot by" in l]
    assert [s.split("selected slot by ")[1].split(",")[0] for s in slots] == ["LRU", "LRU", "affinity"]
    assert "id  1 |" in slots[1]  # not slot 0, which its 60 % shared with turn 1 would pick
    assert answers[2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert answers[2]["choices"][0]["tokens"] == greedy_reference(model, tokenizer.render_chatml(turn2), 4)
    read_back(log)
