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

import shlex
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab import present
from shadowlab.present import nice_step, num, pct, short_sha, signed  # nice_step: re-exported (tests)
from shadowlab.report import decision, traffic as report_traffic
from shadowlab.report.junit import CELL_ERRORS, render_junit  # re-exported: the report's third file
from shadowlab.report.timeline import GRID_TURNS, TL_BAR_H, Timeline, build_timeline  # re-exported
from shadowlab.judge import plausibility
from shadowlab.results import records
from shadowlab.judge import gate as gate_mod
from shadowlab.escape import visible, xml_text  # re-exported (tests)
from shadowlab.judge.expectations import CheckStatus
from shadowlab.judge.gate import GateResult, RunInputs
from shadowlab.results.records import CellMeta, RunLayout, write_bytes_atomic
from shadowlab.judge.verdicts import CellVerdict, IdentityStatus, Outcome, RunVerdict, TurnVerdict

HTML_NAME, MARKDOWN_NAME, JUNIT_NAME = RunLayout.REPORT_HTML, RunLayout.REPORT_MD, RunLayout.JUNIT


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    junit: Path

    def __iter__(self) -> Iterator[Path]:
        return iter((self.html, self.markdown, self.junit))


def render_run(run_dir: str | Path, candidate: str | None = None) -> ReportPaths:
    """Write report.html, report.md and junit.xml into `run_dir`. Raises RunDirError/MatrixError
    when the directory cannot be read, ShadowlabError for a `candidate` (`--gate-candidate`) the
    matrix does not configure (the CLI maps those to exit 2)."""
    inputs = gate_mod.load_run(Path(run_dir), write_verdicts=True)
    return render_inputs(inputs, gate_mod.evaluate_inputs(inputs, candidate))


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


@dataclass(frozen=True)
class GridSummary:
    """A long cell (a traffic) in one grid cell: what its turns after the first reused."""

    reused: int
    prompt: int
    outcomes: tuple[tuple[TurnVerdict, int], ...]  # (first turn of an outcome, how many)
    mismatches: int

    @property
    def share(self) -> float | None:
        return self.reused / self.prompt if self.prompt else None


def grid_summary(cell: CellVerdict) -> GridSummary:
    later = cell.turns[1:]
    first: dict[Outcome, TurnVerdict] = {}
    count: Counter[Outcome] = Counter()
    for t in later:
        first.setdefault(t.outcome, t)
        count[t.outcome] += 1
    mismatches = sum(1 for t in later if t.identity is not None and t.identity.status is IdentityStatus.MISMATCH)
    return GridSummary(sum(t.reused_tokens or 0 for t in later), sum(t.prompt_tokens or 0 for t in later),
                       tuple((first[o], n) for o, n in count.items()), mismatches)


def describe_turn(turn: TurnVerdict) -> str:
    """One sentence on what the engine did with its cache on this turn (the case study's words)."""
    length = num(turn.prompt_tokens)
    created = ", ".join(str(c.pos_max) for c in turn.created)
    made = f"; checkpoints created at pos_max {created}" if created else ""
    erased = f"{len(turn.erased_cascade)}"
    if turn.cascade_missed:
        erased += f" but KEPT {len(turn.cascade_missed)} stale checkpoint(s) above the re-entry point"
    if turn.outcome is Outcome.COLD:
        return f"cold: {length} tokens prefilled{made}"
    if turn.outcome is Outcome.ERROR:
        return f"failed: {turn.error or 'no detail'}"
    div = num(turn.divergence_point)
    if turn.outcome is Outcome.EXTENDED:
        return f"extended the cache: reused {num(turn.reused_tokens)} of {length} tokens{made}"
    if turn.outcome is Outcome.RESTORED:
        ckpt = turn.restored.pos_max if turn.restored else "?"
        cost = f", restore {turn.restore_ms:.1f} ms" if turn.restore_ms is not None else ""
        return (f"diverged at {div}; restored the checkpoint at pos_max {ckpt}, re-entry "
                f"{num(turn.re_entry_point)} → {num(turn.reused_tokens)} tokens saved = "
                f"{pct(turn.saved_fraction)} of the prefill{cost}; cascade erased {erased}{made}")
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


PER_CELL = "‹per cell›"
PER_CONFIGURATION = "‹per configuration›"


