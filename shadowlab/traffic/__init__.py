"""The traffic model shared by `shadowlab simulate` and the traffic replay (issue 12, 13).

A request is a prompt made of *segments*: `Segment(block, start, length)` stands for tokens
`start .. start+length` of content block `block`. Equal (block, offset) means equal tokens, so
shared leading segments are a shared prefix, and the longest common prefix of two prompts is a
walk over their segments: no token list is ever built (66M prompt tokens are a few hundred
thousand segments). Two different continuations of one prefix are assumed to differ at their first token;
`Materialiser` makes that true (distinct blocks are unlimited; one prefix may have at most
`len(vocabulary)` different continuations) and `check_materialised` proves it for a given traffic.

Sources (docs/DESIGN.md §8):
- `generate(TrafficShape)`: conversations that grow turn by turn, each turn's prompt = system
  block + history blocks + a re-rendered (volatile) block + the new user message, interleaved
  with interlopers of three kinds (zero overlap, a conversation's system prefix, a near-duplicate
  of a conversation's last prompt); deterministic from the seed.
- `read_mooncake(path)`: Mooncake / AIPerf JSON lines (`hash_ids` of 512-token blocks).
- `read_trace(path)`: `shadowlab logs --trace` (docs/trace.md). A log states only the prefix a
  request shared with its slot's previous request, not content: each request is built to share
  exactly that prefix with its slot predecessor and nothing more with anything else.

Bad input is a `TrafficError` naming file and line; readers stream (bounded memory per line).
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import stat
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from shadowlab.results import records
from shadowlab.errors import TrafficError

MOONCAKE_BLOCK = 512
MAX_LINE_BYTES = 16 * 1024 * 1024  # a JSON line longer than this is refused, never read whole
NEAR_ZERO = 512  # the case study's baseline-loss line: a turn sharing fewer tokens is a cold start
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


# --------------------------------------------------------------------------- the ideal


class _Node:
    __slots__ = ("edges",)

    def __init__(self) -> None:
        self.edges: dict[tuple[int, int], list[Any]] = {}  # (block, start) -> [length, node]


class PrefixTrie:
    """A radix tree over segments: `add(segments)` returns the longest prefix the prompt shares
    with any prompt added before (a perfect cache's reuse), then remembers it. Cost per prompt:
    its number of segments, not tokens."""

    def __init__(self) -> None:
        self.root = _Node()

    def add(self, segments: Sequence[Segment]) -> int:
        node, shared, matching = self.root, 0, True
        for block, start, length in segments:
            while length > 0:
                edge = node.edges.get((block, start))
                if edge is None:  # new content from here on: one new edge for the rest
                    child = _Node()
                    node.edges[(block, start)] = [length, child]
                    node, matching = child, False
                    break
                elen, child = edge
                m = min(length, elen)
                if m < elen:  # split the edge at m
                    mid = _Node()
                    mid.edges[(block, start + m)] = [elen - m, child]
                    edge[0], edge[1] = m, mid
                    child = mid
                if matching:
                    shared += m
                node, start, length = child, start + m, length - m
        return shared


def ideals(requests: Iterable[Request]) -> Iterator[tuple[int, int]]:
    """Per request: (perfect-cache ideal, consecutive-turn ideal) (`Ideals.add`)."""
    tracker = Ideals()
    for r in requests:
        yield tracker.add(r)


class Ideals:
    """The two ideals of each request of a traffic, request by request.

    The perfect-cache ideal is the longest prefix a prompt shares with ANY earlier request; the
    consecutive-turn ideal the prefix shared with the previous request of its own conversation
    (0 for an interloper or a conversation's first turn). Both are capped at the prompt length -
    1 (every engine evaluates at least one prompt token) and never below what the engine said it
    reused for the request (`Request.reported_reuse`: the invariant of docs/DESIGN.md §10; a
    request raised to it is counted in `raised`).

    What a perfect cache holds is every distinct prefix seen, so memory grows with the traffic's
    distinct content; it is kept small: a prompt is walked in canonical segments (adjacent pieces
    of one block merged, so equal tokens always cut alike) and each (prefix, segment start) is
    one dict entry, keyed by a 64-bit hash of the prefix before it and the segment's (block,
    start), holding the longest length seen there; the prefix after a segment is the hash of
    (prefix, block, start, length). A prompt shares a segment's first m tokens when an earlier
    one held m or more there, and goes on past it only when an earlier one ended that segment at
    the same token (then the next key exists). Exact but for hash collisions (about n^2 / 2^64
    for n entries: 10^-5 at 10^7), and the same on every machine and process (Python hashes
    integers and tuples of them without a per-process seed). PrefixTrie gives the same figures
    with a tree (tests/shadowlab/test_simulate.py compares them)."""

    def __init__(self) -> None:
        self._reach: dict[int, int] = {}
        self._last: dict[str, array] = {}
        self._index = 0
        self.raised = 0  # requests whose ideal the engine's own reuse raised

    def add(self, r: Request, index: int | None = None) -> tuple[int, int]:
        """`index`: the request's place in the whole traffic (its answer's block id), when this
        tracker sees only some of it (one server of several)."""
        index = self._index if index is None else index
        self._index += 1
        # What a cache holds after the request: its prompt and its answer's evaluated tokens (a
        # capture trace's later prompt may continue with them: `extends`).
        served = r.segments + ((Segment(output_block(index), 0, r.output_length - 1),) if r.output_length > 1 else ())
        ideal = self._add(served)
        prev = self._last.get(r.conversation) if r.conversation is not None else None
        consecutive = _common_canonical(prev, r.segments) if prev is not None else 0
        if r.conversation is not None:
            # A conversation's last prompt, as flat (block, start, length) triples: 24 bytes a
            # segment, where the Segment objects would keep ~130 (every conversation ever seen is kept).
            self._last[r.conversation] = array("q", [x for seg in _canonical(served) for x in seg])
        cap = r.prompt_tokens - 1
        ideal = min(ideal, cap)
        if r.reported_reuse is not None and r.reported_reuse > ideal:
            ideal = r.reported_reuse
            self.raised += 1
        return ideal, min(consecutive, cap)

    def _add(self, segments: Sequence[Segment]) -> int:
        reach = self._reach
        shared, matching, prefix = 0, True, 0
        for block, start, length in _canonical(segments):
            key = hash((prefix, block, start))
            held = reach.get(key, 0)
            if matching:
                shared += min(held, length)
                matching = held >= length
            if held < length:
                reach[key] = length
            prefix = hash((prefix, block, start, length))
        return shared


def _common_canonical(prev: array, segments: Sequence[Segment]) -> int:
    """`common_prefix` of a prompt kept as canonical triples and a prompt's segments: both cut
    alike where their tokens are equal, so they share whole segments, then part of the first
    that differs in length only."""
    shared, i = 0, 0
    for block, start, length in _canonical(segments):
        if i + 2 >= len(prev) or prev[i] != block or prev[i + 1] != start:
            break
        shared += min(length, prev[i + 2])
        if length != prev[i + 2]:
            break
        i += 3
    return shared


def _canonical(segments: Sequence[Segment]) -> Iterator[tuple[int, int, int]]:
    """The segments with each run of adjacent pieces of one block merged into one."""
    run: list[int] | None = None
    for block, start, length in segments:
        if length <= 0:
            continue
        if run is not None and block == run[0] and start == run[1] + run[2]:
            run[2] += length
            continue
        if run is not None:
            yield run[0], run[1], run[2]
        run = [block, start, length]
    if run is not None:
        yield run[0], run[1], run[2]


# --------------------------------------------------------------------------- the generator


@dataclass(frozen=True)
class Dist:
    """A distribution of token counts: `fixed` (a), `uniform` (a..b), `lognormal` (median a,
    sigma b), clipped to [low, high]."""

    kind: str = "fixed"
    a: float = 0
    b: float = 0
    low: int = 0
    high: int = 1 << 20

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        elif self.kind == "lognormal":
            v = self.a * math.exp(rng.gauss(0.0, self.b))
        else:
            raise TrafficError(f"unknown distribution kind {self.kind!r}", hint="fixed, uniform or lognormal")
        return int(min(self.high, max(self.low, round(v))))

    @classmethod
    def parse(cls, value: Any, where: str) -> Dist:
        """`1200`, `[500, 3000]` (uniform), or `{kind, a, b, low, high}`."""
        if isinstance(value, bool):
            raise TrafficError(f"{where}: expected a number, a [low, high] pair or a mapping")
        if isinstance(value, (int, float)):
            return cls("fixed", value, value)
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
            return cls("uniform", value[0], value[1])
        if isinstance(value, dict):
            unknown = set(value) - {"kind", "a", "b", "low", "high"}
            if unknown:
                raise TrafficError(f"{where}: unknown key(s) {sorted(unknown)}", hint="kind, a, b, low, high")
            try:
                return cls(**value)
            except TypeError as exc:
                raise TrafficError(f"{where}: {exc}") from None
        raise TrafficError(f"{where}: expected a number, a [low, high] pair or a mapping, got {value!r}")


@dataclass(frozen=True)
class TrafficShape:
    """The declared shape of generated traffic; `generate` realises it from `seed`.

    Each conversation's turn t sends: its system block, the history blocks of turns < t, a
    re-rendered block (`volatile_tokens`, new content every turn: the divergence point of turn
    t+1 is the end of turn t's history, deep inside the prompt), then the new user message.
    `concurrent` conversations are live at a time (a new one starts when one ends).
    Interlopers make up `interloper_share` of all requests, of the kinds weighted by
    `interloper_kinds` (zero overlap; the system block of a live conversation, then new text;
    a near-duplicate: a live conversation's last prompt cut at `near_duplicate_cut` of it, then
    new text).
    `preamble` (length -> weight) starts every prompt with the first n tokens of ONE header block
    shared by all requests, n drawn per conversation and per interloper: the template header and
    BOS that make "unrelated" prompts share 1, 3 or 32 tokens in the case study.
    `user_delimiter` opens every user message (each history block and the new user message) with
    the delimiter segment (`DELIMITER_BLOCK`, `DELIMITER_TOKENS` long: the engine's tokens of
    `<|im_start|>user` first, put there by `Materialiser(delimiter=...)`), so a request sent with
    llama.cpp's `message_delimiters` gets checkpoints at `Request.user_starts`.
    """

    conversations: int = 4
    turns: int = 6
    concurrent: int = 2
    system_tokens: Dist = Dist("uniform", 200, 400)
    turn_tokens: Dist = Dist("uniform", 100, 300)
    volatile_tokens: Dist = Dist("fixed", 0)
    user_tokens: Dist = Dist("uniform", 20, 60)
    interloper_share: float = 0.0
    interloper_tokens: Dist = Dist("uniform", 50, 300)
    interloper_kinds: tuple[tuple[str, float], ...] = (("zero", 1.0),)
    near_duplicate_cut: Dist = Dist("uniform", 0.5, 0.95, 0, 1)
    arrival: str = "round_robin"  # "round_robin" | "random" | "bursts"
    burst: int = 3
    interloper_placement: str = "random"  # "random" | "before_turns"
    output_tokens: int = 1
    gap_s: float = 1.0
    seed: int = 0
    preamble: tuple[tuple[int, float], ...] = ()
    user_delimiter: bool = False

    KINDS = ("zero", "system", "near_duplicate")
    ARRIVALS = ("round_robin", "random", "bursts")
    PLACEMENTS = ("random", "before_turns")

    @property
    def requests(self) -> int:
        """How many requests `generate` makes: every conversation turn, and interlopers making up
        `interloper_share` of the whole (the one count the bounds and the generator use)."""
        turns = self.conversations * self.turns
        return round(turns / (1 - self.interloper_share)) if self.interloper_share else turns

    @classmethod
    def case_study(cls, seed: int = 0, scale: int = 1) -> TrafficShape:
        """The case study's production lane (seed 000; `CASE_STUDY` lists what it measured and
        tests/shadowlab/test_simulate.py holds `realised_shape` of this to it): one slot's worth
        of interleaved traffic, ~3,500 requests and ~62M prompt tokens at scale 1. Conversations
        (20 turns each, a heavy-tailed system prompt and pasted turns) re-render a block before
        the new user message, so a turn diverges from its predecessor deep in the prompt; a third
        of the requests are unrelated jobs that share only the template header (1, 3 or 32
        tokens) with anything. `scale` multiplies conversations and jobs alike."""
        return cls(
            conversations=119 * scale, turns=20, concurrent=1,
            preamble=((32, 0.55), (3, 0.4), (1, 0.05)),
            system_tokens=Dist("lognormal", 1000, 1.4, 300, 150_000),
            turn_tokens=Dist("lognormal", 55, 2.3, 5, 150_000),
            volatile_tokens=Dist("lognormal", 1700, 1.0, 600, 60_000), user_tokens=Dist("uniform", 20, 300),
            interloper_share=0.32, interloper_tokens=Dist("lognormal", 4000, 2.6, 700, 258_037),
            interloper_kinds=(("zero", 1.0),), arrival="random", gap_s=111.0, seed=seed)  # ~4.5 days

    @classmethod
    def case_study_interleaved(cls, seed: int = 0, scale: int = 1) -> TrafficShape:
        """The lane the case study's mechanism describes (seeds/000: "every low-overlap interloper
        erases the checkpoints the next conversation turn would need"): the same conversations
        and jobs at the same scale (~3,500 requests, ~64M prompt tokens), but a job sits in front
        of every turn that continues a conversation, as a memory-worker job after each turn
        would. A fifth of the jobs run on a live conversation's template and system prompt (the
        upper mode of the shared prefix), the rest share only the header. The request before a
        conversation turn is then never its own previous turn. It does NOT match the case study's
        measured shared-prefix percentiles (only ~3 % of requests share 4,096+ with the one
        before, not 24 %): no one-slot traffic can show those and leave POLICY=0 near zero
        (docs/DESIGN.md §10, "The case study's conclusion, checked")."""
        return replace(
            cls.case_study(seed, scale), conversations=88 * scale, interloper_share=0.497,
            interloper_placement="before_turns", interloper_kinds=(("zero", 0.8), ("system", 0.2)),
            volatile_tokens=Dist("lognormal", 1300, 1.0, 600, 60_000),
            interloper_tokens=Dist("lognormal", 2500, 2.6, 700, 258_037))


PRESETS = {"case-study": TrafficShape.case_study, "case-study-interleaved": TrafficShape.case_study_interleaved}


# What the case study measured on its lane (seeds/000: 3,292 partial-reuse turns of ~3,500; the
# prefix each request shared with the slot's cached prompt, i.e. the request before it).
CASE_STUDY = {
    "requests": 3500, "prompt_tokens": 66_230_000,
    "prompt_size": {"median": 6552, "max": 258_037},
    "shared_with_previous": {"min": 1, "p10": 3, "p25": 3, "median": 32, "p75": 3734, "p90": 9923, "max": 155_259},
    "share_near_zero_overlap": 0.57, "share_4096_or_more": 0.24, "reusable_share": 12.39 / 66.23,
}


SHAPE_KEYS = {f for f in TrafficShape.__dataclass_fields__}
_DIST_KEYS = {"system_tokens", "turn_tokens", "volatile_tokens", "user_tokens", "interloper_tokens",
              "near_duplicate_cut"}


def shape_from_dict(doc: Any, where: str = "<shape>", *, count: bool = True) -> TrafficShape:
    """A TrafficShape from a YAML/JSON mapping (unknown keys refused). `count=False`: the request
    count, which several keys make, is left to the caller (one key checked by itself: the other
    keys' defaults are no figures of the shape; a matrix, with its own lower bound)."""
    if not isinstance(doc, dict):
        raise TrafficError(f"{where}: a traffic shape is a mapping of {sorted(SHAPE_KEYS)}")
    unknown = set(doc) - SHAPE_KEYS
    if unknown:
        raise TrafficError(f"{where}: unknown key(s) {sorted(unknown)}", hint=f"known: {', '.join(sorted(SHAPE_KEYS))}")
    kw: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _DIST_KEYS:
            kw[key] = Dist.parse(value, f"{where}: {key}")
        elif key == "interloper_kinds":
            if not isinstance(value, dict):
                raise TrafficError(f"{where}: interloper_kinds is a mapping kind -> weight")
            kw[key] = tuple((str(k), float(v)) for k, v in value.items())
        elif key == "preamble":
            if not isinstance(value, dict):
                raise TrafficError(f"{where}: preamble is a mapping header length -> weight")
            try:
                kw[key] = tuple((int(k), float(v)) for k, v in value.items())
            except (TypeError, ValueError):
                raise TrafficError(f"{where}: preamble maps whole header lengths to weights, got {value!r}") from None
        else:
            kw[key] = value
    shape = TrafficShape(**kw)
    _check_shape(shape, where, count)
    return shape


def _check_shape(s: TrafficShape, where: str, count: bool = True) -> None:
    for key in ("conversations", "turns", "concurrent", "burst", "output_tokens", "seed"):
        v = getattr(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "seed" else 1):
            raise TrafficError(f"{where}: {key} must be an integer >= {0 if key == 'seed' else 1}, got {v!r}")
    if not isinstance(s.interloper_share, (int, float)) or not 0 <= s.interloper_share < 1:
        raise TrafficError(f"{where}: interloper_share must be in [0, 1), got {s.interloper_share!r}")
    if not isinstance(s.user_delimiter, bool):
        raise TrafficError(f"{where}: user_delimiter must be true or false, got {s.user_delimiter!r}")
    if s.arrival not in TrafficShape.ARRIVALS:
        raise TrafficError(f"{where}: arrival must be one of {TrafficShape.ARRIVALS}, got {s.arrival!r}")
    n_conv = s.conversations * s.turns
    if count and s.requests > MAX_REQUESTS:
        jobs = " and their interlopers" if s.interloper_share else ""
        raise TrafficError(f"{where}: {n_conv:,} conversation turns (conversations × turns){jobs} are more than "
                           f"{MAX_REQUESTS:,} requests")
    if s.interloper_placement not in TrafficShape.PLACEMENTS:
        raise TrafficError(f"{where}: interloper_placement must be one of {TrafficShape.PLACEMENTS}, "
                           f"got {s.interloper_placement!r}")
    bad = [k for k, _ in s.interloper_kinds if k not in TrafficShape.KINDS]
    if bad or not any(w > 0 for _, w in s.interloper_kinds):
        raise TrafficError(f"{where}: interloper_kinds: kinds are {TrafficShape.KINDS} with a positive weight")
    if s.preamble and (any(n < 1 or w < 0 for n, w in s.preamble) or not any(w > 0 for _, w in s.preamble)):
        raise TrafficError(f"{where}: preamble: header lengths >= 1 with weights >= 0, one of them positive")


class _Blocks:
    """Fresh block ids, in order of creation."""

    def __init__(self, first: int = 1) -> None:
        self.next = first

    def new(self, length: int) -> Segment:
        self.next += 1
        return Segment(self.next - 1, 0, length)


@dataclass
class _Conversation:
    name: str
    system: Segment
    history: list[Segment] = field(default_factory=list)
    turns_left: int = 0
    last: tuple[Segment, ...] = ()
    preamble: tuple[Segment, ...] = ()
    last_starts: tuple[int, ...] = ()  # user_starts of `last`


class _Preamble:
    """The header block every prompt starts with (none when the shape has no preamble)."""

    def __init__(self, shape: TrafficShape, blocks: _Blocks) -> None:
        self.weights = shape.preamble
        self.block = blocks.new(max(n for n, _ in self.weights)).block if self.weights else 0

    def draw(self, rng: random.Random) -> tuple[Segment, ...]:
        if not self.weights:
            return ()
        n = rng.choices([n for n, _ in self.weights], weights=[w for _, w in self.weights])[0]
        return (Segment(self.block, 0, n),)


def generate(shape: TrafficShape, where: str = "<shape>") -> list[Request]:
    """Seeded traffic of the declared shape (the same shape and seed give the same requests);
    errors name `where` (the shape's file)."""
    return list(iter_generate(shape, where))


def iter_generate(shape: TrafficShape, where: str = "<shape>") -> Iterator[Request]:
    """`generate`, one request at a time: what a generated traffic holds at once is its live
    conversations, not its requests (`shadowlab simulate` streams a million of them)."""
    _check_shape(shape, where)
    rng = random.Random(f"shadowlab-traffic:{shape.seed}")
    blocks = _Blocks()
    header = _Preamble(shape, blocks)
    order = _arrival_order(shape, rng)
    n_total = shape.requests  # len(order) conversation turns, the rest interlopers
    inter_at = _interloper_positions(shape, rng, order, n_total)
    live: dict[int, _Conversation] = {}
    it = iter(order)
    for i in range(n_total):
        t = i * shape.gap_s
        if i in inter_at:
            yield _sized(_interloper(shape, rng, blocks, list(live.values()), t, header), i, where)
            continue
        c = next(it)
        conv = live.get(c)
        if conv is None:
            conv = live[c] = _Conversation(f"c{c}", blocks.new(shape.system_tokens.draw(rng)), turns_left=shape.turns,
                                           preamble=header.draw(rng))
        yield _sized(_turn(shape, rng, blocks, conv, t), i, where)
        conv.turns_left -= 1
        if conv.turns_left == 0:
            del live[c]


def _sized(r: Request, i: int, where: str) -> Request:
    """`r` if its prompt fits a context (sizes are segments here, so building it took no time)."""
    if r.prompt_tokens > MAX_PROMPT_TOKENS:
        whose = f"conversation {r.conversation}" if r.conversation else f"a {r.kind} interloper"
        raise TrafficError(f"{where}: request {i} ({whose}) would be {r.prompt_tokens:,} tokens, beyond the "
                           f"{MAX_PROMPT_TOKENS:,} any engine's context holds",
                           hint="lower the sizes' `high`, or the number of turns")
    return r


def _interloper_positions(shape: TrafficShape, rng: random.Random, order: list[int], n_total: int) -> set[int]:
    """Where in the request sequence the interlopers go. `random`: anywhere. `before_turns`: first
    in front of turns that continue their conversation (so the request before such a turn is not
    its own previous turn: the case study's interleaved lane), any left over anywhere."""
    n_inter = n_total - len(order)
    if n_inter <= 0:
        return set()
    if shape.interloper_placement == "random":
        return set(rng.sample(range(n_total), n_inter))
    continuing = [k for k in range(1, len(order)) if order[k] == order[k - 1]]
    before = sorted(rng.sample(continuing, min(n_inter, len(continuing))))
    extra = sorted(rng.sample(range(len(order) + 1), n_inter - len(before)))
    # Conversation turn k gets `ahead[k]` interlopers in front of it (k == len(order): at the end).
    ahead = [0] * (len(order) + 1)
    for k in (*before, *extra):
        ahead[k] += 1
    positions, i = set(), 0
    for k, n in enumerate(ahead):
        positions.update(range(i, i + n))
        i += n + 1
    return positions


def _arrival_order(shape: TrafficShape, rng: random.Random) -> list[int]:
    """Conversation index per conversation turn, `concurrent` conversations live at a time."""
    pending = list(range(shape.conversations))
    live: list[int] = []
    left = {c: shape.turns for c in pending}
    order: list[int] = []
    rr = 0
    while pending or live:
        while pending and len(live) < shape.concurrent:
            live.append(pending.pop(0))
        if shape.arrival == "random":
            c = rng.choice(live)
            run = 1
        else:
            c = live[rr % len(live)]
            rr += 1
            run = shape.burst if shape.arrival == "bursts" else 1
        for _ in range(min(run, left[c])):
            order.append(c)
            left[c] -= 1
        if left[c] == 0:
            live.remove(c)
    return order


def _turn(shape: TrafficShape, rng: random.Random, blocks: _Blocks, conv: _Conversation, t: float) -> Request:
    # Each history block starts with a user message, as does the new one (user_starts).
    opening = (Segment(DELIMITER_BLOCK, 0, DELIMITER_TOKENS),) if shape.user_delimiter else ()
    segments = [*conv.preamble, conv.system]
    starts = []
    for h in conv.history:
        starts.append(sum(s.length for s in segments))
        segments += [*opening, h]
    volatile = shape.volatile_tokens.draw(rng)
    if volatile:
        segments.append(blocks.new(volatile))
    user = blocks.new(max(1, shape.user_tokens.draw(rng)))
    user_start = sum(s.length for s in segments)
    segments += [*opening, user]
    conv.history.append(blocks.new(max(1, shape.turn_tokens.draw(rng))))
    conv.last, conv.last_starts = tuple(segments), (*starts, user_start)
    return Request(t, conv.name, tuple(segments), shape.output_tokens, conv.last_starts, "turn")


def _interloper(shape: TrafficShape, rng: random.Random, blocks: _Blocks, live: list[_Conversation],
                t: float, header: _Preamble) -> Request:
    kinds = [k for k, _ in shape.interloper_kinds]
    kind = rng.choices(kinds, weights=[w for _, w in shape.interloper_kinds])[0]
    size = max(1, shape.interloper_tokens.draw(rng))
    donors = [c for c in live if c.last] if kind == "near_duplicate" else live
    if kind == "zero" or not donors:
        return Request(t, None, (*header.draw(rng), blocks.new(size)), shape.output_tokens, (), "zero")
    donor = rng.choice(donors)
    if kind == "system":
        # A job on the same template and system prompt as a live conversation: header included.
        return Request(t, None, (*donor.preamble, donor.system, blocks.new(size)), shape.output_tokens, (), "system")
    total = sum(s.length for s in donor.last)
    keep = max(1, min(total - 1, int(total * rng.uniform(shape.near_duplicate_cut.a, shape.near_duplicate_cut.b))))
    # The copy holds the donor's user messages up to the cut (a chat request's checkpoints).
    width = DELIMITER_TOKENS if shape.user_delimiter else 1  # a delimiter cut short is none
    starts = tuple(s for s in donor.last_starts if s + width <= keep)
    return Request(t, None, (*truncate(donor.last, keep), blocks.new(size)), shape.output_tokens, starts,
                   "near_duplicate")


# --------------------------------------------------------------------------- realised shape


def _percentiles(values: Sequence[int]) -> dict[str, int | None]:
    v = sorted(values)
    if not v:
        return {k: None for k in ("min", "p10", "p25", "median", "p75", "p90", "max")}
    pick = lambda p: v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"min": v[0], "p10": pick(0.10), "p25": pick(0.25), "median": pick(0.5), "p75": pick(0.75),
            "p90": pick(0.9), "max": v[-1]}


