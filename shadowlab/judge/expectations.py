"""Checks: the matrix's declared expectations, and the default rules, judged against verdicts.

    evaluate(matrix, run) -> tuple[CheckResult, ...]      every check of a run, in a stable order

Two families of checks come out of here, both as `CheckResult`:

- **declared** — each `expectations[i]` entry of the matrix, expanded over the warm cells its
  selection matches and the turn(s) it names: `outcome`, `min_reused`, `min_saved_fraction`,
  `max_forced`, `checkpoints_created_at`, `identity`, `cascade`.
- **default** — rules every run must satisfy whatever the matrix says:
  `ran` (each planned cell ran to the end; otherwise an infrastructure failure),
  `plausible` (no figure of the cell is impossible — shadowlab/judge/plausibility.py; otherwise the
  engine cannot be believed: an infrastructure failure, and the cell's declared checks are
  not judged),
  `answered` (each turn got an answer), `identity` (with `identity.required`, the default: a
  warm turn that reused cache must equal its cold run byte for byte; any mismatch fails),
  `control` (the cold-vs-cold control matched: otherwise every identity result of that engine
  and configuration is inconclusive, which fails), and `cascade` (the engine erased every
  checkpoint above the re-entry point; one it kept is stale state waiting to be restored).

`identity` and `cascade` are both: a default rule, and a key an expectation may declare. Declared
`true`, the check is explicit for the turns selected (its own result, with the expectation's
source and description, and stricter: a turn whose comparison or cascade could not be judged
fails instead of passing quietly); declared `false`, the default rule skips those turns. Both
come from the same verdict fields (`TurnVerdict.identity`; `cascade_missed`, `cascade_checked`).

A check's `status` is PASS, FAIL, INCONCLUSIVE (fails the gate: the evidence cannot be trusted)
or ERROR (the thing to check never ran: an infrastructure failure). The gate maps these to exit
codes; the report lists them. Nothing here reads files: it is a pure function of the loaded
matrix and the `RunVerdict`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from shadowlab.judge import plausibility
from shadowlab.present import pct
from shadowlab.matrix import Expectation, Matrix
from shadowlab.judge.verdicts import (CellVerdict, IdentityCheck, IdentityStatus, Outcome, RunVerdict, TurnVerdict,
                                traffic_summary)

WARM = "warm"
CONTROL = "control"
CELL_OK = "ok"
CASCADE_EXPECTED = "no stale checkpoint kept"
POSSIBLE = "every figure possible"


class CheckStatus(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # counts as a failure: the comparison itself is not trustworthy
    ERROR = "error"  # the subject never ran (infrastructure): decided separately by the gate

    @property
    def failed(self) -> bool:
        return self is not CheckStatus.PASS


@dataclass(frozen=True)
class CheckResult:
    """One verdict of one check on one subject (a cell, or a turn of a cell)."""

    check: str  # "outcome", "min_reused", ..., "identity", "cascade", "control", "ran", "answered"
    status: CheckStatus
    subject: str  # readable: "reference.policy0.A-C turn 1 (C)"
    expected: str
    actual: str
    message: str  # one sentence a reviewer can act on
    source: str  # "default" or "expectation 5 (matrix.yaml line 142)"
    cell_id: str | None = None
    turn: int | None = None
    description: str = ""  # the expectation's own `description`, when it has one

    @property
    def passed(self) -> bool:
        return self.status is CheckStatus.PASS

    def to_dict(self) -> dict[str, object]:
        return {
            "check": self.check, "status": self.status.value, "subject": self.subject,
            "expected": self.expected, "actual": self.actual, "message": self.message,
            "source": self.source, "cell_id": self.cell_id, "turn": self.turn,
            "description": self.description,
        }


def evaluate(matrix: Matrix, run: RunVerdict, planned: Sequence[str] = ()) -> tuple[CheckResult, ...]:
    """Every check of the run: default rules first, then the matrix's expectations in order.

    `planned` lists the cell ids of plan.json; a planned cell with no verdict never ran.
    """
    results: list[CheckResult] = []
    results += ran_checks(run, planned)
    results += plausible_checks(run)
    results += answered_checks(run)
    if matrix.identity.required:
        results += identity_checks(run, _waived(matrix, run, "identity"))
    results += control_checks(run)
    results += cascade_checks(run, _waived(matrix, run, "cascade"))
    recorded = {c.cell_id for c in run.cells}
    incomplete = any(cell_id not in recorded for cell_id in planned)
    for number, expectation in enumerate(matrix.expectations, start=1):
        results += evaluate_expectation(expectation, number, run, incomplete=incomplete)
    return tuple(_with_triage(results, matrix, run))


def _with_triage(results: list[CheckResult], matrix: Matrix, run: RunVerdict) -> list[CheckResult]:
    """Issue 16: an identity mismatch says its triage class (DESIGN §6). corrupted_state and
    undetermined fail as any mismatch; nondeterminism stays inconclusive; split_sensitivity
    fails unless `identity.split_sensitivity` allows it for the engine, and then passes with
    the class still in the message (reported, not hidden)."""
    turns = {(c.cell_id, t.index): (c, t) for c in run.cells for t in c.turns if t.triage is not None}
    out = []
    for r in results:
        found = turns.get((r.cell_id, r.turn)) if r.check == "identity" else None
        if found is None or r.status is CheckStatus.PASS:
            out.append(r)
            continue
        cell, turn = found
        message = f"{r.message}; triage: {turn.triage.cls}: {turn.triage.detail}"
        if turn.triage.cls == "split_sensitivity" and r.status is CheckStatus.FAIL \
                and matrix.identity.allows_split_sensitivity(cell.engine):
            out.append(replace(r, status=CheckStatus.PASS, actual="split_sensitivity",
                               message=message + " (accepted: identity.split_sensitivity allows it)"))
        else:
            out.append(replace(r, actual=turn.triage.cls, message=message))
    return out


# ---------------------------------------------------------------- default rules


def ran_checks(run: RunVerdict, planned: Sequence[str] = ()) -> list[CheckResult]:
    """One result per cell: did it run to the end? A cell that did not is an ERROR."""
    out = []
    for cell in run.cells:
        if cell.status == CELL_OK:
            out.append(_result("ran", CheckStatus.PASS, cell, None, "status ok", "status ok",
                               f"{len(cell.turns)} turn(s) recorded"))
        else:
            reason = cell.reason or "no reason recorded"
            out.append(_result("ran", CheckStatus.ERROR, cell, None, "status ok",
                               f"status {cell.status}", f"the cell did not run to the end: {reason}"))
    seen = {c.cell_id for c in run.cells}
    for cell_id in planned:
        if cell_id not in seen:
            out.append(CheckResult("ran", CheckStatus.ERROR, cell_id, "status ok", "no record",
                                   "planned cell has no meta.json: it never ran (interrupted run?)",
                                   "default", cell_id=cell_id))
    return out


def plausible_checks(run: RunVerdict, shown: int = 4) -> list[CheckResult]:
    """One result per cell that recorded turns: every figure its engine reported is possible.
    An impossible one is an ERROR: the engine cannot be believed, whatever else it says."""
    out = []
    for cell in run.cells:
        if not cell.turns:
            continue
        found = plausibility.cell_problems(cell)
        if not found:
            out.append(_result("plausible", CheckStatus.PASS, cell, None, POSSIBLE, "possible",
                               f"{len(cell.turns)} turn(s): every figure possible"))
            continue
        listed = "; ".join(found[:shown])
        more = f"; and {len(found) - shown} more" if len(found) > shown else ""
        out.append(_result("plausible", CheckStatus.ERROR, cell, None, POSSIBLE,
                           f"{len(found)} impossible",
                           f"the engine reported impossible figures, so it cannot be believed: {listed}{more}"))
    return out


def answered_checks(run: RunVerdict) -> list[CheckResult]:
    """A turn that came back as an error (HTTP 4xx/5xx, timeout) in a cell that otherwise ran."""
    out = []
    for cell in run.cells:
        if cell.status != CELL_OK:
            continue  # already an infrastructure ERROR
        for turn in cell.turns:
            if turn.outcome is Outcome.ERROR:
                out.append(_result("answered", CheckStatus.FAIL, cell, turn, "an answer",
                                   "error", f"the engine failed the turn: {turn.error or 'no detail'}"))
    return out


def identity_checks(run: RunVerdict, waived: set[tuple[str, int]] = frozenset()) -> list[CheckResult]:
    """Warm turns compared with their cold run (verdicts.identity decides what was compared)."""
    out = []
    for cell in _warm(run.cells):
        if cell.status != CELL_OK:
            continue
        for turn in cell.turns:
            if turn.identity is None or (cell.cell_id, turn.index) in waived:
                continue  # the first turn of a cell is itself cold: nothing to compare
            out.append(_identity_result(cell, turn, turn.identity, explicit=False, source="default"))
    return out


def control_checks(run: RunVerdict) -> list[CheckResult]:
    """The cold-vs-cold controls: a mismatch makes identity results of that engine inconclusive."""
    out = []
    for cell in run.cells:
        if cell.kind != CONTROL or cell.status != CELL_OK:
            continue
        control = cell.control
        if control is None:
            out.append(_result("control", CheckStatus.INCONCLUSIVE, cell, None, "identical to cold",
                               "not compared", "the control was not compared with its cold cell"))
        elif control.status is IdentityStatus.MISMATCH:
            out.append(_result(
                "control", CheckStatus.INCONCLUSIVE, cell, None, "identical to cold", "mismatch",
                f"two cold runs of the same prompt differ ({_first_diff(control)}): the engine is "
                f"nondeterministic, so warm-vs-cold identity proves nothing for {cell.engine} / "
                f"{cell.configuration}"))
        elif control.status in (IdentityStatus.IDENTICAL, IdentityStatus.IDENTICAL_NO_REUSE):
            out.append(_result("control", CheckStatus.PASS, cell, None, "identical to cold",
                               "identical", f"cold run repeated in a fresh process: same bytes as "
                               f"{control.reference_cell}"))
        else:
            out.append(_result("control", CheckStatus.INCONCLUSIVE, cell, None, "identical to cold",
                               control.status.value, control.detail or "the control could not be compared"))
    return out


def cascade_checks(run: RunVerdict, waived: set[tuple[str, int]] = frozenset()) -> list[CheckResult]:
    """One result per warm cell: every checkpoint above a turn's re-entry point was erased
    (turns an expectation marks `cascade: false` left out)."""
    out = []
    for cell in _warm(run.cells):
        if cell.status != CELL_OK or cell.log_family == "none":
            continue  # no log: the cascade cannot be seen
        turns = [t for t in cell.turns if (cell.cell_id, t.index) not in waived]
        if not turns:
            continue
        if cell.log_missing:  # the cascade is seen only in the log: none seen is no evidence
            out.append(_result("cascade", CheckStatus.ERROR, cell, None, CASCADE_EXPECTED, "not judged",
                               _needs_log(cell, "the cascade")))
            continue
        passed, actual, message = _judge_cascade_turns(turns)
        out.append(_result("cascade", CheckStatus.PASS if passed else CheckStatus.FAIL, cell, None,
                           CASCADE_EXPECTED, actual, message))
    return out


def _judge_cascade_turns(turns: Sequence[TurnVerdict]) -> tuple[bool, str, str]:
    """The cascade of these turns, from the verdicts' `cascade_missed`: (passed, actual, message)."""
    missed = [(t, c) for t in turns for c in t.cascade_missed]
    if not missed:
        erased = sum(len(t.erased_cascade) for t in turns)
        return True, "none kept", f"{erased} checkpoint(s) erased by the cascade, none missed"
    by_turn: dict[int, list[int]] = {}
    for t, c in missed:
        by_turn.setdefault(t.index, []).append(c.pos_max)
    positions = "; ".join(f"turn {i}: pos_max {', '.join(map(str, p))}" for i, p in by_turn.items())
    return False, f"{len(missed)} kept", (
        f"the engine kept {len(missed)} checkpoint(s) above the re-entry point that the cascade "
        f"must erase ({positions}); a later restore of one would reuse stale state")


