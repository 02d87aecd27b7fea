"""Baseline vs candidate: two run directories (or two configurations of one) side by side.

    result = compare(rundir.load(BASE), rundir.load(CAND), allow=("engine",))
    print(render_text(result))            # or to_dict(result) for --json

Cells are matched by engine, sequence and prompts (the configuration is the point of the
comparison; choose one per side with ``baseline_configuration`` / ``candidate_configuration``).
Cells repeated in fresh processes (same key) are the repeats of one figure. A difference counts
only outside the run-to-run noise (asv compare, pyperf): the delta's noise band is the 99 %
confidence interval of the difference of the means over the repeats (`noise_band`, Welch); a
band that holds 0 is "not significant", and with one repeat of a timed figure there is no band at all
("no noise band: repeat N=1"). Counts (tokens, checkpoints, MiB) of a deterministic engine are
exact and are judged without a band. Traffic cells add the recovered share of the ideal
(verdicts.traffic_summary: Σ reused / Σ ideal, the report's own figure), a ratio of two totals,
so an aggregate's share weighs each cell by its ideal.

Runs whose prompts or engine builds (binary / model sha256 of the records) differ are refused
(CompareRefused, exit 2) unless that difference is declared the point (``allow``); a run without
cell records cannot show its build and needs ``allow=("unverified",)``. Prompts are compared like
with like: the sha256 of their tokens where both runs recorded them, else the sha256 of the
matrices' prompt specs on both sides, never one against the other.

A cell whose engine reported impossible figures (shadowlab/judge/plausibility.py) is no result: the
comparison refuses it (ImpossibleFigures, exit 3, like the gate), or, with
``impossible="exclude"`` (`--exclude-impossible`, and always for the gate's budgets), leaves it
out and names it in ``excluded``. A cell without its engine.log has unknown checkpoint figures,
said in ``notes``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shadowlab.judge import plausibility
from shadowlab.results import rundir
from shadowlab.results.records import CellMeta
from shadowlab.errors import CompareRefused, ImpossibleFigures, ShadowlabError
from shadowlab.judge.verdicts import CellVerdict, RunVerdict, traffic_summary

ALLOWABLE = ("engine", "prompts", "unverified")
NO_BAND = "no noise band: repeat N=1"


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str  # "total" (summed over turns), "per_turn", "per_cell", "share" (total ÷ total `of`)
    better: str  # "lower" | "higher"
    exact: bool  # a count a deterministic engine repeats exactly (judged without a band)
    of: str | None = None  # a share's denominator: the name of another total


METRICS = (
    Metric("processed_tokens", "prefill tokens processed", "total", "lower", True),
    Metric("reused_tokens", "prefill tokens reused", "total", "higher", True),
    Metric("prefill_ms", "prefill ms", "total", "lower", False),
    Metric("ttft_ms", "time to first token ms / turn", "per_turn", "lower", False),
    Metric("created", "checkpoints created / turn", "per_turn", "lower", True),
    Metric("restored", "checkpoints restored / turn", "per_turn", "higher", True),
    Metric("erased", "checkpoints erased / turn", "per_turn", "lower", True),
    Metric("checkpoint_mib", "checkpoint MiB created / turn", "per_turn", "lower", True),
    Metric("create_ms", "checkpoint create ms / turn", "per_turn", "lower", False),
    Metric("restore_ms", "checkpoint restore ms / turn", "per_turn", "lower", False),
    Metric("startup_ms", "start-up ms", "per_cell", "lower", False),
    # Traffic cells only; its total is the reused tokens that count against the ideal.
    Metric("recovered_share", "recovered share of the ideal", "share", "higher", True, of="ideal_tokens"),
)


@dataclass(frozen=True)
class Figures:
    """One repeat of one cell (or a sum of cells): totals, and the turns / cells they cover."""

    totals: Mapping[str, float | None]
    turns: int
    cells: int = 1

    def value(self, metric: Metric) -> float | None:
        total = self.totals.get(metric.name)
        if total is None:
            return None
        if metric.of is not None:
            whole = self.totals.get(metric.of)
            return total / whole if whole else None
        divisor = {"total": 1, "per_turn": self.turns, "per_cell": self.cells}[metric.unit]
        return total / divisor if divisor else None


@dataclass(frozen=True)
class Delta:
    metric: str
    baseline: float | None  # mean over the repeats
    candidate: float | None
    delta: float | None
    band: tuple[float, float] | None  # the delta's noise band; None: none (see judgement)
    judgement: str  # gain | loss | same | not significant | no noise band: repeat N=1 | unknown


@dataclass(frozen=True)
class Row:
    scope: str  # "cell" | "kind" | "overall"
    name: str
    repeats: tuple[int, int]  # (baseline, candidate)
    deltas: tuple[Delta, ...]
    key: tuple[str, ...] = ()  # a cell row's (engine, sequence, prompts[, configuration])
    turns: int = 0  # turns of one repeat of the candidate side

    def delta(self, metric: str) -> Delta:
        return next(d for d in self.deltas if d.metric == metric)


@dataclass(frozen=True)
class Comparison:
    baseline: str
    candidate: str
    baseline_configuration: str | None
    candidate_configuration: str | None
    allowed: tuple[str, ...]
    differences: tuple[str, ...]  # the allowed ones, named
    rows: tuple[Row, ...]
    unmatched: tuple[str, ...] = field(default=())
    excluded: tuple[str, ...] = ()  # cells left out: their engine reported impossible figures
    notes: tuple[str, ...] = ()  # evidence missing (an engine.log), how prompts were compared

    def row(self, scope: str, name: str) -> Row:
        return next(r for r in self.rows if r.scope == scope and r.name == name)


# ---------------------------------------------------------------- figures of a cell


def cell_figures(cell: CellVerdict, meta: CellMeta | None) -> Figures:
    """A cell's figures from its verdict; start-up and time to first token from its record
    (client-side times: unknown in a run reduced to verdicts.json)."""
    turns = cell.turns
    ttft = [t.ttft_ms for t in meta.turns] if meta is not None and len(meta.turns) == len(turns) else [None]
    figures: dict[str, float | None] = {
        "processed_tokens": _sum(t.processed_tokens for t in turns),
        "reused_tokens": _sum(t.reused_tokens for t in turns),
        "prefill_ms": _sum(t.prefill_ms for t in turns),
        "ttft_ms": _sum(ttft),
        "startup_ms": meta.startup_ms if meta is not None else None,
    }
    if any(t.ideal_tokens is not None for t in turns):  # a traffic cell: the report's own share
        _, ideal, recovered, _ = traffic_summary(cell)
        figures |= {"recovered_share": float(recovered), "ideal_tokens": float(ideal)}
    # Checkpoints are known only from engine.log: without it (a run reduced to its records, an
    # engine without a parsable log) none seen is not none made, so they are unknown, not 0.
    if cell.reuse_source == "api+log":
        created = [c for t in turns for c in t.created]
        figures |= {
            "created": float(len(created)),
            "restored": float(sum(t.restored is not None for t in turns)),
            "erased": float(sum(len(t.erased_cascade) + len(t.erased_other) for t in turns)),
            "checkpoint_mib": _sum(c.size_mib for c in created),
            "create_ms": _sum(c.took_ms for c in created),
            "restore_ms": _sum((t.restore_ms or 0.0) if t.restored is not None else 0.0 for t in turns),
        }
    return Figures(figures, turns=len(turns))


def _sum(values: Iterable[float | None]) -> float | None:
    """None when any is unknown: a partial sum would read as a real figure."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def add(figures: Sequence[Figures]) -> Figures:
    names = {n for f in figures for n in f.totals}
    return Figures({n: _sum(f.totals.get(n) for f in figures) for n in names},
                   turns=sum(f.turns for f in figures), cells=sum(f.cells for f in figures))


