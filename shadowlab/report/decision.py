"""The decision record: per candidate configuration, what it gains, what it costs, under which
traffic, the verdict and when to revisit it — the case study's DECISION block, from the figures.

    decisions(inputs, result) -> tuple[Decision, ...]    () unless the matrix names a baseline
    markdown(decisions) -> list[str]                       report.md's section (report.html's
                                                           template renders the same objects)

Gains and costs are `budgets.Cost`s (compare's figures, extrapolated to the matrix's scale); the
verdict is the gate's own budget checks. A gain inside the noise band is said to be "not
significant", never counted. Pure: the loaded run and its gate result in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shadowlab.judge import budgets
from shadowlab.present import pct
from shadowlab.judge.metrics import NO_BAND, Delta
from shadowlab.judge.expectations import CheckResult, CheckStatus
from shadowlab.judge.gate import GateResult, RunInputs

NOT_SIGNIFICANT = "not significant"


@dataclass(frozen=True)
class Line:
    """One sequence of one candidate: its gain and its cost, as sentences."""

    traffic: str  # "A → B → C"
    gain: str
    cost: str
    gains: bool  # reuses more than the baseline, outside the noise


@dataclass(frozen=True)
class Decision:
    configuration: str
    baseline: str
    description: str
    scale: str | None
    lines: tuple[Line, ...]
    verdict: str  # "pass" | "fail" | "no budget declared" | "not judged"
    condemned: tuple[str, ...]  # the failing budget checks' messages
    revisit: tuple[str, ...]
    not_judged: tuple[str, ...] = ()  # sequences without figures: why (impossible figures, unfinished)


def decisions(inputs: RunInputs, result: GateResult) -> tuple[Decision, ...]:
    matrix = inputs.matrix
    if matrix.baseline is None:
        return ()
    found = budgets.costs(inputs.run, inputs.verdict)
    checks = [c for c in result.checks if c.check == "budget"]
    out = []
    for name, spec in matrix.configurations.items():
        mine = [c for c in found if c.configuration == name]
        missing = _without_figures(inputs, name, mine)
        if name == matrix.baseline or not (mine or missing):
            continue
        ids = {f"{c.engine}.{c.configuration}.{c.sequence}" for c in mine} | {cell_id for cell_id, _ in missing}
        judged = [c for c in checks if c.cell_id in ids]
        scale = mine[0].scale if mine else (matrix.scale.name if matrix.scale is not None else None)
        out.append(Decision(name, matrix.baseline, spec.description, scale,
                            tuple(_line(c) for c in mine), _verdict(judged, bool(matrix.budgets)),
                            tuple(c.message for c in judged if c.status is CheckStatus.FAIL),
                            tuple(_revisit(mine, judged)) if mine else (), tuple(why for _, why in missing)))
    return tuple(out)


def _without_figures(inputs: RunInputs, configuration: str, mine: Sequence[budgets.Cost]) -> list[tuple[str, str]]:
    """(cell id, why) of the configuration's warm cells of a sequence the baseline runs that got
    no cost: their figures (or the baseline's) are impossible, or a cell did not finish."""
    baseline = inputs.matrix.baseline or ""
    costed = {(c.engine, c.sequence) for c in mine}
    runs = {(c.engine, c.sequence) for c in inputs.verdict.cells if c.kind == "warm" and c.configuration == baseline}
    return [(c.cell_id, f"{c.sequence}: {budgets.not_judged(c, inputs.verdict, baseline)}")
            for c in inputs.verdict.cells
            if c.kind == "warm" and c.configuration == configuration and (c.engine, c.sequence) in runs
            and (c.engine, c.sequence) not in costed]


def _gain_text(d: Delta, unit: str) -> str:
    if d.delta is None:
        return f"{unit} unknown"
    if d.judgement in (NOT_SIGNIFICANT, NO_BAND):
        return f"{_signed(d.delta)} {unit} ({d.judgement})"
    return f"{_signed(d.delta)} {unit}" + ("" if d.judgement in ("gain", "loss", "same") else f" ({d.judgement})")


def _line(c: budgets.Cost) -> Line:
    gains = c.reused.judgement == "gain"
    gain = (f"reuses {_gain_text(c.reused, 'tokens')}; prefill {_gain_text(c.prefill, 'ms')}"
            + (f"; saves {_n(c.saved_ms)} ms per turn at {c.scale}" if c.scale and c.saved_ms else ""))
    share = c.recovered
    if share.candidate is not None and share.baseline is not None:  # a traffic cell
        gain += f"; recovers {pct(share.candidate)} of the ideal (baseline {pct(share.baseline)})"
    at = f" at {c.scale}" if c.scale else ""
    cost = (f"{_n(c.created)} checkpoints created per turn (baseline {_n(c.baseline_created)})"
            f"; {_n(c.created_at_scale)} per turn, {_n(c.mib_at_scale)} MiB, {_n(c.ms_at_scale)} ms{at}")
    return Line(c.turns_text, gain, cost, gains)


def _verdict(judged: Sequence[CheckResult], declared: bool) -> str:
    if not declared:
        return "no budget declared"
    if any(c.status is CheckStatus.FAIL for c in judged):
        return "fail"
    if not judged or not all(c.passed for c in judged):
        return "not judged"  # an ERROR: a cell without figures (impossible, or unfinished)
    return "pass"


def _revisit(mine: Sequence[budgets.Cost], judged: Sequence[CheckResult]) -> list[str]:
    """When the decision should be made again: what in the figures would have to change."""
    gaining = [c.turns_text for c in mine if c.reused.judgement == "gain"]
    flat = [c.turns_text for c in mine if c.reused.judgement != "gain"]
    out = []
    if gaining and flat:
        out.append(f"gains appear only on {', '.join(gaining)} (none on {', '.join(flat)}): revisit if the "
                   f"traffic comes to look like {gaining[0]} (e.g. consecutive turns of a conversation on "
                   f"one slot: client-to-slot affinity)")
    elif not gaining:
        out.append("no reuse gained on any sequence: revisit only if the traffic changes so that it reuses")
    for c in mine:
        extra = None if c.created_at_scale is None or c.baseline_created is None else c.created_at_scale - c.baseline_created
        if c.reused.judgement == "gain" and c.saved_ms and extra and extra > 0 and c.net_ms is not None and c.net_ms < 0:
            out.append(f"on {c.turns_text} the saving pays for checkpoints costing at most "
                       f"{_n(c.saved_ms / extra)} ms each: revisit if they become that cheap")
    if any(c.prefill.judgement == NO_BAND for c in mine):
        out.append("prefill times come from one repeat each: revisit with repeated cells (a noise band) before trusting a timed difference")
    if judged and all(c.passed for c in judged):
        out.append("within budget at the declared scale: revisit if checkpoint size, time or prompt lengths change")
    return out


def _n(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _signed(v: float) -> str:
    return ("+" if v > 0 else "−" if v < 0 else "") + _n(abs(v))


def markdown(found: Sequence[Decision], cell: object = str) -> list[str]:
    """report.md's decision section (`cell`: the report's Markdown table-cell escaper)."""
    if not found:
        return []
    lines = ["### Decision", ""]
    for d in found:
        lines += [f"**{cell(d.configuration)}** vs baseline **{cell(d.baseline)}** — verdict: "
                  f"**{d.verdict}**" + (f" (costs at {cell(d.scale)} scale)" if d.scale else ""), "",
                  "| traffic | gains | costs |", "|---|---|---|"]
        lines += [f"| {cell(x.traffic)} | {cell(x.gain)} | {cell(x.cost)} |" for x in d.lines]
        lines.append("")
        lines += [f"- not judged: {cell(why)}" for why in d.not_judged]
        lines += [f"- condemned: {cell(m)}" for m in d.condemned]
        lines += [f"- revisit: {cell(r)}" for r in d.revisit]
        lines.append("")
    return lines


__all__ = ["Decision", "Line", "decisions", "markdown"]
