"""The report's traffic section (issue 12; docs/DESIGN.md §2 "Traffic sequences").

Per traffic sequence and engine: per configuration the prompt tokens, what a perfect cache would
still have processed (prompt − ideal), what the engine processed, and the recovered share
(verdicts.traffic_summary: Σ reused / Σ ideal), drawn as bars on one token axis; and per
conversation which requests erased its checkpoints. The erasures come from the verdicts'
lifecycle replay: every erase line of a turn names a checkpoint whose `created_turn` the replay
knows, and that turn's conversation owns it. A cell whose engine reported impossible figures
draws no bar (`excluded` names it): its figures are no results. Pure: a function of the RunVerdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from shadowlab.judge.plausibility import cell_problems
from shadowlab.present import label_width, pct
from shadowlab.judge.verdicts import CellVerdict, RunVerdict, traffic_summary

TR_WIDTH, TR_ROW, TR_TOP, TR_BAR_H, TR_RIGHT, TR_CAPTION = 820, 34, 24, 12, 130, 22


@dataclass(frozen=True)
class Erasure:
    """Turn `turn` (an interloper, or a turn of conversation `by`) erased checkpoints of `owner`."""

    owner: str
    turn: int
    by: str | None  # the erasing turn's conversation; None: an interloper
    positions: tuple[int, ...]  # pos_max of each erased checkpoint

    def text(self) -> str:
        who = "interloper" if self.by is None else f"conversation {self.by}"
        at = [f"{p:,}" for p in self.positions]
        joined = at[0] if len(at) == 1 else ", ".join(at[:-1]) + " and " + at[-1]
        return f"turn {self.turn} ({who}) erased conversation {self.owner}'s checkpoints at {joined}"


@dataclass(frozen=True)
class TrafficRow:
    configuration: str
    cell_id: str
    prompt: int
    ideal: int
    reused: int
    share: float | None
    y: float
    processed_w: float  # bar widths on the section's axis
    reused_w: float
    ideal_x: float  # x of prompt − ideal: what a perfect cache would have processed
    erasures: tuple[Erasure, ...]
    max_in_flight: int | None = None  # most requests in flight at once, as sent (records); None: one at a time

    @property
    def processed(self) -> int:
        return self.prompt - self.reused

    @property
    def label(self) -> str:
        return _label(self.cell_id, self.configuration)


@dataclass(frozen=True)
class TrafficSection:
    engine: str
    sequence: str
    rows: tuple[TrafficRow, ...]
    width: int
    height: int
    ticks: tuple[tuple[float, str], ...]
    left: int = 150  # x where the bars start (as wide as the longest label)
    in_flight: int = 1  # the sequence's `in_flight`
    excluded: tuple[str, ...] = ()  # cells drawn no bar: impossible figures (the first named)

    @property
    def in_flight_text(self) -> str:
        """What the section's sending was, in a sentence ('' for one request at a time)."""
        if self.in_flight <= 1:
            return ""
        seen = sorted({r.max_in_flight for r in self.rows if r.max_in_flight is not None})
        reached = "" if not seen else f" (reached: {'/'.join(map(str, seen))})"
        return (f"Sent with up to {self.in_flight} requests in flight{reached}, a conversation waiting for its "
                "reply; turns tied to their tasks and judged in the order the engine served them.")


def erasures(cell: CellVerdict) -> tuple[Erasure, ...]:
    """Per turn, the checkpoints it erased (cascade or ring) that another conversation's turn
    created, grouped by owner; a turn's own conversation erasing its own checkpoints is no loss
    to report."""
    owner_of = {t.index: t.conversation for t in cell.turns}
    out: list[Erasure] = []
    for t in cell.turns:
        lost: dict[str, list[int]] = {}
        for ref in (*t.erased_cascade, *t.erased_other):
            owner = owner_of.get(ref.created_turn) if ref.created_turn is not None else None
            if owner is not None and owner != t.conversation:
                lost.setdefault(owner, []).append(ref.pos_max)
        out += [Erasure(owner, t.index, t.conversation, tuple(sorted(p))) for owner, p in lost.items()]
    return tuple(out)


