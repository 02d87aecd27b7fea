"""The turn timeline of report.html: one row per turn on a token axis, with the checkpoints
created, erased and restored (an SVG the template draws from these rows).

    build_timeline(cell) -> Timeline
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shadowlab.judge.verdicts import CellVerdict, CheckpointRef, TurnVerdict
from shadowlab.present import fit_label, label_width, nice_step

__all__ = ["GRID_TURNS", "TL_BAR_H", "Mark", "Timeline", "TimelineRow", "build_timeline"]


# -- timelines: one SVG per cell, one row per turn, x = token position -----------------------
# The SVGs carry a viewBox and are drawn at width 100% (at most their own width): they scale to
# the page. The label column is as wide as its longest label (present.label_width), so no label
# runs under the bars.

TL_WIDTH = 1200  # the whole SVG's user units
TL_RIGHT = 170  # outcome column
TL_ROW = 46
TL_TOP = 26
TL_BAR_H = 12

@dataclass(frozen=True)
class Mark:
    kind: str  # created | restored | erased | evicted | missed | alive | alive_below
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class TimelineRow:
    turn: TurnVerdict
    y: float
    bar_w: float
    reused_w: float
    divergence_x: float | None
    re_entry_x: float | None
    marks: tuple[Mark, ...]
    label: str
    title: str


@dataclass(frozen=True)
class Timeline:
    cell: CellVerdict
    width: int
    height: int
    plot_left: int
    plot_width: int
    ticks: tuple[tuple[float, str], ...]
    rows: tuple[TimelineRow, ...]
    axis_y: float

    @property
    def folded(self) -> bool:
        """A long cell (a traffic) starts folded: its summary is in the traffic section."""
        return len(self.rows) > GRID_TURNS


GRID_TURNS = 6  # a cell with more turns is summarised (grid) and folded (timeline)


def build_timeline(cell: CellVerdict) -> Timeline:
    span = max([t.prompt_tokens or 0 for t in cell.turns] + [t.cached_tokens or 0 for t in cell.turns] + [1])
    left = label_width([_turn_label(t) for t in cell.turns] + ["token position →"])
    plot = TL_WIDTH - left - TL_RIGHT
    scale = plot / span

    def x(pos: float) -> float:
        return round(left + min(max(pos, 0), span) * scale, 1)

    step = nice_step(span, max(2, plot // 110))  # a tick label ("123,456") every ≥ 110 units
    ticks = tuple((x(v), f"{v:,}") for v in range(0, span + 1, step))
    rows = tuple(_timeline_row(t, TL_TOP + i * TL_ROW, x, scale) for i, t in enumerate(cell.turns))
    height = TL_TOP + len(rows) * TL_ROW + 6
    return Timeline(cell, TL_WIDTH, height, left, plot, ticks, rows, height - 4)


def _turn_label(turn: TurnVerdict) -> str:
    return f"t{turn.index} {fit_label(turn.prompt_id)}"


def _timeline_row(turn: TurnVerdict, y: float, x: Any, scale: float) -> TimelineRow:
    length = turn.prompt_tokens or 0
    bar_y = y + 16
    marks: list[Mark] = []
    restored_key = _ckpt_key(turn.restored) if turn.restored else None
    gone = {_ckpt_key(c) for c in (*turn.erased_cascade, *turn.erased_other)}
    missed = {_ckpt_key(c) for c in turn.cascade_missed}
    below = {_ckpt_key(c) for c in turn.alive_below_divergence}
    for c in turn.alive_at_start:
        key = _ckpt_key(c)
        if key in gone or key == restored_key or key in missed:
            continue
        kind = "alive_below" if key in below else "alive"
        marks.append(Mark(kind, x(c.n_tokens), bar_y - 7, _ckpt_title("alive at turn start", c)))
    for c in turn.erased_cascade:
        marks.append(Mark("erased", x(c.n_tokens), bar_y - 7, _ckpt_title("erased by the cascade", c)))
    for c in turn.erased_other:
        marks.append(Mark("evicted", x(c.n_tokens), bar_y - 7, _ckpt_title("erased (ring full / too close)", c)))
    for c in turn.cascade_missed:
        marks.append(Mark("missed", x(c.n_tokens), bar_y - 7,
                          _ckpt_title("NOT erased although above the re-entry point (stale)", c)))
    if turn.restored:
        extra = f"; took {turn.restore_ms:.2f} ms" if turn.restore_ms is not None else ""
        marks.append(Mark("restored", x(turn.restored.n_tokens), bar_y + TL_BAR_H / 2,
                          _ckpt_title("restored", turn.restored) + extra))
    for c in turn.created:
        marks.append(Mark("created", x(c.n_tokens), bar_y + TL_BAR_H + 7, _ckpt_title("created", c)))
    re_entry = turn.re_entry_point
    reused = re_entry if re_entry is not None else (turn.reused_tokens or 0)
    label = _turn_label(turn)
    title = (f"turn {turn.index} ({turn.prompt_id}): {length:,} prompt tokens, outcome "
             f"{turn.outcome.value}, reused {turn.reused_tokens}, processed {turn.processed_tokens}")
    return TimelineRow(
        turn=turn, y=y, bar_w=round(length * scale, 1), reused_w=round(min(reused, length) * scale, 1),
        divergence_x=x(turn.divergence_point) if turn.divergence_point is not None and turn.index > 0 else None,
        re_entry_x=x(re_entry) if re_entry is not None and turn.index > 0 else None,
        marks=tuple(marks), label=label, title=title)


def _ckpt_key(c: CheckpointRef) -> tuple[int, int, int]:
    return (c.pos_min, c.pos_max, c.n_tokens)


def _ckpt_title(what: str, c: CheckpointRef) -> str:
    parts = [f"checkpoint {what}: pos_max {c.pos_max}, n_tokens {c.n_tokens}"]
    if c.created_turn is not None:
        parts.append(f"created in turn {c.created_turn}")
    if c.size_mib is not None:
        parts.append(f"{c.size_mib:.3f} MiB")
    if c.took_ms is not None:
        parts.append(f"{c.took_ms:.2f} ms")
    if c.line is not None:
        parts.append(f"engine.log line {c.line}")
    return "; ".join(parts)


# -- identity and provenance ----------------------------------------------------------------
