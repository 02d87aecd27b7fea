"""Command line: ``shadowlab run | report | gate | merge | logs | compare``. Thin: parse, call the stage, map errors.

Exit codes (defined in shadowlab/exitcodes.py; decided here and in the gate, nowhere else):
  0  qualified
  1  a check failed (the run completed; the gate said no)
  2  usage or matrix error (nothing was started)
  3  infrastructure failure (an engine never started; a cell could not run)
  130 / 143  interrupted by SIGINT / SIGTERM (engines stopped, run resumable)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from shadowlab.errors import EngineError, InfrastructureError, QualificationError, ShadowlabError
from shadowlab.exitcodes import (
    EPILOG, EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE, TRACEBACK_NAME, write_traceback,
)


# Subcommands whose options live in their own module (`add_arguments`). Importing all of them costs
# ~0.25 s per start (httpx, the matrix package, ...), a quarter of `shadowlab logs` on 1 GB: main()
# builds only the one named.
MODULE_COMMANDS = {
    "logs": ("shadowlab.logs", "read production llama-server logs: lifecycle counts, shared prefixes, trace"),
    "simulate": ("shadowlab.simulate", "predict what each cache policy would reuse on a traffic (no engine)"),
    "compare": ("shadowlab.compare", "baseline vs candidate run: deltas with their noise band"),
    "capture": ("shadowlab.capture", "record production traffic as a trace of hashed token blocks (never the text)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only` naming a module-backed subcommand, the others of
    MODULE_COMMANDS get their name and help but not their options (their modules stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="shadowlab",
        description="Shadow experiments for context-checkpoint caching on hybrid engines.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run every cell of a matrix, then report and gate",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("matrix", type=Path, help="matrix YAML file (e.g. matrices/ckpt.yaml)")
    run.add_argument("--out", type=Path, default=None,
                     help="run directory (default: reports/<matrix name>-<UTC time>)")
    run.add_argument("--resume", action="store_true",
                     help="reuse --out: skip cells whose meta.json says ok, rerun the rest")
    run.add_argument("--dry-run", action="store_true", help="print the planned cells; start nothing")
    run.add_argument("--jobs", type=positive_int, default=None,
                     help="cells run at once, each on its own cores (default: the matrix's isolation.jobs)")
    run.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]", type=fault_spec,
                     help="pass --fault to every reference-engine cell (repeatable; "
                          "one of the reference engine's faults: " + ", ".join(_known_faults()) + ")")
    run.add_argument("--request-timeout", type=seconds, default=None, metavar="S",
                     help="seconds a turn may take before its cell fails (default: the engine's "
                          "request_timeout_s, else 300)")
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

    for name, text in (("report", "render report.html/report.md/junit.xml for a run directory"),
                       ("gate", "decide qualified or not for a run directory (exit code)")):
        p = sub.add_parser(name, help=text, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("run_dir", type=Path)
    merge = sub.add_parser("merge", help="merge the parts of a sharded run into one run directory",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    merge.add_argument("parts", type=Path, nargs="+", metavar="DIR",
                       help="the run directories `shadowlab run --shard I/N` wrote, one per shard")
    merge.add_argument("--out", type=Path, required=True, help="the merged run directory (new or empty)")
    for name, (module, text) in MODULE_COMMANDS.items():
        p = sub.add_parser(name, help=text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        if only is None or only == name:
            importlib.import_module(module).add_arguments(p)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names (its first word that is no option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


# ---------------------------------------------------------------- option values
# Checked while parsing, so a bad value is argparse's usage error (exit 2), never a traceback
# or a run that silently does something else.

MAX_REQUEST_TIMEOUT_S = 86400.0  # a day; beyond it threading's waits overflow


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    # nan compares false with everything, so test what is allowed, not what is not.
    if not 0 < value <= MAX_REQUEST_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"expected seconds above 0 and at most {MAX_REQUEST_TIMEOUT_S:g}, got {text}")
    return value


def shard_spec(text: str) -> object:
    from shadowlab.shard import ShardSpec, ShardUsageError

    try:
        return ShardSpec.parse(text)
    except ShardUsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fault_spec(text: str) -> str:
    """A --fault value the reference engine knows (its own parser, shadowlab_engine.faults)."""
    try:
        from shadowlab_engine.faults import FaultError, parse_faults
    except ImportError:  # engine not installed: its cells report that when they start
        return text
    try:
        parse_faults([text])
    except FaultError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _known_faults() -> tuple[str, ...]:
    try:
        from shadowlab_engine.faults import KNOWN
    except ImportError:
        return ()
    return KNOWN


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command_of(argv)).parse_args(argv)
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # a closed pipe (`| head -1`) shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader went away (e.g. `shadowlab run X --dry-run | head -1`): not an error.
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_QUALIFIED


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report(args.run_dir)
        if args.command == "logs":
            return int(importlib.import_module("shadowlab.logs").run(args))
        if args.command == "simulate":
            return int(importlib.import_module("shadowlab.simulate").run(args))
        if args.command == "merge":
            return _merge(args.parts, args.out)
        if args.command == "compare":
            return int(importlib.import_module("shadowlab.compare").main(args))
        if args.command == "capture":
            return int(importlib.import_module("shadowlab.capture").run(args))
        return _gate(args.run_dir)
    except BrokenPipeError:
        raise
    except QualificationError as exc:
        print(f"shadowlab: {_safe(exc)}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except (EngineError, InfrastructureError) as exc:
        print(f"shadowlab: {_safe(exc)}", file=sys.stderr)
        return EXIT_INFRASTRUCTURE
    except ShadowlabError as exc:
        print(f"shadowlab: {_safe(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        # run.Interrupted (SIGTERM) is a KeyboardInterrupt carrying the signal number.
        signum = getattr(exc, "signum", 2)
        print(f"shadowlab: interrupted (signal {signum}); engines stopped", file=sys.stderr)
        return 128 + signum
    except Exception as exc:  # noqa: BLE001 - a bug must never read as exit 1 ("a check failed")
        where = write_traceback(_run_dir_of(args))
        print(f"shadowlab: internal error: {type(exc).__name__}: {_safe(exc)} (traceback in {where})",
              file=sys.stderr)
        return EXIT_INFRASTRUCTURE


def _safe(exc: BaseException) -> str:
    from shadowlab.records import terminal_safe  # messages may quote engine output

    return terminal_safe(str(exc))


def _run_dir_of(args: argparse.Namespace) -> Path | None:
    return getattr(args, "run_dir", None) or getattr(args, "out", None)


def _run(args: argparse.Namespace) -> int:
    from shadowlab import run

    options = run.RunOptions(
        matrix_path=args.matrix,
        out=args.out,
        resume=args.resume,
        dry_run=args.dry_run,
        jobs=args.jobs,
        faults=tuple(args.fault),
        request_timeout_s=args.request_timeout,
        shard=_shard_of(args),
    )
    outcome = run.run(options)  # run.Interrupted -> exit 130/143 in main()
    if outcome.run_dir is None:  # dry run
        return EXIT_QUALIFIED
    # The run went through: a traceback left by an earlier attempt is about that one.
    (outcome.run_dir / TRACEBACK_NAME).unlink(missing_ok=True)
    if args.no_report:
        return EXIT_QUALIFIED if outcome.all_ran else EXIT_INFRASTRUCTURE
    return _judge(outcome.run_dir, all_ran=outcome.all_ran)


def _shard_of(args: argparse.Namespace) -> object:
    from shadowlab.shard import ShardSpec, ShardUsageError

    if args.shard_from is not None:
        return ShardSpec.from_ci(args.shard_from, os.environ, args.shard_count)
    if args.shard_count is not None and args.shard is None:
        raise ShardUsageError("--shard-count goes with --shard-from k8s")
    if args.shard is not None and args.shard_count is not None and args.shard_count != args.shard.count:
        raise ShardUsageError(f"--shard {args.shard} and --shard-count {args.shard_count} disagree")
    return args.shard


def _merge(parts: Sequence[Path], out: Path) -> int:
    from shadowlab import merge

    outcome = merge.merge(parts, out)
    print(f"shadowlab: merged {len(outcome.parts)} parts ({outcome.cells} cells) into {outcome.out}; "
          f"`shadowlab report` and `shadowlab gate` read it", file=sys.stderr)
    return EXIT_QUALIFIED


def _judge(run_dir: Path, *, all_ran: bool) -> int:
    """Verdicts, report and gate on the finished run: the directory is read once and the
    verdicts computed once (written to verdicts.json), then shared by the report and the gate."""
    from shadowlab import gate, report

    inputs = gate.load_run(run_dir, write_verdicts=True)
    result = gate.evaluate_inputs(inputs)
    report.render_inputs(inputs, result)
    print(f"shadowlab: report in {run_dir}", file=sys.stderr)
    return gate.show(result)


def _report(run_dir: Path) -> int:
    from shadowlab import report

    report.render_run(run_dir)
    return EXIT_QUALIFIED


def _gate(run_dir: Path) -> int:
    from shadowlab import gate

    return gate.main(run_dir)  # prints its summary


if __name__ == "__main__":
    sys.exit(main())
