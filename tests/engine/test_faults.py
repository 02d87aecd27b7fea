"""Each injected fault, on a real engine process, next to the healthy behaviour it breaks."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from engine_process import fields, greedy_reference, running, spawn, tiny_model
from shadowlab_engine.faults import FaultError, Faults, parse_faults

# small prompts, small batches: checkpoints at L-4-64 and L-4 (POLICY=1), at 128·k (POLICY=0)
FLAGS = ["-c", "2048", "-b", "128", "-ub", "64", "--ctx-checkpoints", "16", "-cram", "0", "-lv", "4"]
_rng = random.Random(11)
P = [_rng.randrange(256) for _ in range(600)]
Q = P[:300] + [(P[300] + 1) % 256] + [_rng.randrange(256) for _ in range(399)]
Z = Q[:560] + [(Q[560] + 1) % 256] + [_rng.randrange(256) for _ in range(100)]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def cold(model):
    """Cold greedy outputs of Q and Z, computed with the model directly."""
    return {"Q": greedy_reference(model, Q, 8), "Z": greedy_reference(model, Z, 8)}


def test_parse_faults():
    assert parse_faults([], None) == Faults()
    f = parse_faults(["stale-restore", "hang-on-request=2"], "skip-cascade,slow-start=1.5")
    assert f == Faults(stale_restore=True, skip_cascade=True, hang_on_request=2, slow_start=1.5)
    assert f.names() == ["stale-restore", "skip-cascade", "hang-on-request=2", "slow-start=1.5"]
    assert parse_faults([], "wrong-conversation-restore").names() == ["wrong-conversation-restore"]
    for bad in (["nope"], ["stale-restore=1"], ["crash-after-requests"], ["crash-after-requests=0"],
                ["hang-on-request=x"], ["slow-start=-1"]):
        with pytest.raises(FaultError):
            parse_faults(bad, None)


def test_unknown_fault_refuses_to_start(model, tmp_path):
    engine = spawn(model, [*FLAGS, "--fault", "explode"], tmp_path, name="unknown")
    try:
        assert engine.wait_exit() != 0
        assert "unknown fault 'explode'" in engine.stderr()
    finally:
        engine.stop()


def test_stale_restore(model, tmp_path, cold):
    """A healthy restore of the same turn matches cold: test_case_study.py, test_server.py."""
    env = {"PXA_CKPT_PROMPT_POLICY": "0"}
    with running(model, [*FLAGS, "--fault", "stale-restore"], tmp_path, env=env, name="stale") as e:
        e.complete(P)
        q = e.complete(Q)
        (restored,) = e.task_lines(1, "restored context checkpoint")
        assert (fields(restored)["n_tokens"], fields(restored)["n_past"]) == (256, 257)
        assert q["timings"]["cache_n"] == 257
        assert q["tokens"] != cold["Q"]


@pytest.mark.parametrize("faults,healthy", [([], True), (["--fault", "skip-cascade"], False)])
def test_skip_cascade(model, tmp_path, cold, faults, healthy):
    """P then Q (forced below P's tail checkpoints) then Z (diverges at 560, above P's 532)."""
    with running(model, [*FLAGS, *faults], tmp_path, name="cascade") as e:
        e.complete(P)
        e.complete(Q)
        z = e.complete(Z)
        assert bool(e.lines("erased invalidated context checkpoint")) is healthy
        if healthy:
            assert e.task_lines(2, "forcing full prompt re-processing")
            assert z["timings"]["cache_n"] == 0 and z["tokens"] == cold["Z"]
        else:
            (restored,) = e.task_lines(2, "restored context checkpoint")
            assert fields(restored)["n_tokens"] == 532  # P's checkpoint, stale for Z
            assert z["tokens"] != cold["Z"]


def test_hang_on_request_and_crash_after_requests(model, tmp_path):
    """Request 2 never answers; the process dies right after answering its 3rd request."""
    flags = [*FLAGS, "--fault", "hang-on-request=2", "--fault", "crash-after-requests=3"]
    with running(model, flags, tmp_path, name="hang-crash") as e:
        e.complete(P[:100], n_predict=2)  # answered: 1
        with pytest.raises(httpx.ReadTimeout):
            e.client.post("/completion", json={"prompt": P[:100], "n_predict": 2}, timeout=3.0)
        assert e.client.get("/health").status_code == 200  # hung, not dead
        assert e.complete(P[:120], n_predict=2)["timings"]["prompt_n"] > 0  # answered: 2
        assert e.post("/completion", {"prompt": "x", "n_predict": -1}).status_code == 400  # answered: 3
        assert e.wait_exit() != 0
        with pytest.raises(httpx.TransportError):
            e.complete(P[:100], n_predict=2)
        assert "fault crash-after-requests: exiting after 3 completion requests" in e.log()


def test_slow_start_holds_health_at_503_and_faults_come_from_env(model, tmp_path):
    t0 = time.monotonic()
    env = {"SHADOWLAB_ENGINE_FAULTS": "slow-start=2,skip-cascade"}
    engine = spawn(model, FLAGS, tmp_path, env=env, name="slow")
    try:
        first = None
        while first is None and time.monotonic() - t0 < 30:
            try:
                first = engine.client.get("/health", timeout=2.0)
            except httpx.TransportError:
                time.sleep(0.02)
        assert first is not None and first.status_code == 503
        assert first.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        assert engine.post("/completion", {"prompt": "x"}).status_code == 503
        seen = engine.wait_health()
        assert seen[-1] == 200 and engine.client.get("/health").json() == {"status": "ok"}
        assert time.monotonic() - t0 >= 2.0
        assert engine.client.get("/props").json()["faults"] == ["skip-cascade", "slow-start=2"]
    finally:
        engine.stop()
