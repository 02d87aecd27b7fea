"""The qualification gate: one exit code for a run directory, decided here and nowhere else.

    evaluate(run_dir) -> GateResult      never raises for a bad run directory: exit_code 2
    load_run(run_dir) -> RunInputs       the run directory read once (rundir.load) + its verdicts
    evaluate_inputs(inputs) -> GateResult    what the report and `shadowlab run` share

Exit codes (GATE_HELP, README):

    0  qualified: every cell ran and every check passed
    1  a check failed: an expectation of the matrix, byte identity (a warm turn that reused
       cache differs from its cold run), a cold-vs-cold control that differs (identity is then
       inconclusive, which fails), a cascade that kept stale checkpoints, or a turn the engine
       answered with an error
    2  usage or matrix error: not a run directory, matrix.yaml unreadable or invalid, a record
       newer than this shadowlab understands
    3  infrastructure failure: an engine never started, or a cell could not run to the end
       (crashed, hung, interrupted), or an engine reported figures no engine can truthfully
       report (reused more tokens than the prompt has, a negative prefill time, reuse on the
       first turn of a fresh process, ... — shadowlab/judge/plausibility.py): it cannot be believed;
       or a check's evidence is missing (a cell's engine.log: the cascade is never passed unseen).
       Takes precedence over 1: a run with a missing cell is never reported as merely "a check
       failed"; the summary still lists every failed check.

A pure function of the run directory: verdicts come from `shadowlab.verdicts.compute(run)` on
the loaded records (or `verdicts.json` when the raw cell records are not there), so the gate can
be re-run on another machine from the directory alone. The exit codes are exitcodes.py's.

A verdicts.json without the records it was computed from (no cells/) is judged as it stands
(its figures re-judged by the plausibility rules), but nothing re-derives it: every output says
so (`GateResult.unverified`: the gate's line, the report's banner and headline, junit.xml).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from shadowlab.judge import budgets, plausibility, verdicts
from shadowlab.present import pct, signed
from shadowlab.results import rundir
from shadowlab.errors import ShadowlabError
from shadowlab.exitcodes import (
    EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE, GATE_HELP, write_traceback,
)
from shadowlab.judge.expectations import CheckResult, CheckStatus, evaluate as evaluate_checks
from shadowlab.matrix import Matrix
from shadowlab.plan.select import Partial, check_gate_candidate
from shadowlab.results.records import CellMeta, terminal_safe


@dataclass(frozen=True)
class RunInputs:
    """A loaded run directory and its verdicts: what the gate judges and the report renders."""

    run: rundir.RunDir
    verdict: verdicts.RunVerdict

    @property
    def run_dir(self) -> Path:
        return self.run.root

    @property
    def matrix(self) -> Matrix:
        assert self.run.matrix is not None  # load_run requires it
        return self.run.matrix

    @property
    def planned(self) -> tuple[str, ...]:
        return self.run.planned

    @property
    def plan(self) -> Mapping[str, Any]:
        return self.run.plan

    @property
    def environment(self) -> Mapping[str, Any]:
        return self.run.environment

    @property
    def metas(self) -> Mapping[str, CellMeta]:
        return self.run.metas

    @property
    def partial(self) -> str | None:
        """What `run -k` left out of this run (plan.json's `selection`), in one line; None for a
        run of the whole matrix."""
        selection = Partial.from_dict(self.run.plan.get("selection"))
        return None if selection is None else selection.describe()

    @property
    def unverified(self) -> str | None:
        """Why the verdicts are unverified (judged from verdicts.json alone), else None."""
        if self.run.has_cells or self.run.saved_verdicts is None:
            return None
        return UNVERIFIED


UNVERIFIED = ("UNVERIFIED: judged from verdicts.json alone; the records it was computed from (cells/: "
              "meta.json, engine.log) are not in the run directory, so no figure of it was re-derived")


@dataclass(frozen=True)
class CandidateVerdict:
    """One configuration's own answer: its checks, the share of the ideal it recovered and its
    net benefit against the baseline — the first thing the report shows."""

    configuration: str
    is_baseline: bool
    status: str  # "pass" | "fail" | "error" (a cell that did not run, or cannot be believed)
    checks: int
    failed: tuple[CheckResult, ...]
    recovered: float | None  # Σ reused / Σ ideal over its believable warm traffic cells
    saved: float | None  # Σ reused / Σ prompt tokens over its believable warm cells
    # (both over the sequences every configuration runs: shared_sequences)
    net_ms: float | None  # net benefit per turn against the baseline (budgets), mean over sequences
    worst_net: tuple[str, float] | None  # (sequence, net ms per turn) of its worst sequence
    gated: bool = True  # False: `--gate-candidate` names another configuration

    def to_dict(self) -> dict[str, Any]:
        return {"configuration": self.configuration, "baseline": self.is_baseline, "status": self.status,
                "gated": self.gated, "checks": self.checks, "failed": len(self.failed),
                "recovered_share_of_ideal": self.recovered, "saved_share": self.saved,
                "net_benefit_ms_per_turn": self.net_ms,
                "worst_sequence": None if self.worst_net is None else
                {"sequence": self.worst_net[0], "net_benefit_ms_per_turn": self.worst_net[1]}}


@dataclass(frozen=True)
class GateResult:
    exit_code: int
    run_dir: Path
    checks: tuple[CheckResult, ...] = ()  # the gated checks: the exit code is theirs
    error: str | None = None  # exit 2: why the run directory could not be judged
    inputs: RunInputs | None = field(default=None, repr=False, compare=False)
    unverified: str | None = None  # judged from a verdicts.json without its records: why that is
    candidate: str | None = None  # `--gate-candidate`: only it (and its baseline) is gated
    not_gated: tuple[CheckResult, ...] = ()  # the other configurations' checks: shown, not gated
    candidates: tuple[CandidateVerdict, ...] = ()

    def __int__(self) -> int:
        return self.exit_code

    @property
    def qualified(self) -> bool:
        return self.exit_code == EXIT_QUALIFIED

    @property
    def partial(self) -> str | None:
        """A `run -k` run: what it left out (every output says so); None for the whole matrix."""
        return self.inputs.partial if self.inputs is not None else None

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        """Failed checks, infrastructure errors first: the one count of failures (gate line,
        report banner, junit.xml's failures + errors)."""
        failed = [c for c in self.checks if c.status.failed]
        return tuple(sorted(failed, key=lambda c: c.status is not CheckStatus.ERROR))

    @property
    def counts(self) -> dict[str, int]:
        """Gated checks by status, and `failed`: every one that is not a pass."""
        found = Counter(c.status for c in self.checks)
        return {**{s.value: found.get(s, 0) for s in CheckStatus}, "failed": len(self.failures)}

    @property
    def verdict_text(self) -> str:
        text = self._verdict
        if self.candidate is not None:
            text += f" — gating candidate {self.candidate}" + (
                f" against baseline {self._baseline}" if self._baseline else "")
        return text if self.unverified is None else f"{text} — {self.unverified}"

    @property
    def _baseline(self) -> str | None:
        return next((c.configuration for c in self.candidates if c.is_baseline), None)

    @property
    def _verdict(self) -> str:
        if self.exit_code == EXIT_INFRASTRUCTURE and any(c.check == "plausible" for c in self.failures):
            return "not qualified: an engine reported impossible figures (infrastructure failure)"
        return {
            EXIT_QUALIFIED: "qualified",
            EXIT_CHECK_FAILED: "not qualified: a check failed",
            EXIT_USAGE: "not judged: usage or matrix error",
            EXIT_INFRASTRUCTURE: "not qualified: infrastructure failure",
        }[self.exit_code]

    def summary(self, limit: int = 20) -> str:
        """A compact, plain-text summary (what `shadowlab gate` prints)."""
        lines = [f"shadowlab gate: {self.run_dir}: {self.verdict_text} (exit {self.exit_code})"]
        if self.error:
            lines.append(f"  {self.error}")
            return "\n".join(lines)
        if self.partial:
            lines.append(f"  {terminal_safe(self.partial)}")
        lines.append("  " + counts_text(self.counts))
        for c in self.candidates:
            lines.append(f"  {c.configuration:<22} {candidate_text(c)}")
        for check in self.failures[:limit]:
            lines.append(f"  {check.status.value.upper():<12} {check.check:<22} {check.subject}: "
                         f"{message_after_subject(check)}")
        if len(self.failures) > limit:
            lines.append(f"  … and {len(self.failures) - limit} more (see report.md)")
        if self.not_gated:
            failed = sum(1 for c in self.not_gated if c.status.failed)
            lines.append(f"  not gated: {len(self.not_gated)} checks of the other configurations "
                         f"({failed} failed; the report lists them)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """`shadowlab gate --json` (version 1): the exit code, the counts, every check."""
        return {
            "version": JSON_VERSION, "run_dir": str(self.run_dir), "exit_code": self.exit_code,
            "qualified": self.qualified, "verdict": self.verdict_text, "error": self.error,
            "unverified": self.unverified, "partial": self.partial, "gate_candidate": self.candidate,
            "counts": self.counts,
            "candidates": [c.to_dict() for c in self.candidates],
            "checks": [c.to_dict() for c in self.checks],
            "not_gated": [c.to_dict() for c in self.not_gated],
        }


JSON_VERSION = 1


def counts_text(counts: Mapping[str, int]) -> str:
    """The one way the count of failures is said: "checks: 40 passed, 2 failed (1 fail, 1
    inconclusive, 0 error)"."""
    parts = ", ".join(f"{counts[s.value]} {s.value}" for s in CheckStatus if s is not CheckStatus.PASS)
    return f"checks: {counts['pass']} passed, {counts['failed']} failed ({parts})"


def candidate_text(c: CandidateVerdict) -> str:
    """One configuration's answer in a line: "pass · recovered 62.5% of the ideal · net +12 ms/turn"."""
    role = "baseline" if c.is_baseline else c.status.upper()
    checks = f"{len(c.failed)} of {c.checks} checks failed" if c.failed else f"{c.checks} checks passed"
    parts = [f"{role} ({checks})"]
    if c.recovered is not None:
        parts.append(f"recovered {pct(c.recovered)} of the ideal")
    elif c.saved is not None:
        parts.append(f"reused {pct(c.saved)} of prompt tokens")
    if c.net_ms is not None:
        parts.append(f"net benefit {signed(c.net_ms, 1)} ms/turn")
    if not c.gated:
        parts.append("not gated")
    return " · ".join(parts)


def message_after_subject(check: CheckResult) -> str:
    """The check's message without its subject when it opens with it (a budget's message names
    its cell: "policy0 traffic: net benefit …"), so no line says its subject twice."""
    head = f"{check.subject}: "
    return check.message[len(head):] if check.message.startswith(head) else check.message


def exit_code_for(checks: tuple[CheckResult, ...]) -> int:
    if any(c.status is CheckStatus.ERROR for c in checks):
        return EXIT_INFRASTRUCTURE
    if any(c.status.failed for c in checks):
        return EXIT_CHECK_FAILED
    return EXIT_QUALIFIED


def evaluate(run_dir: str | Path, candidate: str | None = None) -> GateResult:
    """Judge a run directory. Bad directories (or a `candidate` the matrix does not configure)
    give exit_code 2 with `error` set."""
    run_dir = Path(run_dir)
    try:
        return evaluate_inputs(load_run(run_dir), candidate)
    except ShadowlabError as exc:
        return GateResult(EXIT_USAGE, run_dir, error=str(exc))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # A record shaped unlike any this shadowlab writes. Never let it escape as a traceback:
        # Python's exit status 1 would read as "a check failed".
        return GateResult(EXIT_USAGE, run_dir, error=f"cannot read the run records: {type(exc).__name__}: {exc}")


def evaluate_inputs(inputs: RunInputs, candidate: str | None = None) -> GateResult:
    """The gate on an already loaded run (the report renders the same result it shows).

    `candidate` (`--gate-candidate`): gate only what would ship — the checks of that
    configuration's cells, of the baseline's, and of no cell; the other configurations' checks
    are kept in `not_gated` (shown, never in the exit code). Raises ShadowlabError for a name the
    matrix does not configure."""
    checks = evaluate_checks(inputs.matrix, inputs.verdict, inputs.planned)
    checks += tuple(budgets.checks(inputs.run, inputs.verdict))  # cost vs benefit against the baseline
    configuration_of = _configuration_of(inputs)
    gated_names = _gated_configurations(inputs.matrix, candidate)
    if candidate is not None and candidate not in configuration_of.values():
        # gating a configuration with no cell in the run would qualify it on no evidence
        raise ShadowlabError(f"--gate-candidate {candidate!r}: no cell of that configuration is in this run",
                             hint="gate a configuration the run holds (a `run -k` part holds only some)")
    gated = tuple(c for c in checks if configuration_of.get(c.cell_id or "") in gated_names or
                  (c.cell_id or "") not in configuration_of)
    not_gated = tuple(c for c in checks if c not in gated)
    verdicts_ = candidate_verdicts(inputs, checks, configuration_of, gated_names)
    return GateResult(exit_code_for(gated), inputs.run_dir, gated, inputs=inputs, unverified=inputs.unverified,
                      candidate=candidate, not_gated=not_gated, candidates=verdicts_)


def _gated_configurations(matrix: Matrix, candidate: str | None) -> frozenset[str]:
    names = list(matrix.configurations)
    if candidate is None:
        return frozenset(names)
    check_gate_candidate(matrix, candidate)  # the run command's rule, before it starts anything
    return frozenset({candidate, *([matrix.baseline] if matrix.baseline else [])})


def _configuration_of(inputs: RunInputs) -> dict[str, str]:
    """cell id -> configuration, for every planned cell and every judged one (a budget's subject
    is its warm cell's id)."""
    found = {str(c.get("id")): str(c.get("configuration")) for c in inputs.plan.get("cells", ())
             if isinstance(c, Mapping) and c.get("configuration") is not None}
    found.update({c.cell_id: c.configuration for c in inputs.verdict.cells})
    return found


def candidate_verdicts(inputs: RunInputs, checks: Sequence[CheckResult], configuration_of: Mapping[str, str],
                       gated: frozenset[str]) -> tuple[CandidateVerdict, ...]:
    """Per configuration of the matrix (the baseline first): pass/fail from its cells' checks,
    the share it recovered, its net benefit against the baseline."""
    matrix = inputs.matrix
    costs = budgets.costs(inputs.run, inputs.verdict) if matrix.baseline else []
    names = sorted(matrix.configurations, key=lambda n: n != matrix.baseline)
    shared = shared_sequences(inputs.verdict)
    out = []
    for name in names:
        mine = [c for c in checks if configuration_of.get(c.cell_id or "") == name]
        if not mine:
            continue  # not in this run's selection
        failed = tuple(c for c in mine if c.status.failed)
        status = "error" if any(c.status is CheckStatus.ERROR for c in failed) else "fail" if failed else "pass"
        warm = [c for c in inputs.verdict.cells if c.kind == "warm" and c.configuration == name
                and c.sequence in shared and not plausibility.cell_problems(c)]
        recovered, saved = _shares(warm)
        nets = [(c.sequence, c.net_ms, len(c.traffic.split(" → "))) for c in costs
                if c.configuration == name and name != matrix.baseline and c.net_ms is not None]
        net = sum(v * n for _, v, n in nets) / sum(n for *_, n in nets) if nets else None
        worst = min(((s, v) for s, v, _ in nets), key=lambda x: x[1]) if len(nets) > 1 else None
        out.append(CandidateVerdict(name, name == matrix.baseline, status, len(mine), failed, recovered, saved,
                                    net, worst, name in gated))
    return tuple(out)


def shared_sequences(run: verdicts.RunVerdict) -> tuple[str, ...]:
    """The sequences every configuration of the run has a warm cell of (else every sequence):
    shares over these compare like with like (one configuration's append probe would lift it)."""
    seen: dict[str, set[str]] = {}
    for c in run.cells:
        if c.kind == "warm":
            seen.setdefault(c.configuration, set()).add(c.sequence)
    every = set.intersection(*seen.values()) if seen else set()
    order = dict.fromkeys(c.sequence for c in run.cells if c.kind == "warm")
    return tuple(s for s in order if s in every) or tuple(order)


def _shares(warm: Sequence[verdicts.CellVerdict]) -> tuple[float | None, float | None]:
    """(Σ reused / Σ ideal over the traffic cells, Σ reused / Σ prompt over all)."""
    traffic = [verdicts.traffic_summary(c) for c in warm if any(t.ideal_tokens is not None for t in c.turns)]
    ideal = sum(s[1] for s in traffic)
    recovered = sum(s[2] for s in traffic) / ideal if ideal else None
    turns = [t for c in warm for t in c.turns[1:]]
    prompt = sum(t.prompt_tokens or 0 for t in turns)
    saved = sum(t.reused_tokens or 0 for t in turns) / prompt if prompt else None
    return recovered, saved


def main(run_dir: str | Path, out: TextIO | None = None, *, candidate: str | None = None,
         as_json: bool = False) -> int:
    """`shadowlab gate RUN_DIR [--gate-candidate NAME] [--json]`: print the summary (or the JSON
    document), return the exit code.

    An unexpected exception (a bug) is exit 3 with its traceback in RUN_DIR, never exit 1."""
    try:
        result = evaluate(run_dir, candidate)
    except Exception as exc:  # noqa: BLE001 - exit 1 would read as "a check failed"
        where = write_traceback(Path(run_dir))
        print(f"shadowlab gate: {run_dir}: internal error: {type(exc).__name__}: {exc} "
              f"(traceback in {where})", file=out or sys.stdout)
        return EXIT_INFRASTRUCTURE
    if as_json:  # JSON escapes every control character itself; the exit code is the same
        print(json.dumps(result.to_dict(), indent=1, ensure_ascii=True), file=out or sys.stdout)
        return result.exit_code
    return show(result, out)


def show(result: GateResult, out: TextIO | None = None) -> int:
    """Print the summary (it quotes engine output: escaped); return the exit code."""
    print(terminal_safe(result.summary()), file=out or sys.stdout)
    return result.exit_code


# ---------------------------------------------------------------- reading the run directory


def load_run(run_dir: str | Path, *, write_verdicts: bool = False) -> RunInputs:
    """The run directory read once, and its verdicts computed once. Raises RunDirError /
    MatrixError. `write_verdicts` (the report, `shadowlab run`) refreshes verdicts.json; the
    gate only reads."""
    run = rundir.load(run_dir)
    return RunInputs(run, judge(run, write=write_verdicts))


judge = verdicts.judge  # public here too: gate callers judge a loaded run


__all__ = [
    "EXIT_QUALIFIED", "EXIT_CHECK_FAILED", "EXIT_USAGE", "EXIT_INFRASTRUCTURE", "GATE_HELP",
    "CandidateVerdict", "GateResult", "JSON_VERSION", "RunInputs", "UNVERIFIED", "candidate_text", "candidate_verdicts",
    "counts_text", "message_after_subject", "shared_sequences", "evaluate", "evaluate_inputs", "exit_code_for", "judge", "load_run", "main", "show",
]
