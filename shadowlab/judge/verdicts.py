"""Per-turn verdicts: a pure function of a run directory.

    compute(run) -> RunVerdict     run: a rundir.RunDir (a path is loaded first); writes verdicts.json

The run directory is read by rundir.py only; the checkpoint replay (ring, re-entry, cascade,
attribution of events to turns) is lifecycle.py's, shared with `shadowlab logs`; the JSON form is
records.py's codec.

Everything the report and the gate show comes from the dataclasses below, serialised whole into
``verdicts.json`` (``RunVerdict.to_dict()`` / ``RunVerdict.from_dict()``), so no later stage
re-derives a number differently.

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
import re
import typing
from pathlib import Path
from typing import Any

from shadowlab.judge import attribution, identity, plausibility  # attribution: where split controls are planned
from shadowlab.logs import lifecycle
from shadowlab.results import records
from shadowlab.results.records import common_prefix
from shadowlab.results.verdict_schema import (  # the verdict schema, re-exported where callers find it
    VERDICTS, VERDICTS_SCHEMA_VERSION, CellVerdict, CheckpointRef, IdentityCheck, IdentityStatus, Outcome,
    RunVerdict, TriageVerdict, TurnVerdict)

if typing.TYPE_CHECKING:
    from shadowlab.results.rundir import RunDir


def loaded(data: dict[str, Any], *, source: str = records.RunLayout.VERDICTS) -> RunVerdict:
    """A verdicts.json object as the judge reads it: upgraded (RunVerdict.from_dict) and re-judged
    by the plausibility rules, whatever its version."""
    return _judge_plausibility(RunVerdict.from_dict(data, source=source))


def _judge_plausibility(run: "RunVerdict") -> "RunVerdict":
    """The plausibility rules applied again to every turn read from a verdicts.json, whatever its
    version: the file is derived and may have been edited, so what it says is impossible is kept
    and what its figures show to be impossible is added (the raw-timings rule needs the records)."""
    cells = []
    for cell in run.cells:
        turns = tuple(dataclasses.replace(t, implausible=tuple(dict.fromkeys(
            (*t.implausible, *plausibility.turn_problems(t))))) for t in cell.turns)
        cells.append(dataclasses.replace(cell, turns=turns))
    return dataclasses.replace(run, cells=tuple(cells), schema_version=VERDICTS_SCHEMA_VERSION)


# ---------------------------------------------------------------- compute


def compute(run: "RunDir | str | Path", *, write: bool = True) -> RunVerdict:
    """The verdicts of a loaded run directory (a path is loaded first, matrix optional); writes
    verdicts.json unless ``write`` is false."""
    from shadowlab.results import rundir

    if not isinstance(run, rundir.RunDir):
        run = rundir.load(run, need_matrix=False)
    patterns = _extra_patterns(run)
    cells = [_cell_verdict(run, meta, patterns) for meta in run.metas.values()]
    cells, controls, noisy = _attach_identity(cells, run.metas)
    cells = _attach_triage(cells, run)
    cells = [_with_ideals(c, run) for c in cells]
    verdict = RunVerdict(
        run_id=run.run_id,
        cells=tuple(cells),
        controls=tuple(controls),
        nondeterministic_engines=tuple(sorted(noisy)),
    )
    if write:
        with records.storage_errors(records.DERIVED_WRITE_HINT):  # a full disk: exit 3, naming the file
            records.write_json_atomic(run.layout.verdicts, verdict.to_dict())
    return verdict


def cell_verdict(run: "RunDir", cell_id: str) -> CellVerdict:
    """One cell's verdict from its records, as `compute` judges it (without the identity
    comparison, which needs the other cells): what `simulate RUN/cells/CELL` checks."""
    return _with_ideals(_cell_verdict(run, run.metas[cell_id], _extra_patterns(run)), run)


def _with_ideals(cell: CellVerdict, run: "RunDir") -> CellVerdict:
    """A warm traffic cell's turns get their ideals (traffic.ideals over the sequence's requests:
    the longest prefix shared with any earlier request, and with the conversation's previous one)."""
    sequences = getattr(run.matrix, "sequences", None) or {}
    seq = sequences.get(cell.sequence) if cell.kind == "warm" else None
    requests = getattr(seq, "requests", None)
    if not requests:
        return cell
    from shadowlab import traffic

    ideal = list(traffic.ideals(requests))
    turns = tuple(_floored(t, *ideal[t.index]) if t.index < len(ideal) else t for t in cell.turns)
    return dataclasses.replace(cell, turns=turns)