def realised_shape(requests: Sequence[Request]) -> dict[str, Any]:
    """What the traffic turned out to be (`ShapeTally`, fed every request with its ideals)."""
    tally = ShapeTally()
    for r in requests:
        tally.add(r)
    return tally.result()


class ShapeTally:
    """What a traffic turned out to be, request by request: sizes, the prefix each request shares
    with the one before it on its server (the one-slot view of the case study: share under 512,
    4,096+), divergence depths of consecutive conversation turns, the ideals (`Ideals`, per
    server: a server reuses only what it computed). Holds a few integers per request (the
    percentiles' values), one Ideals per server and the conversations' names."""

    def __init__(self) -> None:
        self.ideals: dict[str | None, Ideals] = {}
        self._prev: dict[str | None, tuple[Segment, ...]] = {}
        self._sizes, self._prev_shared, self._depths = array("q"), array("q"), array("q")
        self._names: set[str] = set()
        self.requests = self.interlopers = self.ideal = self.consecutive = self.reusable = 0

    def add(self, r: Request, index: int | None = None) -> tuple[int, int]:
        """The request's (ideal, consecutive ideal); `index` its place in the traffic (default:
        the requests added so far)."""
        index = self.requests if index is None else index
        ideal, consecutive = self.ideals.setdefault(r.server, Ideals()).add(r, index)
        prev = self._prev.get(r.server)
        if prev is not None:
            shared = common_prefix(prev, r.segments)
            self._prev_shared.append(shared)
            self.reusable += shared
        self._prev[r.server] = r.segments
        self._sizes.append(r.prompt_tokens)
        if consecutive:
            self._depths.append(consecutive)
        if r.conversation is None:
            self.interlopers += 1
        else:
            self._names.add(r.conversation)
        self.requests += 1
        self.ideal += ideal
        self.consecutive += consecutive
        return ideal, consecutive

    @property
    def raised(self) -> int:
        """Requests whose ideal the engine's own reported reuse raised (`Ideals.raised`)."""
        return sum(t.raised for t in self.ideals.values())

    def result(self) -> dict[str, Any]:
        prev_shared, n = self._prev_shared, len(self._prev_shared)
        return {
            "requests": self.requests,
            "interlopers": self.interlopers,
            "conversations": len(self._names),
            "prompt_tokens": sum(self._sizes),
            "prompt_size": _percentiles(self._sizes),
            "shared_with_previous": _percentiles(prev_shared),
            "share_near_zero_overlap": (sum(s < NEAR_ZERO for s in prev_shared) / n) if n else None,
            "share_4096_or_more": (sum(s >= 4096 for s in prev_shared) / n) if n else None,
            "reusable_with_previous": self.reusable,
            "divergence_depth": _percentiles(self._depths),
            "ideal_tokens": self.ideal,
            "consecutive_ideal_tokens": self.consecutive,
        }


