"""Baseline vs candidate: two run directories (or two configurations of one) side by side.

    result = compare(rundir.load(BASE), rundir.load(CAND), allow=("engine",))
    print(render_text(result))            # or to_dict(result) for --json

The command's part of a comparison: refusing runs that are not comparable, and the output. The
figures, their matching and the judgement of a difference (noise band, "not significant") are
``shadowlab/judge/metrics.py``'s, which the gate's budgets use as well; its names are re-exported
here for callers of ``compare``.

Runs whose prompts or engine builds (binary / model sha256 of the records,
``records.EngineBuild``) differ are refused (CompareRefused, exit 2) unless that difference is
declared the point (``allow``); a run without cell records cannot show its build and needs
``allow=("unverified",)``. Prompts are compared like with like: the sha256 of their tokens where
both runs recorded them, else the sha256 of the matrices' prompt specs on both sides, never one
against the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shadowlab.errors import CompareRefused, ShadowlabError
from shadowlab.judge import metrics, verdicts
from shadowlab.judge.metrics import (  # re-exported: compare's figures are the metrics module's
    METRICS, NO_BAND, Comparison, Delta, Figures, Metric, Row, add, cell_figures, compare_configurations, judge,
    noise_band, repeats_by_key, side)
from shadowlab.matrix.dump import matrix_to_dict
from shadowlab.present import MISSING  # a missing figure reads as on every other page
from shadowlab.results import rundir
from shadowlab.results.codec import to_jsonable
from shadowlab.results.records import EngineBuild, sha256_json

ALLOWABLE = ("engine", "prompts", "unverified")


# ---------------------------------------------------------------- what the runs differ in


def engine_builds(run: rundir.RunDir) -> dict[str, EngineBuild]:
    """{engine: its build} from the cell records (empty without them)."""
    return {m.engine.name: EngineBuild.of(m.engine) for m in run.metas.values() if m.engine is not None}


def prompt_hashes(run: rundir.RunDir) -> dict[str, str]:
    """{prompt id: sha256 of its tokens} from the turn records (empty without cell records)."""
    return {t.prompt_id: t.prompt_sha256 for m in run.metas.values() for t in m.turns}


def spec_hashes(run: rundir.RunDir) -> dict[str, str]:
    """{prompt id: sha256 of the matrix's spec} for every prompt and traffic sequence the matrix
    declares (a traffic's prompts are drawn from its shape)."""
    if run.matrix is None:
        return {}
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
            out.append(("engine", f"engine {name!r}: {eb[name].describe()} vs {ec[name].describe()}"))
    return out


# ---------------------------------------------------------------- the comparison


def compare(base: rundir.RunDir, cand: rundir.RunDir, *, baseline_configuration: str | None = None,
            candidate_configuration: str | None = None, allow: Sequence[str] = (),
            impossible: str = "refuse") -> Comparison:
    """``impossible``: "refuse" a side with a cell whose figures are impossible (ImpossibleFigures,
    exit 3), or "exclude" such cells (named in ``excluded``)."""
    refused = [text for kind, text in differences(base, cand) if kind not in allow]
    if refused:
        raise CompareRefused(refused, hint="compare runs of the same prompts and engine build, or "
                                           "name the difference that is the point: --allow " + "|".join(ALLOWABLE))
    allowed = tuple(text for kind, text in differences(base, cand) if kind in allow)
    if (baseline_configuration is None) != (candidate_configuration is None):
        raise ShadowlabError("--baseline-config and --candidate-config go together",
                             hint="name the configuration of each side, or neither (configurations then match by name)")
    how = prompt_differences(base, cand)[1]
    return metrics.compare_sides(base, verdicts.judge(base), cand, verdicts.judge(cand), baseline_configuration,
                                 candidate_configuration, tuple(allow), allowed, impossible, (how,) if how else ())


# ---------------------------------------------------------------- output


def to_dict(c: Comparison) -> dict[str, Any]:
    return to_jsonable(c)


def render_text(c: Comparison) -> str:
    lines = [f"baseline  {c.baseline}" + (f" [{c.baseline_configuration}]" if c.baseline_configuration else ""),
             f"candidate {c.candidate}" + (f" [{c.candidate_configuration}]" if c.candidate_configuration else "")]
    lines += [f"allowed difference: {d}" for d in c.differences]
    lines += [f"excluded (impossible figures, no result): {e}" for e in c.excluded]
    lines += [f"note: {n}" for n in c.notes]
    metrics = {m.name: m for m in METRICS}
    shown: list[Row] = []
    head = 0  # the line of the last table's heading (set with its first row)
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
    return MISSING if v is None else f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def _signed(v: float | None) -> str:
    return MISSING if v is None else ("+" if v > 0 else "") + _num(v)


def _pct(v: float | None) -> str:
    return MISSING if v is None else f"{v:.1%}"


def _pp(v: float | None) -> str:
    """A difference of two shares, in percentage points."""
    return MISSING if v is None else f"{'+' if v > 0 else ''}{v * 100:.1f} pp"


__all__ = ["ALLOWABLE", "Comparison", "Delta", "Figures", "METRICS", "Metric", "NO_BAND", "Row", "add",
           "cell_figures", "compare", "compare_configurations", "differences", "engine_builds", "judge", "noise_band",
           "prompt_differences", "render_text", "repeats_by_key", "side", "spec_hashes", "to_dict"]