# ---------------------------------------------------------------- judging one delta


def judge(metric: Metric, base: Sequence[float | None], cand: Sequence[float | None]) -> Delta:
    if not base or not cand or any(v is None for v in (*base, *cand)):
        return Delta(metric.name, _mean(base), _mean(cand), None, None, "unknown")
    b, c = [float(v) for v in base], [float(v) for v in cand]  # type: ignore[arg-type]
    mb, mc = statistics.mean(b), statistics.mean(c)
    delta = mc - mb
    if len(b) < 2 or len(c) < 2:
        if not metric.exact:
            return Delta(metric.name, mb, mc, delta, None, NO_BAND)
        band = None
    else:
        band = noise_band(b, c)
        if band[0] <= 0 <= band[1] and band != (0.0, 0.0):
            return Delta(metric.name, mb, mc, delta, band, "not significant")
    if delta == 0:
        return Delta(metric.name, mb, mc, delta, band, "same")
    better = delta < 0 if metric.better == "lower" else delta > 0
    return Delta(metric.name, mb, mc, delta, band, "gain" if better else "loss")


def _mean(values: Sequence[float | None]) -> float | None:
    """The side's own figure for display, when every repeat of it is known."""
    return statistics.mean(values) if values and None not in values else None  # type: ignore[arg-type]