# --------------------------------------------------------------------------- materialisation


class _Branch:
    """A node of the materialiser's prefix tree: the edges leaving it, keyed by (block, start) as
    in PrefixTrie, and the first token of each (two continuations of one prefix must differ
    there, or their prompts would share more than their segments say)."""

    __slots__ = ("edges", "firsts")

    def __init__(self) -> None:
        self.edges: dict[tuple[int, int], list[Any]] = {}  # (block, start) -> [length, node]
        self.firsts: dict[int, tuple[int, int]] = {}  # first token -> the edge that starts with it


class Materialiser:
    """Exact token ids for segments. A block's tokens come from a seeded stream keyed by (seed,
    block id), so equal ids give equal tokens and a shorter use of a block is a prefix of a longer
    one. Two prompts can share more than their segments say only where they part ways, so a
    block's first token is chosen there: `prompt` walks the prefix tree of the requests seen so
    far, and a block met for the first time takes a token that no other continuation of that
    prefix starts with. Distinct blocks are unlimited; what is bounded is the number of different
    continuations of ONE prefix (len(vocabulary)), and a block reused after another prefix must
    not collide there (both a TrafficError naming the request).

    `delimiter` (token ids, at most DELIMITER_TOKENS): the first tokens of DELIMITER_BLOCK (the
    rest drawn as for any block). Its first token leaves the vocabulary, so no other block can
    contain the delimiter: it occurs exactly at the requests' user starts."""

    def __init__(self, vocabulary: Sequence[int], seed: int = 0, delimiter: Sequence[int] = ()) -> None:
        if len(delimiter) > DELIMITER_TOKENS:
            raise TrafficError(f"the user-message delimiter is {len(delimiter)} tokens; a traffic holds "
                               f"{DELIMITER_TOKENS} for it", hint="a tokenizer that knows ChatML's <|im_start|>")
        vocabulary = [v for v in vocabulary if not delimiter or v != delimiter[0]]
        if len(vocabulary) < 2:
            raise TrafficError("materialising needs a vocabulary of at least 2 token ids")
        self.vocabulary = list(vocabulary)
        self.seed = seed
        self._tokens: dict[int, list[int]] = {}
        self._rngs: dict[int, random.Random] = {}
        if delimiter:
            self._rngs[DELIMITER_BLOCK] = random.Random(f"shadowlab-block:{seed}:{DELIMITER_BLOCK}")
            self._tokens[DELIMITER_BLOCK] = [int(t) for t in delimiter]
        self._root = _Branch()
        self._count = 0  # requests placed

    def block(self, block: int, n: int) -> list[int]:
        tokens = self._tokens.get(block)
        if tokens is None:
            rng = self._rngs[block] = random.Random(f"shadowlab-block:{self.seed}:{block}")
            tokens = self._tokens[block] = [rng.choice(self.vocabulary)]
        if len(tokens) < n:
            tokens.extend(self._rngs[block].choices(self.vocabulary, k=n - len(tokens)))
        return tokens

    def prompt(self, request: Request) -> list[int]:
        self._place(request.segments)
        self._count += 1
        out: list[int] = []
        for s in request.segments:
            out.extend(self.block(s.block, s.start + s.length)[s.start:s.start + s.length])
        return out

    def _place(self, segments: Sequence[Segment]) -> None:
        """Walk (and grow) the prefix tree, claiming a distinct first token for every new edge."""
        node = self._root
        for block, start, length in segments:
            while length > 0:
                edge = node.edges.get((block, start))
                if edge is None:
                    self._claim(node, block, start)
                    child = _Branch()
                    node.edges[(block, start)] = [length, child]
                    node = child
                    break
                elen, child = edge
                m = min(length, elen)
                if m < elen:  # split the edge at m: the rest of it is the new node's one edge
                    mid = _Branch()
                    mid.edges[(block, start + m)] = [elen - m, child]
                    mid.firsts[self.block(block, start + m + 1)[start + m]] = (block, start + m)
                    edge[0], edge[1] = m, mid
                    child = mid
                node, start, length = child, start + m, length - m

    def _claim(self, node: _Branch, block: int, start: int) -> None:
        if block not in self._tokens and start == 0:
            free = [v for v in self.vocabulary if v not in node.firsts]
            if not free:
                raise TrafficError(
                    f"request {self._count}: more than {len(self.vocabulary)} different continuations of one "
                    "prefix, but only that many distinct tokens to start them with",
                    hint="a tokenizer with a larger vocabulary, or fewer requests that part ways at one point")
            rng = self._rngs[block] = random.Random(f"shadowlab-block:{self.seed}:{block}")
            self._tokens[block] = [rng.choice(free)]
        token = self.block(block, start + 1)[start]
        other = node.firsts.setdefault(token, (block, start))
        if other != (block, start):
            raise TrafficError(
                f"request {self._count}: block {block} (offset {start}) follows a prefix that block {other[0]} "
                f"(offset {other[1]}) already follows, and both start with token {token}",
                hint="a block id reused after another prefix; give it its own id")


