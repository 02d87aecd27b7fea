"""The ideal reuse of a traffic: what a perfect cache (`Ideals`, `PrefixTrie` its reference) and a
cache that keeps each conversation's previous turn would reuse, request by request."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from shadowlab.traffic.model import Request, Segment, output_block


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
