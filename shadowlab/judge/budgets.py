"""Budgets: what a candidate configuration may cost against the baseline, and what it must gain.

    costs(run, verdict) -> tuple[Cost, ...]        every configuration against the matrix's baseline
    checks(run, verdict) -> list[CheckResult]      the gate checks of the matrix's `budgets`

The figures are `shadowlab/judge/metrics.py`'s (one source of truth, shared with `shadowlab
compare`, which the gate never imports): each configuration is compared with `baseline` in the
same run, cell by cell, and a `Cost` is one cell row of that comparison per turn, extrapolated to
the matrix's `scale`:

- checkpoints created per turn at scale = the baseline's + the candidate's extra × the prompt
  length factor (the extra ones are mid-prompt, one per batch: they grow with the prompt; the
  baseline's tail ones do not);
- MiB and ms per turn at scale = checkpoints at scale × the per-checkpoint figure at scale (given
  explicitly, e.g. the case study's 62.9 MiB / 63 ms, or the measured mean × a factor);
- prefill ms saved per turn = tokens the candidate did not process that the baseline did (an
  exact count; a difference inside the noise band counts 0) × the prompt length factor × the ms
  per token at scale (given, else the baseline's measured prefill ms ÷ tokens);
- net benefit = prefill ms saved − checkpoint ms spent beyond the baseline's.

Without `scale` every figure is as measured. A budget fails when a figure breaks its limit and
names the figures that condemn it; a figure that cannot be known (no engine.log) fails too. A
cell whose engine (or whose baseline's) reported impossible figures is not judged (ERROR, saying
so): the metrics leave such cells out, and no cost of them is a figure.
Pure: the loaded run and its verdicts in, results out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shadowlab.judge import metrics, plausibility
from shadowlab.results import rundir
from shadowlab.errors import CompareRefused
from shadowlab.judge.expectations import CheckResult, CheckStatus
from shadowlab.matrix import Budget, Matrix, Scale
from shadowlab.judge.verdicts import CellVerdict, RunVerdict

UNKNOWN = "unknown (checkpoint figures need the cell's engine.log)"


@dataclass(frozen=True)
class Cost:
    """One warm cell of a configuration against the same cell of the baseline, per turn."""

    engine: str
    configuration: str
    sequence: str
    traffic: str  # "A → B → C": the prompts in order
    repeats: tuple[int, int]  # (baseline, candidate)
    scale: str | None  # the scale's name; None: as measured
    created: float | None  # measured, median over repeats
    baseline_created: float | None
    created_at_scale: float | None
    mib_at_scale: float | None
    ms_at_scale: float | None
    baseline_ms_at_scale: float | None
    saved_tokens: float | None  # per turn, at scale (0 where the difference is inside the noise)
    saved_ms: float | None
    reused: metrics.Delta  # the comparison's own judgements, for the decision record
    prefill: metrics.Delta
    recovered: metrics.Delta  # share of the ideal: known on traffic cells only

    @property
    def spent_ms(self) -> float | None:
        """Checkpoint ms per turn beyond the baseline's (negative: fewer)."""
        return _minus(self.ms_at_scale, self.baseline_ms_at_scale)

    @property
    def net_ms(self) -> float | None:
        return _minus(self.saved_ms, self.spent_ms)

    @property
    def label(self) -> str:
        turns = self.traffic.split(" → ")
        return f"{self.configuration} " + ("→".join(turns) if len(turns) <= 4 else self.sequence)

    @property
    def turns_text(self) -> str:
        """The prompts in order, or the sequence and its turn count beyond four (a traffic)."""
        turns = self.traffic.split(" → ")
        return self.traffic if len(turns) <= 4 else f"{self.sequence} ({len(turns)} turns)"


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# ---------------------------------------------------------------- figures


def costs(run: rundir.RunDir, verdict: RunVerdict) -> tuple[Cost, ...]:
    """Every configuration of the run (the baseline too: against itself) against the baseline."""
    matrix = run.matrix
    if matrix is None or matrix.baseline is None:
        return ()
    out: list[Cost] = []
    for configuration in matrix.configurations:
        try:
            result = metrics.compare_configurations(run, verdict, matrix.baseline, configuration)
        except CompareRefused:
            continue  # no finished warm cell on one side: the budget check says so
        out += [cost_of(row, configuration, matrix) for row in result.rows if row.scope == "cell"]
    return tuple(out)


