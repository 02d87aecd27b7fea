"""`shadowlab capture` with real parts: llama-server b11434 answering a seeded client that holds
several chat conversations (streamed and not) and raw `/completion` jobs, through the capture
proxy or through Debian's nginx mirroring to the capture sink.

What the trace must equal is computed from the client's side: its own tokenization of what it
sent (the server's /apply-template and /tokenize, asked directly) and the conversations it held.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadowlab import traffic

from .conftest import HEADER, Capture, Nginx, SeededChat, Sent, send, wait_until

pytestmark = pytest.mark.llama
BLOCK = 16
MARKER = "<|im_start|>user"


# --------------------------------------------------------------------------- what the client knows


def client_tokens(server: httpx.Client, sent: Sent) -> list[int]:
    if sent.endpoint == "chat":
        prompt = server.post("/apply-template", json={"messages": sent.body["messages"]}).json()["prompt"]
    else:
        prompt = sent.body["prompt"]
    return server.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def expected_shared_blocks(a: list[int], b: list[int]) -> int:
    """Leading ids two prompts share: their whole-block common prefix, or every id when equal."""
    if a == b:
        return -(-len(a) // BLOCK)
    return lcp(a, b) // BLOCK


def assert_trace_is_what_was_sent(lines: list[dict[str, Any]], sent: list[Sent], tokens: list[list[int]],
                                  marker: list[int]) -> None:
    assert len(lines) == len(sent)
    for line, s, t in zip(lines, sent, tokens):
        assert line["input_length"] == len(t)
        assert line["block_size"] == BLOCK and len(line["hash_ids"]) == -(-len(t) // BLOCK)
        assert line["endpoint"] == s.endpoint and line["stream"] == bool(s.body.get("stream"))
        if s.endpoint == "chat":  # llama.cpp's user-message checkpoints go where its marker is
            assert line["user_starts"] == [i for i in range(len(t)) if t[i:i + len(marker)] == marker]
        else:
            assert "user_starts" not in line
    for j in range(len(lines)):
        for i in range(j):
            a, b = lines[i]["hash_ids"], lines[j]["hash_ids"]
            assert lcp(a, b) == expected_shared_blocks(tokens[i], tokens[j]), (i, j)
        # the longest earlier prompt this one extends whole, exact to the token
        ends = [len(tokens[i]) for i in range(j) if tokens[j][:len(tokens[i])] == tokens[i]]
        assert lines[j].get("extends", [None])[0] == (max(ends) if ends else None), j
    by_conversation: dict[str, set[str]] = {}
    for line, s in zip(lines, sent):
        if s.conversation is None:
            assert "session_id" not in line
        else:
            by_conversation.setdefault(s.conversation, set()).add(line["session_id"])
            assert line["session_source"] == ("header" if HEADER in s.headers else
                                              "user" if "user" in s.body else "prompt_cache_key")
    assert all(len(ids) == 1 for ids in by_conversation.values())
    assert len({next(iter(ids)) for ids in by_conversation.values()}) == len(by_conversation)


def assert_no_text_or_token_ids(directory: Path, sent: list[Sent], tokens: list[list[int]]) -> None:
    """Every file capture wrote: no prompt or answer text, no run of token ids."""
    blob = b"".join(p.read_bytes() for p in directory.rglob("*") if p.is_file())
    texts = set()
    for s in sent:
        texts.update(m["content"] for m in s.body.get("messages", ()))
        texts.add(s.body.get("prompt", ""))
        texts.add(s.answer)
    for text in filter(None, texts):
        for piece in (text, text[:24], json.dumps(text)[1:25]):
            if len(piece) >= 12:
                assert piece.encode() not in blob, piece
    for t in tokens:
        for at in range(0, max(1, len(t) - 8), 97):
            window = t[at:at + 8]
            for sep in (",", ", ", " "):
                assert sep.join(map(str, window)).encode() not in blob, window


def simulated(trace: Path, policy: str) -> dict[str, Any]:
    """`shadowlab simulate TRACE --policy P --json`, the command a team runs."""
    out = subprocess.run([sys.executable, "-m", "shadowlab", "simulate", str(trace), "--policy", policy, "--json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out)


def direct(server: Any) -> httpx.Client:
    """A client straight to llama-server, one connection per request: after a streamed
    `/completion` answer the server closes the connection it called keep-alive, and a client
    that reuses it fails (the proxy resends such a request on a fresh connection)."""
    return httpx.Client(base_url=str(server.client.base_url), timeout=120,
                        limits=httpx.Limits(max_keepalive_connections=0))


def chat_traffic(client: httpx.Client, seed: int, **shape: Any) -> list[Sent]:
    out = []
    for s in SeededChat(seed, **shape).requests():
        send(client, s)
        assert s.status == 200, s.raw[:500]
        out.append(s)
    return out


# --------------------------------------------------------------------------- the proxy


def test_proxy_trace_equals_what_the_client_sent(llama, tmp_path):
    with llama() as server, Capture(tmp_path / "cap", "--upstream", str(server.client.base_url),
                                    "--conversation-header", HEADER) as cap:
        with httpx.Client(base_url=cap.url, timeout=120) as client:
            sent = chat_traffic(client, 1)
        tokens = [client_tokens(server.client, s) for s in sent]
        marker = server.client.post("/tokenize", json={"content": MARKER, "add_special": False}).json()["tokens"]
    lines = cap.lines()
    assert_trace_is_what_was_sent(lines, sent, tokens, marker)
    for line, s in zip(lines, sent):  # what the answers said, as they said it
        assert line["status"] == 200 and line["reported_reuse"] == s.reported_reuse
        assert line["reported_prompt_tokens"] == s.prompt_tokens == line["input_length"]
    assert any(line.get("extends", [0, 0])[1] > 0 for line in lines)  # answers re-sent, found
    assert_no_text_or_token_ids(cap.out, sent, tokens)
    assert cap.status()["channel"]["sent"] == len(sent) and not cap.status()["channel"]["dropped_full"]
    assert cap.status()["event_loop"] == "uvloop"  # the front's loop: a dependency where it builds
    # The server ran with -np 1 and its default RAM cache: simulate compares with what it reported.
    doc = simulated(cap.trace(tmp_path / "trace.jsonl"), "llama-cram")
    assert doc["policies"][0]["versus_reported"] == {"equal_turns": len(sent), "turns": len(sent),
                                                     "first_difference": None}


def _normal(sent: Sent) -> list[Any]:
    """An answer without what differs between two runs of it (ids, clocks, rates)."""
    docs = ([json.loads(line[5:]) for line in sent.raw.split(b"\n") if line.startswith(b"data: {")]
            if sent.body.get("stream") else [json.loads(sent.raw)])
    for doc in docs:
        for key in ("id", "created"):
            doc.pop(key, None)
        if isinstance(doc.get("timings"), dict):
            doc["timings"] = {k: v for k, v in doc["timings"].items() if k in ("cache_n", "prompt_n", "predicted_n")}
    return docs


def test_killing_the_recorder_mid_stream_leaves_traffic_untouched(llama, tmp_path):
    """SIGKILL the recorder while an answer streams through the proxy: every answer is what the
    server gives the same client directly (a second fresh server), the supervisor restarts the
    recorder, the trace resumes with the requests after it, and no piece holds a torn line."""
    with llama() as reference_server, direct(reference_server) as client:
        reference = chat_traffic(client, 2, max_tokens=48)
    killed_at = len(reference) // 2
    assert reference[killed_at].body["stream"] or reference[killed_at + 1].body["stream"]
    killed_at += 0 if reference[killed_at].body["stream"] else 1
    with llama() as server, Capture(tmp_path / "cap", "--upstream", str(server.client.base_url)) as cap:
        first_pid = cap.status()["recorder_pid"]
        answers = []
        with httpx.Client(base_url=cap.url, timeout=120) as client:
            for i, s in enumerate(SeededChat(2, max_tokens=48).requests()):
                if i == killed_at:
                    _stream_killing(client, s, first_pid)
                else:
                    send(client, s)
                answers.append(s)
            wait_until(lambda: cap.recorder_ready() and cap.status()["recorder_pid"] != first_pid, 60,
                       "the recorder restarted")
            after = [send(client, s) for s in SeededChat(3, conversations=2, turns=2, jobs=0).requests()]
        status = cap.status()["channel"]
    assert [_normal(a) for a in answers] == [_normal(r) for r in reference]
    assert all(s.status == 200 for s in after)
    assert -signal.SIGKILL in status["recorder_exits"] and status["recorder_starts"] >= 2
    assert status["offered"] == status["sent"] + status["dropped_full"] + status["dropped_down"]
    pieces = sorted(cap.out.glob("trace-*.jsonl"))
    assert len(pieces) >= 2  # the restarted recorder opened a piece of its own
    for piece in pieces:
        data = piece.read_bytes()
        assert not data or data.endswith(b"\n")
        for line in data.splitlines():
            json.loads(line)
    loaded = traffic.read_mooncake(cap.trace(tmp_path / "all.jsonl"))
    assert not loaded.skipped
    resumed = [json.loads(line) for line in pieces[-1].read_text().splitlines()]
    assert [line["input_length"] for line in resumed[-len(after):]] == [s.prompt_tokens for s in after]


def _stream_killing(client: httpx.Client, s: Sent, pid: int) -> None:
    with client.stream("POST", "/v1/chat/completions", json=s.body, headers=s.headers) as response:
        s.status = response.status_code
        chunks = []
        for chunk in response.iter_raw():
            if not chunks:
                os.kill(pid, signal.SIGKILL)  # the answer has started; the recorder is gone
            chunks.append(chunk)
    s.raw = b"".join(chunks)
    events = [json.loads(line[5:]) for line in s.raw.split(b"\n") if line.startswith(b"data: {")]
    s.answer = "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices", ()))


# --------------------------------------------------------------------------- nginx's mirror


def test_nginx_mirror_trace_equals_what_the_client_sent(llama, nginx_binary, tmp_path):
    with llama() as server, Capture(tmp_path / "cap", "--mirror", "--tokenizer", str(server.client.base_url),
                                    "--conversation-header", HEADER) as cap, \
            Nginx(nginx_binary, tmp_path / "nginx", server.port_lease.port, cap.port) as proxy:
        with httpx.Client(base_url=proxy.url, timeout=120) as client:
            sent = chat_traffic(client, 1)
        tokens = [client_tokens(server.client, s) for s in sent]
        marker = server.client.post("/tokenize", json={"content": MARKER, "add_special": False}).json()["tokens"]
        wait_until(lambda: cap.recorder().get("counts", {}).get("exchanges") == len(sent), 60, "mirrored")
    lines = cap.lines()
    assert_trace_is_what_was_sent(lines, sent, tokens, marker)
    assert all(line["output_length"] is None and line["status"] is None for line in lines)  # never seen
    assert_no_text_or_token_ids(cap.out, sent, tokens)


def test_capture_down_or_stopped_changes_no_answer_of_the_primary(llama, nginx_binary, tmp_path):
    """The mirror target killed, then stopped (SIGSTOP: it accepts nothing more and answers
    nothing): every answer through nginx is still the one the same client gets directly."""
    with llama() as reference_server, direct(reference_server) as client:
        reference = chat_traffic(client, 4, conversations=3, turns=3)
    with llama() as server, Capture(tmp_path / "cap", "--mirror", "--tokenizer", str(server.client.base_url)) as cap, \
            Nginx(nginx_binary, tmp_path / "nginx", server.port_lease.port, cap.port) as proxy:
        answers = []
        with httpx.Client(base_url=proxy.url, timeout=120) as client:
            for i, s in enumerate(SeededChat(4, conversations=3, turns=3).requests()):
                if i == len(reference) // 3:
                    os.killpg(cap.proc.pid, signal.SIGSTOP)
                if i == 2 * len(reference) // 3:
                    os.killpg(cap.proc.pid, signal.SIGKILL)
                answers.append(send(client, s))
    assert [_normal(a) for a in answers] == [_normal(r) for r in reference]


# --------------------------------------------------------------------------- the decision side

AGREEMENT = {
    "llama-1slot": ["-np", "1", "-cram", "0"],
    "llama-cram": ["-np", "1", "-cram", "8192"],
    "llama-slots4": ["-np", "4", "-cram", "0"],
}




@pytest.mark.parametrize("policy", list(AGREEMENT))
def test_a_mirror_trace_predicts_the_reuse_the_server_reported(policy, llama, nginx_binary, tmp_path):
    """Seeded chat traffic through nginx to llama-server started with the policy's flags; the
    mirror's trace, simulated under that policy, gives each request the reuse (`timings.cache_n`)
    the server reported to the client, turn by turn."""
    with llama(AGREEMENT[policy]) as server, \
            Capture(tmp_path / "cap", "--mirror", "--tokenizer", str(server.client.base_url),
                    "--conversation-header", HEADER) as cap, \
            Nginx(nginx_binary, tmp_path / "nginx", server.port_lease.port, cap.port) as proxy:
        with httpx.Client(base_url=proxy.url, timeout=120) as client:
            sent = chat_traffic(client, 5, conversations=5, turns=4)
        wait_until(lambda: cap.recorder().get("counts", {}).get("exchanges") == len(sent), 60, "mirrored")
    predicted = simulated(cap.trace(tmp_path / "trace.jsonl"), policy)["policies"][0]["turns"]["reused"]
    reported = [s.reported_reuse for s in sent]
    differ = [(i, reported[i], predicted[i]) for i in range(len(sent)) if reported[i] != predicted[i]]
    assert not differ, f"{len(sent) - len(differ)} of {len(sent)} agree; (request, reported, predicted): {differ}"
    assert sum(reported) > 0