@dataclass(frozen=True)
class ConfigurationProcesses:
    """What one configuration's engine processes set where the engine's vary by configuration."""

    configuration: str
    cells: int
    statuses: str  # "3 ok" / "2 ok, 1 failed"
    flags: str  # "-np 4": the ‹per configuration› parts of the command line, with their flags
    env: str  # "PXA_CKPT_PROMPT_POLICY=0 SHADOWLAB_SLOT_AFFINITY=1"


@dataclass(frozen=True)
class ProcessGroup:
    """One engine's processes, said once: the command line and environment delta every cell
    shares, a part that differs by configuration marked ‹per configuration› (and said per
    configuration), one that differs between cells of a configuration ‹per cell› (a port, a
    directory) and named in `varying`. Every cell's own line stays in `processes`."""

    engine: str
    cells: int
    command: str
    env_delta: tuple[tuple[str, str], ...]
    varying: tuple[str, ...]  # "--port: 24945 … 24960 (24 values)"
    configurations: tuple[ConfigurationProcesses, ...]


def process_groups(metas: Mapping[str, CellMeta]) -> list[ProcessGroup]:
    """One group per engine (and command-line length: a configuration that adds flags is its own)."""
    groups: dict[tuple[str, int], dict[str, list[CellMeta]]] = {}
    for m in metas.values():
        cell = m.cell if isinstance(m.cell, Mapping) else {}
        key = (str(cell.get("engine", m.engine.name if m.engine else "?")), len(m.command or ()))
        groups.setdefault(key, {}).setdefault(str(cell.get("configuration", "?")), []).append(m)
    return [_process_group(engine, by_conf) for (engine, _), by_conf in groups.items()]


def _process_group(engine: str, by_conf: Mapping[str, Sequence[CellMeta]]) -> ProcessGroup:
    argv = {c: [[str(a) for a in m.command or ()] for m in ms] for c, ms in by_conf.items()}
    env = {c: [{str(k): str(v) for k, v in (m.env_delta or {}).items()} for m in ms] for c, ms in by_conf.items()}
    first = next(iter(argv.values()))[0]
    shown, varying, flags = [], [], {c: [] for c in by_conf}
    for i in range(len(first)):
        mark, per = _vary({c: [a[i] for a in argvs] for c, argvs in argv.items()})
        flag = first[i - 1] if i and first[i - 1].startswith("-") else f"argument {i}"
        shown.append(shlex.quote(first[i]) if mark is None else mark)
        if mark == PER_CELL:
            varying.append(f"{flag}: {_span([a[i] for argvs in argv.values() for a in argvs])}")
        elif mark == PER_CONFIGURATION:
            for c, value in per.items():
                flags[c].append(f"{flag} {shlex.quote(value)}" if flag.startswith("-") else shlex.quote(value))
    env_delta, env_of = [], {c: [] for c in by_conf}
    for k in sorted({k for es in env.values() for e in es for k in e}):
        mark, per = _vary({c: [e.get(k, "") for e in es] for c, es in env.items()})
        if mark is None:
            env_delta.append((k, next(iter(per.values()))))
        elif mark == PER_CELL:
            env_delta.append((k, PER_CELL))
            varying.append(f"{k}: {_span([e.get(k, '(unset)') for es in env.values() for e in es])}")
        else:
            env_of.update({c: [*env_of[c], f"{k}={value}"] for c, value in per.items() if value})
    configurations = tuple(
        ConfigurationProcesses(c, len(ms), _statuses(ms), " ".join(flags[c]) or "—", " ".join(env_of[c]) or "—")
        for c, ms in by_conf.items())
    return ProcessGroup(engine, sum(len(ms) for ms in by_conf.values()), " ".join(shown), tuple(env_delta),
                        tuple(varying), configurations)


def _vary(values: Mapping[str, Sequence[str]]) -> tuple[str | None, dict[str, str]]:
    """(None: one value everywhere | PER_CONFIGURATION: one per configuration | PER_CELL, the
    value of each configuration's first cell)."""
    per = {c: v[0] for c, v in values.items()}
    if any(len(set(v)) > 1 for v in values.values()):
        return PER_CELL, per
    return (None if len(set(per.values())) == 1 else PER_CONFIGURATION), per


def _statuses(group: Sequence[CellMeta]) -> str:
    found = Counter(getattr(m.status, "value", str(m.status)) for m in group)
    return ", ".join(f"{n} {s}" for s, n in found.items())