def cost_of(row: metrics.Row, configuration: str, matrix: Matrix) -> Cost:
    scale = matrix.scale or Scale()
    factor = scale.prompt_length_factor
    created, base_created = row.delta("created").candidate, row.delta("created").baseline
    at_scale = None if created is None or base_created is None else base_created + (created - base_created) * factor
    engine, sequence, traffic = row.key[:3]
    return Cost(
        engine=engine, configuration=configuration, sequence=sequence, traffic=traffic,
        repeats=row.repeats, scale=scale.name if matrix.scale is not None else None,
        created=created, baseline_created=base_created, created_at_scale=at_scale,
        mib_at_scale=_times(at_scale, _per_checkpoint(row, "checkpoint_mib", "candidate", scale)),
        ms_at_scale=_times(at_scale, _per_checkpoint(row, "create_ms", "candidate", scale)),
        baseline_ms_at_scale=_times(base_created, _per_checkpoint(row, "create_ms", "baseline", scale)),
        saved_tokens=_times(_saved_tokens(row), factor), saved_ms=_times(_times(_saved_tokens(row), factor),
                                                                           _ms_per_token(row, scale)),
        reused=row.delta("reused_tokens"), prefill=row.delta("prefill_ms"),
        recovered=row.delta("recovered_share"))


