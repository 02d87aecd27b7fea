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

import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from shadowlab.judge import budgets, verdicts
from shadowlab.results import rundir
from shadowlab.errors import RunDirError, ShadowlabError
from shadowlab.exitcodes import (
    EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE, GATE_HELP, write_traceback,
)
from shadowlab.judge.expectations import CheckResult, CheckStatus, evaluate as evaluate_checks
from shadowlab.matrix import Matrix
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
    def unverified(self) -> str | None:
        """Why the verdicts are unverified (judged from verdicts.json alone), else None."""
        if self.run.has_cells or self.run.saved_verdicts is None:
            return None
        return UNVERIFIED


UNVERIFIED = ("UNVERIFIED: judged from verdicts.json alone; the records it was computed from (cells/: "
              "meta.json, engine.log) are not in the run directory, so no figure of it was re-derived")


@dataclass(frozen=True)
class GateResult:
    exit_code: int
    run_dir: Path
    checks: tuple[CheckResult, ...] = ()
    error: str | None = None  # exit 2: why the run directory could not be judged
    inputs: RunInputs | None = field(default=None, repr=False, compare=False)
    unverified: str | None = None  # judged from a verdicts.json without its records: why that is

    def __int__(self) -> int:
        return self.exit_code

    @property
    def qualified(self) -> bool:
        return self.exit_code == EXIT_QUALIFIED

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        """Failed checks, infrastructure errors first."""
        failed = [c for c in self.checks if c.status.failed]
        return tuple(sorted(failed, key=lambda c: c.status is not CheckStatus.ERROR))

    @property
    def verdict_text(self) -> str:
        text = self._verdict
        return text if self.unverified is None else f"{text} — {self.unverified}"

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
        counts = Counter(c.status for c in self.checks)
        lines.append("  checks: " + ", ".join(f"{counts.get(s, 0)} {s.value}" for s in CheckStatus))
        for check in self.failures[:limit]:
            lines.append(f"  {check.status.value.upper():<12} {check.check:<22} {check.subject}: {check.message}")
        if len(self.failures) > limit:
            lines.append(f"  … and {len(self.failures) - limit} more (see report.md)")
        return "\n".join(lines)


def exit_code_for(checks: tuple[CheckResult, ...]) -> int:
    if any(c.status is CheckStatus.ERROR for c in checks):
        return EXIT_INFRASTRUCTURE
    if any(c.status.failed for c in checks):
        return EXIT_CHECK_FAILED
    return EXIT_QUALIFIED


def evaluate(run_dir: str | Path) -> GateResult:
    """Judge a run directory. Bad directories give exit_code 2 with `error` set."""
    run_dir = Path(run_dir)
    try:
        inputs = load_run(run_dir)
    except ShadowlabError as exc:
        return GateResult(EXIT_USAGE, run_dir, error=str(exc))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # A record shaped unlike any this shadowlab writes. Never let it escape as a traceback:
        # Python's exit status 1 would read as "a check failed".
        return GateResult(EXIT_USAGE, run_dir, error=f"cannot read the run records: {type(exc).__name__}: {exc}")
    return evaluate_inputs(inputs)


def evaluate_inputs(inputs: RunInputs) -> GateResult:
    """The gate on an already loaded run (the report renders the same result it shows)."""
    checks = evaluate_checks(inputs.matrix, inputs.verdict, inputs.planned)
    checks += tuple(budgets.checks(inputs.run, inputs.verdict))  # cost vs benefit against the baseline
    return GateResult(exit_code_for(checks), inputs.run_dir, checks, inputs=inputs, unverified=inputs.unverified)


def main(run_dir: str | Path, out: TextIO | None = None) -> int:
    """`shadowlab gate RUN_DIR`: print the summary, return the exit code.

    An unexpected exception (a bug) is exit 3 with its traceback in RUN_DIR, never exit 1."""
    try:
        result = evaluate(run_dir)
    except Exception as exc:  # noqa: BLE001 - exit 1 would read as "a check failed"
        where = write_traceback(Path(run_dir))
        print(f"shadowlab gate: {run_dir}: internal error: {type(exc).__name__}: {exc} "
              f"(traceback in {where})", file=out or sys.stdout)
        return EXIT_INFRASTRUCTURE
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
    "GateResult", "RunInputs", "UNVERIFIED", "evaluate", "evaluate_inputs", "exit_code_for", "judge", "load_run", "main", "show",
]
