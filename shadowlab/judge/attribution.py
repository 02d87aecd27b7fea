"""Tie requests sent concurrently to the llama.cpp tasks that served them (DESIGN §2, `in_flight`).

Sent one after another, a turn's log lines are the bytes between its request and the next one.
Sent concurrently, the lines of several requests interleave, and nothing in an answer names the
task that produced it (llama-server's `/completion` body has `id_slot`, no task id). So each
turn is tied to a task by what both sides state independently:

- the log, per task id: its slot, `new prompt ... task.n_tokens` (the prompt length) and
  `prompt eval time = X ms / N tokens` (prefill time to 0.01 ms and tokens processed);
- the answer: `id_slot` (when given), the prompt length sent, `timings.prompt_n` and
  `timings.prompt_ms` (the same clock value the log line prints with `%.2f`), and `id_task` where
  the engine claims one (the reference engine): a claim, checked against the same figures.

A turn is tied when exactly one task states its figures and no other turn claims that task. Any
turn left over is not guessed at: `tie` says why, and the runner fails the cell with it. The
spans it then gives each turn partition the log by the order tasks finished, so lines without a
task id (llama-server's prompt-cache lines) go to the task that finished next after them.

Judging the run needs while it runs lives here too, so the runner parses no log: `tie_turns`
(the tie of one cell's turns, its records updated) and `plan_split_controls` (issue 16,
docs/DESIGN.md §5: which restored warm turns get a split control, and how) are the run's
judging step, `RUN_JUDGING`, which `shadowlab run` hands the run stage (`RunOptions.judging`).

A split control is a fresh process that computes a restored warm turn's prompt through the warm
turn's batch schedule (`splits.warm_schedule`), without any restore: a kind that takes split
points is sent the schedule as `split_points`; one that does not (llama-server) one request per
batch break (`splits.request_sequence`) with the kind's split-control flags (checkpoints off),
each request a turn of the cell (its last turn is the control's output). They are planned after
the warm cells, from the warm and cold records (a mismatch can only be seen then), so
`build_plan` never does: a healthy run gets none and its plan.json is unchanged. The plan is a
pure function of the records, so `--resume` plans the same cells again and keeps those that ran.
The verdicts ask the same questions (`turn_schedule`, `no_control_reason`) of the same records,
so the reason a turn has no split control is computed in one place.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shadowlab.engines import EngineAdapter, LogFamily, UnknownEngineKind, UnknownLogFamily, get_adapter, log_family
from shadowlab.judge import identity, splits
from shadowlab.logs import parse as logparse
from shadowlab.plan import Cell, CellKind, Plan, Turn
from shadowlab.results import records
from shadowlab.run.context import Judging

# llama.cpp's `launch_slot_: id N | task M | processing task` (the slot takes the task, in the
# order the server took tasks from its queue) and `release: ... | stop processing` (the slot is
# free again). The parser has no event for either (no cache state changes); a schedule needs both:
# the task's first parsed line may come later (llama-server prints `new prompt` in slot order).
MARKER_RE = re.compile(rb"id\s{0,8}(\d{1,9}) \| task (\d{1,18}) \| (processing task|stop processing)")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Claim:
    """What one turn's request and answer say about the task that served it."""

    index: int
    prompt_tokens: int | None
    processed: int | None  # timings.prompt_n
    prefill_ms: float | None  # timings.prompt_ms
    slot: int | None = None  # id_slot, when the answer names one
    task: int | None = None  # id_task, when the answer claims one


@dataclass(frozen=True)
class Task:
    """One task id's lines in the log."""

    task: int
    slot: int | None
    first: int  # byte offset of its first line
    last: int  # byte offset of its last line
    prompt_tokens: int | None  # `new prompt ... task.n_tokens`
    processed: int | None  # the last `prompt eval time` line's tokens
    prefill_ms: float | None  # ... and its milliseconds


@dataclass(frozen=True)
class Tied:
    """Turn index -> its task, and why every other turn is not tied (empty: all were)."""

    tasks: Mapping[int, Task]
    untied: Mapping[int, str]


