"""``shadowlab logs``' figures: the per-server / per-slot / overall counters and distributions
(nearest-rank percentiles). Split out of `shadowlab.logs.analysis` (``shadowlab logs``), which re-exports the names its importers use."""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence
from typing import Any

from shadowlab.logs import accel, reading

EVENT_COUNT_KINDS = accel.EVENT_COUNT_KINDS
PERCENTILES = (("min", 0), ("p10", 10), ("p25", 25), ("median", 50), ("p75", 75), ("p90", 90), ("max", 100))
LARGE_SHARED = 4096


# --------------------------------------------------------------------------- figures


def _pct(sorted_values: Sequence[int], p: int) -> int | None:
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[max(0, math.ceil(p * n / 100) - 1)] if p else sorted_values[0]


def distribution(values: Sequence[int]) -> dict[str, Any]:
    return _ranked(sorted(values))


def _ordered(values: array) -> Sequence[int]:
    """An array('q') sorted: in C where the accelerator is built (an array again, no Python int
    per value: ~10x less CPU on 200k requests), else by sorted()."""
    c = reading.folder()
    if c is None:
        return sorted(values)
    out = array("q", values)
    c.sort_q(out)
    return out


def _merged(a: array, b: array) -> array:
    """Two ascending arrays('q') as one, ascending (a new array; a and b are left as they are):
    the two runs merged in C where the accelerator is built, else sorted()."""
    out = array("q", a)
    out.extend(b)
    c = reading.folder()
    if c is None:
        return array("q", sorted(out))
    c.merge_q(out, len(a))
    return out


def _ranked(v: Sequence[int]) -> dict[str, Any]:
    """distribution() of values already sorted."""
    out: dict[str, Any] = {name: _pct(v, p) for name, p in PERCENTILES}
    out["n"] = len(v)
    return out