def check_materialised(requests: Sequence[Request], prompts: Sequence[Sequence[int]]) -> None:
    """Every pair of prompts shares exactly the tokens their segments say (raises otherwise).

    Linear, not pairwise: over the prefix tree of the segments, (1) every request that follows an
    edge has the same tokens along it, and (2) the edges leaving one node start with different
    tokens. Then two prompts share tokens exactly as far as their paths share edges, which is
    their segments' common prefix."""
    root = _Branch()
    for index, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
        if len(prompt) != request.prompt_tokens:
            raise TrafficError(f"materialised request {index} has {len(prompt)} tokens, its segments say "
                               f"{request.prompt_tokens}")
        node, pos = root, 0
        for block, start, length in request.segments:
            while length > 0:
                edge = node.edges.get((block, start))
                if edge is None:
                    token = prompt[pos]
                    other = node.firsts.setdefault(token, (block, start))
                    if other != (block, start):
                        raise TrafficError(f"materialised request {index} shares token {token} at position {pos} "
                                           "with a request whose segments part from it there")
                    child = _Branch()
                    node.edges[(block, start)] = [length, child, list(prompt[pos:pos + length])]
                    node, pos = child, pos + length
                    break
                elen, child, tokens = edge
                m = min(length, elen)
                if list(prompt[pos:pos + m]) != tokens[:m]:
                    raise TrafficError(f"materialised request {index}: block {block} at offset {start} has "
                                       "other tokens than an earlier use of it")
                if m < elen:
                    mid = _Branch()
                    mid.edges[(block, start + m)] = [elen - m, child, tokens[m:]]
                    mid.firsts[tokens[m]] = (block, start + m)
                    edge[0], edge[1], edge[2] = m, mid, tokens[:m]
                    child = mid
                node, start, length, pos = child, start + m, length - m, pos + m


