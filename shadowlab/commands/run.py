"""``shadowlab run MATRIX``: every cell of a matrix, then verdicts, report and gate."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from shadowlab.bounds import Bounds
from shadowlab.commands.gate import GATE_CANDIDATE_HELP
from shadowlab.exitcodes import (
    EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, TRACEBACK_NAME,
)

EXITS = (
    (EXIT_QUALIFIED, "qualified (with --dry-run: the plan was printed; with --no-report: every cell ran)"),
    (EXIT_CHECK_FAILED, "a check failed (the run completed; the gate said no)"),
    (EXIT_USAGE, "usage or matrix error (nothing was started)"),
    (EXIT_INFRASTRUCTURE, "infrastructure failure (an engine never started, a cell could not run, "
                          "impossible figures)"),
    (EXIT_SIGINT, "interrupted by SIGINT (engines stopped; rerun with --resume)"),
    (EXIT_SIGTERM, "interrupted by SIGTERM (engines stopped; rerun with --resume)"),
)

MAX_REQUEST_TIMEOUT_S = 86400.0  # a day; beyond it threading's waits overflow
REQUEST_TIMEOUT = Bounds(0, MAX_REQUEST_TIMEOUT_S, low_open=True, unit="seconds")


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("matrix", type=Path, help="matrix YAML file (e.g. matrices/ckpt.yaml; - reads standard input)")
    run.add_argument("--out", type=Path, default=None,
                     help="run directory (default: reports/<matrix name>-<UTC time>)")
    run.add_argument("--resume", action="store_true",
                     help="reuse --out: skip cells whose meta.json says ok, rerun the rest")
    run.add_argument("--dry-run", action="store_true", help="print the planned cells; start nothing")
    run.add_argument("-k", "--only", action="append", default=[], metavar="PATTERN",
                     help="run only the warm cells whose engine, configuration, sequence or cell id "
                          "matches (a name or glob; repeatable), with their references: plan.json and "
                          "the report say the run is partial (--resume keeps the selection)")
    run.add_argument("--binary", default=None, metavar="[ENGINE=]PATH",
                     help="the llama-server build to qualify, over the matrix's binary "
                          "(default: $SHADOWLAB_BINARY; $LLAMA_SERVER_BIN_PATH where the matrix says auto)")
    run.add_argument("--model", default=None, metavar="[ENGINE=]PATH",
                     help="the GGUF to load, over the matrix's model (default: $SHADOWLAB_MODEL)")
    run.add_argument("--jobs", type=jobs, default=None,
                     help="cells run at once, each on its own cores (default: the matrix's isolation.jobs)")
    run.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]", type=fault_spec,
                     help="pass --fault to every cell of an engine kind that takes faults (repeatable; "
                          "one of: " + ", ".join(_known_faults()) + ")")
    run.add_argument("--request-timeout", type=REQUEST_TIMEOUT.argument, default=None, metavar="S",
                     help="seconds a turn may take before its cell fails (default 300)")
    run.add_argument("--gate-candidate", metavar="NAME", default=None, help=GATE_CANDIDATE_HELP
                     + " (a name the matrix does not run: exit 2 before anything starts)")
    run.add_argument("--no-report", action="store_true",
                     help="skip verdicts/report/gate after the run (exit 0 if every cell ran, else 3)")
    shard = run.add_mutually_exclusive_group()
    shard.add_argument("--shard", type=shard_spec, default=None, metavar="I/N",
                       help="run only shard I of N (1-based) and write a part for `shadowlab merge`; "
                            "with --dry-run: which shard owns which cells")
    shard.add_argument("--shard-from", choices=("k8s", "github", "gitlab"), default=None,
                       help="take I/N from the CI: k8s $JOB_COMPLETION_INDEX (+ --shard-count or "
                            "$SHADOWLAB_SHARD_COUNT), gitlab $CI_NODE_INDEX/$CI_NODE_TOTAL, github "
                            "$SHADOWLAB_SHARD_INDEX/$SHADOWLAB_SHARD_COUNT (set from strategy.job-index/-total)")
    run.add_argument("--shard-count", type=positive_int, default=None, metavar="N",
                     help="the number of shards, for --shard-from k8s (a pod knows only its index)")


def main(args: argparse.Namespace) -> int:
    from shadowlab import run
    from shadowlab.judge import attribution
    from shadowlab.matrix.overrides import Overrides

    options = run.RunOptions(
        matrix_path=args.matrix,
        out=args.out,
        resume=args.resume,
        dry_run=args.dry_run,
        jobs=args.jobs,
        faults=tuple(args.fault),
        request_timeout_s=args.request_timeout,
        shard=_shard_of(args),
        judging=attribution.RUN_JUDGING,  # what the run needs judged while it runs (no log read in run/)
        only=tuple(args.only) or _selection_of(args),
        overrides=Overrides.gather(args.binary, args.model),
        gate_candidate=args.gate_candidate,
    )
    outcome = run.run(options)  # run.Interrupted -> exit 130/143 in cli.main()
    if outcome.run_dir is None:  # dry run
        return EXIT_QUALIFIED
    # The run went through: a traceback left by an earlier attempt is about that one.
    (outcome.run_dir / TRACEBACK_NAME).unlink(missing_ok=True)
    if args.no_report:
        return EXIT_QUALIFIED if outcome.all_ran else EXIT_INFRASTRUCTURE
    return judge(outcome.run_dir, args.gate_candidate)


def judge(run_dir: Path, candidate: str | None = None) -> int:
    """Verdicts, report and gate on the finished run: the directory is read once and the
    verdicts computed once (written to verdicts.json), then shared by the report and the gate."""
    import sys

    from shadowlab import report
    from shadowlab.judge import gate

    inputs = gate.load_run(run_dir, write_verdicts=True)
    result = gate.evaluate_inputs(inputs, candidate)
    report.render_inputs(inputs, result)
    print(f"shadowlab: report in {run_dir}", file=sys.stderr)
    return gate.show(result)


# ---------------------------------------------------------------- option values
# Checked while parsing, so a bad value is argparse's usage error (exit 2), never a traceback
# or a run that silently does something else. A number's bounds are shadowlab/bounds.py's.

def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def jobs(text: str) -> int:
    """--jobs overrides the matrix's isolation.jobs: the same bounds (read only when given)."""
    from shadowlab.matrix.schema import schema_key

    return int(schema_key("isolation", "jobs").bounds.argument(text))