# Declared checks whose figures come from engine.log, and what the log shows them. Without the
# log they are not judged (ERROR): none seen is not none there.
NEEDS_LOG = {"checkpoints_created_at": "where checkpoints were created", "cascade": "the cascade",
             "outcome": "the outcome of a turn (a restore, a forcing line)", "max_forced": "a forced re-processing"}


def _needs_log(cell: CellVerdict, what: str) -> str:
    return (f"not judged: {what} is seen only in the engine's log, and {cell.engine_log} is missing "
            "(the records give reuse from the API only)")


def _waived(matrix: Matrix, run: RunVerdict, key: str) -> set[tuple[str, int]]:
    """(cell, turn) pairs an expectation marks `identity: false` / `cascade: false` (`key`): the
    default rule of that name is not applied to them."""
    waived: set[tuple[str, int]] = set()
    for expectation in matrix.expectations:
        if getattr(expectation, key) is False:
            for cell in selected_cells(expectation, run):
                waived.update((cell.cell_id, t.index) for t in selected_turns(expectation, cell))
    return waived


# ---------------------------------------------------------------- declared expectations


def selected_cells(expectation: Expectation, run: RunVerdict) -> list[CellVerdict]:
    sel = expectation.selection
    return [c for c in _warm(run.cells) if sel.matches(c.engine, c.configuration, c.sequence)]


