"""``shadowlab report RUN_DIR``: report.html, report.md and junit.xml for a run directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from shadowlab.exitcodes import EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "the report was written (whatever the gate would decide: `shadowlab gate` says that)"),
    (EXIT_USAGE, "not a run directory, or one shadowlab cannot read"),
    (EXIT_INFRASTRUCTURE, "the report could not be written (disk full, read-only)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from shadowlab.commands.gate import GATE_CANDIDATE_HELP

    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--gate-candidate", metavar="NAME", default=None,
                        help=GATE_CANDIDATE_HELP + " (the report's banner and junit.xml then judge that candidate)")


def main(args: argparse.Namespace) -> int:
    from shadowlab import report

    report.render_run(args.run_dir, candidate=args.gate_candidate)
    return EXIT_QUALIFIED
