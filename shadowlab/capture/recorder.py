"""The recorder process: exchanges in, trace lines out (`python -m shadowlab.capture.recorder`,
started and restarted by the front's RecorderSupervisor; killing it never touches traffic).

Per exchange of an inference endpoint (`/v1/chat/completions`, `/chat/completions`,
`/completion`, `/completions`, `/v1/completions`): the prompt's tokens from the engine's own
tokenizer (tokenizer.py), their chained salted block ids (blocks.py), the user-message starts
(chat requests, or `/completion` with `message_delimiters`), the longest earlier prompt it
extends whole and how many tokens of that request's answer follow it (`extends`), the
conversation key (conversation.py), what the answer reported (answers.py). The prompt and the
answer exist only in this process's memory while the line is built; the line holds numbers.

Lines are written in arrival order: a line waits until every exchange that arrived before it
has ended (the `oldest` in flight the front sends), at most REORDER_WINDOW_S and MAX_HELD lines;
an exchange that ends after a later one was written is dropped and counted (`late`). Memory is
bounded whatever the traffic: the held lines, the PromptEnds LRU, one exchange at a time.
Status (counts per outcome) goes to `recorder.json` in the output directory every second.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowlab.capture import answers, blocks, channel, conversation, writer
from shadowlab.capture.tokenizer import EngineTokenizer, TokenizerError, occurrences
from shadowlab.results.records import write_json_atomic

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
COMPLETION_PATHS = ("/completion", "/completions", "/v1/completions")
REORDER_WINDOW_S = 300.0
MAX_HELD = 100_000
MAX_ANSWER_CHARS = 4 << 20  # an assistant message longer than this is not tokenized for `extends`
STATUS_S = 1.0


class Skip(Exception):
    """An exchange that gives no trace line, with the reason it is counted under."""


@dataclass(frozen=True)
class Config:
    block: int
    user_delimiter: str | None  # None: detect from the template; "" none
    ends_capacity: int


class LineBuilder:
    """One exchange to one trace line (a dict of numbers)."""

    def __init__(self, salt: bytes, tokenizer: EngineTokenizer, config: Config) -> None:
        self.salt, self.tok, self.config = salt, tokenizer, config
        self.salt_id = blocks.salt_id(salt)
        self.ends = blocks.PromptEnds(salt, config.block, config.ends_capacity)

    def line(self, meta: dict[str, Any], body: bytes, response: bytes) -> dict[str, Any]:
        endpoint = _endpoint(meta)
        if not meta.get("body_whole"):
            raise Skip("request body over the recording limit")
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise Skip("request body is not JSON") from None
        if not isinstance(doc, dict):
            raise Skip("request body is not a JSON object")
        tokens = self._tokens(endpoint, doc)
        if not tokens:
            raise Skip("empty prompt")
        ids = blocks.chain(self.salt, tokens, self.config.block)
        line = self._numbers(meta, endpoint, doc, tokens, ids, response)
        starts = self._user_starts(endpoint, doc, tokens)
        if starts is not None:
            line["user_starts"] = starts
            line["user_start_ids"] = [blocks.prefix_id(self.salt, tokens, ids, u, self.config.block) for u in starts]
        end = self.ends.longest(tokens, ids)
        if end is not None:
            line["extends"] = [end.tokens, self._answer_follows(endpoint, doc, tokens, end.tokens), end.last_id]
        self.ends.add(tokens, ids)
        return line

    def _numbers(self, meta: dict[str, Any], endpoint: str, doc: dict[str, Any], tokens: list[int],
                 ids: list[int], response: bytes) -> dict[str, Any]:
        said = (answers.reported(response, bool(meta.get("event_stream")))
                if meta.get("status") is not None else answers.Reported())
        line: dict[str, Any] = {
            "timestamp": int(meta["t"] * 1000), "input_length": len(tokens), "output_length": said.output_length,
            "hash_ids": ids, "block_size": self.config.block, "salt_id": self.salt_id, "endpoint": endpoint,
            "stream": doc.get("stream") is True, "status": meta.get("status"), "reported_reuse": said.reused,
            "reported_prompt_tokens": said.prompt_tokens, "max_output_length": _max_output(doc),
        }
        found = conversation.key(doc, meta.get("conversation_header"))
        if found is not None:
            line["session_id"] = conversation.session_id(self.salt, *found)
            line["session_source"] = found[0]
        return line

    def _tokens(self, endpoint: str, doc: dict[str, Any]) -> list[int]:
        try:
            if endpoint == "chat":
                if not isinstance(doc.get("messages"), list):
                    raise Skip("chat request without messages")
                return self.tok.chat_prompt(doc)
            prompt = doc.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
                raise Skip("several prompts in one request")
            if not isinstance(prompt, (str, list)):
                raise Skip("completion request without a prompt")
            return self.tok.tokens(prompt)
        except TokenizerError as exc:
            raise Skip(f"tokenizer: {exc}") from None

    def _user_starts(self, endpoint: str, doc: dict[str, Any], tokens: list[int]) -> list[int] | None:
        """Where llama.cpp would checkpoint user messages: chat requests always, a completion
        only with `message_delimiters` (None: the request gets no such checkpoints)."""
        try:
            if endpoint == "chat":
                return occurrences(tokens, self.tok.user_marker(self.config.user_delimiter))
            delimiters = doc.get("message_delimiters")
            if not isinstance(delimiters, list) or not delimiters:
                return None
            starts: set[int] = set()
            for d in delimiters:
                if isinstance(d, dict) and d.get("role") == "user" and isinstance(d.get("delimiter"), str):
                    starts.update(occurrences(tokens, self.tok.tokens(d["delimiter"], add_special=False)))
            return sorted(starts)
        except TokenizerError as exc:
            raise Skip(f"tokenizer: {exc}") from None

    def _answer_follows(self, endpoint: str, doc: dict[str, Any], tokens: list[int], at: int) -> int:
        """How many tokens after `at` (the end of the earlier prompt this one extends) are that
        request's answer as the client sent it back: the last assistant message's tokens, where
        they start at `at`. The server reused them if it generated exactly those tokens."""
        if endpoint != "chat" or at >= len(tokens):
            return 0
        content = next((m.get("content") for m in reversed(doc["messages"])
                        if isinstance(m, dict) and m.get("role") == "assistant"), None)
        if not isinstance(content, str) or not content or len(content) > MAX_ANSWER_CHARS:
            return 0
        try:
            answer = self.tok.tokens(content, add_special=False)
        except TokenizerError:
            return 0
        n = 0
        while n < len(answer) and at + n < len(tokens) and answer[n] == tokens[at + n]:
            n += 1
        return n


def _max_output(doc: dict[str, Any]) -> int | None:
    """The answer length the client allowed (an answer that long was cut, not ended)."""
    for name in ("n_predict", "max_completion_tokens", "max_tokens"):  # llama-server's precedence
        value = doc.get(name)
        if type(value) is int and value >= 0:
            return value
    return None


def _endpoint(meta: dict[str, Any]) -> str:
    if meta.get("method") != "POST":
        raise Skip("not a POST")
    path = str(meta.get("path", "")).split("?", 1)[0]
    if path in CHAT_PATHS:
        return "chat"
    if path in COMPLETION_PATHS:
        return "completion"
    raise Skip("not an inference endpoint")


class Reorder:
    """Lines held until every exchange that arrived before them has ended (module docstring)."""

    def __init__(self) -> None:
        self._held: list[tuple[int, float, str]] = []  # (seq, held since, line)
        self.released_below = 0  # every seq below this is written or given up
        self.late = 0

    def hold(self, seq: int, line: str) -> None:
        if seq < self.released_below:
            self.late += 1
            return
        heapq.heappush(self._held, (seq, time.monotonic(), line))

    def release(self, boundary: int | None) -> list[str]:
        """Lines below `boundary` (None: all), and those held past the window or the count."""
        out = []
        now = time.monotonic()
        while self._held and (boundary is None or self._held[0][0] < boundary or len(self._held) > MAX_HELD
                              or now - self._held[0][1] > REORDER_WINDOW_S):
            seq, _, line = heapq.heappop(self._held)
            out.append(line)
            self.released_below = max(self.released_below, seq + 1)
        if boundary is not None:  # every exchange below it has ended: its frame came or was dropped
            self.released_below = max(self.released_below, boundary)
        return out


class Recorder:
    def __init__(self, sock: socket.socket, out: Path, tokenizer_url: str, config: Config,
                 rotate_bytes: int, rotate_s: float) -> None:
        self.sock, self.out, self.config = sock, out, config
        self.tokenizer = EngineTokenizer(tokenizer_url)
        self.repaired = writer.repair(out)
        self.writer = writer.TraceWriter(out, rotate_bytes, rotate_s)
        self.reorder = Reorder()
        self.builder: LineBuilder | None = None
        self.counts: Counter[str] = Counter()
        self._status_at = 0.0

    def run(self) -> None:
        while (payload := channel.read_frame(self.sock)) is not None:
            meta, body, response = channel.decode(payload)
            self._take(meta, body, response)
            self._status()
        self.flush()

    def _take(self, meta: dict[str, Any], body: bytes, response: bytes) -> None:
        kind = meta.get("kind")
        if kind == "hello":
            self.builder = LineBuilder(bytes.fromhex(meta["salt"]), self.tokenizer, self.config)
            return
        if kind == "exchange" and self.builder is not None:
            self.counts["exchanges"] += 1
            try:
                line = self.builder.line(meta, body, response)
                self.reorder.hold(meta["seq"], json.dumps(line, separators=(",", ":")) + "\n")
            except Skip as exc:
                self.counts[f"skipped: {exc}"] += 1
        boundary = meta.get("oldest")
        self.writer.write(self.reorder.release(meta.get("next", 0) if boundary is None else boundary))

    def flush(self) -> None:
        self.writer.write(self.reorder.release(None))
        self.writer.close()
        self._status(force=True)

    def _status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._status_at < STATUS_S:
            return
        self._status_at = now
        doc = {"pid": os.getpid(), "piece": str(self.writer.path) if self.writer.path else None,
               "lines": self.writer.lines, "late": self.reorder.late, "repaired_bytes": self.repaired,
               "counts": dict(self.counts)}
        write_json_atomic(self.out / "recorder.json", doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shadowlab.capture.recorder")
    p.add_argument("--channel-fd", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--block-tokens", type=int, required=True)
    p.add_argument("--user-delimiter", default=None)
    p.add_argument("--ends-capacity", type=int, default=100_000)
    p.add_argument("--rotate-bytes", type=int, required=True)
    p.add_argument("--rotate-s", type=float, required=True)
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.channel_fd)
    config = Config(args.block_tokens, args.user_delimiter, args.ends_capacity)
    recorder = Recorder(sock, args.out, args.tokenizer, config, args.rotate_bytes, args.rotate_s)

    def stop(signum: int, frame: Any) -> None:  # SIGTERM: write what is held, then go
        recorder.flush()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front stops us; a terminal's ^C goes to it
    recorder.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