# --------------------------------------------------------------------------- readers


def _open_regular(path: Path) -> Any:
    """A binary file object of `path` if it is a regular file; TrafficError otherwise (a FIFO
    would wait for a writer, /dev/zero never end: refused unread)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise TrafficError(f"cannot read: {exc.strerror}", file=str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TrafficError("not a regular file (a FIFO, a device or a directory): nothing was read", file=str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, ends with newline), each line read bounded."""
    with _open_regular(path) as fh:
        number = 0
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise TrafficError(f"line longer than {MAX_LINE_BYTES} bytes", file=str(path), line=number)
            yield number, line, line.endswith(b"\n")


def _json_lines(path: Path, skipped: list[str]) -> Iterator[tuple[int, Any]]:
    """Decoded JSON objects; a cut last line (no newline, not JSON) is skipped and counted."""
    for number, line, whole in _lines(path):
        if not line.strip():
            continue
        try:
            doc = _parse_line(line, path, number)
        except records.JSONRefused as exc:
            if not whole:
                skipped.append(f"line {number}: cut last line skipped")
                return
            raise TrafficError(f"not a JSON line: {exc}", file=str(path), line=number) from None
        if not isinstance(doc, dict):
            raise TrafficError("a line must be a JSON object", file=str(path), line=number)
        yield number, doc