def shard_spec(text: str) -> object:
    from shadowlab.plan.shard import ShardSpec, ShardUsageError

    try:
        return ShardSpec.parse(text)
    except ShardUsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fault_spec(text: str) -> str:
    """A --fault value some engine kind takes (asked of the kinds: engines.check_fault)."""
    from shadowlab import engines

    try:
        engines.check_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _known_faults() -> tuple[str, ...]:
    from shadowlab import engines

    return engines.fault_names()


def _selection_of(args: argparse.Namespace) -> tuple[str, ...]:
    """--resume without -k: the selection the run started with (plan.json), so a partial run
    resumes as the part it is; with -k, the run's own check refuses a different one."""
    if not args.resume or args.out is None:
        return ()
    from shadowlab.errors import RunDirError
    from shadowlab.results import records

    try:
        plan = records.read_json(args.out / "plan.json")
    except (RunDirError, OSError):  # no readable plan: the resume itself says so
        return ()
    selection = plan.get("selection") if isinstance(plan, dict) else None
    only = selection.get("only") if isinstance(selection, dict) else None
    return tuple(str(p) for p in only) if isinstance(only, list) else ()


def _shard_of(args: argparse.Namespace) -> object:
    from shadowlab.plan.shard import ShardSpec, ShardUsageError

    if args.shard_from is not None:
        return ShardSpec.from_ci(args.shard_from, os.environ, args.shard_count)
    if args.shard_count is not None and args.shard is None:
        raise ShardUsageError("--shard-count goes with --shard-from k8s")
    if args.shard is not None and args.shard_count is not None and args.shard_count != args.shard.count:
        raise ShardUsageError(f"--shard {args.shard} and --shard-count {args.shard_count} disagree")
    return args.shard
