"""The report: report.html, report.md and junit.xml, a pure function of a run directory.

    render_run(run_dir) -> ReportPaths      writes the three files next to the cell records

- ``report.html`` — one self-contained page (inline CSS and SVG; no script, no network, no
  font): verdict banner, the matrix grid (configurations × sequences), the turn table, a turn
  timeline per cell on a token axis, identity with every mismatch expanded, the cold-vs-cold
  controls, expectations, parser notes and provenance. Rendered by Jinja2 with autoescape on:
  every string that came from an engine (completions, log lines, failure reasons) is data and is
  escaped; control characters and unpaired surrogates are shown as visible escapes.
- ``report.md`` — the verdict and compact tables, for a pull-request comment or a CI step summary.
- ``junit.xml`` — one test case per cell and one per check; failures carry the message.

Numbers come from the run directory as `shadowlab.gate.load_run` loaded it once (rundir.py; the
verdicts computed once from the records) and the gate's checks on those inputs, so the report,
the gate and CI never disagree. `render_inputs(inputs, result)` renders an already loaded run
(`shadowlab run` hands over what its gate judges).
"""

from __future__ import annotations

import math
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import markupsafe

from shadowlab.report import decision, traffic as report_traffic
from shadowlab.judge import plausibility
from shadowlab.results import records
from shadowlab.judge import gate as gate_mod
from shadowlab.escape import visible, xml_text
from shadowlab.judge.expectations import CheckResult, CheckStatus
from shadowlab.judge.gate import GateResult, RunInputs
from shadowlab.results.records import CellMeta, RunLayout, write_bytes_atomic
from shadowlab.judge.verdicts import CellVerdict, CheckpointRef, IdentityStatus, Outcome, RunVerdict, TurnVerdict

HTML_NAME, MARKDOWN_NAME, JUNIT_NAME = RunLayout.REPORT_HTML, RunLayout.REPORT_MD, RunLayout.JUNIT
CELL_ERRORS = ("ran", "plausible")  # checks that make a cell's own junit case an <error>


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    junit: Path

    def __iter__(self) -> Iterator[Path]:
        return iter((self.html, self.markdown, self.junit))


def render_run(run_dir: str | Path) -> ReportPaths:
    """Write report.html, report.md and junit.xml into `run_dir`. Raises RunDirError/MatrixError
    when the directory cannot be read (the CLI maps those to exit 2)."""
    inputs = gate_mod.load_run(Path(run_dir), write_verdicts=True)
    return render_inputs(inputs, gate_mod.evaluate_inputs(inputs))


def render_inputs(inputs: RunInputs, result: GateResult) -> ReportPaths:
    """Write the three files for a loaded run and the gate's result on it."""
    root = inputs.run_dir
    paths = ReportPaths(root / HTML_NAME, root / MARKDOWN_NAME, root / JUNIT_NAME)
    with records.storage_errors(records.DERIVED_WRITE_HINT):  # exit 3, one line naming the file
        write_bytes_atomic(paths.html, _encode(render_html(inputs, result)))
        write_bytes_atomic(paths.markdown, _encode(render_markdown(inputs, result)))
        write_bytes_atomic(paths.junit, render_junit(inputs, result))
    return paths


def _encode(text: str) -> bytes:
    return text.encode("utf-8", errors="backslashreplace")


# ---------------------------------------------------------------- text from engines


def md_cell(text: Any) -> str:
    """One markdown table cell: no raw HTML (GitHub renders it), no pipes, one line."""
    value = visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return value.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


# ---------------------------------------------------------------- view model


OUTCOME_CLASS = {
    Outcome.COLD: "cold", Outcome.EXTENDED: "ext", Outcome.RESTORED: "rest",
    Outcome.FORCED: "forced", Outcome.SILENT_RESET: "silent", Outcome.ERROR: "err",
}
IDENTITY_MARK = {
    IdentityStatus.IDENTICAL: ("=", "id-ok", "identical to cold after reuse"),
    IdentityStatus.IDENTICAL_NO_REUSE: ("≈", "id-weak", "identical, but nothing was reused: no evidence"),
    IdentityStatus.MISMATCH: ("≠", "id-bad", "differs from cold"),
    IdentityStatus.NO_REFERENCE: ("?", "id-none", "no cold reference"),
    IdentityStatus.ERROR: ("!", "id-bad", "comparison failed"),
}