def tasks(events: Iterable[object]) -> dict[int, Task]:
    """Each task id's lines (logparse events; lines without a task id are skipped)."""
    seen: dict[int, dict] = {}
    for ev in events:
        task = getattr(ev, "task", None)
        if task is None:
            continue
        t = seen.setdefault(task, {"slot": None, "first": ev.offset, "last": ev.offset,
                                   "prompt_tokens": None, "processed": None, "prefill_ms": None})
        t["first"], t["last"] = min(t["first"], ev.offset), max(t["last"], ev.offset)
        if t["slot"] is None and getattr(ev, "slot", None) is not None:
            t["slot"] = ev.slot
        if ev.kind == "new_prompt" and t["prompt_tokens"] is None:
            t["prompt_tokens"] = ev.n_tokens
        elif ev.kind == "prompt_eval":
            t["processed"], t["prefill_ms"] = ev.n_tokens, ev.ms
    return {task: Task(task, **fields) for task, fields in seen.items()}


def _ms(value: float) -> str:
    return f"{value:.2f}"  # as llama.cpp's `%10.2f` prints it (both round the binary value)


def states(claim: Claim, task: Task) -> bool:
    """Whether the task's lines state every figure the turn's answer gives."""
    if claim.task is not None and claim.task != task.task:
        return False
    if task.processed is None or task.prefill_ms is None:  # the task never finished its prefill
        return False
    if claim.processed is None or claim.prefill_ms is None or claim.processed != task.processed:
        return False
    if _ms(claim.prefill_ms) != _ms(task.prefill_ms):
        return False
    if claim.slot is not None and task.slot is not None and claim.slot != task.slot:
        return False
    return task.prompt_tokens is None or claim.prompt_tokens is None or claim.prompt_tokens == task.prompt_tokens


def _figures(c: Claim) -> str:
    ms = "?" if c.prefill_ms is None else _ms(c.prefill_ms)
    slot = "" if c.slot is None else f"slot {c.slot}, "
    claim = "" if c.task is None else f", claimed task {c.task}"
    return f"{slot}{c.prompt_tokens} prompt tokens, {c.processed} processed in {ms} ms{claim}"


def tie(claims: Sequence[Claim], by_task: Mapping[int, Task]) -> Tied:
    """Each turn's task: the one task that states its figures, unclaimed by any other turn."""
    candidates = {c.index: {t for t in by_task if states(c, by_task[t])} for c in claims}
    tied: dict[int, int] = {}
    changed = True
    while changed:  # a tie removes its task from every other turn's candidates
        changed = False
        taken = set(tied.values())
        for index, found in candidates.items():
            free = found - taken
            if index not in tied and len(free) == 1:
                tied[index] = next(iter(free))
                changed = True
                taken = set(tied.values())
    untied: dict[int, str] = {}
    for c in claims:  # each task is tied once at most: a tie takes it from every other turn
        found = candidates[c.index]
        if c.index in tied:
            continue
        if not found:
            untied[c.index] = f"no task in engine.log states turn {c.index}'s figures ({_figures(c)})"
        else:
            shown = ", ".join(str(t) for t in sorted(found)[:5])
            untied[c.index] = (f"{len(found)} tasks of engine.log (task {shown}) state turn {c.index}'s "
                               f"figures ({_figures(c)}): its lines cannot be told apart")
    return Tied({i: by_task[t] for i, t in tied.items()}, untied)


def spans(tied: Mapping[int, Task], ends: Mapping[int, int], start: int) -> dict[int, tuple[int, int]]:
    """[start, end) per tied turn, partitioning the log from ``start`` by the order tasks
    finished: each span runs from the previous task's end to the end of its own last line
    (``ends``: task id -> that offset)."""
    out: dict[int, tuple[int, int]] = {}
    at = start
    for index, task in sorted(tied.items(), key=lambda kv: (ends[kv[1].task], kv[0])):
        end = max(ends[task.task], at)
        out[index] = (at, end)
        at = end
    return out


@dataclass(frozen=True)
class Markers:
    """Task id -> byte offset of its `processing task` line (the first) and of its `stop
    processing` line (the last)."""

    launched: Mapping[int, int]
    released: Mapping[int, int]
    slots: Mapping[int, int]  # task id -> the slot its launch line names


