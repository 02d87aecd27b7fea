"""``shadowlab gate RUN_DIR``: one exit code for a run directory (the qualification gate)."""

from __future__ import annotations

import argparse
from pathlib import Path

from shadowlab.exitcodes import EXIT_CHECK_FAILED, EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "qualified: every cell ran and every check passed"),
    (EXIT_CHECK_FAILED, "a check failed (an expectation, byte identity, a control, the cascade, a budget)"),
    (EXIT_USAGE, "usage or matrix error: not a run directory, matrix.yaml unreadable or invalid"),
    (EXIT_INFRASTRUCTURE, "infrastructure failure: an engine never started, a cell could not run to "
                          "the end, or impossible figures; takes precedence over 1"),
)


GATE_CANDIDATE_HELP = ("gate only what would ship: this configuration's checks, its baseline's and the run's "
                       "own; the other configurations' are shown but never decide the exit code")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--gate-candidate", metavar="NAME", default=None, help=GATE_CANDIDATE_HELP)
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON document (version 1: exit code, counts, per-candidate "
                             "verdicts, every check) instead of the summary; the exit code is the same")


def main(args: argparse.Namespace) -> int:
    from shadowlab.judge import gate

    return gate.main(args.run_dir, candidate=args.gate_candidate, as_json=args.json)  # prints its result
