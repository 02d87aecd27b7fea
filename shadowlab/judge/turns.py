"""One cell's turns, judged from its own records: meta.json and engine.log (verdicts.py adds
what needs the other cells).

    judge_cell(run, meta, patterns) -> CellVerdict

Where each number comes from
----------------------------
- divergence point: longest common prefix of this turn's prompt token ids with the slot's cached
  tokens (the previous turn's prompt ids + its completion ids), from the records alone — exact and
  engine-independent; only a lower bound (noted) when the previous completion came back without
  token ids (ik_llama.cpp) and the new prompt holds all of the previous prompt.
- re-entry point: the log's ``restored ... n_past`` (or ``pos_max + 1`` for forks without it),
  else the turn's first ``cached n_tokens = N, memory_seq_rm`` line, else the API timings.
- reused / processed: from the API (``timings.cache_n`` / ``prompt_n``) AND from the log (restore
  or cache trim; ``prompt eval time`` tokens). They are cross-checked; a disagreement is listed in
  ``TurnVerdict.disagreements`` and the API figures are kept.
- checkpoints alive at turn start: every ``created`` event of earlier turns of the cell replayed
  against every erase (``erased invalidated``, ``erasing old``, ``too close``, ``superseding``).
- engines without a log family (``none``: OpenAI-compatible servers) get reuse from the API only;
  ``CellVerdict.reuse_source`` says ``api`` and every log-derived field is None.

Outcome of a turn (first rule that applies): ``error`` (HTTP error, timeout, no completion);
``cold`` (turn 0 of a fresh process); ``restored`` (a ``restored context checkpoint`` line);
``forced`` (the forcing line); ``extended`` (tokens reused without either line); ``silent_reset``
(nothing reused and no forcing line; a note says so when the prompt did share tokens). Without a
log, a partial match with nothing reused counts as ``forced`` and partial reuse below the cached
length as ``restored``, both with a note "API only".

Checks that catch a broken engine: ``cascade_missed`` (checkpoints alive at turn start with
``pos_max`` above the re-entry point that no erase line removed — llama.cpp erases every
``pos_max > pos_next``; ``cascade_checked`` says whether the turn could be judged at all), and
``disagreements`` (API vs log figures, a restore that re-enters beyond the tokens its checkpoint
covers). Figures no engine can truthfully report (reused more than the prompt, a negative
prefill time, reuse on the first turn of a fresh process, a re-entry above the divergence point,
...) go to ``implausible`` instead, by the rules of ``shadowlab/judge/plausibility.py``: the gate fails
such a cell as an infrastructure failure, since its engine cannot be believed.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from shadowlab.judge import attribution, plausibility
from shadowlab.logs import lifecycle
from shadowlab.results.records import common_prefix
from shadowlab.results.verdict_schema import CellVerdict, CheckpointRef, Outcome, TurnVerdict

if typing.TYPE_CHECKING:
    from shadowlab.results.rundir import RunDir

__all__ = ["STATE_REPLACED", "judge_cell", "turn_ok"]


def judge_cell(run: "RunDir", meta: Any, patterns: dict) -> CellVerdict:
    cell = meta.cell or {}
    engine = cell.get("engine") or (meta.engine.name if meta.engine else "?")
    family = meta.engine.log_family if meta.engine else "none"
    has_log = run.has_log(meta.cell_id)
    extra, problems = patterns.get(engine, ((), ()))
    parsed = run.parse_log(meta.cell_id, family, extra) if family != "none" else None
    engine_prompts = run.prompts.get(engine, {})
    cell_notes: list[str] = []
    marks = None
    if parsed is not None and _concurrent(meta):  # the launch lines tie task-less lines to tasks
        marks = attribution.markers(run.layout.engine_log(meta.cell_id))
    turns = _turn_verdicts(meta, parsed, engine_prompts, cell_notes, marks)
    spans = [tuple(t.log_offsets) for t in meta.turns if t.log_offsets and len(t.log_offsets) == 2]
    unattributed = 0
    # a cell's log is one process by construction: its start-up line is no event of its turns
    counts = {k: n for k, n in parsed.counts.items() if k != lifecycle.STARTED} if parsed else {}
    if parsed is not None:
        unattributed = sum(1 for e in parsed.events
                           if e.kind != lifecycle.STARTED and not any(a <= e.offset < b for a, b in spans))
    return CellVerdict(
        cell_id=meta.cell_id,
        kind=str(cell.get("kind", "warm")),
        engine=engine,
        configuration=str(cell.get("configuration", "")),
        sequence=str(cell.get("sequence") or ""),
        status=getattr(meta.status, "value", str(meta.status)),
        reason=meta.reason,
        log_family=family,
        reuse_source="api+log" if parsed is not None else "api",
        turns=tuple(turns),
        unknown_lines=parsed.unknown_count if parsed else 0,
        unknown_samples=tuple(f"{n}: {t}" for n, t in parsed.unknown_samples) if parsed else (),
        event_counts=counts,
        unattributed_events=unattributed,
        notes=tuple(problems)
        + (() if family == "none" or has_log else ("engine.log is missing",))
        + tuple(cell_notes),
    )


def _ref(ev: Any, turn: int | None) -> CheckpointRef:
    return CheckpointRef(
        pos_min=ev.pos_min,
        pos_max=ev.pos_max,
        n_tokens=ev.n_tokens,
        size_mib=ev.size_mib,
        took_ms=ev.took_ms,
        created_turn=turn,
        task=ev.task,
        line=ev.line,
    )


def _slot_cache_for_turn(
    events: list[Any], cache: list[int] | None, saved: dict[int | None, list[int] | None], placed: set[int]
) -> tuple[list[int] | None, tuple[str, ...]]:
    """The slot's tokens when this turn's restore decision is made: the records' cache, unless
    the RAM prompt cache swapped in a saved entry (its tokens: the cache when it was saved).
    ``placed``: offsets of saves of another slot (cleared after them), already in ``saved``."""
    notes: tuple[str, ...] = ()
    for ev in events:
        if ev.kind == "cache_saved":
            if ev.offset not in placed:
                saved[ev.n_tokens] = cache
        elif ev.kind == "cache_loaded":
            if ev.n_tokens in saved and saved[ev.n_tokens] is not None:
                cache = saved.pop(ev.n_tokens)
                notes += (f"the prompt cache loaded a saved entry of {ev.n_tokens} tokens into the slot",)
            else:
                cache = None
                notes += ("the prompt cache loaded an entry this run's records do not hold: divergence unknown",)
    return cache, notes


def turn_ok(t: Any) -> bool:
    return t.error is None and t.completion is not None and (t.http_status is None or 200 <= t.http_status < 300)


def _concurrent(meta: Any) -> bool:
    """The turns were sent concurrently and tied to their tasks (records' `log_attribution`)."""
    return any(getattr(t, "log_attribution", "span") == "task" for t in meta.turns)


def _task_owner(meta: Any) -> dict[int, int]:
    """Task id -> the turn tied to it (records' `task_ids`)."""
    return {task: t.index for t in meta.turns for task in (t.task_ids or ())}


def _assign_events(meta: Any, parsed: Any, notes: list[str] | None = None,
                   marks: Any = None) -> list[tuple[Any, int | None]]:
    """Every event with the turn it belongs to: lifecycle.attribute_by_span on the turns' spans;
    for turns sent concurrently attribution.assign by task (``marks``: the log's launch lines)."""
    if marks is not None:
        return attribution.assign(parsed.events, marks, _task_owner(meta))
    spans = [lifecycle.TurnSpan(t.index, *(t.log_offsets if t.log_offsets and len(t.log_offsets) == 2
                                           else (None, None)), tuple(t.task_ids or ()))
             for t in meta.turns]
    return lifecycle.attribute_by_span(parsed.events, spans, notes)


def _turn_verdicts(
    meta: Any, parsed: Any, engine_prompts: dict[str, list[int]], cell_notes: list[str] | None = None,
    marks: Any = None,
) -> list[TurnVerdict]:
    """Per-turn verdicts of one cell. The checkpoint rings are lifecycle.Replay.turns' (the one
    replay); what needs the records is kept here per slot: the tokens each slot holds (prompt +
    completion of its last turn) and the prompt-cache entries' tokens. With several slots a turn
    may land on another slot than the previous turn."""
    assigned = _assign_events(meta, parsed, cell_notes, marks) if parsed is not None else []
    intruded, unknown_from = _loads_into_busy_slots(meta, parsed, marks, cell_notes)
    order, rank = _processing_order(meta, assigned)
    starts = {t.index: t.log_offsets[0] if t.log_offsets else None for t in order}
    states = {s.index: s for s in lifecycle.Replay.turns(assigned, [t.index for t in order], starts)}
    caches: dict[int | None, list[int] | None] = {}  # tokens each slot holds (records); None: unknown
    # Slots whose last completion came back as text without token ids (ik_llama.cpp's /completion):
    # the cache is known only up to the end of that prompt.
    open_tail: dict[int | None, bool] = {}
    saved_tokens: dict[int | None, list[int] | None] = {}  # prompt-cache entries: n_tokens -> tokens
    placed: set[int] = set()  # offsets of the saves that a clear gave to the slot it emptied
    concurrent = _concurrent(meta)
    out = []
    for t in order:
        state = states[t.index]
        slot, mine = state.slot, list(state.events)
        for step in state.applied:  # what the replay did to the slots, as the records see it
            if step.owned_save:  # an idle slot's save: that slot's tokens
                saved_tokens[step.event.n_tokens] = caches.get(step.slot)
                placed.add(step.event.offset)
            elif step.event.kind == lifecycle.CLEARED and step.slot in caches:
                caches[step.slot] = []  # emptied by the server; a slot no turn used stays fresh
        start = t.log_offsets[0] if t.log_offsets else min((ev.offset for ev in mine), default=None)
        alive = tuple(_ref(c, turn) for c, turn in state.alive)
        erased_by_turn = [(kind, _ref(c, turn)) for kind, c, turn in state.erased if hasattr(c, "pos_max")]
        fresh = rank[t.index] == 0 or (parsed is not None and slot not in caches)
        cache = [] if fresh else caches.get(slot)
        turn_cache, cache_note = _slot_cache_for_turn(mine, cache, saved_tokens, placed)
        prompt_ids = t.prompt_token_ids if t.prompt_token_ids is not None else engine_prompts.get(t.prompt_id)
        tail_unknown = not fresh and turn_cache is cache and open_tail.get(slot, False)
        tv = _judge_turn(t, mine, alive, erased_by_turn, turn_cache, prompt_ids, parsed is not None, fresh, tail_unknown,
                         from_entry=turn_cache is not cache, processing_rank=rank[t.index] if concurrent else None)
        since = unknown_from.get(slot)
        if t.index in intruded or (since is not None and start is not None and since[0] < start):
            # Its slot's state was replaced while a task ran on it: the ring is unknown from then.
            why = intruded.get(t.index) or [f"slot {slot}'s checkpoints are unknown since line {since[1]} "
                                            "(a prompt-cache load into it while it was busy): cascade not judged"]
            tv = dataclasses.replace(tv, cascade_checked=False, cascade_missed=(), notes=tv.notes + tuple(why))
        extra_notes = state.notes + cache_note
        if fresh and rank[t.index] > 0:
            extra_notes += (f"ran on slot {slot}, which no earlier turn of this cell used",)
        if extra_notes:
            tv = dataclasses.replace(tv, notes=tv.notes + extra_notes)
        out.append(tv)
        # What the slot holds afterwards: this prompt and its completion; unknown after a failure.
        caches[slot] = list(prompt_ids) + list(t.completion.tokens or []) if turn_ok(t) and prompt_ids is not None else None
        open_tail[slot] = turn_ok(t) and bool(t.completion.text) and not t.completion.tokens
    return sorted(out, key=lambda tv: tv.index)


STATE_REPLACED = "that task's state was replaced under it"  # ends a turn note; triage reads it


def _loads_into_busy_slots(meta: Any, parsed: Any, marks: Any, cell_notes: list[str] | None
                           ) -> tuple[dict[int, list[str]], dict[int, tuple[int, int]]]:
    """(turn -> why its slot's state is unknown, slot -> (offset, line) of the first such load):
    the prompt cache loaded another prompt into the slot while a task ran there
    (attribution.loads_into_busy_slots). Outputs are still compared with cold; the cascade of a
    turn on that slot from then on cannot be judged from a ring replaced under a running task."""
    if parsed is None or marks is None:
        return {}, {}

    owner = _task_owner(meta)
    out: dict[int, list[str]] = {}
    since: dict[int, tuple[int, int]] = {}
    for ev, slot, task in attribution.loads_into_busy_slots(parsed.events, marks):
        since.setdefault(slot, (ev.offset, ev.line))
        turn = owner.get(task)
        text = (f"line {ev.line}: the prompt cache loaded a saved prompt of {ev.n_tokens} tokens into slot "
                f"{slot} while it was processing task {task}"
                + ("" if turn is None else f" (turn {turn})") + ": " + STATE_REPLACED)
        if turn is not None:
            out.setdefault(turn, []).append(text)
        if cell_notes is not None and len(cell_notes) < 20:
            cell_notes.append(text)
    return out, since


def _processing_order(meta: Any, assigned: list[tuple[Any, int | None]]) -> tuple[list[Any], dict[int, int]]:
    """The turns in the order the engine served them, and each one's place in it. Sent one after
    another that is their order; sent concurrently (`log_attribution: task`), the order of their
    tasks' first lines in the log (attribution.processing_order)."""

    turns = list(meta.turns)
    if not _concurrent(meta):
        return turns, {t.index: k for k, t in enumerate(turns)}
    first: dict[int, int | None] = {t.index: None for t in turns}
    for ev, turn in assigned:
        if turn in first and (first[turn] is None or ev.offset < first[turn]):
            first[turn] = ev.offset
    by_index = {t.index: t for t in turns}
    order = [by_index[i] for i in attribution.processing_order(first, [t.index for t in turns])]
    return order, {t.index: k for k, t in enumerate(order)}


def _judge_turn(
    t: Any,
    events: list[Any],
    alive: tuple[CheckpointRef, ...],
    erased_by_turn: list[tuple[str, CheckpointRef]],
    cache: list[int] | None,
    prompt_ids: list[int] | None,
    has_log: bool,
    fresh: bool,
    tail_unknown: bool = False,
    from_entry: bool = False,
    processing_rank: int | None = None,
) -> TurnVerdict:
    prompt_len = len(prompt_ids) if prompt_ids is not None else t.prompt_tokens
    if fresh:
        divergence: int | None = 0
    else:
        divergence = common_prefix(cache, prompt_ids) if cache is not None and prompt_ids is not None else None

    by_kind: dict[str, list[Any]] = {}
    for ev in events:
        by_kind.setdefault(ev.kind, []).append(ev)
    restored_ev = by_kind.get("restored", [None])[0]
    forced = "forced" in by_kind
    evals = by_kind.get("prompt_eval", [])
    created = tuple(_ref(ev, t.index) for ev in by_kind.get("created", []))

    re_entry, source, reused_log, disagreements = _log_reuse(restored_ev, by_kind.get("cache_trim", [None])[0], forced)
    processed_log = evals[-1].n_tokens if evals else None
    reused_api, processed_api = t.reused_tokens, t.processed_tokens
    if re_entry is None and reused_api is not None:
        re_entry, source = reused_api, "timings"
    disagreements += _cross_check(reused_api, processed_api, reused_log, processed_log)
    # The previous completion's token ids are unknown and this prompt holds all of the previous
    # prompt: the slot LCP may run on into the completion, so `divergence` is only a lower bound.
    lower_bound = tail_unknown and divergence is not None and cache is not None and divergence == len(cache)
    # The cache is a prompt-cache entry the log names only by its length: a re-entry above the
    # divergence from it is the engine loading another prefix's state (a wrong-entry bug that the
    # identity check judges), not a figure no engine could report.
    entry_mismatch = from_entry and divergence is not None and re_entry is not None and re_entry > divergence
    reused = reused_api if reused_api is not None else reused_log
    processed = processed_api if processed_api is not None else processed_log

    outcome, notes = _outcome(t, fresh, restored_ev is not None, forced, reused, divergence, cache, has_log)
    if len(evals) > 1:
        notes.append(f"{len(evals)} `prompt eval time` lines in the turn; the last one is used")
    if t.log_complete is False and has_log:
        notes.append("the turn's `prompt eval time` line was not seen before its log span closed")
    if not has_log:
        notes.append("reuse from the API only: this engine has no parsable log")
    if lower_bound:
        notes.append(
            f"divergence point {divergence} is a lower bound: the engine returned the previous completion "
            "without token ids, and this prompt holds all of the previous prompt"
        )
    if entry_mismatch:
        notes.append(
            f"divergence point {divergence} is a lower bound: it is measured against the prompt-cache entry the "
            f"log names by its length, and the engine re-entered at {re_entry}: it loaded another prefix's state"
        )
        lower_bound = True
    if divergence is None and not fresh:
        notes.append("divergence point unknown: no prompt token ids recorded (chat turn) or the slot's cache is unknown")

    # Usable for a restore: covers no token at or past the divergence point, and leaves at least
    # one prompt token to evaluate.
    usable_limit = None if divergence is None else min(divergence, (prompt_len or 1) - 1)
    below = tuple(c for c in alive if usable_limit is not None and c.n_tokens <= usable_limit)
    above = tuple(c for c in alive if usable_limit is not None and c.n_tokens > usable_limit)
    missed: tuple[CheckpointRef, ...] = ()
    cascade_checked = has_log and re_entry is not None and not fresh and outcome is not Outcome.ERROR
    if cascade_checked and re_entry is not None:
        missed = lifecycle.cascade_missed(alive, (c for _, c in erased_by_turn), re_entry)
    restored_ref = _ref(restored_ev, None) if restored_ev is not None else None
    verdict = TurnVerdict(
        index=t.index,
        prompt_id=t.prompt_id,
        outcome=outcome,
        conversation=t.conversation,
        prompt_tokens=prompt_len,
        cached_tokens=len(cache) if cache is not None else None,
        divergence_point=divergence,
        divergence_lower_bound=lower_bound,
        re_entry_point=re_entry,
        re_entry_source=source,
        reused_tokens=reused,
        processed_tokens=processed,
        reused_api=reused_api,
        processed_api=processed_api,
        reused_log=reused_log,
        processed_log=processed_log,
        disagreements=tuple(disagreements),
        saved_fraction=reused / prompt_len if reused is not None and prompt_len else None,
        prefill_ms=t.prefill_ms if t.prefill_ms is not None else (evals[-1].ms if evals else None),
        forcing_line=forced,
        restored=restored_ref,
        restore_ms=restored_ref.took_ms if restored_ref else None,
        restore_mib=restored_ref.size_mib if restored_ref else None,
        alive_at_start=alive,
        alive_below_divergence=below,
        alive_above_divergence=above,
        created=created,
        erased_cascade=tuple(ref for kind, ref in erased_by_turn if kind == "erased_invalidated"),
        erased_other=tuple(ref for kind, ref in erased_by_turn if kind != "erased_invalidated"),
        cascade_missed=missed,
        cascade_checked=cascade_checked,
        create_ms=_sum_known(c.took_ms for c in created),
        create_mib=_sum_known(c.size_mib for c in created),
        task_ids=tuple(t.task_ids or ()),
        log_complete=t.log_complete if has_log else None,
        error=t.error or (None if turn_ok(t) else f"HTTP {t.http_status}"),
        notes=tuple(notes),
        processing_rank=processing_rank,
    )
    return dataclasses.replace(verdict, implausible=plausibility.turn_problems(verdict, t.timings))


def _log_reuse(restored_ev: Any, trim: Any, forced: bool) -> tuple[int | None, str | None, int | None, list[str]]:
    """(re-entry point, its source, tokens reused per the log, conflicts) from the turn's lines.
    The first `cached n_tokens` line of a task is the re-entry (later ones follow the batches)."""
    disagreements: list[str] = []
    re_entry = lifecycle.re_entry_point(restored_ev, trim.n_past if trim is not None else None, forced)
    if restored_ev is not None:
        if restored_ev.n_past is not None and restored_ev.n_past > restored_ev.n_tokens:
            disagreements.append(
                f"restore re-entered at n_past = {restored_ev.n_past} but the checkpoint covers only "
                f"n_tokens = {restored_ev.n_tokens}: {restored_ev.n_past - restored_ev.n_tokens} token(s) never processed"
            )
        if trim is not None and trim.n_past != re_entry:
            disagreements.append(f"restore says re-entry {re_entry}, cache trim says {trim.n_past}")
        return re_entry, "restore", trim.n_past if trim is not None else re_entry, disagreements
    if trim is not None:
        return re_entry, "cache_trim", trim.n_past, disagreements
    if forced:
        return re_entry, "forced", 0, disagreements
    return None, None, None, disagreements


def _cross_check(
    reused_api: int | None, processed_api: int | None, reused_log: int | None, processed_log: int | None,
) -> list[str]:
    out = []
    if reused_api is not None and reused_log is not None and reused_api != reused_log:
        out.append(f"reused: API says {reused_api}, log says {reused_log}")
    if processed_api is not None and processed_log is not None and processed_api != processed_log:
        out.append(f"processed: API says {processed_api}, log says {processed_log}")
    return out  # reused + processed != prompt is no disagreement but impossible: plausibility.py


def _outcome(
    t: Any, fresh: bool, restored: bool, forced: bool, reused: int | None, divergence: int | None,
    cache: list[int] | None, has_log: bool,
) -> tuple[Outcome, list[str]]:
    """The turn's outcome (rules in the module docstring) and the notes that qualify it."""
    if not turn_ok(t):
        return Outcome.ERROR, []
    if fresh:
        return Outcome.COLD, []
    if restored:
        return Outcome.RESTORED, []
    if forced:
        return Outcome.FORCED, []
    if reused is not None and reused > 0:
        if not has_log and cache is not None and divergence is not None and divergence < len(cache) - 1:
            return Outcome.RESTORED, ["no engine log: partial reuse below the cached length is counted as a restore (API only)"]
        return Outcome.EXTENDED, []
    if divergence == 0:
        return Outcome.SILENT_RESET, []
    if divergence is None:
        return Outcome.SILENT_RESET, ["nothing reused; with the divergence point unknown this may be a forced reset"]
    if not has_log:
        return Outcome.FORCED, ["no engine log: a partial match with nothing reused is counted as forced (API only)"]
    return Outcome.SILENT_RESET, [
        f"prompt shares {divergence} tokens with the cache but nothing was reused and no forcing line was logged"
    ]


def _sum_known(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None