# Two-sided 99 % quantiles of Student's t for 1..30 degrees of freedom (beyond: 30's, which is
# wider than the true one, so never a gain the data do not carry).
_T99 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012,
        2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779,
        2.771, 2.763, 2.756, 2.750)


def noise_band(base: Sequence[float], cand: Sequence[float]) -> tuple[float, float]:
    """The 99 % confidence interval of mean(cand) − mean(base) (Welch: unequal variances), from at
    least two repeats a side. It narrows as 1/√N with the repeats, as a band of a run-to-run noise
    should; repeats that agree exactly give the delta itself."""
    vb, vc = statistics.variance(base) / len(base), statistics.variance(cand) / len(cand)
    delta = statistics.mean(cand) - statistics.mean(base)
    if vb + vc == 0:
        return (delta, delta)
    df = (vb + vc) ** 2 / (vb ** 2 / (len(base) - 1) + vc ** 2 / (len(cand) - 1))
    half = _T99[min(max(int(df), 1), len(_T99)) - 1] * (vb + vc) ** 0.5
    return (delta - half, delta + half)


# ---------------------------------------------------------------- matching and identity


Key = tuple[str, ...]


@dataclass(frozen=True)
class Side:
    """One side's warm cells by key, and what was left out of them or is unknown."""

    repeats: dict[Key, list[tuple[str, Figures]]]
    excluded: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (cell id, engine, impossible figures)
    notes: tuple[str, ...] = ()


def side(run: rundir.RunDir, verdict: RunVerdict, configuration: str | None) -> Side:
    """The warm cells that ran to the end, keyed (`repeats_by_key`), less those whose engine
    reported impossible figures (never a result)."""
    excluded, believable = [], []
    for cell in verdict.cells:
        problems = plausibility.cell_problems(cell)
        if cell.kind == "warm" and (configuration is None or cell.configuration == configuration):
            if problems:
                excluded.append((cell.cell_id, cell.engine, problems))
                continue
        believable.append(cell)
    kept = dataclasses.replace(verdict, cells=tuple(believable))
    notes = tuple(f"{c.cell_id}: {c.engine_log} is missing: its checkpoint figures are unknown"
                  for c in believable if c.kind == "warm" and c.log_missing
                  and (configuration is None or c.configuration == configuration))
    return Side(repeats_by_key(run, kept, configuration), tuple(excluded), notes)


def repeats_by_key(run: rundir.RunDir, verdict: RunVerdict, configuration: str | None) -> dict[Key, list[tuple[str, Figures]]]:
    """{(engine, sequence, prompts[, configuration]): [(cell id, figures) per repeat]} of the
    warm cells that ran to the end."""
    out: dict[Key, list[tuple[str, Figures]]] = {}
    for cell in verdict.cells:
        if cell.kind != "warm" or cell.status != "ok":
            continue
        if configuration is not None and cell.configuration != configuration:
            continue
        key: Key = (cell.engine, cell.sequence, " → ".join(t.prompt_id for t in cell.turns))
        if configuration is None:
            key += (cell.configuration,)
        out.setdefault(key, []).append((cell.cell_id, cell_figures(cell, run.metas.get(cell.cell_id))))
    return out


def sequence_kind(run: rundir.RunDir, sequence: str) -> str:
    spec = run.matrix.sequences.get(sequence) if run.matrix is not None else None
    return getattr(spec, "kind", "sequence") if spec is not None else "sequence"


