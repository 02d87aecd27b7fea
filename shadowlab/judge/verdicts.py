"""Per-turn verdicts: a pure function of a run directory.

    compute(run) -> RunVerdict     run: a rundir.RunDir (a path is loaded first); writes verdicts.json

The run directory is read by rundir.py only; one cell's turns are judged in turns.py (over the
checkpoint replay of lifecycle.py, shared with `shadowlab logs`); this module adds what needs the
other cells (identity against the cold references, triage with the split controls) and the
traffic ideals. The JSON form is the codec's (results/verdict_schema.py).

Everything the report and the gate show comes from the dataclasses below, serialised whole into
``verdicts.json`` (``RunVerdict.to_dict()`` / ``RunVerdict.from_dict()``), so no later stage
re-derives a number differently.

How each number of a turn is found, and a turn's outcome: shadowlab/judge/turns.py.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

from shadowlab.judge import attribution, identity, plausibility, turns  # attribution: where split controls are planned
from shadowlab.results import records
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
    cells = [turns.judge_cell(run, meta, patterns) for meta in run.metas.values()]
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
    return _with_ideals(turns.judge_cell(run, run.metas[cell_id], _extra_patterns(run)), run)


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
    if turn is None or not turns.turn_ok(turn):
        why = turn.error if turn is not None and turn.error else "the turn failed"
        return identity.failed(reused, ref_id, f"no output to compare: {why}")
    if ref_turn is None or not turns.turn_ok(ref_turn):
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
    if record is not None and turns.turn_ok(record):
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
    replaced = next((n for n in turn.notes if n.endswith(turns.STATE_REPLACED)), None)
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


__all__ = ["IDEAL_LOWER_BOUND", "VERDICTS", "VERDICTS_SCHEMA_VERSION", "CellVerdict", "CheckpointRef", "IdentityCheck",
           "IdentityStatus", "Outcome", "RunVerdict", "TriageVerdict", "TurnVerdict", "cell_verdict", "compute",
           "judge", "loaded", "read", "traffic_summary"]