def selected_turns(expectation: Expectation, cell: CellVerdict) -> list[TurnVerdict]:
    turn = expectation.turn
    if turn is None:
        return list(cell.turns)
    if isinstance(turn, int):
        return [t for t in cell.turns if t.index == turn]
    return [t for t in cell.turns if t.prompt_id == turn]


def evaluate_expectation(expectation: Expectation, number: int, run: RunVerdict, *,
                         incomplete: bool = False) -> list[CheckResult]:
    """All results of one `expectations[i]` entry (`number` is 1-based, as shown to people).
    `incomplete`: some planned cell left no record, so a selection that matches nothing may
    only mean its cells never ran (an ERROR, not a FAIL)."""
    source = f"expectation {number}" + (f" (matrix line {expectation.line})" if expectation.line else "")
    cells = selected_cells(expectation, run)
    if not cells:
        status = CheckStatus.ERROR if incomplete else CheckStatus.FAIL
        why = ("matched no warm cell that left a record: its cells never ran" if incomplete
               else "this expectation matched no warm cell of the run")
        return [CheckResult("selection", status, _selection_text(expectation), "≥ 1 warm cell",
                            "none", why, source, description=expectation.description)]
    out: list[CheckResult] = []
    for cell in cells:
        out += _expectation_on_cell(expectation, cell, source)
    return out