def _floored(turn: TurnVerdict, computed: int, consecutive: int) -> TurnVerdict:
    """The turn with its ideals, never below what the engine reused (docs/DESIGN.md §10).

    The requests give the prefix a prompt shares with earlier prompts; an engine may reuse more
    (its own completion run on into the next prompt, a chat template's tokens the trace does not
    hold), so the computed figure is then only a lower bound: the ideal is raised to the reuse and
    the turn says so. A reuse beyond the prompt is impossible (plausibility judges it) and raises
    nothing."""
    reused, prompt = turn.reused_tokens, turn.prompt_tokens
    if reused is None or prompt is None or not computed < reused <= prompt:
        return dataclasses.replace(turn, ideal_tokens=computed, consecutive_ideal_tokens=consecutive)
    note = (f"ideal raised to the {reused:,} tokens the engine reused: the requests share only {computed:,} "
            f"with earlier ones, so that computed ideal {IDEAL_LOWER_BOUND}")
    return dataclasses.replace(turn, ideal_tokens=reused, consecutive_ideal_tokens=consecutive,
                               notes=(*turn.notes, note))


IDEAL_LOWER_BOUND = "was a lower bound (the engine's output or template)"


def traffic_summary(cell: CellVerdict) -> tuple[int, int, int, float | None]:
    """(prompt tokens, ideal, reused, recovered share = reused / ideal) over a cell's turns."""
    turns = [t for t in cell.turns if t.ideal_tokens is not None]
    prompt = sum(t.prompt_tokens or 0 for t in turns)
    ideal = sum(t.ideal_tokens or 0 for t in turns)
    reused = sum(min(t.reused_tokens or 0, t.ideal_tokens or 0) for t in turns)
    return prompt, ideal, reused, (reused / ideal if ideal else None)


def read(run_dir: str | Path) -> RunVerdict:
    """verdicts.json of a run directory (bounded read, RunDirError when it is not an object)."""
    from shadowlab.results import rundir

    return loaded(rundir.read_saved_verdicts(run_dir), source=str(records.RunLayout(Path(run_dir)).verdicts))


def _extra_patterns(run: "RunDir") -> dict[str, tuple[tuple[Any, ...], tuple[str, ...]]]:
    """{engine: (ExtraPatterns, problems)} from the matrix's `engines.<name>.log_patterns`.
    A pattern names its event kind with a group, e.g. ``(?P<restored>)``; one that does not is
    reported on every cell of its engine, not fatal."""
    from shadowlab.logs import parse as logparse

    out: dict[str, tuple[Any, ...]] = {}
    for name in (run.matrix.engines if run.matrix is not None else {}):
        usable, problems = [], []
        for text in run.log_patterns(name):
            try:
                usable.append(logparse.ExtraPattern.from_regex(str(text)))
            except (ValueError, re.error) as exc:
                problems.append(f"log pattern not used: {exc}")
        if usable or problems:
            out[name] = (tuple(usable), tuple(problems))
    return out


# ---------------------------------------------------------------- one cell


def _cell_verdict(run: "RunDir", meta: Any, patterns: dict) -> CellVerdict:
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
        from shadowlab.judge import attribution

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


def _turn_ok(t: Any) -> bool:
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
        from shadowlab.judge import attribution

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
        caches[slot] = list(prompt_ids) + list(t.completion.tokens or []) if _turn_ok(t) and prompt_ids is not None else None
        open_tail[slot] = _turn_ok(t) and bool(t.completion.text) and not t.completion.tokens
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
    from shadowlab.judge import attribution

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
    from shadowlab.judge import attribution

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
        error=t.error or (None if _turn_ok(t) else f"HTTP {t.http_status}"),
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
    if not _turn_ok(t):
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


# ---------------------------------------------------------------- identity


def _attach_identity(
    cells: list[CellVerdict], metas: dict[str, Any]
) -> tuple[list[CellVerdict], list[IdentityCheck], set[str]]:

    controls: list[IdentityCheck] = []
    noisy: set[str] = set()
    noisy_groups: dict[tuple[str, str], str] = {}
    by_id = {c.cell_id: c for c in cells}

    # Cold-vs-cold controls first: they decide whether warm mismatches are conclusive.
    for c in cells:
        if c.kind != "control":
            continue
        meta = metas[c.cell_id]
        ref_id = (meta.cell or {}).get("control_of")
        check = _compare_turn(meta, 0, metas.get(ref_id) if ref_id else None, ref_id, None, identity, control=True)
        controls.append(check)
        by_id[c.cell_id] = dataclasses.replace(c, control=check)
        if check.status is IdentityStatus.MISMATCH:
            noisy.add(c.engine)
            noisy_groups[(c.engine, c.configuration)] = c.cell_id

    out = []
    for c in cells:
        c = by_id[c.cell_id]
        if c.kind != "warm":
            out.append(c)
            continue
        meta = metas[c.cell_id]
        planned = {pt.get("index"): pt for pt in (meta.cell or {}).get("turns", []) if isinstance(pt, dict)}
        turns = []
        for tv in c.turns:
            plan_turn = planned.get(tv.index) or {}
            if tv.index == 0 and not plan_turn.get("cold_cell"):
                turns.append(tv)
                continue
            ref_id = plan_turn.get("cold_cell")
            check = _compare_turn(meta, tv.index, metas.get(ref_id) if ref_id else None, ref_id, tv.reused_tokens,
                                  identity, ref_index=plan_turn.get("cold_turn", 0))
            if (c.engine, c.configuration) in noisy_groups:
                check = identity.mark_inconclusive(check, noisy_groups[(c.engine, c.configuration)])
            turns.append(dataclasses.replace(tv, identity=check))
        out.append(dataclasses.replace(c, turns=tuple(turns)))
    return out, controls, noisy


