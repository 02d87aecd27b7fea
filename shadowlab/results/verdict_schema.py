"""The schema of verdicts.json: every type a verdict is made of, and its version chain.

    RunVerdict.from_dict(data)   verdicts.json as read (upgraded step by step; newer refused)
    verdict.to_dict()            as written (the one JSON dataclass codec, codec.py)

The judge computes these (shadowlab/judge/verdicts.py) and applies the plausibility rules again
to a file it reads (``verdicts.loaded``); report, gate, compare and simulate only read them. The
types live with the run directory's other records, below every stage that uses them, so
``plausibility`` (which reads them) and ``verdicts`` (which makes them) need not import each
other. DESIGN §5 documents the fields.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.results.codec import from_jsonable, to_jsonable
from shadowlab.results.layout import RunLayout
from shadowlab.results.versions import Versioned


class IdentityStatus(str, enum.Enum):
    """A warm turn's output compared with the cold run of the same prompt."""

    IDENTICAL = "identical"  # same bytes and token ids, and the turn reused cache: evidence
    IDENTICAL_NO_REUSE = "identical_no_reuse"  # same, but the turn re-prefilled: proves nothing
    MISMATCH = "mismatch"  # outputs differ (first differing token and byte recorded)
    NO_REFERENCE = "no_reference"  # no cold cell for this engine/configuration/prompt
    ERROR = "error"  # the warm turn or its reference failed


@dataclass(frozen=True)
class IdentityCheck:
    """Warm-vs-cold (or control-vs-cold) comparison of one output."""

    status: IdentityStatus
    reference_cell: str | None = None  # the cold cell compared against
    reference_turn: int | None = None
    reused_tokens: int | None = None  # what the compared turn reused (evidence only when > 0)
    first_diff_token: int | None = None  # index of the first differing completion token
    first_diff_byte: int | None = None  # byte offset of the first differing UTF-8 byte of text
    text: str | None = None  # this output
    reference_text: str | None = None  # the cold output
    tokens: tuple[int, ...] | None = None
    reference_tokens: tuple[int, ...] | None = None
    inconclusive: bool = False  # a cold-vs-cold control of the same engine mismatched
    detail: str = ""  # one readable sentence


VERDICTS_SCHEMA_VERSION = 4  # 2: TurnVerdict.cascade_checked; 3: implausible, divergence_lower_bound;
# 4: TurnVerdict.triage (issue 16; an older file has none: None). Older files are upgraded on read
# (VERDICTS, below the types).
VERDICTS_NAME = RunLayout.VERDICTS


class Outcome(str, enum.Enum):
    """What the engine did with its cache for one turn (DESIGN.md §5)."""

    COLD = "cold"  # first turn of a fresh slot: nothing to reuse
    EXTENDED = "extended"  # the new prompt extended the cache: reused without a restore
    RESTORED = "restored"  # a context checkpoint was restored below the divergence point
    FORCED = "forced"  # partial match, no usable checkpoint: the forcing line, full re-prefill
    SILENT_RESET = "silent_reset"  # zero overlap: full re-prefill and no forcing line
    ERROR = "error"  # the turn failed (HTTP error, timeout, engine died)


@dataclass(frozen=True)
class CheckpointRef:
    """One context checkpoint as seen in the log (positions are token positions)."""

    pos_min: int
    pos_max: int
    n_tokens: int  # tokens it covers; pos_max + 1 where the log does not say (hybrid models)
    size_mib: float | None = None
    took_ms: float | None = None
    created_turn: int | None = None  # turn index of the cell that created it (None: unknown)
    task: int | None = None  # task id of the line
    line: int | None = None  # 1-based line number in engine.log


@dataclass(frozen=True)
class TriageVerdict:
    """Why a warm turn differs from cold (identity.triage, DESIGN §5), as verdicts.json keeps it."""

    cls: str  # identity.TriageClass value
    detail: str  # one readable sentence: the class and its evidence
    split_control_cell: str | None = None  # the split control compared (None: none ran; detail says why)
    warm_vs_cold: str | None = None  # where warm and cold part (token index and ids, or byte)
    warm_vs_split: str | None = None  # where warm and its split control part; None: equal or none
    cold_vs_control: str | None = None  # where cold and a cold-vs-cold control part; None: equal or none