class Figures:
    """What one scope (a slot; a server and the whole are folded from their slots) adds up: sums
    and arrays of numbers, one ``add`` per request."""

    _SUMS = ("requests", "shared_stated", "prompt_tokens", "reusable", "reused", "processed", "avoidable",
             "prefill_ms", "timed_tokens", "placement", "retention", "baseline", "create_n", "create_mib_n",
             "create_ms_n", "create_mib", "create_ms", "restore_n", "restore_mib_n", "restore_ms_n",
             "restore_mib", "restore_ms")

    def __init__(self) -> None:
        self.requests = 0
        self.outcomes: dict[str, int] = dict.fromkeys(accel.OUTCOMES, 0)
        self.events: dict[str, int] = dict.fromkeys(EVENT_COUNT_KINDS, 0)
        self.shared = array("q")  # over warm requests with a known shared prefix
        self.shared_stated = 0
        self.prompts = array("q")
        # shared and prompts each ascending: the C fold gives its slots' so (they are merged,
        # never sorted again); add() appends in request order
        self.ordered = True
        self.prompt_tokens = self.reusable = self.reused = self.processed = self.avoidable = 0
        self.prefill_ms = 0.0
        self.timed_tokens = 0
        self.placement = self.retention = self.baseline = 0
        self.create_n = self.create_mib_n = self.create_ms_n = 0
        self.create_mib = self.create_ms = 0.0
        self.restore_n = self.restore_mib_n = self.restore_ms_n = 0
        self.restore_mib = self.restore_ms = 0.0
        self.t0: float | None = None
        self.t1: float | None = None

    def add(self, r: Any) -> None:
        """One request (a ``lifecycle.Served`` or ``Request``)."""
        self.ordered = False
        self.requests += 1
        self.outcomes[r.outcome] += 1
        ev = self.events
        if r.created:
            ev["created"] += len(r.created)
            self.create_n += len(r.created)
            for c in r.created:
                if c.size_mib is not None:
                    self.create_mib += c.size_mib
                    self.create_mib_n += 1
                if c.took_ms is not None:
                    self.create_ms += c.took_ms
                    self.create_ms_n += 1
        if r.erase_counts:
            for k, n in r.erase_counts.items():
                ev[k] += n
        c = r.restored
        if c is not None:
            ev["restored"] += 1
            self.restore_n += 1
            if c.size_mib is not None:
                self.restore_mib += c.size_mib
                self.restore_mib_n += 1
            if c.took_ms is not None:
                self.restore_ms += c.took_ms
                self.restore_ms_n += 1
        if r.forced:
            ev["forced"] += 1
        if r.cache_saved or r.cache_loaded:
            ev["cache_saved"] += r.cache_saved
            ev["cache_loaded"] += r.cache_loaded
        prompt = r.prompt_tokens
        if prompt is not None:
            self.prompts.append(prompt)
            self.prompt_tokens += prompt
        reused = r.reused or 0
        shared = r.shared_prefix
        if shared is not None and r.outcome != "cold":
            self.shared.append(shared)
            if r.shared_source != "re_entry":
                self.shared_stated += 1
            self.reusable += shared
            if shared > reused:
                self.avoidable += shared - reused
        self.reused += reused
        if r.processed is not None:
            self.processed += r.processed
            if r.prefill_ms is not None:
                self.prefill_ms += r.prefill_ms
                self.timed_tokens += r.processed
        if r.placement:
            self.placement += 1
        if r.retention:
            self.retention += 1
        if r.baseline_loss:
            self.baseline += 1
        t = r.time
        if t is not None:
            if self.t0 is None or t < self.t0:
                self.t0 = t
            if self.t1 is None or t > self.t1:
                self.t1 = t

    def merge(self, other: Figures) -> Figures:
        """Add another scope's figures into this one (a server's from its slots)."""
        for name in self._SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.outcomes, other.outcomes), (self.events, other.events)):
            for k, v in theirs.items():
                mine[k] += v
        if self.ordered and other.ordered:
            self.shared, self.prompts = _merged(self.shared, other.shared), _merged(self.prompts, other.prompts)
        else:
            self.shared.extend(other.shared)
            self.prompts.extend(other.prompts)
            self.ordered = False
        for t in (other.t0, other.t1):
            if t is not None:
                self.t0 = t if self.t0 is None else min(self.t0, t)
                self.t1 = t if self.t1 is None else max(self.t1, t)
        return self

    def to_dict(self) -> dict[str, Any]:
        # sorted once: the percentiles and both shares read it
        ordered = self.shared if self.ordered else _ordered(self.shared)
        prompts = self.prompts if self.ordered else _ordered(self.prompts)
        shared = _ranked(ordered)
        n = len(ordered)
        rate = self.timed_tokens / (self.prefill_ms / 1000) if self.prefill_ms > 0 else None
        return {
            "requests": self.requests,
            "outcomes": {o: self.outcomes.get(o, 0) for o in accel.OUTCOMES},
            "events": {k: self.events.get(k, 0) for k in EVENT_COUNT_KINDS},
            "forced_vs_restored": [self.outcomes.get("forced", 0), self.outcomes.get("restored", 0)],
            "shared_prefix": shared | {
                "stated_by_log": self.shared_stated,
                "share_under_512": _ratio(bisect.bisect_left(ordered, accel.BASELINE_TOKENS), n),
                "share_4096_or_more": _ratio(n - bisect.bisect_left(ordered, LARGE_SHARED), n),
            },
            "prompt_tokens": _ranked(prompts) | {"sum": self.prompt_tokens},
            "reusable_tokens": self.reusable,
            "reusable_share": _ratio(self.reusable, self.prompt_tokens),
            "reused_tokens": self.reused,
            "processed_tokens": self.processed,
            "prefill_ms": round(self.prefill_ms, 3),
            "prefill_tokens_per_s": round(rate, 3) if rate else None,
            "avoidable_tokens": self.avoidable,
            "avoidable_prefill_s": round(self.avoidable / rate, 3) if rate else None,
            "failures": {"placement": self.placement, "retention": self.retention, "baseline_loss": self.baseline},
            "checkpoint_cost": {
                "created": self.create_n,
                "created_mib_each": _mean(self.create_mib, self.create_mib_n),
                "created_ms_each": _mean(self.create_ms, self.create_ms_n),
                "restored": self.restore_n,
                "restored_mib_each": _mean(self.restore_mib, self.restore_mib_n),
                "restored_ms_each": _mean(self.restore_ms, self.restore_ms_n),
                "creations_per_request": _ratio(self.create_n, self.requests),
            },
            "time_span_s": [self.t0, self.t1],
        }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 6) if b else None


def _mean(total: float, n: int) -> float | None:
    return round(total / n, 6) if n else None
