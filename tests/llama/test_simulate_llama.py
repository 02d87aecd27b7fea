"""`shadowlab simulate` against real llama-server b11434: per-turn reused tokens (`timings.cache_n`)
and slot (`id_slot`) equal the simulator's llama.cpp model, on two traffic seeds under four
configurations (one slot without RAM cache, the RAM cache, three slots with LCP-similarity
selection, three slots with the RAM cache and --cache-idle-slots). Requests are sent one after
another: concurrent requests share llama.cpp's batch and which slot is free depends on timing,
which the simulator flags instead of modelling (none of these turns is timing-dependent)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shadowlab import simulate, traffic
from shadowlab.simulate import Policy, parse_policy
from shadowlab.traffic import TrafficShape

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shadowlab"))
from test_simulate import VOCAB, exactness_shape  # noqa: E402 - the same traffic as the reference tests

from .conftest import BANNED, USER_DELIMITERS

pytestmark = pytest.mark.llama

FLAGS = ["-b", "256", "-ub", "64", "--ctx-checkpoints", "8"]
CONFIGS = {
    "1slot": (["-np", "1", "-cram", "0"], "llama-1slot"),
    "cram": (["-np", "1", "-cram", "8192"], "llama-cram"),
    "slots3": (["-np", "3", "-cram", "0"], "llama-slots4:slots=3"),
    "slots3-cram": (["-np", "3", "-cram", "8192"], "llama-slots4:slots=3,cache_ram_mib=8192"),
}


def llama_policy(text: str) -> Policy:
    p = parse_policy(text + ("," if ":" in text else ":") + "n_batch=256,n_ubatch=64,ctx_checkpoints=8")
    # the tiny model's states are KiB: the 8192 MiB cache never evicts, as on the server
    return Policy(**{**p.__dict__, "checkpoint_mib": 0.04, "kv_mib_per_token": 0.001, "state_mib": 0.1})


@pytest.mark.parametrize("seed", (1, 2))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_llama_server_reuses_exactly_what_the_simulator_predicts(config, seed, llama):
    flags, policy = CONFIGS[config]
    requests = traffic.generate(exactness_shape(seed))
    m = traffic.Materialiser(VOCAB, seed)
    measured = []
    with llama([*FLAGS, *flags]) as server:
        for r in requests:
            resp = server.complete(m.prompt(r), n_predict=r.output_length, logit_bias=BANNED)
            assert resp.status_code == 200, resp.text
            doc = resp.json()
            measured.append((doc["timings"]["cache_n"], doc["id_slot"]))
    want = [(t.reused, t.slot) for t in simulate.simulate(requests, llama_policy(policy))]
    assert measured == want
    assert any(reused for reused, _ in measured)


CHAT_CONFIGS = {
    "1slot": (["-np", "1", "-cram", "0", "--checkpoint-min-step", "64"], "llama-1slot:chat=true,checkpoint_min_step=64"),
    "cram": (["-np", "1", "-cram", "8192"], "llama-cram:chat=true"),
}


@pytest.mark.parametrize("config", list(CHAT_CONFIGS))
def test_delimited_traffic_gets_user_message_checkpoints_as_the_simulator_predicts(config, llama):
    """Traffic whose user messages open with <|im_start|>user (the shape's user_delimiter), sent
    with message_delimiters: llama-server creates checkpoints at the user starts (read from its
    log) and reuses per turn exactly what the simulator's chat model says."""
    flags, policy = CHAT_CONFIGS[config]
    requests = traffic.generate(TrafficShape(**{**exactness_shape(1).__dict__, "user_delimiter": True}))
    measured, at_user_starts = [], 0
    with llama([*FLAGS, *flags]) as server:
        delimiter = server.tokenize("<|im_start|>user")
        m = traffic.Materialiser(VOCAB, 1, delimiter=delimiter)
        for r in requests:
            prompt = m.prompt(r)
            resp = server.complete(prompt, n_predict=r.output_length, logit_bias=BANNED,
                                   message_delimiters=USER_DELIMITERS)
            assert resp.status_code == 200, resp.text
            doc = resp.json()
            measured.append((doc["timings"]["cache_n"], doc["id_slot"]))
            tails = {len(prompt) - 4, len(prompt) - 4 - 64}
            created = {e.n_tokens for e in server.turn_events() if e.kind == "created"}
            assert created <= set(r.user_starts) | tails, (created, r.user_starts)
            at_user_starts += len(created & set(r.user_starts))
    want = [(t.reused, t.slot) for t in simulate.simulate(requests, llama_policy(policy))]
    assert measured == want
    assert at_user_starts > 0 and any(reused for reused, _ in measured)
    raw = [t.reused for t in simulate.simulate(requests, llama_policy(policy.replace("chat=true", "chat=false")))]
    assert raw != [reused for reused, _ in measured]  # the lever changed what was reused
