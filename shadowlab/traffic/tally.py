"""What a traffic turned out to be (`realised_shape`, `ShapeTally`): sizes, the prefix shared with
the previous request of the same server, divergence depths and the ideals."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from shadowlab.traffic.ideals import Ideals
from shadowlab.traffic.model import Request, Segment, common_prefix

NEAR_ZERO = 512  # the case study's baseline-loss line: a turn sharing fewer tokens is a cold start


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