def markers(path: Path, start: int = 0, end: int | None = None) -> Markers:
    """The launch and release lines in [start, end) of the log, read a line-aligned chunk at a
    time (memory bounded whatever the log holds)."""
    launched: dict[int, int] = {}
    released: dict[int, int] = {}
    slots: dict[int, int] = {}
    with logparse.open_log(path) as fh:  # a regular file or LogSourceError, as every log path
        fh.seek(start)
        at, carry = start, b""
        while end is None or at < end:
            chunk = fh.read(CHUNK if end is None else min(CHUNK, end - at))
            if not chunk:
                break
            at += len(chunk)
            body = carry + chunk
            cut = body.rfind(b"\n") + 1
            if cut == 0 and len(body) > CHUNK:  # a line longer than a chunk holds no release line
                carry = b""
                continue
            base = at - len(body)
            for line in re.finditer(rb"[^\n]*\n", body[:cut]):
                m = MARKER_RE.search(line.group())
                if m is None:
                    continue
                task, at_line = int(m.group(2)), base + line.start()
                if m.group(3) == b"processing task":
                    if task not in launched:
                        launched[task], slots[task] = at_line, int(m.group(1))
                else:
                    released[task] = at_line
            carry = body[cut:]
    return Markers(launched, released, slots)


def assign(events: Iterable[object], marks: Markers, owner: Mapping[int, int]) -> list[tuple[object, int | None]]:
    """Every event with the turn it belongs to, for requests sent concurrently: by its task id
    (``owner``: task -> turn); a line without one (llama-server's prompt-cache lines name no
    slot) and every slot choice (`selected slot by ...`) belong to the task launched next after
    it, on its slot when it names one: the server prints them while it hands that task a slot."""
    launches = sorted((at, task) for task, at in marks.launched.items())
    out = []
    for ev in events:
        task = getattr(ev, "task", None)
        # llama.cpp prints a slot choice with the slot's task at that moment: -1 when idle, the
        # running task when a request pinned by id_slot finds it busy (and is deferred). Either
        # way the line is the choice for the task launched next on that slot.
        if task is None or ev.kind == "slot_selected":
            slot = getattr(ev, "slot", None)
            k = bisect.bisect_right(launches, (ev.offset, float("inf")))
            while k < len(launches) and slot is not None and marks.slots.get(launches[k][1]) != slot:
                k += 1
            task = launches[k][1] if k < len(launches) else None
        out.append((ev, owner.get(task) if task is not None else None))
    return out


def loads_into_busy_slots(events: Iterable[object], marks: Markers) -> list[tuple[object, int, int]]:
    """(prompt-cache load, slot, task running there) for every load into a slot that was
    processing another task. llama-server names the slot of a load only by the slot choice just
    before it (`selected slot by ...`); b11434 chooses a slot pinned by `id_slot` and updates its
    prompt cache (save, then load the best saved prompt into it) before it sees the slot is busy
    and defers the request: the running task's state is replaced under it."""
    spans: dict[int, list[tuple[int, float, int]]] = {}
    for task, at in marks.launched.items():
        end = marks.released.get(task)
        spans.setdefault(marks.slots[task], []).append((at, end if end is not None and end > at else float("inf"), task))
    out = []
    chosen: int | None = None
    for ev in events:
        if ev.kind == "slot_selected":
            chosen = ev.slot
        elif ev.kind == "cache_loaded" and chosen is not None:
            running = [task for a, b, task in spans.get(chosen, ()) if a < ev.offset < b]
            if running:
                out.append((ev, chosen, running[0]))
    return out


def schedule(tied: Mapping[int, Task], marks: Markers) -> list[tuple[str, int]]:
    """("start", turn) where each tied task began (its launch line, or its first parsed line
    if earlier: the reference engine's slot choice) and ("end", turn) at its release, in log
    order: the overlap `simulate.simulate(..., schedule=)` replays. A task never released ends
    after every line (its slot stayed busy to the end)."""
    steps = []
    for index, task in tied.items():
        begin = min(task.first, marks.launched.get(task.task, task.first))
        steps.append((begin, 0, "start", index))
        end = marks.released.get(task.task)
        steps.append((end if end is not None and end >= begin else float("inf"), 1, "end", index))
    return [(kind, index) for _, _, kind, index in sorted(steps)]


def processing_order(first_offsets: Mapping[int, int | None], indices: Iterable[int]) -> list[int]:
    """Turn indices in the order the engine started them (their first own line); turns without
    lines keep their planned place after the others."""
    known = sorted((off, i) for i, off in first_offsets.items() if off is not None)
    seen = {i for _, i in known}
    return [i for _, i in known] + [i for i in indices if i not in seen]


