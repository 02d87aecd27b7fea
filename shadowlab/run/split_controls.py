"""Split-control cells (issue 16, docs/DESIGN.md §5): which restored warm turns get one, and how.

A split control is a fresh process that computes a restored warm turn's prompt through the warm
turn's batch schedule (`splits.warm_schedule`), without any restore: the reference engine takes
the schedule as `split_points`; llama-server is sent one request per batch break
(`splits.request_sequence`) with checkpoints off, each request a turn of the cell (its last turn
is the control's output). The run stage plans them
after the warm cells, from the warm and cold records (a mismatch can only be seen then), so
`build_plan` never does: a healthy run gets none and its plan.json is unchanged. The plan is a
pure function of the records, so `--resume` plans the same cells again and keeps those that ran.

The verdicts ask the same questions (`turn_schedule`, `no_control_reason`: judge/splits.py) of
the same records, so the reason a turn has no split control is computed in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from shadowlab.judge import identity, splits
from shadowlab.judge.splits import (  # the judge's questions, asked here of the same records
    cell_id, no_control_reason, turn_schedule)
from shadowlab.logs import parse as logparse
from shadowlab.results import records
from shadowlab.matrix import Matrix
from shadowlab.plan import Cell, CellKind, Plan, Turn

__all__ = ["NO_CHECKPOINTS", "by_requests", "cell_id", "no_control_reason", "plan_cells", "request_fields",
           "turn_schedule"]

# Appended to a llama-server split control's flags (the last occurrence wins): no request breaks
# early for a checkpoint of its own, so each batch break is one request (splits.py).
NO_CHECKPOINTS = ("--ctx-checkpoints", "0")


def by_requests(kind: str) -> bool:
    """Whether a split control of this engine kind is sent as a request sequence (llama-server)
    rather than as one request with `split_points` (the reference engine)."""
    return kind == "llama-server"


def request_fields(kind: str, split_points: Sequence[int]) -> dict[str, object]:
    """The body fields of a split control's (last) request. llama-server's must reuse the cache
    its prefix requests built, all in one slot; the reference engine's computes from 0."""
    if by_requests(kind):
        return {"cache_prompt": True, "id_slot": 0}
    return {"split_points": list(split_points), "cache_prompt": False}


def plan_cells(root: Path, matrix: Matrix, plan: Plan) -> list[Cell]:
    """The split-control cells the finished warm cells call for, in plan order."""
    every = matrix.identity.split_controls == "all"
    out: list[Cell] = []
    for cell in plan.of_kind(CellKind.WARM):
        meta = _ok_meta(root, cell.id)
        if meta is None or meta.engine is None or meta.engine.log_family == "none":
            continue
        log = records.RunLayout(root).engine_log(cell.id)
        events = logparse.parse(log, meta.engine.log_family).events if log.is_file() else ()
        for turn in cell.turns[1:]:
            if turn.cold_cell is None or turn.reference != "cold":
                continue  # traffic replays are compared turn by turn elsewhere; no schedule here
            schedule = turn_schedule(meta, events, turn.index)
            if schedule is None or no_control_reason(meta, schedule, turn.endpoint):
                continue
            if every or _mismatches(root, meta, turn):
                out.append(_control_cell(cell, turn, schedule, meta.engine))
    return out


def _control_cell(warm: Cell, turn: Turn, schedule: splits.Schedule, engine: records.EngineRecord) -> Cell:
    """The reference engine: one turn with the schedule as split points. llama-server: a turn per
    request, turn k sending the prompt's first `split_points[-1]` tokens (the lengths so far; the
    last turn's ends at the prompt's length), so each request is recorded and judged as a turn."""
    turns: tuple[Turn, ...] = (Turn(0, turn.prompt_id, turn.endpoint, split_points=schedule.split_points),)
    flags = warm.flags
    if by_requests(engine.kind):
        lengths, _ = splits.request_sequence(schedule, engine.log_family)
        turns = tuple(Turn(k, turn.prompt_id, turn.endpoint, split_points=tuple((lengths or ())[:k + 1]))
                      for k in range(len(lengths or ())))
        flags = (*warm.flags, *NO_CHECKPOINTS)
    return Cell(id=cell_id(warm.id, turn.index), kind=CellKind.SPLIT_CONTROL, engine=warm.engine,
                configuration=warm.configuration, sequence=warm.sequence, turns=turns,
                flags=flags, env=dict(warm.env), control_of=warm.id)


def _ok_meta(root: Path, cid: str) -> records.CellMeta | None:
    try:
        meta = records.read_meta(records.RunLayout(root).meta(cid))
    except (OSError, ValueError, TypeError, records.RunDirError):
        return None
    return meta if meta.status is records.CellStatus.OK else None


def _mismatches(root: Path, meta: records.CellMeta, turn: Turn) -> bool:
    cold = _ok_meta(root, turn.cold_cell or "")
    warm = next((t for t in meta.turns if t.index == turn.index), None)
    ref = next((t for t in cold.turns if t.index == turn.cold_turn), None) if cold else None
    if warm is None or ref is None or warm.completion is None or ref.completion is None:
        return False
    check = identity.compare(warm.completion.text, warm.completion.tokens, ref.completion.text,
                             ref.completion.tokens, reused_tokens=warm.reused_tokens)
    return check.status is identity.IdentityStatus.MISMATCH
