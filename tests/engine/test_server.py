"""The HTTP server as a real process on 127.0.0.1: endpoints, bad input, chat, log lines.

/health while loading is tested with the slow-start fault in test_faults.py.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from engine_process import fields, greedy_reference, running, spawn, tiny_model
from shadowlab_engine import tokenizer

FLAGS = ["-c", "1024", "-b", "256", "-ub", "64", "--ctx-checkpoints", "8", "-cram", "0",
         "--checkpoint-min-step", "0", "-lv", "4"]
_rng = random.Random(7)
P = [_rng.randrange(256) for _ in range(300)]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def engine(model, tmp_path_factory):
    with running(model, FLAGS, tmp_path_factory.mktemp("server"), name="server") as e:
        yield e


def test_props_report_model_hash_config_and_device(engine, model):
    props = engine.client.get("/props").json()
    assert props["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert props["device"] == "cpu"
    assert props["build_info"].startswith("shadowlab-engine ")
    assert props["model_config"]["name"] == "tiny"
    assert (props["n_ctx"], props["n_batch"], props["n_ubatch"]) == (1024, 256, 64)
    assert (props["ctx_checkpoints"], props["cache_ram_mib"], props["total_slots"]) == (8, 0, 1)
    assert (props["ckpt_prompt_policy"], props["ckpt_prompt_end"], props["faults"]) == (1, 0, [])
    assert (props["slot_affinity"], props["ckpt_retain_mib"]) == (0, 0)  # issue 12's fixes: off
    assert props["kv_bytes_per_token"] == 2 * 16 * 4  # tiny: one attention layer, 1 KV head of 16
    assert props["pid"] == engine.proc.pid


def test_tokenize_detokenize_round_trip(engine):
    text = "héllo <|im_start|>user\n"
    tokens = engine.post("/tokenize", {"content": text}).json()["tokens"]
    assert tokens == tokenizer.encode(text)
    assert engine.post("/tokenize", {"content": "a", "add_special": True}).json()["tokens"] == [tokenizer.BOS, 97]
    assert engine.post("/detokenize", {"tokens": tokens}).json()["content"] == text


def test_completion_shape_and_cache_accounting(engine):
    r1 = engine.complete(P, n_predict=6, return_tokens=True)
    t = r1["timings"]
    assert t["cache_n"] + t["prompt_n"] == len(P)
    assert len(r1["tokens"]) <= 6 and r1["stop_type"] in ("limit", "eos")
    assert r1["content"] == tokenizer.decode(r1["tokens"])
    if r1["stop_type"] == "limit":
        assert t["predicted_n"] == 6
        assert r1["tokens_cached"] == len(P) + 5  # the last sampled token is not evaluated
    assert "completion_probabilities" not in r1
    # the same prompt again: n_past = L - 1, restored from the L-4 checkpoint
    r2 = engine.complete(P, n_predict=6, n_probs=3)
    assert (r2["timings"]["cache_n"], r2["timings"]["prompt_n"]) == (len(P) - 4, 4)
    assert r2["tokens"] == r1["tokens"]
    probs = r2["completion_probabilities"]
    assert len(probs) == r2["timings"]["predicted_n"]
    for tok, p in zip(r2["tokens"], probs):
        assert p["id"] == tok == p["top_logprobs"][0]["id"]  # greedy: the top-1 token
        assert len(p["top_logprobs"]) == 3 and p["logprob"] <= 0
        assert bytes(p["bytes"]) == tokenizer.decode_bytes([tok])
    # a third time, restored again: the logprobs are bit-identical
    assert engine.complete(P, n_predict=6, n_probs=3)["completion_probabilities"] == probs
    slots = engine.client.get("/slots").json()
    assert [c["n_tokens"] for c in slots[0]["checkpoints"]] == [len(P) - 4 - 64, len(P) - 4]


BAD_REQUESTS = [
    ("/completion", b"{not json", 400),
    ("/completion", b"[1, 2]", 400),
    ("/completion", b'{"prompt": "abc", "temperature": NaN}', 400),
    ("/completion", b"[" * 100000, 400),
    ("/completion", b'{"prompt": "abc", "n_predict": 1e400}', 400),
    ("/completion", {"prompt": "abc", "seed": 2**70}, 400),
    ("/completion", {"prompt": [1, 2, 100000]}, 400),
    ("/completion", {"prompt": [1, -1]}, 400),
    ("/completion", {"prompt": [1, 2.5]}, 400),
    ("/completion", {"prompt": [7] * 1024}, 400),
    ("/completion", {"prompt": "abc", "n_predict": -3}, 400),
    ("/completion", {"prompt": "abc", "n_predict": "3"}, 400),
    ("/completion", {"prompt": 5}, 400),
    ("/completion", {"prompt": []}, 400),
    ("/completion", {"prompt": "abc", "temperature": "hot"}, 400),
    ("/completion", {"prompt": "abc", "cache_prompt": "yes"}, 400),
    ("/completion", {"prompt": "abc", "id_slot": 3}, 400),
    ("/completion", {"prompt": "abc", "n_probs": -1}, 400),
    ("/completion", {"prompt": "abc", "stop": [1]}, 400),
    ("/completion", {"prompt": "abc", "prompt_cache_key": 7}, 400),
    ("/completion", {"prompt": "abc", "prompt_cache_key": ""}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "k" * 257}, 400),
    ("/v1/chat/completions", {"messages": "hi"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400),
    ("/detokenize", {"tokens": [99999]}, 400),
    ("/tokenize", {"content": 1}, 400),
    ("/no/such/endpoint", {}, 404),
]


@pytest.mark.parametrize("path,body,status", BAD_REQUESTS)
def test_bad_input_gets_a_4xx_json_error(engine, path, body, status):
    if isinstance(body, bytes):
        r = engine.client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = engine.post(path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"]


def test_stop_word_cuts_the_content(engine):
    full = engine.complete(P[:200], n_predict=12)
    text = full["content"]
    word = next(ch for ch in text[1:] if ch.isascii())  # 12 random-ish bytes: some are ASCII
    cut = engine.complete(P[:200], n_predict=12, stop=[word])
    assert (cut["stop_type"], cut["stopping_word"]) == ("word", word)
    assert cut["content"] == text[: text.find(word)]
    assert full["tokens"][: len(cut["tokens"])] == cut["tokens"]


def test_oversized_or_chunked_bodies_are_refused_and_the_server_keeps_serving(engine):
    import socket

    for head in (b"Content-Length: 999999999999\r\n", b"Transfer-Encoding: chunked\r\n"):
        with socket.create_connection(("127.0.0.1", engine.port), timeout=10) as s:
            s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n5\r\nhello\r\n0\r\n\r\n")
            reply = s.recv(65536)
        assert reply.split(b"\r\n", 1)[0] in (b"HTTP/1.1 413 Request Entity Too Large", b"HTTP/1.1 411 Length Required")
    assert engine.client.get("/health").status_code == 200


def test_wrong_method_and_unknown_get(engine):
    assert engine.client.get("/completion").status_code == 405
    assert engine.client.get("/nothing").json()["error"]["code"] == 404


def test_chat_restores_at_a_user_message_start(engine, model):
    system = {"role": "system", "content": "You are a careful assistant. " * 4}
    u1 = {"role": "user", "content": "Tell me about gated delta rules and checkpoints. " * 3}
    turn1 = [system, u1, {"role": "assistant", "content": "First answer, version one."},
             {"role": "user", "content": "And how does the cascade erase them?"}]
    turn2 = [system, u1, {"role": "assistant", "content": "A different first answer."},
             {"role": "user", "content": "And how does the cascade erase them?"}]
    engine.complete([300 % 256] * 50, n_predict=1)  # the slot holds something unrelated first
    mark = engine.mark()
    r1 = engine.post("/v1/chat/completions", {"messages": turn1, "max_tokens": 4, "temperature": 0}).json()
    assert r1["object"] == "chat.completion"
    assert r1["usage"]["prompt_tokens"] == len(tokenizer.render_chatml(turn1))
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    starts = tokenizer.message_starts(turn1, "user")
    created = [fields(l)["n_tokens"] for l in engine.lines_since(mark, "created context checkpoint")]
    assert starts[0] in created and starts[1] in created  # --checkpoint-min-step 0
    r2 = engine.post("/v1/chat/completions", {"messages": turn2, "max_tokens": 4, "temperature": 0,
                                               "logprobs": True, "top_logprobs": 2}).json()
    content = r2["choices"][0]["logprobs"]["content"]
    assert [c["id"] for c in content][: len(r2["choices"][0]["tokens"])] == r2["choices"][0]["tokens"]
    assert all(len(c["top_logprobs"]) == 2 for c in content)
    # divergence inside the assistant message: the newest checkpoint below it is u1's start
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == starts[0]
    assert r2["timings"]["cache_n"] == starts[0]
    cold = greedy_reference(model, tokenizer.render_chatml(turn2), 4)
    assert r2["choices"][0]["tokens"] == cold
    assert r2["choices"][0]["message"]["content"] == tokenizer.decode(cold)


def test_log_levels_and_no_slot_corruption_by_bad_requests(model, tmp_path):
    with running(model, [*FLAGS[:-2], "-lv", "3"], tmp_path, name="lv3") as e:
        first = e.complete(P, n_predict=4)
        for path, body, _ in BAD_REQUESTS:
            if isinstance(body, bytes):
                e.client.post(path, content=body)
            else:
                e.post(path, body)
        again = e.complete(P, n_predict=4)
        assert again["timings"]["cache_n"] == len(P) - 4  # the restore still finds its checkpoint
        assert again["tokens"] == first["tokens"]
        assert e.proc.poll() is None
        log = e.log()
        # -lv 3: no checkpoint lines (TRACE in b11434), the rest at default level
        assert "created context checkpoint" not in log and "restored context checkpoint" not in log
        # task ids count the completion tasks run; refused requests create none
        task = 1
        (pe,) = e.task_lines(task, "prompt eval time = ")
        assert "/     4 tokens" in pe and "ms per token" in pe and "tokens per second" in pe
        assert e.task_lines(task, f"new prompt, n_ctx_slot = 1024, n_keep = 0, task.n_tokens = {len(P)}")
        assert e.task_lines(task, f"cached n_tokens = {len(P) - 4}, memory_seq_rm [{len(P) - 4}, end)")
        assert e.task_lines(task, "stop processing: n_tokens = ")
        # the same lines on stderr
        assert [l for l in e.stderr().splitlines() if f"| task {task} |" in l] == e.task_lines(task)


def test_device_cuda_reported_or_refused(model, tmp_path):
    import torch

    engine = spawn(model, [*FLAGS, "--device", "cuda"], tmp_path, name="cuda")
    try:
        if torch.cuda.is_available():
            engine.wait_health()
            assert engine.client.get("/props").json()["device"].startswith("cuda:")
            first = engine.complete(P, n_predict=4)
            assert engine.complete(P, n_predict=4)["tokens"] == first["tokens"]
        else:
            assert engine.wait_exit() != 0
            assert "CUDA" in engine.log()
    finally:
        engine.stop()


def test_concurrent_requests_to_one_slot_are_serialized(engine):
    from concurrent.futures import ThreadPoolExecutor

    mark = engine.mark()
    prompts = [P[:250], P[:250] + [1, 2, 3]]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: engine.post("/completion", {"prompt": p, "n_predict": 3}), prompts))
    assert [r.status_code for r in results] == [200, 200]
    # one task at a time: each task's lines are contiguous, from `new prompt` to `stop processing`
    tasks = [int(l.split("| task ")[1].split(" ")[0]) for l in engine.lines_since(mark, "| task ")]
    assert len(set(tasks)) == 2
    first_switch = next(i for i, t in enumerate(tasks) if t != tasks[0])
    assert all(t == tasks[-1] for t in tasks[first_switch:])


def test_a_client_that_resets_its_connection_leaves_no_traceback_in_the_log(engine):
    """A keep-alive connection reset by the client (a streamed answer closed after its final
    event) is not a server error: nothing but the engine's own lines reaches the log."""
    import socket
    import struct

    before = len(engine.stderr())  # what shadowlab's engine.log gets besides the log lines
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", engine.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(4096)  # the answer; the server now waits for the next request line
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
    assert engine.complete(P, n_predict=2)["tokens"]  # still serving; its lines follow the resets
    tail = engine.stderr()[before:]
    assert "Traceback" not in tail and "ConnectionResetError" not in tail
    assert "| task" in tail
