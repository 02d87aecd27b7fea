"""Seeded traffic of a declared shape (`generate`, `iter_generate`): conversations that grow turn by
turn, each turn's prompt = system block + history blocks + a re-rendered (volatile) block + the
new user message, interleaved with interlopers of three kinds (zero overlap, a conversation's
system prefix, a near-duplicate of a conversation's last prompt); deterministic from the seed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from shadowlab.errors import TrafficError
from shadowlab.traffic.model import (DELIMITER_BLOCK, DELIMITER_TOKENS, MAX_PROMPT_TOKENS, Request, Segment,
                                     _Blocks, truncate)
from shadowlab.traffic.shape import TrafficShape, _check_shape


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