def _span(values: Sequence[str]) -> str:
    distinct = list(dict.fromkeys(values))
    if all(v.isdigit() for v in distinct):
        return f"{min(distinct, key=int)} … {max(distinct, key=int)} ({len(distinct)} values)"
    return ", ".join(distinct[:3]) + (f", … ({len(distinct)} values)" if len(distinct) > 3 else "")


@dataclass(frozen=True)
class Scope:
    """What the gate judged, in words: the banner says what QUALIFIED (or not) is about."""

    what: str  # "configurations baseline, policy0 × sequences A-C, A-B-C on engine reference"
    evidence: tuple[str, ...]  # "16 warm turns that reused cache byte-identical to cold", ...


def judged_scope(inputs: RunInputs, result: GateResult) -> Scope:
    m = inputs.matrix
    cells = [c for c in inputs.verdict.cells]
    configurations = [n for n in m.configurations if any(c.configuration == n for c in cells)]
    sequences = [n for n in m.sequences if any(c.sequence == n for c in cells)]
    if result.candidate is not None:
        configurations = [c.configuration for c in result.candidates if c.gated]
    engines = [f"{e.name} ({e.version})" if e.version else e.name for e in engine_provenance(inputs.metas)] \
        or list(dict.fromkeys(c.engine for c in cells))
    what = (f"configuration{'s' if len(configurations) != 1 else ''} {', '.join(configurations)} × "
            f"sequence{'s' if len(sequences) != 1 else ''} {', '.join(sequences)} on "
            f"{'engine' if len(engines) == 1 else 'engines'} {', '.join(engines)}")
    by = Counter(c.check for c in result.checks if c.passed)
    declared = sum(1 for c in result.checks if c.passed and c.source != "default" and c.check != "budget")
    evidence = [f"{by['ran']} cells ran to the end" if by["ran"] else "",
                f"{by['identity']} warm turns compared byte for byte with their cold run" if by["identity"] else "",
                f"{by['control']} cold-vs-cold controls identical" if by["control"] else "",
                f"{by['cascade']} cascade checks passed (every checkpoint above the re-entry point erased)"
                if by["cascade"] else "",
                f"{declared} declared expectations held" if declared else "",
                f"{by['budget']} budget checks against the baseline ({m.baseline}) held" if by["budget"] else ""]
    return Scope(what, tuple(e for e in evidence if e))


@dataclass(frozen=True)
class ImpossibleFigure:
    cell: CellVerdict
    turn: TurnVerdict
    problem: str


def impossible_figures(run: RunVerdict) -> list[ImpossibleFigure]:
    """Every figure the plausibility rules refused, cell by cell, turn by turn."""
    return [ImpossibleFigure(c, t, p) for c in run.cells for t in c.turns for p in t.implausible]


# ---------------------------------------------------------------- HTML


def turn_table_rows(cell: CellVerdict) -> int:
    """Rows a cell takes in the turn table: one per turn, plus a row for a turn's impossible
    figures and one for its disagreements and notes (the cell column spans them all)."""
    return sum(1 + bool(t.implausible) + bool(t.disagreements or t.notes) for t in cell.turns)


def render_html(inputs: RunInputs, result: GateResult, metas: Mapping[str, CellMeta] | None = None) -> str:
    run = inputs.verdict
    metas = inputs.metas if metas is None else metas
    warm = [c for c in run.cells if c.kind == "warm"]
    all_checks = (*result.checks, *result.not_gated)
    context = dict(
        inputs=inputs, matrix=inputs.matrix, run=run, result=result, metas=metas,
        env=_fields(inputs.environment), blank=_Fields(), grids=build_grids(inputs), warm=warm,
        timelines=[build_timeline(c) for c in warm if c.turns],
        traffic=_traffic_sections(inputs, metas),
        identity_rows=identity_rows(run), controls=[c for c in run.cells if c.kind == "control"],
        expectation_checks=[c for c in all_checks if c.source != "default"],
        default_checks=[c for c in all_checks if c.source == "default"], not_gated=set(result.not_gated),
        engines=engine_provenance(metas), failures=result.failures,
        processes=engine_processes(metas), process_groups=process_groups(metas),
        impossible=impossible_figures(run), scope=judged_scope(inputs, result),
        counts=result.counts, counts_text=gate_mod.counts_text(result.counts), totals=_totals(warm),
        candidate_text=gate_mod.candidate_text, after_subject=gate_mod.message_after_subject,
        outcome_class=OUTCOME_CLASS, identity_mark=IDENTITY_MARK, diff_split=diff_split,
        describe_turn=describe_turn, table_rows=turn_table_rows, GRID_TURNS=GRID_TURNS, grid_summary=grid_summary,
        candidates=result.candidates, shared_sequences=gate_mod.shared_sequences(run),
        Outcome=Outcome, IdentityStatus=IdentityStatus, CheckStatus=CheckStatus,
        TL_BAR_H=TL_BAR_H, decisions=decision.decisions(inputs, result),
    )
    return present.environment().get_template("report.html.j2").render(**context)