def _expectation_on_cell(x: Expectation, cell: CellVerdict, source: str) -> list[CheckResult]:
    turns = selected_turns(x, cell)
    checks = _declared_checks(x)
    if cell.status != CELL_OK or (not turns and x.turn is not None):
        why = (f"the cell did not run to the end ({cell.status}: {cell.reason or 'no reason'})"
               if cell.status != CELL_OK else f"turn {x.turn!r} was not recorded")
        status = CheckStatus.ERROR if cell.status != CELL_OK else CheckStatus.FAIL
        return [CheckResult(name, status, _subject(cell, None), _expected_text(x, name), "not run", why,
                            source, cell.cell_id, None, x.description) for name in checks]
    impossible = plausibility.cell_problems(cell)
    if impossible:  # its engine cannot be believed: a pass on its figures would be no pass
        return [CheckResult(name, CheckStatus.ERROR, _subject(cell, None), _expected_text(x, name), "not judged",
                            f"not judged: the engine's figures for this cell are impossible ({impossible[0]})",
                            source, cell.cell_id, None, x.description) for name in checks]
    out = [_unjudged(name, x, cell, source) for name in checks if name in NEEDS_LOG and cell.log_missing]
    checks = [name for name in checks if not (name in NEEDS_LOG and cell.log_missing)]
    if "max_forced" in checks:
        out.append(_max_forced(x, cell, turns, source))
    if "min_recovered_share" in checks:
        out.append(_min_recovered(x, cell, turns, source))
    for turn in turns:
        for name in checks:
            if name in ("max_forced", "min_recovered_share"):
                continue
            if name == "identity" and x.turn is None and _own_reference(turn):
                continue  # every turn of the cell: the cold first turn is the reference, not a turn to compare
            out.append(_turn_check(name, x, cell, turn, source))
    return out


