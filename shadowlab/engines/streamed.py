"""A streamed answer (llama-server's server-sent events) read back into the body it adds up to.

llama-server's `/completion` with `"stream": true` answers `text/event-stream`: `data: <json>`
events, one per generated token (`content`: the text it completes, `tokens`: its id), the last
with `"stop": true` and every other field of the answer (`timings`, `stop_type`, `tokens_cached`,
...) but `content` "" and `tokens` [] (they went in the events); `:` lines are keep-alive pings;
an error after the first event is `data: {"error": {...}}`. `read` joins the events into the
body a request that is not streamed gets, so the adapters parse one shape, and notes when the
first token arrived: the time to first token measured as such, not to the end of generation.
It is the kinds' own format (llama-server's, which the reference engine speaks too): the runner
reaches it only through `EngineAdapter.read_streamed`, for the families that stream
(`LogFamily.streams`).

The stream is untrusted engine output: bounded in bytes, in events and in tokens (never more
than n_predict) and in time; an event that is no JSON object, a token that is no id, a stream
that ends without its final event, or more token ids than the engine says it predicted are a
`MalformedStream` naming the event. Fewer ids than predicted is what llama-server does for a
token that ends inside a UTF-8 character: the ids are dropped (the body says so under
`LOST_IDS_KEY`) and identity compares the text alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

EVENT_STREAM = "text/event-stream"
MAX_TOKEN_ID = 2**31 - 1
MAX_EXTRA_EVENTS = 256  # events beyond one per token: pings, the final event, a left-over text
_IGNORED_FIELDS = (b"event", b"id", b"retry")


LOST_IDS_KEY = "shadowlab_lost_ids"  # set in the joined body when the stream lost token ids (the note)


class MalformedStream(ValueError):
    """The streamed answer cannot be read as llama-server's events (the turn's record error)."""


@dataclass(frozen=True)
class StreamedAnswer:
    body: dict[str, Any]  # the answer as it would have come without streaming
    first_token_at: float  # clock time of the first event with a token or text (else the final one)
    events: int


def is_event_stream(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() == EVENT_STREAM


def read(chunks: Iterable[bytes], *, n_predict: int | None, max_bytes: int, deadline: float,
         clock: Callable[[], float] = time.monotonic) -> StreamedAnswer:
    """Read events until the final one (or an error event); raise MalformedStream, or
    httpx.ReadTimeout past the deadline."""
    answer = _Assembly(n_predict)
    size, pending = 0, b""
    for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise MalformedStream(f"answer larger than {max_bytes} bytes")
        if clock() > deadline:
            raise httpx.ReadTimeout("the answer did not end in time")
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            done = answer.line(line.removesuffix(b"\r"), clock)
            if done is not None:
                return done
    for line in (pending, b""):  # a last line without its newline, then the end of the last event
        done = answer.line(line.removesuffix(b"\r"), clock)
        if done is not None:
            return done
    raise MalformedStream(f"the stream ended before its final event (`stop: true`), after {answer.events} events")


class _Assembly:
    """The events read so far; server-sent events' rules: `data:` lines up to a blank line are one
    event, `:` lines are comments."""

    def __init__(self, n_predict: int | None) -> None:
        # llama-server samples (and streams) one token even for n_predict 0
        self.n_predict = None if n_predict is None else max(n_predict, 1)
        self.max_events = (n_predict or 0) + MAX_EXTRA_EVENTS
        self.data: list[bytes] = []
        self.events = 0
        self.contents: list[str] = []
        self.tokens: list[int] = []
        self.probs: list[Any] = []  # llama-server's per-token `completion_probabilities` (n_probs)
        self.first_token_at: float | None = None

    def line(self, line: bytes, clock: Callable[[], float]) -> StreamedAnswer | None:
        if line.startswith(b"data:"):
            self.data.append(line[5:].removeprefix(b" "))
            return None
        if line == b"":
            return self._dispatch(clock) if self.data else None
        self._count()
        if line.startswith(b":") or line.split(b":", 1)[0] in _IGNORED_FIELDS:
            return None
        raise MalformedStream(f"after event {self.events}: a line that is no server-sent event "
                              f"field: {line[:60]!r}")

    def _count(self) -> None:
        self.events += 1
        if self.events > self.max_events:
            raise MalformedStream(f"more than {self.max_events} events for n_predict {self.n_predict}")

    def _dispatch(self, clock: Callable[[], float]) -> StreamedAnswer | None:
        self._count()
        data, self.data = b"\n".join(self.data), []
        if data.strip() == b"[DONE]":  # OpenAI's end marker: nothing to add
            return None
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            raise MalformedStream(f"event {self.events} is not JSON: {data[:60]!r}") from None
        if not isinstance(event, dict):
            raise MalformedStream(f"event {self.events} is not a JSON object")
        if event.get("error") is not None:  # the answer is the error (the runner reads it as one)
            return StreamedAnswer(event, self._first(clock), self.events)
        content, tokens = self._piece(event)
        if event.get("stop") is True:
            return self._final(event, content, tokens, clock)
        self.contents.append(content)
        self.tokens += tokens
        probs = event.get("completion_probabilities")
        if isinstance(probs, list):
            self.probs += probs
        if self.n_predict is not None and len(self.tokens) > self.n_predict:
            raise MalformedStream(f"event {self.events}: {len(self.tokens)} tokens streamed, more than "
                                  f"n_predict {self.n_predict}")
        if content or tokens:
            self._first(clock)
        return None

    def _first(self, clock: Callable[[], float]) -> float:
        if self.first_token_at is None:
            self.first_token_at = clock()
        return self.first_token_at

    def _piece(self, event: dict[str, Any]) -> tuple[str, list[int]]:
        content, tokens = event.get("content", ""), event.get("tokens", [])
        if not isinstance(content, str):
            raise MalformedStream(f"event {self.events}: `content` is not text")
        if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                                 and 0 <= t <= MAX_TOKEN_ID for t in tokens)):
            raise MalformedStream(f"event {self.events}: `tokens` is not a list of token ids")
        return content, tokens

    def _final(self, event: dict[str, Any], content: str, tokens: list[int],
               clock: Callable[[], float]) -> StreamedAnswer:
        ids = self.tokens + tokens
        predicted = event.get("tokens_predicted")
        lost = None
        # llama-server counts the EOS token it streams; the reference engine streams no stop token.
        if isinstance(predicted, int) and not (len(ids) == predicted
                                               or (len(ids) == predicted - 1 and event.get("stop_type") == "eos")):
            if len(ids) > predicted or (self.n_predict is not None and predicted > self.n_predict + 1):
                raise MalformedStream(f"the events carry {len(ids)} token ids for {predicted} tokens predicted")
            # Fewer: llama-server sends no event for a token whose text ends inside a UTF-8
            # character, so its id never comes. The text is whole (the next event carries the
            # character); the ids are not, so none is kept: identity compares the text alone.
            lost = (f"the events carry {len(ids)} token ids for {predicted} tokens predicted (llama-server "
                    "streams no event for a token that ends inside a UTF-8 character): ids dropped, "
                    "identity compares the text alone")
            ids = []
        body = {**event, "content": "".join(self.contents) + content, "tokens": ids}
        if lost:
            body[LOST_IDS_KEY] = lost
        if self.probs and "completion_probabilities" not in event:  # streamed per token, not at the end
            body["completion_probabilities"] = self.probs
        return StreamedAnswer(body, self._first(clock), self.events)


__all__ = ["EVENT_STREAM", "MalformedStream", "StreamedAnswer", "is_event_stream", "read"]