class _Fields(dict):  # type: ignore[type-arg]
    """A record's object as the template reads it: a field it lacks is None (a run directory
    without environment.json, or an older one, renders '—' instead of failing the report)."""

    def __missing__(self, key: str) -> None:
        return None


def _fields(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _Fields({k: _fields(v) for k, v in value.items()})
    return value


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


# ---------------------------------------------------------------- Markdown


def render_markdown(inputs: RunInputs, result: GateResult, metas: Mapping[str, CellMeta] | None = None) -> str:
    run = inputs.verdict
    metas = inputs.metas if metas is None else metas
    icon = ("⚠️" if result.unverified else "✅") if result.qualified else "❌"
    lines = [f"## {icon} shadowlab `{md_cell(inputs.matrix.name)}` — {result.verdict_text} "
             f"(exit {result.exit_code})", ""]
    lines.append(f"run `{md_cell(run.run_id)}` · {len(run.cells)} cells · {gate_mod.counts_text(result.counts)}")
    lines.append("")
    if result.partial:  # before anything judged: this is not the whole matrix
        lines += [f"> **{md_cell(result.partial[0].upper() + result.partial[1:])}.** The rest of the matrix was not run.", ""]
    scope = judged_scope(inputs, result)
    lines += [f"Judged: {md_cell(scope.what)}" + (f" — {md_cell('; '.join(scope.evidence))}" if scope.evidence else ""), ""]
    if result.candidates:
        lines += ["| configuration | verdict | recovered / reused | net benefit per turn | failed checks |",
                  "|---|---|---|---|---|"]
        for c in result.candidates:
            share = (f"{pct(c.recovered)} of the ideal" if c.recovered is not None else
                     f"{pct(c.saved)} of prompt tokens" if c.saved is not None else "—")
            net = "—" if c.net_ms is None else f"{signed(c.net_ms, 1)} ms"
            verdict = ("baseline" if c.is_baseline else f"**{c.status}**") + ("" if c.gated else " (not gated)")
            lines.append(f"| {md_cell(c.configuration)} | {verdict} | {share} | {net} | {len(c.failed)} of {c.checks} |")
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
                         f"{md_cell(c.expected)} | {md_cell(c.actual)} | "
                         f"{md_cell(gate_mod.message_after_subject(c))} |")
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
                f"| {md_cell(cell.cell_id)} | {t.index} | {md_cell(t.prompt_id)} | {num(t.prompt_tokens)} | "
                f"{num(t.divergence_point)} | {num(t.re_entry_point)} | {num(t.reused_tokens)} | "
                f"{pct(t.saved_fraction)} | {t.outcome.value}{' ⛔ impossible figures' if t.implausible else ''} | {ident} |")
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
    lines.append(f"<sub>shadowlab {md_cell(sl.get('version'))} @ {md_cell(short_sha(sl.get('commit')))}"
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
            text += f" {pct(t.saved_fraction)}"
        if t.identity is not None and t.identity.status is IdentityStatus.MISMATCH:
            text += " ≠cold" + (f" ({md_cell(t.triage.cls)})" if t.triage is not None else "")
        parts.append(text)
    return " → ".join(parts)


__all__ = ["CELL_ERRORS", "GRID_TURNS", "HTML_NAME", "JUNIT_NAME", "MARKDOWN_NAME", "TL_BAR_H", "ReportPaths", "Timeline",
           "build_grids", "build_timeline", "md_cell", "nice_step", "render_html", "render_inputs", "render_junit",
           "render_markdown", "render_run", "visible", "xml_text"]