def _own_reference(turn: TurnVerdict) -> bool:
    """The first turn of a fresh process: computed cold, it has no other run to equal."""
    return turn.index == 0 and turn.outcome is Outcome.COLD and turn.identity is None


def _unjudged(name: str, x: Expectation, cell: CellVerdict, source: str) -> CheckResult:
    """A declared check on figures from a log the cell does not have."""
    turn = x.turn if isinstance(x.turn, int) else None
    return CheckResult(name, CheckStatus.ERROR, _subject(cell, None) + (f" turn {x.turn}" if x.turn is not None else ""),
                       _expected_text(x, name), "not judged", _needs_log(cell, NEEDS_LOG[name]), source, cell.cell_id,
                       turn, x.description)


def _declared_checks(x: Expectation) -> list[str]:
    """The checks an expectation declares; `identity: false` / `cascade: false` only waive."""
    names = ("outcome", "min_reused", "min_saved_fraction", "max_forced", "checkpoints_created_at", "identity",
             "cascade", "min_recovered_share")
    return [n for n in names if getattr(x, n) is not None and getattr(x, n) is not False]


def _turn_check(name: str, x: Expectation, cell: CellVerdict, turn: TurnVerdict, source: str) -> CheckResult:
    if name == "identity":
        if turn.identity is None:
            return CheckResult("identity", CheckStatus.FAIL, _subject(cell, turn), "identical to cold",
                               "no comparison", "this turn has no cold reference to compare with",
                               source, cell.cell_id, turn.index, x.description)
        result = _identity_result(cell, turn, turn.identity, explicit=True, source=source)
        return replace(result, description=x.description)
    passed, actual, message = _JUDGES[name](x, turn)
    return CheckResult(name, CheckStatus.PASS if passed else CheckStatus.FAIL, _subject(cell, turn),
                       _expected_text(x, name), actual, message, source, cell.cell_id, turn.index,
                       x.description)


def _judge_outcome(x: Expectation, turn: TurnVerdict) -> tuple[bool, str, str]:
    actual = turn.outcome.value
    allowed = x.outcome or ()
    if actual in allowed:
        return True, actual, f"outcome {actual}"
    why = _outcome_context(turn)
    return False, actual, f"expected {' or '.join(allowed)}, the turn was {actual}{why}"


def _outcome_context(turn: TurnVerdict) -> str:
    parts = []
    if turn.divergence_point is not None:
        parts.append(f"divergence {turn.divergence_point}")
    if turn.re_entry_point is not None:
        parts.append(f"re-entry {turn.re_entry_point}")
    if turn.reused_tokens is not None:
        parts.append(f"reused {turn.reused_tokens}")
    return f" ({', '.join(parts)})" if parts else ""


def _judge_min_reused(x: Expectation, turn: TurnVerdict) -> tuple[bool, str, str]:
    if turn.reused_tokens is None:
        return False, "unknown", "the engine reported no reuse figure for this turn"
    ok = turn.reused_tokens >= (x.min_reused or 0)
    verb = "reused" if ok else "reused only"
    return ok, str(turn.reused_tokens), f"{verb} {turn.reused_tokens} of {turn.prompt_tokens} tokens"


