"""The batch schedule of a restored turn, and whether a split control can reproduce it (issue 16).

A warm turn's prompt went through the engine in two parts: the prefix as the *earlier* request
computed it (its `-ub` batches, broken again at each checkpoint that request placed) up to the
re-entry point, then the suffix as the warm turn computed it (broken at its own checkpoints).
`warm_schedule` rebuilds that list of breaks from the log's `created` / `restored` events; the
reference engine takes it as `split_points` (docs/DESIGN.md §1), so its split control is exact.

llama-server takes no split points, but a fresh process can be sent requests. b11434's server
(`tools/server/server-context.cpp`) fills each prompt batch with up to `-b` tokens from where the
request starts computing, and breaks it early only where it will place a checkpoint (L−4−ub and
L−4, user-message starts); every such break starts a batch that logs `created context
checkpoint`, so the created lines *are* the breaks. `llama_decode` then cuts each batch into
`-ub` ubatches from its start. With checkpoints off (`--ctx-checkpoints 0`) a request breaks
nowhere early, and a request that extends the slot's cached prompt exactly is plain KV reuse
(the recurrent state already sits at the end: no restore). So `request_sequence` sends one
request per break — the earlier request's breaks below the re-entry point, the re-entry point,
the warm turn's own breaks — each `n_predict` 1, then the prompt: every batch, hence every
ubatch, is the warm turn's. (With checkpoints on no sequence can: each request would break 4
tokens before its own end.) Where the log does not show that schedule, the reason is the
answer ("undetermined"), never a guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shadowlab_engine.checkpoints import batch_ends

from shadowlab.logs.parse import Event
from shadowlab.results import records

__all__ = ["BATCHING_FAMILY", "DEFAULT_BATCH", "DEFAULT_UBATCH", "Schedule", "batch_sizes", "cell_id",
           "no_control_reason", "request_sequence", "turn_schedule", "unknown_prefix", "warm_schedule"]

DEFAULT_BATCH, DEFAULT_UBATCH = 2048, 512  # llama-server's and the reference engine's -b / -ub
_FLAGS = {"-b": "b", "--batch-size": "b", "-ub": "ub", "--ubatch-size": "ub"}


@dataclass(frozen=True)
class Schedule:
    """Where a warm turn's prompt broke into batches (`split_points`, each < prompt length)."""

    split_points: tuple[int, ...]
    re_entry: int
    prefix_breaks: tuple[int, ...]  # the earlier request's checkpoint breaks (its placement)
    n_prefix: int  # the earlier request's prompt length
    n_prompt: int
    suffix_breaks: tuple[int, ...] = ()  # the warm task's own checkpoint breaks above re_entry
    # Cache the earlier request itself reused (None: not reported): its batches from 0 are then
    # not in its log lines.
    prefix_reused: int | None = 0


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
    own = tuple(sorted(b for b in _breaks(events, warm_task, n_prompt) if b > re_entry))
    return Schedule(points, re_entry, tuple(sorted(prefix_breaks - {n_prefix})), n_prefix, n_prompt, own)


def unknown_prefix(schedule: Schedule) -> str:
    """Why the warm schedule's prefix is not known ("" when it is): the earlier request reused
    cache itself, so it did not compute [0, re-entry) and its lines do not say who did."""
    if schedule.prefix_reused == 0:
        return ""
    reused = "an unreported number of" if schedule.prefix_reused is None else str(schedule.prefix_reused)
    return (f"the warm turn re-entered at {schedule.re_entry}, in a checkpoint of an earlier "
            f"{schedule.n_prefix}-token request that itself reused {reused} cached tokens, so how "
            "that prefix was batched from 0 is not in its log lines: no split control reproduces "
            "the warm batch schedule known to be exact")


# The log family whose batching the docstring above describes (read from b11434's server).
BATCHING_FAMILY = "llama.cpp"