# ---------------------------------------------------------------- judged while the run goes


def tie_turns(log: Path, family: LogFamily, start: int, turns: Sequence[records.TurnRecord],
              claims: Mapping[int, tuple[int | None, int | None]]) -> str | None:
    """Tie one cell's turns sent concurrently (their log from byte ``start``; ``claims``: turn
    index -> the answer's (id_slot, id_task)) to their tasks, and record it in each turn: its
    task, its span (`spans`) and `log_attribution: task`. Why a turn is not tied (the first, and
    how many more), None when every one is; then no record is changed."""
    events = [ev for ev in family.parse(log).events if ev.offset >= start]
    found = [Claim(t.index, t.prompt_tokens, t.processed_tokens, t.prefill_ms, *claims.get(t.index, (None, None)))
             for t in turns]
    tied = tie(found, tasks(events))
    if tied.untied:
        first = min(tied.untied)
        more = f" ({len(tied.untied) - 1} more turns untied)" if len(tied.untied) > 1 else ""
        return f"{tied.untied[first]}{more}"
    ends = {task.task: _line_end(log, task.last) for task in tied.tasks.values()}
    by_turn = spans(tied.tasks, ends, start)
    for t in turns:
        task = tied.tasks[t.index]
        t.task_ids, t.log_offsets, t.log_complete = [task.task], list(by_turn[t.index]), True
        t.log_attribution = "task"
    return None


def _line_end(path: Path, offset: int) -> int:
    """Offset just after the line that starts at ``offset`` (bounded: at most 64 KiB on)."""
    with logparse.open_log(path) as fh:
        fh.seek(offset)
        chunk = fh.read(1 << 16)
    cut = chunk.find(b"\n")
    return offset + (cut + 1 if cut >= 0 else len(chunk))


def cell_id(warm_id: str, index: int) -> str:
    return f"{warm_id}.split.{index}"


def _adapter(kind: str) -> EngineAdapter | None:
    """The recorded kind's adapter; None for a kind this shadowlab does not know (no control)."""
    try:
        return get_adapter(kind)
    except UnknownEngineKind:
        return None


def _family(name: str) -> LogFamily | None:
    try:
        return log_family(name)
    except UnknownLogFamily:
        return None


def by_requests(kind: str) -> bool:
    """Whether a split control of this engine kind is sent as a request sequence (each request a
    turn of the cell) rather than as one request with `split_points` (`adapter.split_control`)."""
    adapter = _adapter(kind)
    return adapter is not None and adapter.split_control == "requests"


def turn_schedule(meta: records.CellMeta, events: Sequence[logparse.Event], index: int) -> splits.Schedule | None:
    """The batch schedule of warm turn `index`, None when it restored nothing. The prefix is the
    earlier turn whose task created the restored checkpoint (else the previous turn), computed
    from 0 as that turn logged it; `prefix_reused` says when it was not (`splits.unknown_prefix`)."""
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
    adapter = _adapter(meta.engine.kind) if meta.engine else None
    if adapter is None:
        return None
    _, n_ubatch = adapter.batch_sizes(meta.command)
    schedule = splits.warm_schedule(events, prefix.task_ids[-1], warm_task, prefix.prompt_tokens,
                                    warm.prompt_tokens, n_ubatch)
    # A fresh process's first turn computed from 0 whatever it reported; a later one may not have.
    reused = 0 if prefix.index == 0 else prefix.reused_tokens
    return dataclasses.replace(schedule, prefix_reused=reused) if schedule is not None and reused != 0 else schedule


def no_control_reason(meta: records.CellMeta, schedule: splits.Schedule | None, endpoint: str) -> str:
    """Why this restored turn cannot have a split control; "" when it can (the reference engine
    with its split points, llama-server with a request sequence)."""
    if schedule is None:
        return "the warm turn's log shows no restore to replay (or no task ids / prompt lengths)"
    if endpoint != "completion":
        return ("a chat turn is rendered and tokenized by the engine, so neither split points nor a "
                "request sequence of token prefixes reproduces its batches")
    kind = meta.engine.kind if meta.engine else "?"
    adapter = _adapter(kind)
    mode = adapter.split_control if adapter is not None else "none"
    if mode == "points":
        return splits.unknown_prefix(schedule)
    if mode != "requests":
        return f"a {kind} engine takes no split points and its batch placement is unknown"
    _, why = splits.request_sequence(schedule, meta.engine.log_family)
    return why


