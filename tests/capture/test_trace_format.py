"""The capture trace's parts without an engine: block ids, the prompt-ends index, the reader's
reading of capture's fields, the channel's drops, the writer's rotation and repair, the
recorder's ordering, the command's usage errors."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shadowlab import simulate, traffic
from shadowlab.capture import blocks, channel, writer
from shadowlab.capture.recorder import Reorder
from shadowlab.errors import TrafficError
from shadowlab.traffic import Segment, common_prefix

SALT = bytes(range(32))
B = 16


def test_equal_prefixes_share_exactly_their_whole_blocks():
    a = list(range(100))
    b = a[:37] + [999] + a[38:]
    ia, ib = blocks.chain(SALT, a, B), blocks.chain(SALT, b, B)
    assert len(ia) == 7 and ia[:2] == ib[:2] and all(x != y for x, y in zip(ia[2:], ib[2:]))
    assert blocks.chain(SALT, a[:40], B)[-1] != ia[2]  # a partial block is no full block
    assert blocks.chain(bytes(32), a, B)[0] != ia[0]  # another salt, other ids


def test_prompt_ends_finds_the_longest_earlier_prompt_a_prompt_extends_whole():
    ends = blocks.PromptEnds(SALT, B, capacity=3)
    p1, p2 = list(range(37)), list(range(53))
    for p in (p1, p2, list(range(500, 520))):
        ends.add(p, blocks.chain(SALT, p, B))
    p3 = list(range(70))
    found = ends.longest(p3, blocks.chain(SALT, p3, B))
    assert found.tokens == 53 and found.last_id == blocks.chain(SALT, p2, B)[-1]
    assert ends.longest(list(range(36)) + [7], blocks.chain(SALT, list(range(36)) + [7], B)) is None
    ends.add(list(range(900, 990)), blocks.chain(SALT, list(range(900, 990)), B))  # over capacity
    assert len(ends._ends) == 3 and sum(len(v) for v in ends._inside.values()) == 3


def _line(ids: list[int], n: int, **extra: object) -> dict:
    return {"timestamp": extra.pop("t", 0), "input_length": n, "output_length": extra.pop("out", 4),
            "hash_ids": ids, "block_size": B, **extra}


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_extends_and_user_start_ids_give_exact_shared_prefixes(tmp_path):
    p1 = list(range(37))
    p2 = p1 + [1000, 1001] + list(range(2000, 2030))  # p1, two answer tokens, a new message
    p3 = list(range(21)) + [5000] * 20  # shares p1 up to its user start at 21, then differs
    i1, i2, i3 = (blocks.chain(SALT, p, B) for p in (p1, p2, p3))
    lines = [
        _line(i1, 37, user_starts=[21], user_start_ids=[blocks.prefix_id(SALT, p1, i1, 21, B)]),
        _line(i2, len(p2), t=1, extends=[37, 2, i1[-1]], user_starts=[21, 40],
              user_start_ids=[blocks.prefix_id(SALT, p2, i2, u, B) for u in (21, 40)]),
        _line(i3, len(p3), t=2, user_starts=[21], user_start_ids=[blocks.prefix_id(SALT, p3, i3, 21, B)]),
    ]
    loaded = traffic.read_mooncake(_write(tmp_path / "t.jsonl", lines))
    r1, r2, r3 = loaded.requests
    served1 = r1.segments + (Segment(traffic.output_block(0), 0, r1.output_length - 1),)
    assert common_prefix(served1, r2.segments) == 39  # the whole prompt and the two answer tokens
    assert common_prefix(r1.segments, r3.segments) == 21  # to the user start, not 16
    assert r2.kind == "chat" and r2.user_starts == (21, 40) and r2.prompt_tokens == len(p2)
    blind = [dict(x) for x in lines]
    for x in blind:
        x.pop("extends", None), x.pop("user_start_ids", None)
    r1, r2, r3 = traffic.read_mooncake(_write(tmp_path / "b.jsonl", blind)).requests
    assert common_prefix(r1.segments, r2.segments) == 32 and common_prefix(r1.segments, r3.segments) == 16


def test_unknown_answer_lengths_come_from_the_turn_that_resends_them(tmp_path):
    p1, p2 = list(range(37)), list(range(37)) + [7] * 30
    i1, i2 = blocks.chain(SALT, p1, B), blocks.chain(SALT, p2, B)
    for limit, want in ((None, 6), (8, 6), (5, 5)):
        lines = [_line(i1, 37, out=None, max_output_length=limit), _line(i2, 67, t=1, extends=[37, 5, i1[-1]])]
        assert traffic.read_mooncake(_write(tmp_path / "o.jsonl", lines)).requests[0].output_length == want


def test_capture_fields_are_checked(tmp_path):
    ids = blocks.chain(SALT, list(range(40)), B)
    bad = [
        [_line(ids, 40, extends=[41, 0, ids[-1]])],
        [_line(ids, 40, extends="x")],
        [_line(ids, 40, user_starts=[3], user_start_ids=[1, 2])],
        [_line(ids, 40), _line(ids, 40, block_size=32)],
        [_line(ids, 40, user_starts=[40])],
    ]
    for lines in bad:
        with pytest.raises(TrafficError):
            traffic.read_mooncake(_write(tmp_path / "bad.jsonl", lines))
    loaded = traffic.read_mooncake(_write(tmp_path / "s.jsonl", [_line(ids, 40, status=503, reported_reuse=None),
                                                                  _line(ids, 40, t=1, reported_reuse=39)]))
    assert len(loaded.requests) == 1 and "HTTP 503" in loaded.skipped[0] and loaded.reported_reuse == (39,)


def test_a_chat_request_gets_its_user_start_checkpoints_whatever_the_policy_says():
    starts = (300,)
    chat = traffic.Request(0.0, "c", (Segment(1, 0, 600),), 1, starts, "chat")
    raw = traffic.Request(0.0, "c", (Segment(1, 0, 600),), 1, starts, "mooncake")
    policy = simulate.parse_policy("llama-1slot")
    assert simulate.simulate([chat], policy)[0].created == simulate.simulate([raw], policy)[0].created + 1


def test_the_channel_drops_and_counts_instead_of_waiting():
    async def go() -> channel.Counts:
        ours, theirs = socket.socketpair()
        link = channel.Channel(limit_bytes=64 * 1024)
        assert not link.offer(channel.encode({"n": 0}))  # no recorder yet
        loop = asyncio.get_running_loop()
        ours.setblocking(False)
        transport, _ = await loop.create_unix_connection(lambda: channel._Link(loop.create_future()), sock=ours)
        transport.set_write_buffer_limits(high=link.limit)
        link.attach(transport)
        frame = channel.encode({"n": 1}, b"x" * 30_000)
        sent = sum(link.offer(frame) for _ in range(200))  # nobody reads: the kernel and the bound fill
        meta, body, _ = channel.decode(channel.read_frame(theirs) or b"")
        assert meta["n"] == 1 and body == b"x" * 30_000  # what was sent is whole
        transport.abort()
        theirs.close()
        assert 0 < sent < 200
        return link.counts

    counts = asyncio.run(go())
    assert counts.offered == 201 and counts.dropped_down == 1
    assert counts.sent + counts.dropped_full + counts.dropped_down == counts.offered and counts.dropped_full > 0


def test_pieces_rotate_and_a_torn_last_line_is_cut_back(tmp_path):
    w = writer.TraceWriter(tmp_path, rotate_bytes=100, rotate_s=3600)
    for i in range(5):
        w.write([json.dumps({"i": i, "pad": "x" * 60}) + "\n"])
    w.close()
    pieces = writer.pieces(tmp_path)
    assert len(pieces) >= 2 and [json.loads(x)["i"] for p in pieces for x in p.read_text().splitlines()] == list(range(5))
    with open(pieces[-1], "ab") as fh:
        fh.write(b'{"i": 5, "pa')
    assert writer.repair(tmp_path) == len(b'{"i": 5, "pa') and pieces[-1].read_bytes().endswith(b"\n")


def test_lines_are_written_in_arrival_order_and_a_late_one_is_counted():
    r = Reorder()
    r.hold(1, "b")
    assert r.release(0) == []  # exchange 0 is still in flight
    r.hold(0, "a")
    assert r.release(None) == ["a", "b"]
    r.release(5)
    r.hold(3, "late")
    assert r.late == 1 and r.release(None) == []


def test_the_command_refuses_what_it_cannot_run(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "shadowlab", "capture", "--out", str(tmp_path), *args],
                              capture_output=True, text=True, timeout=60)

    assert run().returncode == 2  # a proxy without --upstream
    assert run("--mirror").returncode == 2  # a mirror without a tokenizer
    assert run("--upstream", "http://127.0.0.1:1", "--block-tokens", "0").returncode == 2
    assert run("--upstream", "ftp://x").returncode == 2
    conf = run("--mirror", "--upstream", "127.0.0.1:8080", "--listen", "127.0.0.1:8091",
               "--nginx-config", "0.0.0.0:80")
    assert conf.returncode == 0 and "mirror /_shadowlab_capture;" in conf.stdout
    assert "server 127.0.0.1:8091; keepalive" in conf.stdout and "listen 0.0.0.0:80;" in conf.stdout


def test_a_chunked_body_ends_where_its_framing_says_in_any_pieces():
    from shadowlab.capture.http1 import BadMessage, ChunkScanner, Tap

    body = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nTrailer: v\r\n\r\n"
    for step in range(1, len(body) + 1):
        tap, scanner, used = Tap(100), ChunkScanner(None), 0
        scanner.tap = tap
        for at in range(0, len(body), step):
            used += scanner.feed(body[at:at + step])
        assert scanner.done and used == len(body) and tap.payload() == b"helloabc", step
    scanner = ChunkScanner(None)
    assert scanner.feed(body + b"HTTP/1.1") == len(body)  # what follows is not this body's
    with pytest.raises(BadMessage):
        ChunkScanner(None).feed(b"zz\r\n")


REPLAY_MATRIX = """\
version: 1
name: cap
engines:
  reference: {kind: reference, model: {preset: tiny, seed: 0}, flags: [-c, 2048, -np, 1], threads: 1}
