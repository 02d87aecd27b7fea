"""The figures a comparison and the budgets weigh, and how a difference is judged.

    cell_figures(cell, meta) -> Figures          one repeat of one warm cell, from its verdict
    judge(metric, base, cand) -> Delta           gain / loss / same / not significant / no band
    compare_sides(base, bv, cand, cv, ...)       cells matched by key, rows per cell, kind, overall
    compare_configurations(run, verdict, b, c)   two configurations of one run (the gate's budgets)

Cells are matched by engine, sequence and prompts (the configuration is the point of the
comparison). Cells repeated in fresh processes (same key) are the repeats of one figure. A
difference counts only outside the run-to-run noise (asv compare, pyperf): the delta's noise band
is the 99 % confidence interval of the difference of the means over the repeats (`noise_band`,
Welch); a band that holds 0 is "not significant", and with one repeat of a timed figure there is
no band at all ("no noise band: repeat N=1"). Counts (tokens, checkpoints, MiB) of a
deterministic engine are exact and are judged without a band. Traffic cells add the recovered
share of the ideal (verdicts.traffic_summary: Σ reused / Σ ideal, the report's own figure), a
ratio of two totals, so an aggregate's share weighs each cell by its ideal.

A cell whose engine reported impossible figures (shadowlab/judge/plausibility.py) is no result:
``compare_sides`` refuses it (ImpossibleFigures, exit 3, like the gate), or, with
``impossible="exclude"`` (`--exclude-impossible`, and always for the gate's budgets), leaves it
out and names it in ``excluded``. A cell without its engine.log has unknown checkpoint figures,
said in ``notes``. Refusing runs that are not comparable (other prompts, another engine build)
is the compare command's (shadowlab/compare.py); the gate needs none of it, since one run has
one build and one set of prompts.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shadowlab.errors import CompareRefused, ImpossibleFigures
from shadowlab.judge import plausibility
from shadowlab.judge.verdicts import CellVerdict, RunVerdict, traffic_summary
from shadowlab.results import rundir
from shadowlab.results.records import CellMeta

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



# ---------------------------------------------------------------- comparing two sides


def compare_configurations(run: rundir.RunDir, verdict: RunVerdict, baseline: str, candidate: str) -> Comparison:
    """Two configurations of one run whose verdicts are already computed (the gate's budgets and
    the report's decision section): one run has one build and one set of prompts. A cell with
    impossible figures is left out (``excluded``): the gate fails it on its own."""
    return compare_sides(run, verdict, run, verdict, baseline, candidate, (), (), "exclude")


def compare_sides(base: rundir.RunDir, bv: RunVerdict, cand: rundir.RunDir, cv: RunVerdict,
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


__all__ = ["NO_BAND", "Comparison", "Delta", "Figures", "Key", "METRICS", "Metric", "Row", "Side", "add", "cell_figures",
           "compare_configurations", "compare_sides", "judge", "noise_band", "repeats_by_key", "sequence_kind", "side"]