@dataclass(frozen=True)
class GridRow:
    configuration: str
    description: str
    delta: str
    cells: tuple[CellVerdict | None, ...]  # one per sequence; None: not in the matrix's selection


@dataclass(frozen=True)
class Grid:
    engine: str
    sequences: tuple[str, ...]
    rows: tuple[GridRow, ...]


def build_grids(inputs: RunInputs) -> list[Grid]:
    m = inputs.matrix
    warm = {(c.engine, c.configuration, c.sequence): c for c in inputs.verdict.cells if c.kind == "warm"}
    grids = []
    for engine in m.engines:
        sequences = tuple(s for s in m.sequences if any(k[0] == engine and k[2] == s for k in warm))
        rows = []
        for name, conf in m.configurations.items():
            cells = tuple(warm.get((engine, name, s)) for s in sequences)
            if any(cells):
                delta = " ".join([*conf.flags, *(f"{k}={v}" for k, v in conf.env.items())])
                rows.append(GridRow(name, conf.description, delta, cells))
        if rows:
            grids.append(Grid(engine, sequences, tuple(rows)))
    return grids


def describe_turn(turn: TurnVerdict) -> str:
    """One sentence on what the engine did with its cache on this turn (the case study's words)."""
    length = _num(turn.prompt_tokens)
    created = ", ".join(str(c.pos_max) for c in turn.created)
    made = f"; checkpoints created at pos_max {created}" if created else ""
    erased = f"{len(turn.erased_cascade)}"
    if turn.cascade_missed:
        erased += f" but KEPT {len(turn.cascade_missed)} stale checkpoint(s) above the re-entry point"
    if turn.outcome is Outcome.COLD:
        return f"cold: {length} tokens prefilled{made}"
    if turn.outcome is Outcome.ERROR:
        return f"failed: {turn.error or 'no detail'}"
    div = _num(turn.divergence_point)
    if turn.outcome is Outcome.EXTENDED:
        return f"extended the cache: reused {_num(turn.reused_tokens)} of {length} tokens{made}"
    if turn.outcome is Outcome.RESTORED:
        ckpt = turn.restored.pos_max if turn.restored else "?"
        cost = f", restore {turn.restore_ms:.1f} ms" if turn.restore_ms is not None else ""
        return (f"diverged at {div}; restored the checkpoint at pos_max {ckpt}, re-entry "
                f"{_num(turn.re_entry_point)} → {_num(turn.reused_tokens)} tokens saved = "
                f"{_pct(turn.saved_fraction)} of the prefill{cost}; cascade erased {erased}{made}")
    if turn.outcome is Outcome.FORCED:
        above = turn.alive_above_divergence
        miss = ""
        if above and turn.divergence_point is not None:
            nearest = min(above, key=lambda c: c.pos_max)
            miss = (f"; the nearest (pos_max {nearest.pos_max}) lies "
                    f"{nearest.pos_max - turn.divergence_point} tokens above it")
        return (f"diverged at {div}; {len(turn.alive_below_divergence)} checkpoint(s) below it, "
                f"{len(above)} above{miss} → forced: all {length} tokens re-processed; cascade "
                f"erased {erased}{made}")
    return (f"zero overlap: silent reset (no forcing line), all {length} tokens re-processed; "
            f"cascade erased {erased}{made}")


# -- timelines: one SVG per cell, one row per turn, x = token position -----------------------

TL_LEFT = 150  # label column
TL_PLOT = 1020
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


def nice_step(span: int, target_ticks: int = 8) -> int:
    raw = max(span / target_ticks, 1)
    power = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * power:
            return max(int(mult * power), 1)
    return int(10 * power)


def build_timeline(cell: CellVerdict) -> Timeline:
    span = max([t.prompt_tokens or 0 for t in cell.turns] + [t.cached_tokens or 0 for t in cell.turns] + [1])
    scale = TL_PLOT / span

    def x(pos: float) -> float:
        return round(TL_LEFT + min(max(pos, 0), span) * scale, 1)

    step = nice_step(span)
    ticks = tuple((x(v), f"{v:,}") for v in range(0, span + 1, step))
    rows = tuple(_timeline_row(t, TL_TOP + i * TL_ROW, x, scale) for i, t in enumerate(cell.turns))
    height = TL_TOP + len(rows) * TL_ROW + 6
    return Timeline(cell, TL_LEFT + TL_PLOT + TL_RIGHT, height, TL_LEFT, TL_PLOT, ticks, rows, height - 4)


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
    label = f"t{turn.index} {turn.prompt_id}"
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