def engine_builds(run: rundir.RunDir) -> dict[str, tuple[str, str]]:
    return {m.engine.name: (m.engine.binary_sha256, m.engine.model_sha256)
            for m in run.metas.values() if m.engine is not None}


def prompt_hashes(run: rundir.RunDir) -> dict[str, str]:
    """{prompt id: sha256 of its tokens} from the turn records (empty without cell records)."""
    return {t.prompt_id: t.prompt_sha256 for m in run.metas.values() for t in m.turns}


def spec_hashes(run: rundir.RunDir) -> dict[str, str]:
    """{prompt id: sha256 of the matrix's spec} for every prompt and traffic sequence the matrix
    declares (a traffic's prompts are drawn from its shape)."""
    if run.matrix is None:
        return {}
    from shadowlab.matrix.dump import matrix_to_dict
    from shadowlab.results.records import sha256_json

    spec = matrix_to_dict(run.matrix)
    out = {pid: sha256_json(p) for pid, p in spec.get("prompts", {}).items()}
    out |= {f"traffic sequence {name}": sha256_json(s) for name, s in spec.get("sequences", {}).items()
            if isinstance(s, dict) and s.get("kind") == "traffic"}
    return out


def prompt_differences(base: rundir.RunDir, cand: rundir.RunDir) -> tuple[list[str], str | None]:
    """(what differs, how the prompts were compared): token sha256 where both runs recorded a
    prompt's tokens, else the specs' sha256 on both sides; never a token hash against a spec."""
    tb, tc, sb, sc = prompt_hashes(base), prompt_hashes(cand), spec_hashes(base), spec_hashes(cand)
    out, by_spec = [], []
    for pid in sorted((set(tb) & set(tc)) | (set(sb) & set(sc))):
        if pid in tb and pid in tc:
            if tb[pid] != tc[pid]:
                out.append(f"prompt {pid!r}: token sha256 {tb[pid][-12:]} vs {tc[pid][-12:]}")
            continue
        by_spec.append(pid)
        if sb[pid] != sc[pid]:
            out.append(f"{pid if pid.startswith('traffic ') else f'prompt {pid!r}'}: matrix spec sha256 "
                       f"{sb[pid][-12:]} vs {sc[pid][-12:]} (a side has no token records)")
    how = None
    if by_spec:
        shown = ", ".join(by_spec[:6]) + (f" and {len(by_spec) - 6} more" if len(by_spec) > 6 else "")
        how = (f"prompts compared by their matrix spec (sha256), not their tokens: a side has no token "
               f"records for {shown}")
    return out, how


def differences(base: rundir.RunDir, cand: rundir.RunDir) -> list[tuple[str, str]]:
    """(kind, what differs) for every difference between the two runs' inputs."""
    out: list[tuple[str, str]] = [("prompts", text) for text in prompt_differences(base, cand)[0]]
    eb, ec = engine_builds(base), engine_builds(cand)
    if not eb or not ec:
        side = "baseline" if not eb else "candidate"
        out.append(("unverified", f"the {side} has no cell records: its engine build cannot be shown"))
    for name in sorted(set(eb) & set(ec)):
        if eb[name] != ec[name]:
            out.append(("engine", f"engine {name!r}: binary {eb[name][0][:12]} / model {eb[name][1][:12]} "
                                  f"vs binary {ec[name][0][:12]} / model {ec[name][1][:12]}"))
    return out


# ---------------------------------------------------------------- the comparison


def compare(base: rundir.RunDir, cand: rundir.RunDir, *, baseline_configuration: str | None = None,
            candidate_configuration: str | None = None, allow: Sequence[str] = (),
            impossible: str = "refuse") -> Comparison:
    """``impossible``: "refuse" a side with a cell whose figures are impossible (ImpossibleFigures,
    exit 3), or "exclude" such cells (named in ``excluded``)."""
    from shadowlab.judge.verdicts import judge as run_verdict  # verdicts from records, else verdicts.json

    refused = [text for kind, text in differences(base, cand) if kind not in allow]
    if refused:
        raise CompareRefused(refused, hint="compare runs of the same prompts and engine build, or "
                                           "name the difference that is the point: --allow " + "|".join(ALLOWABLE))
    allowed = tuple(text for kind, text in differences(base, cand) if kind in allow)
    if (baseline_configuration is None) != (candidate_configuration is None):
        raise ShadowlabError("--baseline-config and --candidate-config go together",
                             hint="name the configuration of each side, or neither (configurations then match by name)")
    how = prompt_differences(base, cand)[1]
    return _compare(base, run_verdict(base), cand, run_verdict(cand), baseline_configuration,
                    candidate_configuration, tuple(allow), allowed, impossible, (how,) if how else ())