def _compare_turn(
    meta: Any, index: int, ref_meta: Any, ref_id: str | None, reused: int | None, identity: Any, control: bool = False,
    ref_index: int = 0,
) -> IdentityCheck:
    turn = next((t for t in meta.turns if t.index == index), None)
    if ref_id is None:
        return identity.missing_reference(reused, "the plan names no cold cell for this turn")
    if ref_meta is None:
        return identity.missing_reference(reused, f"cold cell {ref_id} has no record (not run)")
    ref_turn = next((t for t in ref_meta.turns if t.index == ref_index), None)
    if turn is None or not _turn_ok(turn):
        why = turn.error if turn is not None and turn.error else "the turn failed"
        return identity.failed(reused, ref_id, f"no output to compare: {why}")
    if ref_turn is None or not _turn_ok(ref_turn):
        why = ref_turn.error if ref_turn is not None and ref_turn.error else "it failed"
        return identity.failed(reused, ref_id, f"cold cell {ref_id} has no output: {why}")
    if turn.prompt_sha256 and ref_turn.prompt_sha256 and turn.prompt_sha256 != ref_turn.prompt_sha256:
        return identity.failed(reused, ref_id, f"cold cell {ref_id} ran a different prompt (sha256 differs)")
    if ref_index and ref_turn.reused_tokens:  # a replayed reference must not have reused cache
        return identity.failed(reused, ref_id, f"reference turn {ref_index} of {ref_id} reused "
                                               f"{ref_turn.reused_tokens} tokens: it is no cold reference")
    if control:
        return identity.compare_control(
            turn.completion.text,
            turn.completion.tokens,
            ref_turn.completion.text,
            ref_turn.completion.tokens,
            reference_cell=ref_id,
        )
    return identity.compare(
        turn.completion.text,
        turn.completion.tokens,
        ref_turn.completion.text,
        ref_turn.completion.tokens,
        reused_tokens=reused,
        reference_cell=ref_id,
        reference_turn=ref_index,
    )


# ---------------------------------------------------------------- triage (issue 16)


def _attach_triage(cells: list[CellVerdict], run: "RunDir") -> list[CellVerdict]:
    """Why each warm mismatch differs from cold (DESIGN §5): its split control, the cold-vs-cold
    control of its engine and configuration, or the reason a split control is missing."""
    controls = {(c.engine, c.configuration): c.control for c in cells if c.kind == "control" and c.control}
    out = []
    for c in cells:
        if c.kind != "warm" or not any(_mismatch(t) for t in c.turns):
            out.append(c)
            continue
        meta = run.metas[c.cell_id]
        family = meta.engine.log_family if meta.engine else "none"
        parsed = run.parse_log(c.cell_id, family, ()) if family != "none" and run.has_log(c.cell_id) else None
        events = parsed.events if parsed is not None else ()
        turns = tuple(dataclasses.replace(t, triage=_triage_turn(c, t, meta, events, run.metas,
                                                                 controls.get((c.engine, c.configuration))))
                      if _mismatch(t) else t for t in c.turns)
        out.append(dataclasses.replace(c, turns=turns))
    return out


def _mismatch(turn: TurnVerdict) -> bool:
    return turn.identity is not None and turn.identity.status is IdentityStatus.MISMATCH