def build(run: RunVerdict, traffic_sequences: Sequence[str], in_flight: Mapping[str, int] | None = None,
          reached: Mapping[str, int] | None = None) -> list[TrafficSection]:
    """One section per (engine, traffic sequence) with a warm cell that has ideals.
    ``in_flight``: sequence -> its `in_flight`; ``reached``: cell id -> the most requests its
    records had in flight at once."""
    sections = []
    for engine in dict.fromkeys(c.engine for c in run.cells):
        for sequence in traffic_sequences:
            cells = [c for c in run.cells if c.kind == "warm" and c.engine == engine and c.sequence == sequence
                     and any(t.ideal_tokens is not None for t in c.turns)]
            if cells:
                section = _section(engine, sequence, [c for c in cells if not cell_problems(c)],
                                   (in_flight or {}).get(sequence, 1), reached or {})
                excluded = tuple(f"{c.cell_id}: {cell_problems(c)[0]}" for c in cells if cell_problems(c))
                sections.append(replace(section, excluded=excluded))
    return sections


def _section(engine: str, sequence: str, cells: list[CellVerdict], in_flight: int = 1,
             reached: Mapping[str, int] | None = None) -> TrafficSection:
    sums = [traffic_summary(c) for c in cells]
    longest = max((s[0] for s in sums), default=1) or 1
    scale = TR_WIDTH / longest
    labels = [_label(c.cell_id, c.configuration) for c in cells]
    left = label_width(labels, least=90)
    rows = []
    for i, (cell, (prompt, ideal, reused, share)) in enumerate(zip(cells, sums)):
        rows.append(TrafficRow(
            configuration=cell.configuration, cell_id=cell.cell_id, prompt=prompt, ideal=ideal, reused=reused,
            share=share, y=TR_TOP + i * TR_ROW, processed_w=round((prompt - reused) * scale, 1),
            reused_w=round(reused * scale, 1), ideal_x=round(left + (prompt - ideal) * scale, 1),
            erasures=erasures(cell), max_in_flight=(reached or {}).get(cell.cell_id)))
    step = _step(longest)
    ticks = tuple((round(left + v * scale, 1), f"{v:,}") for v in range(0, longest + 1, step))
    return TrafficSection(engine, sequence, tuple(rows), left + TR_WIDTH + TR_RIGHT,
                          TR_TOP + len(rows) * TR_ROW + 8 + TR_CAPTION, ticks, left=left, in_flight=in_flight)


def _label(cell_id: str, configuration: str) -> str:
    """The configuration, and which repeat (`<cell>.r<k>`) when the matrix repeats cells."""
    head, _, tail = cell_id.rpartition(".")
    return f"{configuration} {tail}" if head and tail[:1] == "r" and tail[1:].isdigit() else configuration


def _step(span: int, ticks: int = 6) -> int:
    raw = max(1, span // ticks)
    magnitude = 10 ** (len(str(raw)) - 1)
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def markdown(sections: Sequence[TrafficSection], md_cell) -> list[str]:
    """The report.md lines of the traffic sections (md_cell escapes engine and matrix text)."""
    lines: list[str] = []
    for s in sections:
        lines += [f"### Traffic `{md_cell(s.sequence)}` — engine `{md_cell(s.engine)}`", ""]
        if s.in_flight_text:
            lines += [s.in_flight_text, ""]
        lines += ["| configuration | prompt tokens | ideal processed | processed | recovered of the ideal |",
                  "|---|---|---|---|---|"]
        for r in s.rows:
            lines.append(f"| {md_cell(r.label)} | {r.prompt:,} | {r.prompt - r.ideal:,} | "
                         f"{r.processed:,} | {pct(r.share)} |")
        lines.append("")
        lines += [f"- not shown (impossible figures, no result): {md_cell(e)}" for e in s.excluded]
        lines += [""] if s.excluded else []
        for r in s.rows:
            if r.erasures:
                lines.append(f"Erased checkpoints under `{md_cell(r.label)}`:")
                lines += [f"- {md_cell(e.text())}" for e in r.erasures]
                lines.append("")
    return lines
