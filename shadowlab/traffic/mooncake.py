"""Mooncake / AIPerf JSON lines (`hash_ids` of 512-token blocks) and `shadowlab capture`'s traces
in the same format (docs/trace.md): `read_mooncake`, `stream_mooncake`, `write_mooncake`."""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from shadowlab.errors import TrafficError
from shadowlab.traffic.lines import _count, _int, _json_lines, _key
from shadowlab.traffic.model import (MAX_ID, MAX_PROMPT_TOKENS, MAX_TIME_S, Loaded, Request, Segment, Stream,
                                     _Blocks, output_block)

MOONCAKE_BLOCK = 512


MOONCAKE_KEYS = {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay", "messages"}
# `shadowlab capture`'s extra fields (docs/trace.md "Capture traces"); other readers ignore them.
CAPTURE_KEYS = {"block_size", "salt_id", "endpoint", "stream", "status", "reported_reuse", "reported_prompt_tokens",
                "session_source", "user_starts", "user_start_ids", "extends", "max_output_length"}


def read_mooncake(path: Path | str) -> Loaded:
    """`stream_mooncake`, all in memory."""
    return stream_mooncake(path).loaded()


# A mirror trace's answers have no length until a later prompt re-sends them (`_Extensions`): a
# request whose answer is unknown waits for that many later lines at most, then goes on as 1
# token. (Conversations resumed later than that lose the answer's tokens from the slot model.)
ANSWER_WINDOW = 16_384


def stream_mooncake(path: Path | str) -> Stream:
    """Mooncake JSON lines: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (ids of
    512-token blocks; the last block is cut to the input length, tokens beyond the listed blocks
    are a block of their own), optional `session_id` (the conversation). AIPerf's variant: a
    `delay` (ms after the previous request of the session) instead of `timestamp`; `messages`
    without `hash_ids` carries no prefix information and is skipped (counted).
    `shadowlab capture`'s fields (docs/trace.md): `block_size` (instead of 512; one per file),
    `user_starts` (a chat request: the engine checkpoints there whatever the policy says: kind
    "chat"), `extends` [L, k, id] (the prompt is the whole prompt of the latest earlier request
    of L tokens whose last id is `id`, then k tokens of that request's answer, then its own
    blocks from L + k on: `_Extensions`), `status` (an error answer is skipped, counted),
    `reported_reuse` (kept per request); `output_length` null = unknown."""
    out = Stream(iter(()), str(Path(path)), "mooncake", block_size=MOONCAKE_BLOCK)
    out.requests = _mooncake_requests(Path(path), out)
    return out


def _mooncake_requests(path: Path, meta: Stream) -> Iterator[Request]:
    skipped = meta.skipped
    last_time: float | None = None
    session_time: dict[str, float] = {}
    fresh = _Blocks(first=-(1 << 62))  # never equal to a hash id of the file
    block: int | None = None
    extensions = _Extensions()
    count, captured = 0, False
    for line, doc in _json_lines(path, skipped):
        unknown = set(doc) - MOONCAKE_KEYS - CAPTURE_KEYS
        if unknown:
            raise TrafficError(f"unknown field(s) {sorted(unknown)}", file=str(path), line=line,
                               hint=f"Mooncake fields: {', '.join(sorted(MOONCAKE_KEYS))}; capture's: docs/trace.md")
        session = _key(doc, "session_id", path, line)
        session = None if session is None else str(session)
        if "hash_ids" not in doc:
            if "messages" in doc:
                skipped.append(f"line {line}: messages without hash_ids (no prefix information)")
                continue
            raise TrafficError("missing 'hash_ids'", file=str(path), line=line)
        status = _int(doc, "status", path, line, required=False)
        if status is not None and not 200 <= status < 300:
            skipped.append(f"line {line}: the server answered HTTP {status}")
            continue
        b = _int(doc, "block_size", path, line, required=False, minimum=1, maximum=MAX_PROMPT_TOKENS) or MOONCAKE_BLOCK
        if block is not None and b != block:
            raise TrafficError(f"block_size {b} after lines of {block}", file=str(path), line=line,
                               hint="hash ids of different block sizes never compare: read one capture at a time")
        block = meta.block_size = b
        t = _mooncake_time(doc, path, line, session, last_time, session_time)
        n = _int(doc, "input_length", path, line, minimum=1, maximum=MAX_PROMPT_TOKENS)
        n_out = _int(doc, "output_length", path, line, required=False, maximum=MAX_PROMPT_TOKENS)
        _count(count, path, line)
        starts = _user_starts(doc.get("user_starts"), n, path, line)
        own = _hash_segments(doc["hash_ids"], n, fresh, path, line, block)
        own = _cut(own, _prefix_cuts(doc.get("user_start_ids"), starts, path, line))
        segments = extensions.splice(doc.get("extends"), own, n, path, line)
        kind = "mooncake" if starts is None else "chat"
        reported = _int(doc, "reported_reuse", path, line, required=False, maximum=MAX_PROMPT_TOKENS)
        limit = _int(doc, "max_output_length", path, line, required=False, maximum=MAX_PROMPT_TOKENS)
        # Only a capture's lines can be extended (`extends` is its field, as `block_size` on every line
        # is): a plain Mooncake file keeps no prompt for it.
        captured = captured or not CAPTURE_KEYS.isdisjoint(doc)
        extensions.add(count, Request(t, session, segments, n_out or 1, starts or (), kind, reported),
                       doc["hash_ids"] if captured else [], n, limit if n_out is None else -1)
        count += 1
        last_time = t
        yield from extensions.ready()
    yield from extensions.ready(final=True)


class _Extensions:
    """Capture's `extends`: the earlier prompt a request extends whole, found by (its last hash
    id, its length); the answer tokens that follow it; answers of unknown length (a mirror
    trace) filled in from the requests that continue them. Requests pass through in order: one
    whose answer is unknown is held (with those after it) until a later prompt re-sends that
    answer or ANSWER_WINDOW lines have passed; the prompts a later line may extend are the
    latest ANSWER_WINDOW distinct ones (an older one is read as its blocks show it, as one in an
    earlier piece)."""

    def __init__(self) -> None:
        self._ends: OrderedDict[tuple[int, int], tuple[int, tuple[Segment, ...]]] = OrderedDict()
        self._pending: deque[list[Any]] = deque()  # [index, request, answer limit or -1, longest re-sent]
        self._first = 0  # index of _pending[0]

    def add(self, index: int, request: Request, ids: list[int], n: int, unknown_limit: int | None) -> None:
        """`unknown_limit`: -1 when the request's answer length is known; else the answer length
        its client allowed (None: no limit given)."""
        if ids:
            self._ends[(ids[-1], n)] = (index, request.segments)
            self._ends.move_to_end((ids[-1], n))
            if len(self._ends) > ANSWER_WINDOW:
                self._ends.popitem(last=False)
        if not self._pending:
            self._first = index
        self._pending.append([index, request, unknown_limit, 0])

    def ready(self, final: bool = False) -> Iterator[Request]:
        """The requests that can go on: every one before the first whose answer is still unknown
        (all of them at the end of the file, or when that one has waited its window)."""
        while self._pending:
            index, request, limit, k = self._pending[0]
            newest = self._pending[-1][0]
            if limit != -1 and not final and newest - index < ANSWER_WINDOW:
                return
            self._pending.popleft()
            self._first = index + 1
            if limit != -1 and k:
                # An answer re-sent as k tokens was k + 1 long (its end-of-generation token is never
                # re-sent), or k when k is the length its client allowed (it was cut there).
                request = replace(request, output_length=k if limit is not None and k >= limit else k + 1)
            yield request

    def splice(self, extends: Any, own: tuple[Segment, ...], n: int, path: Path, line: int) -> tuple[Segment, ...]:
        if extends is None:
            return own
        if (not isinstance(extends, list) or len(extends) != 3
                or not all(type(v) is int for v in extends) or extends[0] < 1 or extends[1] < 0):
            raise TrafficError(f"'extends' must be [tokens >= 1, answer tokens >= 0, hash id], got {extends!r}",
                               file=str(path), line=line)
        at, k, last_id = extends
        if at + k > n:
            raise TrafficError(f"'extends' {at} + {k} tokens is beyond input_length {n}", file=str(path), line=line)
        found = self._ends.get((last_id, at))
        if found is None:  # not in this file (an earlier piece), or too long ago: the prefix as the blocks show it
            return own
        earlier, segments = found
        if k and earlier >= self._first:
            entry = self._pending[earlier - self._first]
            entry[3] = max(entry[3], k)
        head = segments + ((Segment(output_block(earlier), 0, k),) if k else ())
        return head + _from(own, at + k)


def _from(segments: tuple[Segment, ...], at: int) -> tuple[Segment, ...]:
    """The segments from token `at` on."""
    out, pos = [], 0
    for s in segments:
        if pos + s.length > at:
            cut = max(0, at - pos)
            out.append(Segment(s.block, s.start + cut, s.length - cut))
        pos += s.length
    return tuple(out)


def _prefix_cuts(ids: Any, starts: tuple[int, ...] | None, path: Path, line: int) -> list[tuple[int, int]]:
    """(position, id) of capture's `user_start_ids`: the id of the prefix up to each user start
    (null where the start ends a block)."""
    if ids is None:
        return []
    if (starts is None or not isinstance(ids, list) or len(ids) != len(starts)
            or not all(i is None or type(i) is int for i in ids)):
        raise TrafficError("'user_start_ids' must be ids (or null) one per user start", file=str(path), line=line)
    return [(u, i) for u, i in zip(starts, ids) if i is not None]


def _cut(segments: tuple[Segment, ...], cuts: list[tuple[int, int]]) -> tuple[Segment, ...]:
    """The segments with each cut's prefix named: the tokens from the start of the segment
    holding position u up to u become a segment of the prefix's own id (every prompt with that
    id has those tokens), so prompts that share a prefix up to u share u tokens, not u rounded
    down to a block."""
    out, pos, cuts = [], 0, sorted(cuts)
    for s in segments:
        start, end = s.start, s.start + s.length
        while cuts and cuts[0][0] < pos + (end - s.start):
            u, prefix = cuts.pop(0)
            if u <= pos + (start - s.start):
                continue
            out.append(Segment(prefix, start, u - pos - start + s.start))
            start = u - pos + s.start
        out.append(Segment(s.block, start, end - start))
        pos += s.length
    return tuple(out)


def _user_starts(value: Any, n: int, path: Path, line: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v < n for v in value):
        raise TrafficError(f"'user_starts' must be positions below input_length {n}", file=str(path), line=line)
    return tuple(sorted(set(value)))


def _mooncake_time(doc: dict, path: Path, line: int, session: str | None, last: float | None,
                   session_time: dict[str, float]) -> float:
    ts = _int(doc, "timestamp", path, line, required=False, maximum=int(MAX_TIME_S * 1000))
    if ts is None:
        delay = _int(doc, "delay", path, line, required=False, maximum=int(MAX_TIME_S * 1000))
        if delay is None:
            raise TrafficError("missing 'timestamp' (or AIPerf's 'delay')", file=str(path), line=line)
        base = session_time.get(session, last or 0.0) if session else (last or 0.0)
        t = base + delay / 1000.0
    else:
        t = ts / 1000.0
        if last is not None and t < last:
            raise TrafficError(f"timestamp {ts} ms is before the previous line's {int(last * 1000)} ms",
                               file=str(path), line=line, hint="Mooncake traces are in time order; sort the file")
    if session:
        session_time[session] = t
    return t


def _hash_segments(ids: Any, n: int, fresh: _Blocks, path: Path, line: int,
                   block: int = MOONCAKE_BLOCK) -> tuple[Segment, ...]:
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_ID
                                            for i in ids):
        raise TrafficError(f"'hash_ids' must be a list of integers from 0 to {MAX_ID:,}", file=str(path), line=line)
    if len(ids) > (n + block - 1) // block:
        raise TrafficError(f"{len(ids)} hash_ids cover more than input_length {n} in {block}-token blocks",
                           file=str(path), line=line)
    segs = [Segment(h, 0, min(block, n - k * block)) for k, h in enumerate(ids)]
    rest = n - block * len(ids)
    if rest > 0:
        segs.append(fresh.new(rest))
    return tuple(segs)


def write_mooncake(requests: Sequence[Request], path: Path) -> None:
    """Requests whose segments are whole 512-token blocks (the last one cut) as Mooncake lines."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in requests:
            doc: dict[str, Any] = {"timestamp": int(round(r.time * 1000)), "input_length": r.prompt_tokens,
                                   "output_length": r.output_length, "hash_ids": [s.block for s in r.segments]}
            if r.conversation is not None:
                doc["session_id"] = r.conversation
            fh.write(json.dumps(doc) + "\n")
