"""One pass over a traffic: its shape and ideals, and every policy's figures, request by request.

A traffic is read once, as a stream (`traffic.stream`): each request is handed to the shape's
tally (the ideals, computed once per run whatever the number of policies) and to each policy's
tally, which serves it on that policy's model of the request's server (`model._Sim`, one per
server: a trace of several servers is simulated per server and the figures summed). What stays
in memory is the working set: per policy and server its slots, checkpoints, prompt-cache and
retention entries; per server the ideals' table (every distinct prefix: what a perfect cache
holds); a few integers per request for the percentiles, and per-turn lists only when they are
asked for (`per_turn`: `--json`, `--out`).

A policy's figures come in two parts so that a sweep can compute them apart (`sweep.py`): what
the policy did (`PolicyTally.partial`, from its own pass) and what the traffic allows (`ShapeRun.
result`, from the pass that computes the ideals); `policy_doc` joins them, the same way for a
policy simulated in this process, in another, or on another machine.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from shadowlab import traffic
from shadowlab.simulate.model import OUTCOMES, TURN_CLASSES, Policy, Turn, _Sim
from shadowlab.traffic import Request


class Classes:
    """Each request's turn class (`model.turn_class`) as the traffic streams: the request before it
    is the previous request of its server."""

    def __init__(self) -> None:
        self._prev: dict[str | None, str | None] = {}
        self._seen: set[str | None] = set()

    def of(self, r: Request) -> str:
        seen, prev = r.server in self._seen, self._prev.get(r.server)
        self._seen.add(r.server)
        self._prev[r.server] = r.conversation
        if r.conversation is None:
            return "interloper"
        return "after_own_turn" if seen and prev == r.conversation else "after_other_request"


class ShapeRun:
    """The traffic's side of every policy's figures: its realised shape, each request's ideals
    (`traffic.ShapeTally`), and per turn class the turns and the consecutive-turn ideal."""

    def __init__(self, per_turn: bool) -> None:
        self.tally = traffic.ShapeTally()
        self.classes = {c: [0, 0] for c in TURN_CLASSES}  # turns, consecutive ideal
        self.perfect = array("q") if per_turn else None
        self.consecutive = array("q") if per_turn else None

    def add(self, index: int, r: Request, cls: str) -> None:
        ideal, consecutive = self.tally.add(r, index)
        row = self.classes[cls]
        row[0] += 1
        row[1] += consecutive
        if self.perfect is not None and self.consecutive is not None:
            self.perfect.append(ideal)
            self.consecutive.append(consecutive)

    def result(self) -> dict[str, Any]:
        return {"shape": self.tally.result(), "raised": self.tally.raised,
                "classes": {c: list(v) for c, v in self.classes.items()},
                "ideal": None if self.perfect is None or self.consecutive is None
                else {"perfect": self.perfect.tolist(), "consecutive": self.consecutive.tolist()}}


class PolicyTally:
    """One policy's running figures over a traffic (the sums `policy_doc` reports)."""

    def __init__(self, policy: Policy, prefill_tps: float, per_turn: bool,
                 turns: Sequence[Turn] | None = None) -> None:
        self.policy, self.tps = policy, prefill_tps
        self._sims: dict[str | None, _Sim] = {}
        self._given = turns  # a run cell's schedule: the turns were served by model.simulate
        self.n = self.prompt = self.processed = self.reused = self.created = self.restores = self.erased = 0
        self.refused = self.refused_tokens = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.loaded = {"cram": 0, "retention": 0}
        self.class_reused = dict.fromkeys(TURN_CLASSES, 0)
        self.late: list[int] = []
        self._busy_until: dict[str | None, float] = {}
        self.said, self.equal, self.first_difference = False, 0, None
        self.per_turn = {k: array("q") for k in ("reused", "outcome", "slot", "created")} if per_turn else None

    def serve(self, index: int, r: Request) -> Turn:
        if self._given is not None:
            return self._given[index]
        sim = self._sims.get(r.server)
        if sim is None:
            sim = self._sims[r.server] = _Sim(self.policy)
        return sim.serve(index, r)

    def add(self, index: int, r: Request, t: Turn, cls: str) -> None:
        self.n += 1
        self.prompt += t.prompt_tokens
        self.processed += t.processed
        self.reused += t.reused
        self.created += t.created
        self.restores += t.restored
        self.erased += t.erased
        self.outcomes[t.outcome] += 1
        if t.outcome == "refused":
            self.refused += 1
            self.refused_tokens += t.prompt_tokens
        if t.loaded:
            self.loaded[t.loaded] += 1
        self.class_reused[cls] += t.reused
        self._timing(index, r, t)
        self._versus_said(index, r.reported_reuse, t.reused)
        if self.per_turn is not None:
            for key, value in (("reused", t.reused), ("outcome", OUTCOMES.index(t.outcome)),
                               ("slot", t.slot), ("created", t.created)):
                self.per_turn[key].append(value)

    def _timing(self, index: int, r: Request, t: Turn) -> None:
        """Requests that would arrive while an earlier one is still prefilling (estimated at
        `prefill_tps`) on a server with several slots: which slot is free, and how llama.cpp
        splits its shared batch, then depends on timing, which a sequential model does not know."""
        if self.policy.slots < 2:
            return  # one slot: requests queue in arrival order, as modelled
        busy_until = self._busy_until.get(r.server, -math.inf)
        if r.time < busy_until:
            self.late.append(index)
        self._busy_until[r.server] = max(busy_until, r.time) + t.processed / self.tps

    def _versus_said(self, index: int, said: int | None, reused: int) -> None:
        """Turn by turn against what the engine said it reused (a request it said nothing of counts
        as a difference, as a run's turn without timings does)."""
        self.said = self.said or said is not None
        if said == reused:
            self.equal += 1
        elif self.first_difference is None:
            self.first_difference = {"turn": index, "measured": said, "predicted": reused}

    def partial(self) -> dict[str, Any]:
        """What the policy did, JSON-able (a sweep's worker sends it back as it is)."""
        return {"policy": self.policy.name, "parameters": dataclasses.asdict(self.policy), "n": self.n,
                "prompt": self.prompt, "processed": self.processed, "reused": self.reused,
                "created": self.created, "restores": self.restores, "erased": self.erased,
                "refused": self.refused, "refused_tokens": self.refused_tokens, "outcomes": dict(self.outcomes),
                "loaded": dict(self.loaded), "class_reused": dict(self.class_reused), "late": list(self.late),
                "versus": None if not self.said else {"equal_turns": self.equal, "turns": self.n,
                                                      "first_difference": self.first_difference},
                "per_turn": None if self.per_turn is None else {k: v.tolist() for k, v in self.per_turn.items()}}


