"""Command line: ``shadowlab <command>``, one row per command in COMMANDS. Thin: parse, call the command, map errors.

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
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shadowlab.errors import EngineError, InfrastructureError, QualificationError, ShadowlabError
from shadowlab.exitcodes import (
    EPILOG, EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE, TRACEBACK_NAME, epilog, write_traceback,
)

if TYPE_CHECKING:
    from pathlib import Path  # pathlib (with urllib.parse and ipaddress) costs ~5% of a start


# The commands, one row each: name, the module in shadowlab/commands/ that implements it
# (EXITS, add_arguments, main), and its one-line help. Importing every module costs ~0.25 s per
# start (httpx, the matrix package, ...), a quarter of `shadowlab logs` on 1 GB: build_parser
# imports only the one named.
COMMANDS = {
    "init": ("shadowlab.commands.init", "write a starter matrix: your build and GGUF, current vs candidate flags"),
    "run": ("shadowlab.commands.run", "run every cell of a matrix, then report and gate"),
    "report": ("shadowlab.commands.report", "render report.html/report.md/junit.xml for a run directory"),
    "gate": ("shadowlab.commands.gate", "decide qualified or not for a run directory (exit code)"),
    "merge": ("shadowlab.commands.merge", "merge the parts of a sharded run into one run directory"),
    "logs": ("shadowlab.commands.logs", "read production llama-server logs: lifecycle counts, shared prefixes, trace"),
    "simulate": ("shadowlab.commands.simulate", "predict what each cache policy would reuse on a traffic (no engine)"),
    "compare": ("shadowlab.commands.compare", "baseline vs candidate run: deltas with their noise band"),
    "capture": ("shadowlab.commands.capture", "record production traffic as a trace of hashed token blocks (never the text)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only` given, every subcommand but the one it names (none
    for "") gets its name and help but not its options (their modules stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="shadowlab",
        description="Shadow experiments for context-checkpoint caching on hybrid engines.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, text) in COMMANDS.items():
        if only is None or only == name:
            module = importlib.import_module(module_name)
            p = sub.add_parser(name, help=text, description=text, epilog=epilog(module.EXITS),
                               formatter_class=_Formatter)
            module.add_arguments(p)
        else:
            sub.add_parser(name, help=text, formatter_class=_Formatter)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, its width found as shutil.get_terminal_size finds it (COLUMNS, then standard
    output's terminal, then 80) without importing shutil: argparse makes a formatter at every
    add_argument, and shutil's imports (zlib, bz2, lzma) cost ~5% of a start."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _columns() - 2 if width is None else width)


def _columns() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class _VersionAction(argparse.Action):
    """`--version`, the package metadata read only when asked (importlib.metadata costs ~20 ms
    of every start otherwise)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser._print_message(f"{parser.prog} {_version()}\n", sys.stdout)
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shadowlab")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _command_of(argv: Sequence[str]) -> str:
    """The subcommand `argv` names (its first word that is no option); "" when none does
    (`shadowlab --help` lists the commands from COMMANDS alone)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command's modules are imported while its parser is built: a collection then finds
    # only what lives on (classes, functions, tables), ~4% of a start's instructions
    collecting = gc.isenabled()
    gc.disable()
    try:
        args = build_parser(_command_of(argv)).parse_args(argv)
    finally:
        if collecting:
            gc.enable()
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
    """The one error boundary: every command's errors become exit codes here."""
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).main(args))
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
    from shadowlab.results.records import terminal_safe  # messages may quote engine output

    return terminal_safe(str(exc))


def _run_dir_of(args: argparse.Namespace) -> Path | str | None:
    return getattr(args, "run_dir", None) or getattr(args, "out", None)


__all__ = ["COMMANDS", "EPILOG", "EXIT_CHECK_FAILED", "EXIT_INFRASTRUCTURE", "EXIT_QUALIFIED", "EXIT_USAGE",
           "TRACEBACK_NAME", "build_parser", "main"]


if __name__ == "__main__":
    sys.exit(main())
