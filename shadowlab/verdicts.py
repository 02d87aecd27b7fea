"""Per-turn verdicts: a pure function of a run directory.

    compute(run_dir) -> RunVerdict        reads cells/*/meta.json + engine.log, writes verdicts.json

Everything the report and the gate show comes from the dataclasses below, serialised whole into
``verdicts.json`` (``RunVerdict.to_dict()`` / ``RunVerdict.from_dict()``), so no later stage
re-derives a number differently.

Where each number comes from
----------------------------
- divergence point: longest common prefix of this turn's prompt token ids with the slot's cached
  tokens (the previous turn's prompt ids + its completion ids), from the records alone — exact and
  engine-independent.
- re-entry point: the log's ``restored ... n_past`` (or ``pos_max + 1`` for forks without it),
  else the turn's first ``cached n_tokens = N, memory_seq_rm`` line, else the API timings.
- reused / processed: from the API (``timings.cache_n`` / ``prompt_n``) AND from the log (restore
  or cache trim; ``prompt eval time`` tokens). They are cross-checked; a disagreement is listed in
  ``TurnVerdict.disagreements`` and the API figures are kept.
- checkpoints alive at turn start: every ``created`` event of earlier turns of the cell replayed
  against every erase (``erased invalidated``, ``erasing old``, ``too close``, ``superseding``).
- engines without a log family (``none``: OpenAI-compatible servers) get reuse from the API only;
  ``CellVerdict.reuse_source`` says ``api`` and every log-derived field is None.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any

VERDICTS_SCHEMA_VERSION = 1


class Outcome(str, enum.Enum):
    """What the engine did with its cache for one turn (DESIGN.md §5)."""

    COLD = "cold"  # first turn of a fresh slot: nothing to reuse
    EXTENDED = "extended"  # the new prompt extended the cache: reused without a restore
    RESTORED = "restored"  # a context checkpoint was restored below the divergence point
    FORCED = "forced"  # partial match, no usable checkpoint: the forcing line, full re-prefill
    SILENT_RESET = "silent_reset"  # zero overlap: full re-prefill and no forcing line
    ERROR = "error"  # the turn failed (HTTP error, timeout, engine died)


class IdentityStatus(str, enum.Enum):
    """A warm turn's output compared with the cold run of the same prompt."""

    IDENTICAL = "identical"  # same bytes and token ids, and the turn reused cache: evidence
    IDENTICAL_NO_REUSE = "identical_no_reuse"  # same, but the turn re-prefilled: proves nothing
    MISMATCH = "mismatch"  # outputs differ (first differing token and byte recorded)
    NO_REFERENCE = "no_reference"  # no cold cell for this engine/configuration/prompt
    ERROR = "error"  # the warm turn or its reference failed


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


@dataclass(frozen=True)
class TurnVerdict:
    """Everything shadowlab concludes about one turn of one cell."""

    index: int
    prompt_id: str
    outcome: Outcome
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # slot cache length at turn start (records: prompt + completion)
    divergence_point: int | None = None  # LCP with the slot cache (records); None: unknown
    re_entry_point: int | None = None  # where prefill restarted
    re_entry_source: str | None = None  # "restore" | "cache_trim" | "timings"
    reused_tokens: int | None = None  # the figure used downstream (API when present, else log)
    processed_tokens: int | None = None
    reused_api: int | None = None
    processed_api: int | None = None
    reused_log: int | None = None
    processed_log: int | None = None
    disagreements: tuple[str, ...] = ()  # API vs log (and re-entry vs divergence) conflicts
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
    create_ms: float | None = None  # sum over `created`
    create_mib: float | None = None
    task_ids: tuple[int, ...] = ()
    log_complete: bool | None = None  # the turn's `prompt eval time` line was seen
    identity: IdentityCheck | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()


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

    def count(self, outcome: Outcome) -> int:
        return sum(1 for t in self.turns if t.outcome is outcome)


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
        return _to_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunVerdict":
        version = data.get("schema_version")
        if not isinstance(version, int) or version > VERDICTS_SCHEMA_VERSION:
            raise ValueError(
                f"verdicts.json schema_version {version!r} is not one this shadowlab reads "
                f"(<= {VERDICTS_SCHEMA_VERSION})"
            )
        return _from_json(cls, data)


def _add_json_methods(cls: type) -> None:
    cls.to_dict = lambda self: _to_json(self)  # type: ignore[attr-defined]
    cls.from_dict = classmethod(lambda c, data: _from_json(c, data))  # type: ignore[attr-defined]


for _cls in (CheckpointRef, IdentityCheck, TurnVerdict, CellVerdict):
    _add_json_methods(_cls)


# ---------------------------------------------------------------- JSON form


def _to_json(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_json(v) for v in obj]
    return obj


def _from_json(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_json(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: _from_json(hints[k], v) for k, v in value.items() if k in known})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if origin is tuple:
        args = typing.get_args(tp)
        return tuple(_from_json(args[0] if args else Any, v) for v in value)
    if origin is list:
        args = typing.get_args(tp)
        return [_from_json(args[0] if args else Any, v) for v in value]
    if origin is dict:
        return dict(value)
    return value
