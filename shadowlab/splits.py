"""The batch schedule of a restored turn, and whether a split control can reproduce it (issue 16).

A warm turn's prompt went through the engine in two parts: the prefix as the *earlier* request
computed it (its `-ub` batches, broken again at each checkpoint that request placed) up to the
re-entry point, then the suffix as the warm turn computed it (broken at its own checkpoints).
`warm_schedule` rebuilds that list of breaks from the log's `created` / `restored` events; the
reference engine takes it as `split_points` (docs/DESIGN.md §1), so its split control is exact.

llama-server takes no split points: a fresh process can only be sent requests, and each request
places its own checkpoints (so its own breaks) near its end. `request_sequence` says whether
"send prompt[:r], then the prompt" reproduces the schedule, by the placement the earlier
request itself logged; when it does not, the reason is the answer ("undetermined"), never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shadowlab_engine.checkpoints import batch_ends

from .logparse import Event

__all__ = ["Schedule", "request_sequence", "warm_schedule"]


@dataclass(frozen=True)
class Schedule:
    """Where a warm turn's prompt broke into batches (`split_points`, each < prompt length)."""

    split_points: tuple[int, ...]
    re_entry: int
    prefix_breaks: tuple[int, ...]  # the earlier request's checkpoint breaks (its placement)
    n_prefix: int  # the earlier request's prompt length
    n_prompt: int


def _breaks(events: Iterable[Event], task: int, below: int) -> set[int]:
    return {e.n_tokens for e in events if e.kind == "created" and e.task == task and 0 < e.n_tokens < below}


def warm_schedule(
    events: Sequence[Event], prefix_task: int, warm_task: int, n_prefix: int, n_prompt: int, n_ubatch: int
) -> Schedule | None:
    """The warm turn's batch breaks; None when the warm task logged no restore (nothing to
    replay: it re-entered at 0 or extended the cache)."""
    restored = [e for e in events if e.kind == "restored" and e.task == warm_task]
    if not restored:
        return None
    last = restored[-1]
    re_entry = last.n_past if getattr(last, "n_past", None) is not None else last.n_tokens
    prefix_breaks = _breaks(events, prefix_task, n_prefix) | {n_prefix}
    prefix = [e for e in batch_ends(0, prefix_breaks | {re_entry}, n_ubatch) if e <= re_entry]
    suffix = batch_ends(re_entry, _breaks(events, warm_task, n_prompt) | {n_prompt}, n_ubatch)
    points = tuple(p for p in (*prefix, *suffix) if p < n_prompt)
    return Schedule(points, re_entry, tuple(sorted(prefix_breaks - {n_prefix})), n_prefix, n_prompt)


def request_sequence(schedule: Schedule, n_batch: int, n_ubatch: int) -> tuple[tuple[int, ...] | None, str]:
    """(prompt lengths to send in order in a fresh llama-server, "") when that reproduces the
    warm schedule, else (None, why not). A request of n tokens is assumed to break where the
    earlier request broke relative to its own end (its tail checkpoints) and at multiples of
    `-b` it broke at: the placement the log shows, nothing assumed beyond it. The first request
    must generate nothing (`n_predict` 0), so the second one extends its cache exactly."""
    r, n = schedule.re_entry, schedule.n_prefix
    tail = {n - b for b in schedule.prefix_breaks if b % n_batch}
    at_batch = {b for b in schedule.prefix_breaks if b % n_batch == 0}
    own = {r - o for o in tail if 0 < r - o} | {b for b in at_batch if b < r}
    first = tuple(batch_ends(0, own | {r}, n_ubatch))
    warm = tuple(p for p in schedule.split_points if p <= r)
    if first == warm:
        return (r, schedule.n_prompt), ""
    extra = sorted(set(first) - set(warm))
    missing = sorted(set(warm) - set(first))
    return None, (
        f"the warm turn re-entered at {r} (a checkpoint the earlier {n}-token request placed "
        f"{n - r} tokens before its end); a first request of {r} tokens would place its own "
        f"breaks ({', '.join(map(str, extra)) or 'none extra'}"
        + (f"; lacks {', '.join(map(str, missing))}" if missing else "")
        + "), so no request sequence reproduces the warm batch schedule without split points"
    )