@dataclass(frozen=True)
class TurnVerdict:
    """Everything shadowlab concludes about one turn of one cell."""

    index: int
    prompt_id: str
    outcome: Outcome
    conversation: str | None = None  # the turn record's: warm turns' conversation, else None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # slot cache length at turn start (records: prompt + completion)
    divergence_point: int | None = None  # LCP with the slot cache (records); None: unknown
    # The previous completion came back without token ids: the LCP may run on into it, so
    # divergence_point is only a lower bound (a re-entry above it is then no contradiction).
    divergence_lower_bound: bool = False
    re_entry_point: int | None = None  # where prefill restarted
    re_entry_source: str | None = None  # "restore" | "cache_trim" | "timings"
    reused_tokens: int | None = None  # the figure used downstream (API when present, else log)
    processed_tokens: int | None = None
    reused_api: int | None = None
    processed_api: int | None = None
    reused_log: int | None = None
    processed_log: int | None = None
    disagreements: tuple[str, ...] = ()  # API vs log conflicts, a restore past its checkpoint
    # Figures no engine can truthfully report (shadowlab/judge/plausibility.py): the cell's engine
    # cannot be believed, an infrastructure failure for the gate.
    implausible: tuple[str, ...] = ()
    saved_fraction: float | None = None  # reused / prompt_tokens
    prefill_ms: float | None = None
    forcing_line: bool = False  # the log printed the forcing line for this turn
    restored: CheckpointRef | None = None
    restore_ms: float | None = None
    restore_mib: float | None = None
    alive_at_start: tuple[CheckpointRef, ...] = ()  # checkpoints alive when the turn began
    alive_below_divergence: tuple[CheckpointRef, ...] = ()  # usable: pos_max < divergence point
    alive_above_divergence: tuple[CheckpointRef, ...] = ()  # must be erased by the cascade
    created: tuple[CheckpointRef, ...] = ()  # created during this turn
    erased_cascade: tuple[CheckpointRef, ...] = ()  # `erased invalidated` during this turn
    erased_other: tuple[CheckpointRef, ...] = ()  # `erasing old` / too close / superseded
    cascade_missed: tuple[CheckpointRef, ...] = ()  # alive above re-entry yet not erased
    # cascade_missed was judged: the log was parsed, the re-entry point is known, and the turn is
    # neither the first of a fresh slot nor failed. False: an empty cascade_missed proves nothing.
    cascade_checked: bool = False
    create_ms: float | None = None  # sum over `created`
    create_mib: float | None = None
    task_ids: tuple[int, ...] = ()
    log_complete: bool | None = None  # the turn's `prompt eval time` line was seen
    identity: IdentityCheck | None = None
    triage: TriageVerdict | None = None  # a warm mismatch: why (schema 4; older files: None)
    error: str | None = None
    notes: tuple[str, ...] = ()
    # Traffic turns (optional in schema 3): the longest prefix shared with any earlier request,
    # and with the previous request of the same conversation (shadowlab.traffic.ideals).
    ideal_tokens: int | None = None
    consecutive_ideal_tokens: int | None = None
    # Requests sent concurrently: where the engine served this turn among the cell's (from 0,
    # its task's first line); None when the turns were sent one after another, in order.
    processing_rank: int | None = None


@dataclass(frozen=True)
class CellVerdict:
    """One cell (one fresh engine process) and its turns."""

    cell_id: str
    kind: str  # "warm" | "cold" | "control"
    engine: str
    configuration: str
    sequence: str
    status: str  # records.CellStatus value
    reason: str | None = None
    log_family: str = "none"
    reuse_source: str = "api+log"  # "api+log" or "api" (engine has no parsable log)
    turns: tuple[TurnVerdict, ...] = ()
    control: IdentityCheck | None = None  # control cells: this output vs the cold cell's
    unknown_lines: int = 0
    unknown_samples: tuple[str, ...] = ()
    event_counts: dict[str, int] = field(default_factory=dict)
    unattributed_events: int = 0  # events outside every turn's span (start-up, shutdown)
    notes: tuple[str, ...] = ()  # e.g. a matrix log pattern that could not be used

    def count(self, outcome: Outcome) -> int:
        return sum(1 for t in self.turns if t.outcome is outcome)

    @property
    def log_missing(self) -> bool:
        """The engine writes a log shadowlab reads (a log family), yet none was read: every
        log-derived figure (checkpoints, cascade, forcing lines) is unknown, not absent."""
        return self.log_family != "none" and self.reuse_source != "api+log"

    @property
    def engine_log(self) -> str:
        """The cell's engine.log, as a run directory names it (RunLayout)."""
        return RunLayout(Path(".")).relative(RunLayout(Path(".")).engine_log(self.cell_id))


