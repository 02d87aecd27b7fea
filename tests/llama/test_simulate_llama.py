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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shadowlab"))
from test_simulate import VOCAB, exactness_shape  # noqa: E402 - the same traffic as the reference tests

from .conftest import BANNED

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