def policy_doc(part: dict[str, Any], traffic_side: dict[str, Any], prefill_tps: float,
               versus_key: str = "versus_reported") -> dict[str, Any]:
    """One policy's figures (the `policies[]` entry of simulate.json) from what it did and what
    the traffic allows. `versus_key`: what the engine's own reuse is called (a run cell's)."""
    p = part["parameters"]
    n, reused = part["n"], part["reused"]
    ideal_sum = traffic_side["shape"]["ideal_tokens"]
    consecutive = traffic_side["shape"]["consecutive_ideal_tokens"]
    classes = {}
    for c in TURN_CLASSES:
        turns, ideal_c = traffic_side["classes"][c]
        got = part["class_reused"][c]
        classes[c] = {"turns": turns, "reused_tokens": got, "consecutive_ideal_tokens": ideal_c,
                      "share_of_consecutive_ideal": got / ideal_c if ideal_c else None}
    doc: dict[str, Any] = {
        "policy": part["policy"],
        "parameters": p,
        "requests": n,
        "prompt_tokens": part["prompt"],
        "processed_tokens": part["processed"],
        "reused_tokens": reused,
        "ideal_tokens": ideal_sum,
        "consecutive_ideal_tokens": consecutive,
        "share_of_ideal": reused / ideal_sum if ideal_sum else None,
        "share_of_consecutive_ideal": reused / consecutive if consecutive else None,
        "outcomes": part["outcomes"],
        "forced": part["outcomes"]["forced"],
        "silent": part["outcomes"]["silent_reset"],
        "restored": part["outcomes"]["restored"],
        "loaded_entries": part["loaded"],
        "checkpoints_created": part["created"],
        "checkpoints_erased": part["erased"],
        "creations_per_turn": part["created"] / n if n else None,
        "checkpoint_mib_per_turn": part["created"] * p["checkpoint_mib"] / n if n else None,
        "checkpoint_ms_per_turn": (part["created"] * p["create_ms"] + part["restores"] * p["restore_ms"]) / n
        if n else None,
        "prefill_s": part["processed"] / prefill_tps,
        "avoidable_prefill_s": (ideal_sum - reused) / prefill_tps if ideal_sum >= reused else 0.0,
        "timing_dependent_turns": part["late"],
        "by_turn_class": classes,
    }
    if part["versus"] is not None:
        doc[versus_key] = part["versus"]
    if part["per_turn"] is not None:
        t = part["per_turn"]
        doc["turns"] = {"reused": t["reused"], "outcome": [OUTCOMES[o] for o in t["outcome"]],
                        "slot": t["slot"], "created": t["created"]}
    # Prompts of n_ctx tokens or more: refused as the engine refuses them (model._Sim.serve).
    doc["refused"] = {"requests": part["refused"], "prompt_tokens": part["refused_tokens"], "n_ctx": p["n_ctx"]}
    return doc


def versus(first: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The case study's weighing of `other` against `first` (the first policy listed): prefill
    saved per turn against checkpoint time spent per turn, both at the policy's stated costs."""
    n = other["requests"]
    saved = (first["prefill_s"] - other["prefill_s"]) * 1000.0 / n if n else 0.0
    spent = (other["checkpoint_ms_per_turn"] or 0.0) - (first["checkpoint_ms_per_turn"] or 0.0)
    return {"policy": first["policy"], "prefill_ms_saved_per_turn": saved,
            "checkpoint_ms_more_per_turn": spent, "net_ms_per_turn": saved - spent,
            "creations_more_per_turn": (other["creations_per_turn"] or 0.0) - (first["creations_per_turn"] or 0.0)}


def one_pass(requests: Iterable[Request], tallies: Sequence[PolicyTally], shape: ShapeRun | None) -> None:
    """Every request, in order, through the shape's tally (when given) and each policy's."""
    classes = Classes()
    for index, r in enumerate(requests):
        cls = classes.of(r)
        if shape is not None:
            shape.add(index, r, cls)
        for t in tallies:
            t.add(index, r, t.serve(index, r), cls)