@dataclass(frozen=True)
class RunVerdict:
    """The whole run: what report.py renders and gate.py judges."""

    run_id: str
    cells: tuple[CellVerdict, ...] = ()
    controls: tuple[IdentityCheck, ...] = ()  # every control cell vs its cold cell
    nondeterministic_engines: tuple[str, ...] = ()  # engines whose control mismatched
    schema_version: int = VERDICTS_SCHEMA_VERSION

    def cell(self, cell_id: str) -> CellVerdict:
        for c in self.cells:
            if c.cell_id == cell_id:
                return c
        raise KeyError(cell_id)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = VERDICTS_NAME) -> "RunVerdict":
        """A verdicts.json object upgraded through ``VERDICTS`` (RunDirError for a newer or
        unversioned file; ValueError naming the field for a wrong shape). The plausibility rules
        are applied again by the judge's reader (``verdicts.loaded``), not here."""
        data = VERDICTS.read(data, source=source)
        return from_jsonable(cls, _implied_conversations(data))


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """verdicts.json v1 -> v2: `TurnVerdict.cascade_checked` did not exist. It is derived the way
    `compute` sets it: the cell has a log, the re-entry point is known, and the turn is neither
    the first of its slot (cold) nor failed. (compute also needs the log to have parsed; a v1
    file does not say, so a cell with a log family counts as parsed.)"""
    cells = []
    for cell in data.get("cells", []):
        has_log = cell.get("log_family", "none") != "none"
        turns = [
            {"cascade_checked": has_log and turn.get("re_entry_point") is not None
             and turn.get("outcome") not in (Outcome.COLD.value, Outcome.ERROR.value), **turn}
            for turn in cell.get("turns", [])
        ]
        cells.append({**cell, "turns": turns})
    return {**data, "cells": cells, "schema_version": 2}


_LOWER_BOUND_NOTE = "is a lower bound"  # compute's note, written exactly when the flag is set


def _upgrade_v2(data: dict[str, Any]) -> dict[str, Any]:
    """verdicts.json v2 -> v3: `TurnVerdict.divergence_lower_bound` did not exist; compute wrote
    a note saying so exactly when it holds. `implausible` is filled after loading, by the same
    rules compute applies (`_judge_plausibility`), from the turn's own figures: the raw API
    timings are not in verdicts.json, so only their rule cannot be re-applied."""
    cells = []
    for cell in data.get("cells", []):
        turns = [
            {"divergence_lower_bound": any(_LOWER_BOUND_NOTE in str(n) for n in turn.get("notes", ())), **turn}
            for turn in cell.get("turns", [])
        ]
        cells.append({**cell, "turns": turns})
    return {**data, "cells": cells, "schema_version": 3}


def _implied_conversations(data: dict[str, Any]) -> dict[str, Any]:
    """A verdicts.json written before turns carried `conversation` (optional in schema 3, so no
    new version): a warm cell's turns belong to its sequence (before sequences had kinds every warm
    cell was one ordered conversation), a cold or control turn to none. Other shapes are left for
    the checked read to report."""
    cells = data.get("cells")
    if not isinstance(cells, list):
        return data
    out = []
    for cell in cells:
        if isinstance(cell, dict) and isinstance(cell.get("turns"), list):
            implied = cell.get("sequence") if cell.get("kind") == "warm" else None
            cell = {**cell, "turns": [{"conversation": implied, **t} if isinstance(t, dict) else t
                                      for t in cell["turns"]]}
        out.append(cell)
    return {**data, "cells": out}


# verdicts.json's version chain: v1 -> v2 -> v3; v3 -> v4 needs no step (TurnVerdict.triage did
# not exist: a missing field reads as None, no triage).
VERDICTS = Versioned(VERDICTS_NAME, "schema_version", VERDICTS_SCHEMA_VERSION,
                     {1: _upgrade_v1, 2: _upgrade_v2, 3: lambda data: data})


def _add_json_methods(cls: type) -> None:
    cls.to_dict = lambda self: to_jsonable(self)  # type: ignore[attr-defined]
    cls.from_dict = classmethod(lambda c, data: from_jsonable(c, data))  # type: ignore[attr-defined]


for _cls in (CheckpointRef, IdentityCheck, TriageVerdict, TurnVerdict, CellVerdict):
    _add_json_methods(_cls)


__all__ = ["VERDICTS", "VERDICTS_NAME", "VERDICTS_SCHEMA_VERSION", "CellVerdict", "CheckpointRef", "IdentityCheck",
           "IdentityStatus", "Outcome", "RunVerdict", "TriageVerdict", "TurnVerdict"]