def request_sequence(schedule: Schedule, family: str) -> tuple[tuple[int, ...] | None, str]:
    """(prompt lengths to send in order to a fresh llama-server started with `--ctx-checkpoints
    0`, the last the whole prompt; "") when that reproduces the warm schedule, else (None, why
    not). Each length but the last is sent with `n_predict` 1 (its sampled token is not decoded)
    and must reuse exactly the one before it (the runner checks the answer's `cache_n`)."""
    r = schedule.re_entry
    if unknown_prefix(schedule):
        return None, unknown_prefix(schedule)
    if family != BATCHING_FAMILY:
        return None, (
            f"the warm turn re-entered at {r}; a request sequence reproduces a schedule only with "
            f"checkpoints off, one request per batch break, which follows from upstream {BATCHING_FAMILY}'s "
            f"prompt batching (b11434) and is not known for the {family} family: no request "
            "sequence reproduces the warm batch schedule known to be exact")
    breaks = {b for b in schedule.prefix_breaks if b < r} | {r} | set(schedule.suffix_breaks)
    return (*sorted(b for b in breaks if 0 < b < schedule.n_prompt), schedule.n_prompt), ""


# ---------------------------------------------------------------- a warm cell's split controls


def cell_id(warm_id: str, index: int) -> str:
    return f"{warm_id}.split.{index}"


def batch_sizes(command: Sequence[str]) -> tuple[int, int]:
    """(-b, -ub) as the engine was started (the last occurrence wins, as in llama-server)."""
    found = {"b": DEFAULT_BATCH, "ub": DEFAULT_UBATCH}
    for flag, value in zip(command, command[1:]):
        if flag in _FLAGS and value.isdigit():
            found[_FLAGS[flag]] = int(value)
    return found["b"], found["ub"]


def turn_schedule(meta: records.CellMeta, events: Sequence[Event], index: int) -> Schedule | None:
    """The batch schedule of warm turn `index`, None when it restored nothing. The prefix is the
    earlier turn whose task created the restored checkpoint (else the previous turn), computed
    from 0 as that turn logged it; `prefix_reused` says when it was not (`unknown_prefix`)."""
    turns = {t.index: t for t in meta.turns}
    warm, earlier = turns.get(index), turns.get(index - 1)
    if warm is None or earlier is None or not warm.task_ids or not earlier.task_ids:
        return None
    warm_task = warm.task_ids[-1]
    restored = [e for e in events if e.kind == "restored" and e.task == warm_task]
    if not restored:
        return None
    creators = {e.task for e in events if e.kind == "created" and e.n_tokens == restored[-1].n_tokens}
    prefix = next((turns[j] for j in range(index - 1, -1, -1)
                   if j in turns and turns[j].task_ids and turns[j].task_ids[-1] in creators), earlier)
    if prefix.prompt_tokens is None or warm.prompt_tokens is None:
        return None
    _, n_ubatch = batch_sizes(meta.command)
    schedule = warm_schedule(events, prefix.task_ids[-1], warm_task, prefix.prompt_tokens,
                                    warm.prompt_tokens, n_ubatch)
    # A fresh process's first turn computed from 0 whatever it reported; a later one may not have.
    reused = 0 if prefix.index == 0 else prefix.reused_tokens
    return dataclasses.replace(schedule, prefix_reused=reused) if schedule is not None and reused != 0 else schedule


def no_control_reason(meta: records.CellMeta, schedule: Schedule | None, endpoint: str) -> str:
    """Why this restored turn cannot have a split control; "" when it can (the reference engine
    with its split points, llama-server with a request sequence)."""
    if schedule is None:
        return "the warm turn's log shows no restore to replay (or no task ids / prompt lengths)"
    if endpoint != "completion":
        return ("a chat turn is rendered and tokenized by the engine, so neither split points nor a "
                "request sequence of token prefixes reproduces its batches")
    kind = meta.engine.kind if meta.engine else "?"
    if kind == "reference":
        return unknown_prefix(schedule)
    if kind != "llama-server":
        return f"a {kind} engine takes no split points and its batch placement is unknown"
    _, why = request_sequence(schedule, meta.engine.log_family)
    return why