def _judge_min_saved(x: Expectation, turn: TurnVerdict) -> tuple[bool, str, str]:
    if turn.saved_fraction is None:
        return False, "unknown", "the saved fraction is unknown for this turn"
    ok = turn.saved_fraction >= (x.min_saved_fraction or 0.0)
    return ok, pct(turn.saved_fraction), f"saved {pct(turn.saved_fraction)} of the prefill"


def _judge_created_at(x: Expectation, turn: TurnVerdict) -> tuple[bool, str, str]:
    created = sorted(c.pos_max for c in turn.created)
    missing = [p for p in (x.checkpoints_created_at or ()) if p not in created]
    actual = "[" + ", ".join(map(str, created)) + "]"
    if not missing:
        return True, actual, f"checkpoints created at pos_max {actual}"
    return False, actual, (f"no checkpoint created at pos_max {', '.join(map(str, missing))}; "
                           f"created at {actual}")


def _judge_cascade(x: Expectation, turn: TurnVerdict) -> tuple[bool, str, str]:
    """Declared `cascade: true`: the default rule's judgement on this one turn, but a turn whose
    cascade the verdicts could not judge fails (the first turn of a fresh slot has none)."""
    if not turn.cascade_checked:
        if turn.outcome is Outcome.COLD:
            return True, "none kept", "first turn of a fresh slot: no checkpoint to erase"
        why = (f"the turn failed: {turn.error or 'no detail'}" if turn.outcome is Outcome.ERROR
               else "no parsed engine log or no known re-entry point for this turn")
        return False, "unknown", f"the cascade could not be judged: {why}"
    passed, actual, message = _judge_cascade_turns([turn])
    if passed:
        message += f" (re-entry point {turn.re_entry_point})"
    return passed, actual, message


_JUDGES = {
    "outcome": _judge_outcome,
    "min_reused": _judge_min_reused,
    "min_saved_fraction": _judge_min_saved,
    "checkpoints_created_at": _judge_created_at,
    "cascade": _judge_cascade,
}


def _max_forced(x: Expectation, cell: CellVerdict, turns: list[TurnVerdict], source: str) -> CheckResult:
    forced = [t for t in turns if t.outcome is Outcome.FORCED]
    limit = x.max_forced or 0
    status = CheckStatus.PASS if len(forced) <= limit else CheckStatus.FAIL
    where = ", ".join(f"turn {t.index} ({t.prompt_id})" for t in forced) or "none"
    turn_index = turns[0].index if x.turn is not None and turns else None
    subject = _subject(cell, turns[0] if turn_index is not None else None)
    return CheckResult("max_forced", status, subject, f"≤ {limit}", str(len(forced)),
                       f"{len(forced)} forced full re-processing(s): {where}", source, cell.cell_id,
                       turn_index, x.description)


def _min_recovered(x: Expectation, cell: CellVerdict, turns: list[TurnVerdict], source: str) -> CheckResult:
    """Σ reused / Σ ideal over the turns (traffic): a cell without ideals cannot pass."""
    _, ideal, reused, share = traffic_summary(replace(cell, turns=tuple(turns)))
    limit = x.min_recovered_share or 0.0
    turn_index = turns[0].index if x.turn is not None and turns else None
    subject = _subject(cell, turns[0] if turn_index is not None else None)
    if not any(t.ideal_tokens is not None for t in turns):
        return CheckResult("min_recovered_share", CheckStatus.FAIL, subject, f"≥ {pct(limit)}", "no ideal",
                           "not a traffic cell: no turn has an ideal to recover", source, cell.cell_id,
                           turn_index, x.description)
    passed = (share if share is not None else 0.0) >= limit or (ideal == 0 and limit == 0)
    actual = "no reusable prefix" if share is None else pct(share)
    return CheckResult("min_recovered_share", CheckStatus.PASS if passed else CheckStatus.FAIL, subject,
                       f"≥ {pct(limit)}", actual, f"recovered {reused:,} of {ideal:,} reusable prefix tokens",
                       source, cell.cell_id, turn_index, x.description)