def _parse_line(line: bytes, path: Path, number: int) -> Any:
    """One line through records.parse_json (the one bounded JSON reader): JSON nested too deeply
    is refused whether or not the line is whole; other JSONRefused pass to the caller."""
    try:
        return records.parse_json(line)
    except records.JSONTooDeep as exc:
        raise TrafficError(str(exc), file=str(path), line=number) from None


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


def _int(doc: dict, key: str, path: Path, line: int, *, required: bool = True, minimum: int = 0,
         maximum: int | None = None) -> int | None:
    if key not in doc or doc[key] is None:
        if required:
            raise TrafficError(f"missing {key!r}", file=str(path), line=line)
        return None
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise TrafficError(f"{key!r} must be an integer, got {v!r}", file=str(path), line=line)
    if v < minimum:
        raise TrafficError(f"{key!r} must be >= {minimum}, got {v}", file=str(path), line=line)
    if maximum is not None and v > maximum:
        raise TrafficError(f"{key!r} is {int(v):,}, beyond the {maximum:,} it may be", file=str(path), line=line)
    return int(v)


def _key(doc: dict, key: str, path: Path, line: int, *, text: bool = True) -> str | int | None:
    """An id that names something (a session, a server, a slot): an integer in [0, MAX_ID], or
    (`text`) a string of at most MAX_KEY_CHARS; None when absent."""
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_ID:
        return v
    if text and isinstance(v, str) and len(v) <= MAX_KEY_CHARS:
        return v
    kinds = f"a string of at most {MAX_KEY_CHARS} characters or " if text else ""
    raise TrafficError(f"{key!r} must be {kinds}an integer from 0 to {MAX_ID:,}, got {_shown(v)}",
                       file=str(path), line=line)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