@dataclass(frozen=True)
class IdentityRow:
    cell: CellVerdict
    turn: TurnVerdict
    check: Any  # IdentityCheck


def identity_rows(run: RunVerdict) -> list[IdentityRow]:
    return [IdentityRow(c, t, t.identity) for c in run.cells if c.kind == "warm"
            for t in c.turns if t.identity is not None]


def diff_split(text: str | None, byte_offset: int | None) -> tuple[str, str]:
    """Split text at the first differing UTF-8 byte (for highlighting)."""
    if text is None:
        return "", ""
    if byte_offset is None:
        return text, ""
    data = text.encode("utf-8", errors="surrogatepass")
    head = data[:byte_offset].decode("utf-8", errors="ignore")
    return head, text[len(head):]


@dataclass(frozen=True)
class EngineProvenance:
    name: str
    kind: str
    version: str
    binary: str
    binary_sha256: str
    model: str
    model_sha256: str
    device: str
    cells: int


def engine_provenance(metas: Mapping[str, CellMeta]) -> list[EngineProvenance]:
    seen: dict[tuple[str, str, str], list[CellMeta]] = {}
    for meta in metas.values():
        e = meta.engine
        if e is None:
            continue
        seen.setdefault((e.name, e.binary_sha256, e.model_sha256), []).append(meta)
    out = []
    for (_, _, _), group in seen.items():
        e = group[0].engine
        assert e is not None
        device = group[0].gpu.reported_device if group[0].gpu else None
        out.append(EngineProvenance(e.name, e.kind, e.version, e.binary_path, e.binary_sha256, e.model_path,
                                    e.model_sha256, device or "—", len(group)))
    return out


@dataclass(frozen=True)
class EngineProcess:
    """What ran for one cell: a matrix is trusted code (it names any program and environment),
    so the report shows exactly what it started."""

    cell_id: str
    status: str
    command: str  # shell-quoted, as started
    env_delta: tuple[tuple[str, str], ...]  # variables set or changed against shadowlab's own


def engine_processes(metas: Mapping[str, CellMeta]) -> list[EngineProcess]:
    return [EngineProcess(cell_id, getattr(m.status, "value", str(m.status)),
                          shlex.join(str(a) for a in m.command or ()),
                          tuple(sorted((str(k), str(v)) for k, v in (m.env_delta or {}).items())))
            for cell_id, m in metas.items()]


@dataclass(frozen=True)
class ImpossibleFigure:
    cell: CellVerdict
    turn: TurnVerdict
    problem: str


def impossible_figures(run: RunVerdict) -> list[ImpossibleFigure]:
    """Every figure the plausibility rules refused, cell by cell, turn by turn."""
    return [ImpossibleFigure(c, t, p) for c in run.cells for t in c.turns for p in t.implausible]


# ---------------------------------------------------------------- HTML


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("shadowlab", "templates"),
        autoescape=True,  # every template, whatever its extension: engine text is untrusted
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_visible_output,  # every {{ }}: no field can forget `| visible`
    )
    env.filters.update(visible=visible, pct=_pct, num=_num, ms=_ms, short_sha=_short_sha)
    return env


def turn_table_rows(cell: CellVerdict) -> int:
    """Rows a cell takes in the turn table: one per turn, plus a row for a turn's impossible
    figures and one for its disagreements and notes (the cell column spans them all)."""
    return sum(1 + bool(t.implausible) + bool(t.disagreements or t.notes) for t in cell.turns)


def _visible_output(value: Any) -> Any:
    """Each template output made visible before autoescape. Markup (a macro's own HTML, whose
    parts went through here already) passes as it is."""
    if value is None or isinstance(value, (markupsafe.Markup, int, float)):
        return value
    return visible(value)