# ---------------------------------------------------------------- identity


def _identity_result(cell: CellVerdict, turn: TurnVerdict, ident: IdentityCheck, *, explicit: bool,
                     source: str) -> CheckResult:
    """Default rule: MISMATCH fails; a reused turn must be IDENTICAL. Explicit `identity: true`:
    the output must equal the cold run's (a turn that re-prefilled passes but is no evidence)."""
    expected = "identical to cold"
    reused = turn.reused_tokens or 0
    status, message = CheckStatus.PASS, ""
    if ident.status is IdentityStatus.MISMATCH:
        status = CheckStatus.INCONCLUSIVE if ident.inconclusive else CheckStatus.FAIL
        message = (f"warm output differs from the cold run {ident.reference_cell} "
                   f"({_first_diff(ident)}) after reusing {reused} tokens")
        if ident.inconclusive:
            message += "; the cold-vs-cold control also differs, so this is inconclusive"
    elif ident.status is IdentityStatus.IDENTICAL:
        message = f"byte-identical to {ident.reference_cell} after reusing {reused} tokens"
    elif ident.status is IdentityStatus.IDENTICAL_NO_REUSE:
        message = "identical, but the turn reused nothing: no evidence about cache reuse"
    elif ident.status is IdentityStatus.NO_REFERENCE:
        status = CheckStatus.FAIL if (reused > 0 or explicit) else CheckStatus.PASS
        message = ("no cold reference: the reuse cannot be shown safe" if status.failed
                   else "no cold reference, and the turn reused nothing")
    else:  # ERROR: the warm turn or its reference failed
        status = CheckStatus.FAIL
        message = ident.detail or "the comparison failed (the turn or its cold run errored)"
    return CheckResult("identity", status, _subject(cell, turn), expected, ident.status.value, message,
                       source, cell.cell_id, turn.index)


def _first_diff(ident: IdentityCheck) -> str:
    parts = []
    if ident.first_diff_token is not None:
        parts.append(f"first differing token #{ident.first_diff_token}")
    if ident.first_diff_byte is not None:
        parts.append(f"byte {ident.first_diff_byte}")
    return ", ".join(parts) or ident.detail or "outputs differ"


# ---------------------------------------------------------------- small pieces


def _warm(cells: Iterable[CellVerdict]) -> list[CellVerdict]:
    return [c for c in cells if c.kind == WARM]


def _subject(cell: CellVerdict, turn: TurnVerdict | None) -> str:
    return cell.cell_id if turn is None else f"{cell.cell_id} turn {turn.index} ({turn.prompt_id})"


def _result(check: str, status: CheckStatus, cell: CellVerdict, turn: TurnVerdict | None, expected: str,
            actual: str, message: str) -> CheckResult:
    return CheckResult(check, status, _subject(cell, turn), expected, actual, message, "default",
                       cell.cell_id, turn.index if turn else None)


def _expected_text(x: Expectation, name: str) -> str:
    if name == "outcome":
        return " or ".join(x.outcome or ())
    if name == "min_reused":
        return f"≥ {x.min_reused}"
    if name == "min_saved_fraction":
        return f"≥ {pct(x.min_saved_fraction or 0.0)}"
    if name == "max_forced":
        return f"≤ {x.max_forced}"
    if name == "checkpoints_created_at":
        return "pos_max ⊇ [" + ", ".join(map(str, x.checkpoints_created_at or ())) + "]"
    if name == "cascade":
        return CASCADE_EXPECTED
    if name == "min_recovered_share":
        return f"≥ {pct(x.min_recovered_share or 0.0)}"
    return "identical to cold"


def _selection_text(x: Expectation) -> str:
    s = x.selection
    turn = f" turn {x.turn}" if x.turn is not None else ""
    return f"{s.engine}.{s.configuration}.{s.sequence}{turn}"