MOONCAKE_KEYS = {"timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay", "messages"}
# `shadowlab capture`'s extra fields (docs/trace.md "Capture traces"); other readers ignore them.
CAPTURE_KEYS = {"block_size", "salt_id", "endpoint", "stream", "status", "reported_reuse", "reported_prompt_tokens",
                "session_source", "user_starts", "user_start_ids", "extends", "max_output_length"}


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


def output_block(index: int) -> int:
    """The block id of request `index`'s answer in a slot (simulate's opaque output tokens; a
    capture trace's `extends` names them where a prompt continues with that answer)."""
    return -1 - index


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


def _count(count: int, path: Path, line: int) -> None:
    if count >= MAX_REQUESTS:
        raise TrafficError(f"more than {MAX_REQUESTS:,} requests", file=str(path), line=line,
                           hint="split the trace by time (--since/--until when it comes from shadowlab logs)")


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


TRACE_KEYS = {"time", "server", "slot", "task", "line", "prompt_tokens", "shared_prefix", "shared_source",
              "reused", "processed", "outcome", "prefill_ms", "checkpoints", "failures",
              "shared_with", "shared_exact"}  # the last two: version 2
TRACE_VERSIONS = (1, 2)


def read_trace(path: Path | str) -> Loaded:
    """`stream_trace`, all in memory."""
    return stream_trace(path).loaded()


# Of each server, the latest prompts a prompt-cache load may have brought back (see stream_trace).
CACHE_LOAD_LOOKBACK = 256


def stream_trace(path: Path | str) -> Stream:
    """`shadowlab logs --trace` (docs/trace.md, versions 1 and 2). Version 2's `shared_with`
    names the task whose prompt the slot's cache held (the slot's previous request, or the saved
    request a prompt-cache load brought back): the request is built on that task's prompt when it
    is among the server's last CACHE_LOAD_LOOKBACK. Otherwise, as for version 1: each request is built to share exactly
    its `shared_prefix` (where `shared_source` is `lcp` or `n_past`; else `reused`, a lower bound)
    with the previous request of the same server and slot, and nothing else: the log says nothing
    about content, so a prefix shared with an older request is invisible (the ideal is then the
    consecutive one) and no request has a conversation. A request that loaded a prompt-cache
    entry (`checkpoints.cache_loaded`, llama-server's `-cram`) shared that prefix with the entry,
    not with the slot's previous request: it is built on the server's latest earlier prompt
    (among the last CACHE_LOAD_LOOKBACK) that is at least that long, the entry's content as far
    as the log can tell. `reused` (what the engine reused) is kept as the request's
    `reported_reuse`: its ideal is never below it. A request without `prompt_tokens` is skipped
    and counted."""
    out = Stream(iter(()), str(Path(path)), "trace")
    out.requests = _trace_requests(Path(path), out.skipped)
    return out