def render_html(inputs: RunInputs, result: GateResult, metas: Mapping[str, CellMeta] | None = None) -> str:
    run = inputs.verdict
    metas = inputs.metas if metas is None else metas
    warm = [c for c in run.cells if c.kind == "warm"]
    context = dict(
        inputs=inputs, matrix=inputs.matrix, run=run, result=result, metas=metas,
        env=_fields(inputs.environment), blank=_Fields(), grids=build_grids(inputs), warm=warm,
        timelines=[build_timeline(c) for c in warm if c.turns],
        traffic=_traffic_sections(inputs, metas),
        identity_rows=identity_rows(run), controls=[c for c in run.cells if c.kind == "control"],
        expectation_checks=[c for c in result.checks if c.source != "default"],
        default_checks=[c for c in result.checks if c.source == "default"],
        engines=engine_provenance(metas), failures=result.failures,
        processes=engine_processes(metas), impossible=impossible_figures(run),
        counts=_status_counts(result.checks), totals=_totals(warm),
        outcome_class=OUTCOME_CLASS, identity_mark=IDENTITY_MARK, diff_split=diff_split,
        describe_turn=describe_turn, table_rows=turn_table_rows,
        Outcome=Outcome, IdentityStatus=IdentityStatus, CheckStatus=CheckStatus,
        TL_BAR_H=TL_BAR_H, decisions=decision.decisions(inputs, result),
    )
    return _environment().get_template("report.html.j2").render(**context)


class _Fields(dict):  # type: ignore[type-arg]
    """A record's object as the template reads it: a field it lacks is None (a run directory
    without environment.json, or an older one, renders '—' instead of failing the report)."""

    def __missing__(self, key: str) -> None:
        return None