def _times(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a * b


def _per_checkpoint(row: metrics.Row, metric: str, side: str, scale: Scale) -> float | None:
    """One checkpoint's MiB (create ms) at scale: given, else the side's measured mean × factor."""
    explicit, factor = {"checkpoint_mib": (scale.checkpoint_mib, scale.checkpoint_mib_factor),
                        "create_ms": (scale.checkpoint_ms, scale.checkpoint_ms_factor)}[metric]
    if explicit is not None:
        return explicit
    total, created = getattr(row.delta(metric), side), getattr(row.delta("created"), side)
    if total is None or created is None:
        return None
    return (total / created if created else 0.0) * (1.0 if factor is None else factor)


def _saved_tokens(row: metrics.Row) -> float | None:
    """Prompt tokens per turn the candidate did not process and the baseline did; a difference
    the comparison does not call a gain or a loss (inside the noise, or none) saves nothing."""
    processed = row.delta("processed_tokens")
    if processed.judgement == "unknown" or processed.delta is None or not row.turns:
        return None
    return -processed.delta / row.turns if processed.judgement in ("gain", "loss") else 0.0


def _ms_per_token(row: metrics.Row, scale: Scale) -> float | None:
    if scale.prefill_ms_per_token is not None:
        return scale.prefill_ms_per_token
    ms, tokens = row.delta("prefill_ms").baseline, row.delta("processed_tokens").baseline
    return None if ms is None or not tokens else ms / tokens


# ---------------------------------------------------------------- gate checks


def checks(run: rundir.RunDir, verdict: RunVerdict) -> list[CheckResult]:
    """One result per budget × selected warm cell, in the matrix's order."""
    matrix = run.matrix
    if matrix is None or not matrix.budgets:
        return []
    found = costs(run, verdict)
    out: list[CheckResult] = []
    for number, budget in enumerate(matrix.budgets, start=1):
        source = f"budget {number}" + (f" (matrix line {budget.line})" if budget.line else "")
        out += _budget_results(budget, source, found, verdict, matrix)
    return out


def _budget_results(budget: Budget, source: str, found: Sequence[Cost], verdict: RunVerdict,
                    matrix: Matrix) -> list[CheckResult]:
    sel = budget.selection
    out = [judge(budget, c, source) for c in found if sel.matches(c.engine, c.configuration, c.sequence)]
    judged = {(c.engine, c.configuration, c.sequence) for c in found}
    # A sequence the baseline does not run has nothing to be compared with: not judged. One it
    # runs whose cell (or the candidate's) did not finish cannot be judged: an ERROR.
    planned = {(c.engine, c.sequence) for c in verdict.cells if c.kind == "warm" and c.configuration == matrix.baseline}
    for cell in verdict.cells:
        combo = (cell.engine, cell.configuration, cell.sequence)
        if cell.kind == "warm" and sel.matches(*combo) and combo not in judged and combo[::2] in planned:
            judged.add(combo)
            out.append(CheckResult(
                "budget", CheckStatus.ERROR, f"{cell.configuration} {cell.sequence}", _limits(budget, None),
                "not judged", not_judged(cell, verdict, matrix.baseline or ""), source,
                cell.cell_id, None, budget.description))
    return out


def not_judged(cell: CellVerdict, verdict: RunVerdict, baseline: str) -> str:
    """Why a warm cell has no cost against the baseline: impossible figures (its own or the
    baseline's cell of its sequence), else a cell that did not finish."""
    base = [c for c in verdict.cells if c.kind == "warm" and c.engine == cell.engine
            and c.sequence == cell.sequence and c.configuration == baseline]
    for whose, c in (("its", cell), *(("the baseline's", b) for b in base)):
        problems = plausibility.cell_problems(c)
        if problems:
            return (f"not judged: {whose} cell {c.cell_id} reported impossible figures, which are no "
                    f"results ({problems[0]})")
    return (f"no finished warm cell of {cell.configuration} and of the baseline {baseline} for "
            f"{cell.sequence}: the budget cannot be judged")


def judge(budget: Budget, cost: Cost, source: str) -> CheckResult:
    """Every limit of the budget on one cell: the failing figures named, or all of them."""
    at = f" at {cost.scale} scale" if cost.scale else ""
    tests = []  # (limit set, failed, text)
    if budget.max_created_per_turn is not None:
        v = cost.created
        tests.append((v is None or v > budget.max_created_per_turn,
                      f"{_f(v)} checkpoints created per turn" + (f" > budget {_f(budget.max_created_per_turn)}"
                                                                 if v is not None and v > budget.max_created_per_turn else "")))
    for name, value, unit in (("max_checkpoint_mib_per_turn", cost.mib_at_scale, "MiB"),
                              ("max_checkpoint_ms_per_turn", cost.ms_at_scale, "ms")):
        limit = getattr(budget, name)
        if limit is not None:
            bad = value is None or value > limit
            tests.append((bad, f"checkpoints {_f(value)} {unit} per turn{at}"
                               + (f" > budget {_f(limit)}" if value is not None and bad else "")))
    if budget.min_net_benefit_ms is not None:
        net = cost.net_ms
        bad = net is None or net < budget.min_net_benefit_ms
        tests.append((bad, f"net benefit {_signed(net)} ms per turn (saved {_f(cost.saved_ms)} ms, spent "
                           f"{_f(cost.spent_ms)} ms more than the baseline{at})"
                           + (f" < budget {_signed(budget.min_net_benefit_ms)}" if net is not None and bad else "")))
    failed = [text for bad, text in tests if bad]
    status = CheckStatus.FAIL if failed else CheckStatus.PASS
    unknown = "; " + UNKNOWN if any("?" in t for t in failed) else ""
    shown = failed or [text for _, text in tests]
    return CheckResult("budget", status, cost.label, _limits(budget, cost.scale),
                       "; ".join(text for _, text in tests), f"{cost.label}: " + "; ".join(shown) + unknown,
                       source, f"{cost.engine}.{cost.configuration}.{cost.sequence}", None, budget.description)


def _limits(budget: Budget, scale: str | None) -> str:
    names = {"max_created_per_turn": "created/turn ≤ {}", "max_checkpoint_mib_per_turn": "MiB/turn ≤ {}",
             "max_checkpoint_ms_per_turn": "checkpoint ms/turn ≤ {}", "min_net_benefit_ms": "net benefit ≥ {} ms/turn"}
    text = ", ".join(t.format(_f(getattr(budget, k))) for k, t in names.items() if getattr(budget, k) is not None)
    return text + (f" ({scale} scale)" if scale else "")


def _f(v: float | None) -> str:
    if v is None:
        return "?"
    if v == int(v) and abs(v) < 100:
        return str(int(v))
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 1 or v == 0 else f"{v:.3g}"


def _signed(v: float | None) -> str:
    return "?" if v is None else ("−" + _f(-v) if v < 0 else _f(v))


__all__ = ["Cost", "checks", "cost_of", "costs", "judge", "not_judged"]