def plan_split_controls(root: Path, plan: Plan, every: bool = False) -> list[Cell]:
    """The split-control cells the finished warm cells of run directory ``root`` call for, in
    plan order: each restored warm turn whose output differs from cold (``every``: each restored
    warm turn, the matrix's `identity.split_controls: all`)."""
    layout = records.RunLayout(root)
    out: list[Cell] = []
    for cell in plan.of_kind(CellKind.WARM):
        meta = _ok_meta(layout, cell.id)
        family = _family(meta.engine.log_family) if meta is not None and meta.engine is not None else None
        if meta is None or meta.engine is None or family is None or not family.read:
            continue
        log = layout.engine_log(cell.id)
        events = family.parse(log).events if log.is_file() else ()
        for turn in cell.turns[1:]:
            if turn.cold_cell is None or turn.reference != "cold":
                continue  # traffic replays are compared turn by turn elsewhere; no schedule here
            schedule = turn_schedule(meta, events, turn.index)
            if schedule is None or no_control_reason(meta, schedule, turn.endpoint):
                continue
            if every or _mismatches(layout, meta, turn):
                out.append(_control_cell(cell, turn, schedule, meta.engine))
    return out


def _control_cell(warm: Cell, turn: Turn, schedule: splits.Schedule, engine: records.EngineRecord) -> Cell:
    """A kind taking split points (`split_control: points`): one turn with the schedule as split
    points. One sent a request sequence (`requests`): a turn per request, turn k sending the
    prompt's first `split_points[-1]` tokens (the lengths so far; the last turn's ends at the
    prompt's length), so each request is recorded and judged as a turn. The warm cell's engine
    flags, env and generation go with it, and the kind's own split-control flags."""
    delimiters = turn.message_delimiters
    turns: tuple[Turn, ...] = (Turn(0, turn.prompt_id, turn.endpoint, split_points=schedule.split_points,
                                    message_delimiters=delimiters),)
    adapter = _adapter(engine.kind)
    flags = (*warm.flags, *(adapter.split_control_flags() if adapter is not None else ()))
    if by_requests(engine.kind):
        lengths, _ = splits.request_sequence(schedule, engine.log_family)
        turns = tuple(Turn(k, turn.prompt_id, turn.endpoint, split_points=tuple((lengths or ())[:k + 1]),
                           message_delimiters=delimiters) for k in range(len(lengths or ())))
    return dataclasses.replace(warm, id=cell_id(warm.id, turn.index), kind=CellKind.SPLIT_CONTROL, turns=turns,
                               flags=flags, env=dict(warm.env), depends_on=None, control_of=warm.id, in_flight=1)


def _ok_meta(layout: records.RunLayout, cid: str) -> records.CellMeta | None:
    try:
        meta = records.read_meta(layout.meta(cid))
    except (OSError, ValueError, TypeError, records.RunDirError):
        return None
    return meta if meta.status is records.CellStatus.OK else None


def _mismatches(layout: records.RunLayout, meta: records.CellMeta, turn: Turn) -> bool:
    cold = _ok_meta(layout, turn.cold_cell or "")
    warm = next((t for t in meta.turns if t.index == turn.index), None)
    ref = next((t for t in cold.turns if t.index == turn.cold_turn), None) if cold else None
    if warm is None or ref is None or warm.completion is None or ref.completion is None:
        return False
    check = identity.compare(warm.completion.text, warm.completion.tokens, ref.completion.text,
                             ref.completion.tokens, reused_tokens=warm.reused_tokens)
    return check.status is identity.IdentityStatus.MISMATCH


RUN_JUDGING = Judging(tie_turns=tie_turns, split_controls=plan_split_controls)

__all__ = ["RUN_JUDGING", "Claim", "Task", "Tied", "Markers", "assign", "by_requests", "cell_id", "loads_into_busy_slots",
           "markers", "no_control_reason", "plan_split_controls", "processing_order", "schedule", "spans", "states",
           "tasks", "tie", "tie_turns", "turn_schedule"]
