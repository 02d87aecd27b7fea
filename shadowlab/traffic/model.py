"""What a traffic is: requests whose prompts are *segments*, and a traffic read from a source.

`Segment(block, start, length)` stands for tokens `start .. start+length` of content block
`block`. Equal (block, offset) means equal tokens, so shared leading segments are a shared
prefix, and the longest common prefix of two prompts is a walk over their segments: no token
list is ever built. Also the bounds on what a traffic may claim (every source checks them) and
`Loaded` / `Stream`, what every source returns.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

# The user-message delimiter as a segment (TrafficShape.user_delimiter): one block shared by every
# user message, so all its uses are equal tokens and the segment model stays exact. Its length is
# fixed before any tokenizer is known (the traffic is realised at matrix load): room for
# `<|im_start|>user` on any tokenizer, the rest of it the block's own tokens (ChatML's "\n" and
# the start of the message, in effect). Block 0 is never one `generate` hands out.
DELIMITER_BLOCK = 0
DELIMITER_TOKENS = 8


class Segment(NamedTuple):
    """Tokens start .. start+length of content block `block` (a NamedTuple: immutable, and the
    simulator compares millions of them)."""

    block: int
    start: int
    length: int


@dataclass(frozen=True)
class Request:
    """One request of a traffic: when, whose, what prompt, how long an answer.

    `conversation` is None for an interloper (a request that belongs to no conversation; affinity
    routes it to an unowned slot). `user_starts` are the prompt positions where user messages
    start (chat requests: llama.cpp's user-message checkpoints); empty for raw prompts.
    """

    time: float
    conversation: str | None
    segments: tuple[Segment, ...]
    output_length: int = 1
    user_starts: tuple[int, ...] = ()
    kind: str = "turn"  # "turn" | "zero" | "system" | "near_duplicate" | "mooncake" | "trace"
    # What the engine said it reused for this request (a capture's `reported_reuse`, a logs
    # trace's `reused`): a floor under the request's ideal (docs/DESIGN.md §10). None: not said.
    reported_reuse: int | None = None
    server: str | None = None  # a trace of several servers: each is simulated on its own

    @functools.cached_property
    def prompt_tokens(self) -> int:
        """Summed once per request: the simulator asks for it per policy and per turn."""
        return sum(s.length for s in self.segments)


def common_prefix(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """Tokens two segment sequences share from the start."""
    n = i = j = oa = ob = 0
    while i < len(a) and j < len(b):
        sa, sb = a[i], b[j]
        if oa == 0 and ob == 0 and sa == sb:  # the common case: the same segment
            n += sa.length
            i += 1
            j += 1
            continue
        if sa.block != sb.block or sa.start + oa != sb.start + ob:
            break
        m = min(sa.length - oa, sb.length - ob)
        n, oa, ob = n + m, oa + m, ob + m
        if oa == sa.length:
            i, oa = i + 1, 0
        if ob == sb.length:
            j, ob = j + 1, 0
    return n


def truncate(segments: Sequence[Segment], n: int) -> tuple[Segment, ...]:
    """The first n tokens of a segment sequence."""
    out: list[Segment] = []
    left = n
    for s in segments:
        if left <= 0:
            break
        out.append(s if s.length <= left else Segment(s.block, s.start, left))
        left -= s.length
    return tuple(out)


def output_block(index: int) -> int:
    """The block id of request `index`'s answer in a slot (simulate's opaque output tokens; a
    capture trace's `extends` names them where a prompt continues with that answer)."""
    return -1 - index


def with_output(requests: Sequence[Request], output_length: int) -> list[Request]:
    return [replace(r, output_length=output_length) for r in requests]


class _Blocks:
    """Fresh block ids, in order of creation."""

    def __init__(self, first: int = 1) -> None:
        self.next = first

    def new(self, length: int) -> Segment:
        self.next += 1
        return Segment(self.next - 1, 0, length)


# Bounds on what a traffic may claim. No engine's context holds a prompt beyond 2^24 tokens (the
# longest windows today are ~10M), and the simulator and replay walk prompts batch by batch: a
# trace line claiming 10^12 tokens is refused, not simulated for hours. 10M requests is ~3,000
# times the case study's five days. Times are at most 10^12 s (~31,700 years: Unix time or time
# since a start alike); ids are what a 64-bit field or a reasonable key holds.
MAX_PROMPT_TOKENS = 1 << 24
MAX_REQUESTS = 10_000_000
MAX_TIME_S = 1e12
MAX_ID = (1 << 63) - 1  # hash ids, integer session ids, slots
MAX_KEY_CHARS = 4096  # a session id or server name as text


@dataclass(frozen=True)
class Loaded:
    """A traffic read from a file: the requests and what was skipped (counted, with reasons)."""

    requests: tuple[Request, ...]
    skipped: tuple[str, ...] = ()
    source: str = ""
    format: str = ""
    reported_reuse: tuple[int | None, ...] = ()  # per request, what the server said it reused (capture)
    block_size: int = 1  # the prefix resolution of a hash-id trace (Mooncake 512; capture's block_size)


@dataclass
class Stream:
    """A traffic read one request at a time (`stream`): `requests` is consumed once; `skipped`
    and `block_size` are complete once it is. What a reader holds meanwhile is bounded by the
    traffic's working set (per slot, per live conversation, a window of pending answers), not
    by its length."""

    requests: Iterator[Request]
    source: str = ""
    format: str = ""
    skipped: list[str] = field(default_factory=list)
    block_size: int = 1

    def loaded(self) -> Loaded:
        """The whole traffic in memory (the matrix, conversation inference, run cells)."""
        requests = tuple(self.requests)
        reported = tuple(r.reported_reuse for r in requests)
        return Loaded(requests, tuple(self.skipped), self.source, self.format,
                      reported if any(r is not None for r in reported) else (), self.block_size)