def compare_configurations(run: rundir.RunDir, verdict: RunVerdict, baseline: str, candidate: str) -> Comparison:
    """Two configurations of one run whose verdicts are already computed (the gate's budgets and
    the report's decision section): one run has one build and one set of prompts. A cell with
    impossible figures is left out (``excluded``): the gate fails it on its own."""
    return _compare(run, verdict, run, verdict, baseline, candidate, (), (), "exclude")


def _compare(base: rundir.RunDir, bv: RunVerdict, cand: rundir.RunDir, cv: RunVerdict,
             baseline_configuration: str | None, candidate_configuration: str | None,
             allow: tuple[str, ...], allowed: tuple[str, ...], impossible: str = "refuse",
             notes: tuple[str, ...] = ()) -> Comparison:
    bs, cs = side(base, bv, baseline_configuration), side(cand, cv, candidate_configuration)
    excluded = tuple(dict.fromkeys(plausibility.described(cell, problems)
                                   for cell, _, problems in (*bs.excluded, *cs.excluded)))
    if excluded and impossible != "exclude":
        engines = dict.fromkeys(engine for _, engine, _ in (*bs.excluded, *cs.excluded))
        raise ImpossibleFigures(excluded, engine=", ".join(engines),
                                hint="the gate refuses these cells too (exit 3); --exclude-impossible "
                                     "compares the other cells and names these")
    bk, ck = bs.repeats, cs.repeats
    keys = [k for k in bk if k in ck]
    if not keys:
        left_out = [f"left out (impossible figures): {text}" for text in excluded]
        raise CompareRefused(["no warm cell of one run matches a cell of the other (engine, sequence, prompts)",
                              *left_out],
                             hint="choose the configurations: --baseline-config NAME --candidate-config NAME")
    rows = [_row("cell", _label(k), [f for _, f in bk[k]], [f for _, f in ck[k]], key=k) for k in keys]
    kinds: dict[str, list[Key]] = {}
    for k in keys:
        kinds.setdefault(sequence_kind(base, k[1]), []).append(k)
    rows += [_aggregate("kind", kind, ks, bk, ck) for kind, ks in kinds.items()]
    rows.append(_aggregate("overall", "overall", keys, bk, ck))
    unmatched = tuple(_label(k) for k in [*bk, *ck] if not (k in bk and k in ck))
    notes = tuple(dict.fromkeys((*notes, *bs.notes, *cs.notes)))
    return Comparison(base.run_id, cand.run_id, baseline_configuration, candidate_configuration,
                      allow, allowed, tuple(rows), unmatched, excluded, notes)



def _label(key: Key) -> str:
    turns = key[2].split(" → ")
    return ".".join((key[0], *key[3:], key[1])) + f" ({key[2] if len(turns) <= 4 else f'{len(turns)} turns'})"


def _row(scope: str, name: str, base: Sequence[Figures], cand: Sequence[Figures], key: Key = ()) -> Row:
    deltas = tuple(judge(m, [f.value(m) for f in base], [f.value(m) for f in cand]) for m in METRICS)
    return Row(scope, name, (len(base), len(cand)), deltas, key, cand[0].turns if cand else 0)


def _aggregate(scope: str, name: str, keys: Sequence[Key], bk: Mapping[Key, list[tuple[str, Figures]]],
               ck: Mapping[Key, list[tuple[str, Figures]]]) -> Row:
    """Repeat r of an aggregate is the sum of repeat r of its cells (as many as every cell has)."""
    def side(groups: Mapping[Key, list[tuple[str, Figures]]]) -> list[Figures]:
        n = min(len(groups[k]) for k in keys)
        return [add([groups[k][r][1] for k in keys]) for r in range(n)]
    return _row(scope, name, side(bk), side(ck))


# ---------------------------------------------------------------- output


def to_dict(c: Comparison) -> dict[str, Any]:
    from shadowlab.results.records import to_jsonable

    return to_jsonable(c)