def _trace_requests(path: Path, skipped: list[str]) -> Iterator[Request]:
    docs = _json_lines(path, skipped)
    first = next(docs, None)
    if first is None:
        raise TrafficError("empty trace (no header line)", file=str(path), line=1)
    _trace_header(first[1], path, first[0])
    fresh = _Blocks()
    previous: dict[tuple[Any, Any], tuple[Segment, ...]] = {}
    recent: dict[Any, deque[tuple[Segment, ...]]] = {}  # per server, its latest prompts
    by_task: dict[Any, OrderedDict[int, tuple[Segment, ...]]] = {}  # per server, its latest prompts by task (v2)
    last_time: dict[Any, float] = {}
    count = 0
    for line, doc in docs:
        unknown = set(doc) - TRACE_KEYS
        if unknown:
            raise TrafficError(f"unknown field(s) {sorted(unknown)}", file=str(path), line=line, hint="docs/trace.md")
        n = _int(doc, "prompt_tokens", path, line, required=False, minimum=1, maximum=MAX_PROMPT_TOKENS)
        if n is None:
            skipped.append(f"line {line}: no prompt_tokens")
            continue
        _count(count, path, line)
        count += 1
        server = _key(doc, "server", path, line)
        key = (server, _key(doc, "slot", path, line, text=False))
        t = _trace_time(doc, path, line, last_time)
        source = doc.get("shared_source")
        shared = _int(doc, "shared_prefix" if source in ("lcp", "n_past") else "reused", path, line,
                      required=False, maximum=MAX_PROMPT_TOKENS) or 0
        reused = _int(doc, "reused", path, line, required=False, maximum=MAX_PROMPT_TOKENS)
        earlier = recent.setdefault(server, deque(maxlen=CACHE_LOAD_LOOKBACK))
        tasks = by_task.setdefault(server, OrderedDict())
        prev = previous.get(key, ())
        with_task = doc.get("shared_with")
        if isinstance(with_task, int) and not isinstance(with_task, bool) and with_task in tasks:
            prev = tasks[with_task]  # v2: the log says whose prompt the slot's cache held
        elif _loaded_entry(doc):
            prev = next((p for p in reversed(earlier) if _length(p) >= min(shared, n)), prev)
        keep = truncate(prev, min(shared, n, _length(prev)))
        rest = n - _length(keep)
        segments = keep + ((fresh.new(rest),) if rest > 0 else ())
        previous[key] = segments
        earlier.append(segments)
        task = doc.get("task")
        if isinstance(task, int) and not isinstance(task, bool):
            tasks[task] = segments
            tasks.move_to_end(task)
            if len(tasks) > CACHE_LOAD_LOOKBACK:
                tasks.popitem(last=False)
        yield Request(t, None, segments, 1, (), "trace", reused, None if server is None else str(server))


def _loaded_entry(doc: dict) -> bool:
    """The line says a prompt-cache entry was loaded for the request (docs/trace.md)."""
    ckpts = doc.get("checkpoints")
    loaded = ckpts.get("cache_loaded") if isinstance(ckpts, dict) else None
    return isinstance(loaded, int) and not isinstance(loaded, bool) and loaded > 0


def _length(segments: Sequence[Segment]) -> int:
    return sum(s.length for s in segments)


def _trace_header(doc: dict, path: Path, line: int) -> None:
    if doc.get("format") != "shadowlab-trace":
        raise TrafficError("not a shadowlab trace: line 1 must be its header", file=str(path), line=line,
                           hint="write one with `shadowlab logs --trace FILE`")
    if doc.get("version") not in TRACE_VERSIONS:
        raise TrafficError(f"trace version {doc.get('version')!r} is not known (this shadowlab reads 1 and 2)",
                           file=str(path), line=line)


def _trace_time(doc: dict, path: Path, line: int, last: dict[Any, float]) -> float:
    t = doc.get("time")
    if t is None:
        return last.get(doc.get("server"), 0.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME_S:  # NaN fails too
        raise TrafficError(f"'time' must be a number of seconds from 0 to {MAX_TIME_S:g}, got {_shown(t)}",
                           file=str(path), line=line)
    server = doc.get("server")
    if server in last and t < last[server]:
        raise TrafficError(f"time {t} is before the previous request's {last[server]} on server {server!r}",
                           file=str(path), line=line)
    last[server] = float(t)
    return float(t)


def sniff(path: Path) -> str:
    """`trace`, `mooncake` or `shape` from the first non-blank line of a file."""
    for number, line, _ in _lines(path):
        text = line.strip()
        if not text:
            continue
        try:
            doc = _parse_line(text, path, number)
        except records.JSONRefused:
            return "shape"  # YAML
        if isinstance(doc, dict) and doc.get("format") == "shadowlab-trace":
            return "trace"
        if isinstance(doc, dict) and set(doc) & MOONCAKE_KEYS:
            return "mooncake"
        return "shape"
    raise TrafficError("empty file", file=str(path))


def read_shape(path: Path) -> TrafficShape:
    import yaml

    with _open_regular(path) as fh:
        raw = fh.read(MAX_LINE_BYTES + 1)
    if len(raw) > MAX_LINE_BYTES:
        raise TrafficError(f"a shape file longer than {MAX_LINE_BYTES} bytes", file=str(path))
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TrafficError(f"cannot read: {exc}", file=str(path)) from None
    except RecursionError:  # YAML's composer recurses per level of nesting
        raise TrafficError("nested too deeply to be a traffic shape", file=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TrafficError(f"not YAML/JSON: {getattr(exc, 'problem', exc)}", file=str(path),
                           line=None if mark is None else mark.line + 1) from None
    return shape_from_dict(doc, str(path))


def load(path: Path | str) -> Loaded:
    """Any traffic source by its content: a logs trace, a Mooncake file, or a shape file."""
    return stream(path).loaded()


def stream(path: Path | str) -> Stream:
    """`load`, one request at a time (the file is read as the requests are consumed)."""
    if str(path).startswith("shape:") and not Path(path).exists():
        return _preset(str(path))
    path = Path(path)
    kind = sniff(path)
    if kind == "trace":
        return stream_trace(path)
    if kind == "mooncake":
        return stream_mooncake(path)
    return Stream(iter_generate(read_shape(path), str(path)), str(path), "shape")


def _preset(source: str) -> Stream:
    """`shape:NAME[:seed]`: a named shape (`PRESETS`) generated from a seed (default 0)."""
    name, _, seed = source[len("shape:"):].partition(":")
    if name not in PRESETS:
        raise TrafficError(f"{source}: no such shape preset", hint=f"known: {', '.join(f'shape:{n}' for n in PRESETS)}")
    if seed and not seed.isdigit():
        raise TrafficError(f"{source}: the seed after the preset's name is a whole number, got {seed!r}")
    return Stream(iter_generate(PRESETS[name](seed=int(seed or 0))), source, "shape")


def write_mooncake(requests: Sequence[Request], path: Path) -> None:
    """Requests whose segments are whole 512-token blocks (the last one cut) as Mooncake lines."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in requests:
            doc: dict[str, Any] = {"timestamp": int(round(r.time * 1000)), "input_length": r.prompt_tokens,
                                   "output_length": r.output_length, "hash_ids": [s.block for s in r.segments]}
            if r.conversation is not None:
                doc["session_id"] = r.conversation
            fh.write(json.dumps(doc) + "\n")


def with_output(requests: Sequence[Request], output_length: int) -> list[Request]:
    return [replace(r, output_length=output_length) for r in requests]