configurations:
  d: {}
sequences:
  traffic: {kind: traffic, trace: capture.jsonl, format: mooncake}
generation: {n_predict: 4, temperature: 0}
isolation: {cores_per_cell: 1, jobs: 1}
identity: {control: false}
"""


def test_a_matrix_replays_a_capture_trace_with_its_exact_prefixes(tmp_path):
    """`{kind: traffic, trace: ..., format: mooncake}` on a capture trace: the replay's prompts
    are as long as the captured ones and share exactly what the trace says they share."""
    from shadowlab.run import prompts
    from shadowlab.matrix import load as load_matrix
    from shadowlab_engine.tokenizer import encode

    p1 = list(range(37))
    p2 = p1 + [1000, 1001] + list(range(2000, 2030))
    p3 = list(range(21)) + [5000] * 20
    i1, i2, i3 = (blocks.chain(SALT, p, B) for p in (p1, p2, p3))
    lines = [_line(i1, 37, user_starts=[21], user_start_ids=[blocks.prefix_id(SALT, p1, i1, 21, B)], session_id="a"),
             _line(i2, len(p2), t=1, extends=[37, 2, i1[-1]], session_id="a"),
             _line(i3, len(p3), t=2, user_starts=[21], user_start_ids=[blocks.prefix_id(SALT, p3, i3, 21, B)])]
    _write(tmp_path / "capture.jsonl", lines)
    (tmp_path / "m.yaml").write_text(REPLAY_MATRIX)
    sequence = load_matrix(tmp_path / "m.yaml").sequences["traffic"]
    built = prompts.materialize_traffic(sequence, encode)
    tokens = [built[pid].tokens for pid in sequence.prompts]
    assert [len(t) for t in tokens] == [37, len(p2), len(p3)]
    assert tokens[1][:37] == tokens[0] and tokens[2][:21] == tokens[0][:21] and tokens[2][21] != tokens[0][21]
    assert [r.conversation for r in sequence.requests] == ["a", "a", None]


def test_the_conversation_key_comes_from_what_the_client_sent_in_order():
    from shadowlab.capture import conversation

    body = {"prompt_cache_key": "k", "user": "u", "id_slot": 2}
    assert conversation.key(body, "h") == ("header", "h")
    assert conversation.key(body, None) == ("prompt_cache_key", "k")
    assert conversation.key({"user": "u", "id_slot": 2}, None) == ("user", "u")
    assert conversation.key({"id_slot": 2}, None) == ("id_slot", "2")
    assert conversation.key({"id_slot": -1, "user": ""}, None) is None
    a, b = conversation.session_id(SALT, "user", "u"), conversation.session_id(bytes(32), "user", "u")
    assert a != b and a == conversation.session_id(SALT, "user", "u") != conversation.session_id(SALT, "header", "u")