def _triage_turn(cell: CellVerdict, turn: TurnVerdict, meta: Any, events: Any, metas: Any,
                 control: IdentityCheck | None) -> TriageVerdict:
    check = turn.identity
    warm_record = next((t for t in meta.turns if t.index == turn.index), None)
    cold_record = _reference_record(metas.get(check.reference_cell), warm_record)
    warm = identity.Output(check.text or "", check.tokens, _logprobs(warm_record))
    cold = identity.Output(check.reference_text or "", check.reference_tokens, _logprobs(cold_record))
    split_id = attribution.cell_id(cell.cell_id, turn.index)
    split_meta = metas.get(split_id)
    split_out, why = None, ""
    # The control's output is its last turn (llama-server's: the last request of its sequence).
    record = max(split_meta.turns, key=lambda t: t.index, default=None) if split_meta else None
    if record is not None and _turn_ok(record):
        split_out = identity.Output(record.completion.text, record.completion.tokens, _logprobs(record))
    elif split_meta is not None:
        why = f"split control {split_id} did not run ({split_meta.reason or split_meta.status.value})"
    else:
        planned = next((pt for pt in (meta.cell or {}).get("turns", []) if pt.get("index") == turn.index), {})
        schedule = attribution.turn_schedule(meta, events, turn.index)
        why = (attribution.no_control_reason(meta, schedule, planned.get("endpoint", "completion"))
               or f"split control {split_id} has no record (not run)")
    pair = None
    if control is not None and control.status in (IdentityStatus.IDENTICAL, IdentityStatus.MISMATCH):
        pair = (identity.Output(control.reference_text or "", control.reference_tokens),
                identity.Output(control.text or "", control.tokens))
    t = identity.triage(warm, cold, split_out, no_split_control=why, control_pair=pair)
    if t is None:  # cannot happen for a MISMATCH check; kept total for a hand-made record
        return TriageVerdict("undetermined", "warm equals cold on re-comparison")
    detail = t.detail
    replaced = next((n for n in turn.notes if n.endswith(STATE_REPLACED)), None)
    if replaced is not None and t.cls.value == "undetermined":
        # The log shows the slot's state swapped while the turn ran: the evidence split controls
        # and cold controls would only approach.
        return TriageVerdict("corrupted_state", f"warm differs from cold at {identity.describe(t.warm_vs_cold)}; "
                             f"{replaced}", None, identity.describe(t.warm_vs_cold), None,
                             identity.describe(t.cold_vs_control))
    if t.cls.value == "undetermined":
        detail += _missing_evidence(warm, cold, pair)
    return TriageVerdict(t.cls.value, detail, split_id if split_out is not None else None,
                         identity.describe(t.warm_vs_cold), identity.describe(t.warm_vs_split),
                         identity.describe(t.cold_vs_control))


def _reference_record(reference: Any, warm: Any) -> Any:
    """The reference cell's turn that computed the warm turn's prompt (same prompt sha256)."""
    if reference is None or warm is None:
        return None
    return next((t for t in reference.turns if t.prompt_sha256 == warm.prompt_sha256), None)


def _logprobs(record: Any) -> tuple[tuple[tuple[int, float], ...], ...] | None:
    """A turn record's top logprobs as identity.Output takes them (None: not recorded)."""
    top = record.completion.top_logprobs if record is not None and record.completion is not None else None
    return None if top is None else tuple(tuple((c.id, c.logprob) for c in per_token) for per_token in top)


def _missing_evidence(warm: Any, cold: Any, control_pair: Any) -> str:
    """What a live run would add to an undetermined mismatch (said, so nobody guesses)."""
    missing = []
    if warm.tokens is None or cold.tokens is None:
        missing.append("the completion token ids (this record holds text only)")
    if control_pair is None:
        missing.append("a cold-vs-cold control (run-to-run noise)")
    if warm.top_logprobs is None or cold.top_logprobs is None:
        missing.append("the top logprobs where the outputs part (generation.n_probs)")
    return f"; a live run would add {' and '.join(missing)}" if missing else ""


def judge(run: Any, *, write: bool = False) -> RunVerdict:
    """A loaded run's verdict: recomputed from the cell records when they are there, else read
    from its verdicts.json (a run directory reduced to its records). Gate and compare both ask
    this, so a verdict is derived the same way wherever it is needed."""
    from shadowlab.errors import RunDirError

    if run.has_cells:
        return compute(run, write=write)
    if run.saved_verdicts is not None:
        source = str(run.layout.verdicts)
        try:
            return loaded(dict(run.saved_verdicts), source=source)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RunDirError(f"verdicts.json cannot be read: {type(exc).__name__}: {exc}", path=source) from None
    if run.planned:
        # Planned, yet not one cell left a record (e.g. the engine could not be prepared):
        # every planned cell is then judged "never ran", an infrastructure failure.
        return RunVerdict(run_id=run.run_id)
    raise RunDirError("no cells/ and no verdicts.json: nothing to judge", path=str(run.root),
                      hint="did `shadowlab run` finish writing this directory?")