def render_text(c: Comparison) -> str:
    lines = [f"baseline  {c.baseline}" + (f" [{c.baseline_configuration}]" if c.baseline_configuration else ""),
             f"candidate {c.candidate}" + (f" [{c.candidate_configuration}]" if c.candidate_configuration else "")]
    lines += [f"allowed difference: {d}" for d in c.differences]
    lines += [f"excluded (impossible figures, no result): {e}" for e in c.excluded]
    lines += [f"note: {n}" for n in c.notes]
    metrics = {m.name: m for m in METRICS}
    shown: list[Row] = []
    for row in c.rows:
        if shown and (row.repeats, row.deltas) == (shown[-1].repeats, shown[-1].deltas):
            # an aggregate of one cell (or one kind) is that cell's table again: say so, once
            lines[head] += f" = {row.scope}: {row.name}"
            continue
        shown.append(row)
        lines.append("")
        head = len(lines)
        lines.append(f"{row.scope}: {row.name}   repeats {row.repeats[0]} vs {row.repeats[1]}")
        for d in row.deltas:
            m = metrics[d.metric]
            if m.of is not None and d.baseline is None and d.candidate is None:
                continue  # a share no side has (not a traffic row): noise, not an unknown
            num, signed = (_pct, _pp) if m.unit == "share" else (_num, _signed)
            band = "" if d.band is None else f"band [{signed(d.band[0])}, {signed(d.band[1])}]"
            lines.append(f"  {m.label:<31} {num(d.baseline):>10} → {num(d.candidate):>10}  "
                         f"{signed(d.delta):>10}  {band:<22} {d.judgement}")
    lines += ["", *(f"unmatched: {u}" for u in c.unmatched)] if c.unmatched else []
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def _signed(v: float | None) -> str:
    return "?" if v is None else ("+" if v > 0 else "") + _num(v)


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v:.1%}"


def _pp(v: float | None) -> str:
    """A difference of two shares, in percentage points."""
    return "?" if v is None else f"{'+' if v > 0 else ''}{v * 100:.1f} pp"


def main(args: Any) -> int:
    """`shadowlab compare BASELINE_RUN CANDIDATE_RUN`: print the comparison (exit 0)."""
    unknown = [a for a in args.allow if a not in ALLOWABLE]
    if unknown:
        raise ShadowlabError(f"--allow {unknown[0]!r}: expected one of {', '.join(ALLOWABLE)}")
    base = rundir.load(args.baseline)
    cand = base if args.candidate == args.baseline else rundir.load(args.candidate)
    result = compare(base, cand, baseline_configuration=args.baseline_config,
                     candidate_configuration=args.candidate_config, allow=tuple(args.allow),
                     impossible="exclude" if args.exclude_impossible else "refuse")
    print(json.dumps(to_dict(result), indent=1) if args.json else render_text(result))
    return 0


def add_arguments(parser: Any) -> None:
    parser.add_argument("baseline", type=_path, metavar="BASELINE_RUN")
    parser.add_argument("candidate", type=_path, metavar="CANDIDATE_RUN",
                        help="may be BASELINE_RUN again, with --baseline-config/--candidate-config")
    parser.add_argument("--baseline-config", default=None, metavar="NAME",
                        help="the baseline run's configuration to compare (default: match configurations)")
    parser.add_argument("--candidate-config", default=None, metavar="NAME")
    parser.add_argument("--allow", action="append", default=[], metavar="|".join(ALLOWABLE),
                        help="a difference between the runs that is the point of the comparison (repeatable)")
    parser.add_argument("--exclude-impossible", action="store_true",
                        help="leave out (and name) cells whose engine reported impossible figures, instead of "
                             "refusing the comparison (exit 3)")
    parser.add_argument("--json", action="store_true", help="the comparison as JSON")


def _path(text: str) -> Any:
    from pathlib import Path

    return Path(text)


__all__ = ["ALLOWABLE", "Comparison", "Delta", "Figures", "METRICS", "Metric", "NO_BAND", "Row", "add",
           "add_arguments", "cell_figures", "compare", "compare_configurations", "differences", "judge", "main",
           "prompt_differences", "render_text", "side", "spec_hashes", "to_dict"]
