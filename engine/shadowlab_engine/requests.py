"""Request fields of the reference engine's HTTP API: validated before a slot is touched
(docs/DESIGN.md §1 "HTTP"), the generation settings and the token events of a stream."""

from __future__ import annotations

import codecs
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .tokenizer import decode_bytes

DEFAULT_N_PREDICT = 16


class RequestError(Exception):
    """A request the server refuses; becomes a 4xx JSON error."""

    def __init__(self, code: int, message: str, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.type = type


# --- request validation --------------------------------------------------------------------


def _int_field(body: dict, key: str, default: int, minimum: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'{key}' must be an integer")
    if minimum is not None and value < minimum:
        raise RequestError(400, f"'{key}' must be >= {minimum}, got {value}")
    if value >= 2**63:
        raise RequestError(400, f"'{key}' is out of range")
    return value


def _bool_field(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"'{key}' must be a boolean")
    return value


def _split_points(value: Any, n_prompt: int) -> tuple[int, ...] | None:
    """`split_points`: strictly increasing positions 0 < p < prompt length where the prefill's
    batches break (checkpoints.Slot.prefill); absent or null keeps the engine's own schedule."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(400, "'split_points' must be an array of positions")
    previous = 0
    for i, p in enumerate(value):
        if isinstance(p, bool) or not isinstance(p, int) or not previous < p < n_prompt:
            raise RequestError(
                400,
                f"'split_points'[{i}] must be an integer above {previous} and below the prompt "
                f"length {n_prompt}, strictly increasing",
            )
        previous = p
    return tuple(value)


def _float_field(body: dict, key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(400, f"'{key}' must be a finite number")
    return float(value)


@dataclass(frozen=True)
class Generation:
    n_predict: int
    stop: tuple[str, ...]
    n_probs: int
    temperature: float
    seed: int
    cache_prompt: bool
    id_slot: int
    conversation: str | None  # `prompt_cache_key`: what affinity routes by
    split_points: tuple[int, ...] | None = None  # /completion only: an explicit batch schedule
    # A streamed /completion: called with (slot id, token, tokens decoded) per generated token.
    on_token: Callable[[int, int, int], None] | None = field(default=None, compare=False)


@dataclass
class Completion:
    """What generation produced; the stop token (EOS/<|im_end|>) is counted, not returned."""

    tokens: list[int] = field(default_factory=list)
    stop_type: str = "limit"
    stopping_word: str = ""
    text: str | None = None  # the content, when a stop word cut it short
    truncated: bool = False
    n_decoded: int = 0
    probs: list[dict] = field(default_factory=list)


class TokenEvents:
    """A streamed /completion's events in llama-server's shape: one per generated token
    (`content` = the text that token completes; bytes that end inside a UTF-8 character wait
    for the token that ends them, and with stop words all text waits for the end, which decides
    where it is cut), then the final answer with `content` "" and `tokens` [] since they went in
    the events. A text left over at the end (a cut stop word, an unfinished character's U+FFFD)
    goes in one more event without tokens, so the events' text adds up to the answer's exactly."""

    def __init__(self, emit: Callable[[dict], None], n_prompt: int, hold_text: bool) -> None:
        self.emit, self.n_prompt, self.hold_text = emit, n_prompt, hold_text
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.sent: list[str] = []
        self.id_slot = -1

    def token(self, id_slot: int, token: int, n_decoded: int) -> None:
        piece = "" if self.hold_text else self.decoder.decode(decode_bytes([token]))
        self.id_slot = id_slot
        self._event(piece, [token], n_decoded)

    def final(self, answer: dict) -> dict:
        sent, content = "".join(self.sent), answer["content"]
        if not content.startswith(sent):  # cannot happen: incremental decoding = whole decoding
            raise RuntimeError("streamed text is not a prefix of the completion")
        if len(content) > len(sent):
            self._event(content[len(sent):], [], answer["tokens_predicted"])
        return {**answer, "content": "", "tokens": []}

    def _event(self, content: str, tokens: list[int], n_decoded: int) -> None:
        self.sent.append(content)
        self.emit({"index": 0, "content": content, "tokens": tokens, "stop": False, "id_slot": self.id_slot,
                   "tokens_predicted": n_decoded, "tokens_evaluated": self.n_prompt})