def _fields(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _Fields({k: _fields(v) for k, v in value.items()})
    return value


def _status_counts(checks: Sequence[CheckResult]) -> dict[str, int]:
    return {s.value: sum(1 for c in checks if c.status is s) for s in CheckStatus}


@dataclass(frozen=True)
class Totals:
    turns: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    impossible_cells: int = 0  # warm cells left out: their figures are no results


def _totals(warm: Sequence[CellVerdict]) -> Totals:
    believable = [c for c in warm if not plausibility.cell_problems(c)]
    turns = [t for c in believable for t in c.turns]
    outcomes: dict[str, int] = {}
    for t in turns:
        outcomes[t.outcome.value] = outcomes.get(t.outcome.value, 0) + 1
    return Totals(len(turns), sum(t.prompt_tokens or 0 for t in turns),
                  sum(t.reused_tokens or 0 for t in turns), outcomes, len(warm) - len(believable))


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _num(value: int | float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _short_sha(value: str | None) -> str:
    return "—" if not value else value[:12]


# ---------------------------------------------------------------- Markdown


def render_markdown(inputs: RunInputs, result: GateResult, metas: Mapping[str, CellMeta] | None = None) -> str:
    run = inputs.verdict
    metas = inputs.metas if metas is None else metas
    icon = ("⚠️" if result.unverified else "✅") if result.qualified else "❌"
    lines = [f"## {icon} shadowlab `{md_cell(inputs.matrix.name)}` — {result.verdict_text} "
             f"(exit {result.exit_code})", ""]
    counts = _status_counts(result.checks)
    lines.append(f"run `{md_cell(run.run_id)}` · {len(run.cells)} cells · checks: "
                 + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    lines.append("")
    if result.unverified:
        lines += [f"> **{md_cell(result.unverified)}**", ""]
    impossible = impossible_figures(run)
    if impossible:
        lines += ["### ⛔ Impossible figures — the engine cannot be believed", "",
                  "An engine reported figures no engine can truthfully report; its cells fail as an "
                  "infrastructure failure (exit 3).", "", "| cell | turn | impossible figure |", "|---|---|---|"]
        lines += [f"| {md_cell(f.cell.cell_id)} | {f.turn.index} {md_cell(f.turn.prompt_id)} | {md_cell(f.problem)} |"
                  for f in impossible]
        lines.append("")
    if result.failures:
        lines += ["### Failed checks", "", "| status | check | subject | expected | actual | message |",
                  "|---|---|---|---|---|---|"]
        for c in result.failures:
            lines.append(f"| {c.status.value} | {md_cell(c.check)} | {md_cell(c.subject)} | "
                         f"{md_cell(c.expected)} | {md_cell(c.actual)} | {md_cell(c.message)} |")
        lines.append("")
    lines += decision.markdown(decision.decisions(inputs, result), md_cell)
    for grid in build_grids(inputs):
        lines += [f"### Matrix — engine `{md_cell(grid.engine)}`", "",
                  "| configuration | " + " | ".join(md_cell(s) for s in grid.sequences) + " |",
                  "|---|" + "---|" * len(grid.sequences)]
        for row in grid.rows:
            cells = [_md_grid_cell(c) for c in row.cells]
            lines.append(f"| {md_cell(row.configuration)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### Turns (after the first, which is cold)", "",
              "| cell | turn | prompt | tokens | divergence | re-entry | reused | saved | outcome | identity |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in (c for c in run.cells if c.kind == "warm"):
        for t in cell.turns[1:]:
            ident = t.identity.status.value if t.identity else ""
            lines.append(
                f"| {md_cell(cell.cell_id)} | {t.index} | {md_cell(t.prompt_id)} | {_num(t.prompt_tokens)} | "
                f"{_num(t.divergence_point)} | {_num(t.re_entry_point)} | {_num(t.reused_tokens)} | "
                f"{_pct(t.saved_fraction)} | {t.outcome.value}{' ⛔ impossible figures' if t.implausible else ''} | {ident} |")
    lines.append("")
    declared = [c for c in result.checks if c.source != "default"]
    if declared:
        passed = sum(1 for c in declared if c.passed)
        lines += [f"### Expectations — {passed}/{len(declared)} passed", "",
                  "| status | check | subject | expected | actual |", "|---|---|---|---|---|"]
        for c in declared:
            lines.append(f"| {'pass' if c.passed else '**' + c.status.value + '**'} | {md_cell(c.check)} | "
                         f"{md_cell(c.subject)} | {md_cell(c.expected)} | {md_cell(c.actual)} |")
        lines.append("")
    lines += report_traffic.markdown(_traffic_sections(inputs, metas), md_cell)
    lines += _md_processes(engine_processes(metas or {}))
    env = inputs.environment
    sl = env.get("shadowlab", {}) if isinstance(env.get("shadowlab"), dict) else {}
    lines.append(f"<sub>shadowlab {md_cell(sl.get('version'))} @ {md_cell(_short_sha(sl.get('commit')))}"
                 f"{' (dirty)' if sl.get('dirty') else ''} · host {md_cell(env.get('host'))} · "
                 f"full report: report.html</sub>")
    return "\n".join(lines) + "\n"


def _traffic_sections(inputs: RunInputs, metas: Mapping[str, CellMeta]) -> list[report_traffic.TrafficSection]:
    """The traffic sections, with each sequence's `in_flight` and how many each cell reached."""
    in_flight = {name: getattr(seq, "in_flight", 1) for name, seq in inputs.matrix.sequences.items()}
    reached = {cell_id: max(t.in_flight for t in m.turns if t.in_flight is not None)
               for cell_id, m in metas.items() if any(t.in_flight is not None for t in m.turns)}
    return report_traffic.build(inputs.verdict, _traffic_sequences(inputs), in_flight, reached)


def _traffic_sequences(inputs: RunInputs) -> list[str]:
    """The matrix's traffic sequences, in matrix order (the report's traffic section)."""
    return [name for name, seq in inputs.matrix.sequences.items() if getattr(seq, "kind", None) == "traffic"]


def _md_processes(processes: Sequence[EngineProcess]) -> list[str]:
    """Every engine process's command line and environment delta (a matrix is trusted code)."""
    if not processes:
        return []
    lines = [f"<details><summary>Engine processes ({len(processes)}): command line and environment "
             "delta of each</summary>", "", "| cell | status | command | environment delta |", "|---|---|---|---|"]
    for p in processes:
        env = " ".join(f"{k}={v}" for k, v in p.env_delta) or "—"
        lines.append(f"| {md_cell(p.cell_id)} | {md_cell(p.status)} | {md_cell(p.command)} | {md_cell(env)} |")
    return lines + ["", "</details>", ""]


def _md_grid_cell(cell: CellVerdict | None) -> str:
    if cell is None:
        return "—"
    if cell.status != "ok":
        return f"**{md_cell(cell.status)}**"
    parts = ["**⛔ impossible figures**"] if any(t.implausible for t in cell.turns) else []
    for t in cell.turns:
        text = f"{md_cell(t.prompt_id)}:{t.outcome.value}"
        if t.index > 0 and t.saved_fraction is not None:
            text += f" {_pct(t.saved_fraction)}"
        if t.identity is not None and t.identity.status is IdentityStatus.MISMATCH:
            text += " ≠cold" + (f" ({md_cell(t.triage.cls)})" if t.triage is not None else "")
        parts.append(text)
    return " → ".join(parts)


# ---------------------------------------------------------------- JUnit XML


def render_junit(inputs: RunInputs, result: GateResult) -> bytes:
    """<testsuites> with a `cells` suite (one case per cell) and a `checks` suite (one per check)."""
    root = ET.Element("testsuites", name=xml_text(f"shadowlab {inputs.matrix.name}"))
    if result.unverified:
        props = ET.SubElement(root, "properties")
        ET.SubElement(props, "property", name="shadowlab.unverified", value=xml_text(result.unverified))
    cells = ET.SubElement(root, "testsuite", name="cells")
    by_cell: dict[str, list[CheckResult]] = {}
    for c in result.checks:
        if c.cell_id:
            by_cell.setdefault(c.cell_id, []).append(c)
    cell_ids = list(dict.fromkeys([*inputs.planned, *(c.cell_id for c in inputs.verdict.cells)]))
    known = {c.cell_id: c for c in inputs.verdict.cells}
    for cell_id in cell_ids:
        case = ET.SubElement(cells, "testcase", classname=xml_text(f"shadowlab.cells.{_kind(known, cell_id)}"),
                             name=xml_text(cell_id))
        # A cell that did not run, or whose engine cannot be believed (`plausible`), is an error.
        errors = [c for c in by_cell.get(cell_id, []) if c.status is CheckStatus.ERROR and c.check in CELL_ERRORS]
        failed = [c for c in by_cell.get(cell_id, []) if c.status.failed and c.check not in CELL_ERRORS]
        if errors:
            _fail(case, "error", errors[0].message, "\n".join(f"{c.check}: {c.message}" for c in errors))
        elif failed:
            _fail(case, "failure", f"{len(failed)} check(s) failed on this cell",
                  "\n".join(f"{c.check}: {c.subject}: {c.message}" for c in failed))
        if cell_id in known:
            ET.SubElement(case, "system-out").text = xml_text(_cell_summary(known[cell_id]))
    checks = ET.SubElement(root, "testsuite", name="checks")
    for c in result.checks:
        if c.check == "ran":
            continue  # it is the cell's own test case
        case = ET.SubElement(checks, "testcase", classname=xml_text(f"shadowlab.checks.{c.check}"),
                             name=xml_text(f"{c.subject} [{c.source}]"))
        if c.status.failed:
            detail = f"expected: {c.expected}\nactual: {c.actual}\n{c.message}"
            if c.description:
                detail += f"\nwhy expected: {c.description}"
            _fail(case, "error" if c.status is CheckStatus.ERROR else "failure",
                  f"{c.status.value}: {c.message}", detail)
    suites = [cells, checks]
    if result.unverified:  # shown in CI as not verified, not as a pass of the evidence
        evidence = ET.SubElement(root, "testsuite", name="evidence")
        case = ET.SubElement(evidence, "testcase", classname="shadowlab.evidence", name="cell records (cells/)")
        ET.SubElement(case, "skipped", message=xml_text(result.unverified))
        suites.append(evidence)
    for suite in suites:
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for k in cases if k.find("failure") is not None)))
        suite.set("errors", str(sum(1 for k in cases if k.find("error") is not None)))
        suite.set("skipped", str(sum(1 for k in cases if k.find("skipped") is not None)))
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _fail(case: ET.Element, tag: str, message: str, text: str) -> None:
    element = ET.SubElement(case, tag, message=xml_text(message), type=tag)
    element.text = xml_text(text)


def _kind(known: dict[str, CellVerdict], cell_id: str) -> str:
    return known[cell_id].kind if cell_id in known else "missing"


def _cell_summary(cell: CellVerdict) -> str:
    parts = [f"{cell.kind} {cell.engine}/{cell.configuration}/{cell.sequence}: {cell.status}"]
    for t in cell.turns:
        parts.append(f"turn {t.index} {t.prompt_id}: {t.outcome.value}, reused {t.reused_tokens} of "
                     f"{t.prompt_tokens}")
    return "\n".join(parts)
