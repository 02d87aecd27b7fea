"""``shadowlab compare BASELINE_RUN CANDIDATE_RUN``: deltas with their noise band."""

from __future__ import annotations

import argparse

from shadowlab.exitcodes import EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "the comparison was printed"),
    (EXIT_USAGE, "the runs are refused as not comparable (each difference named), or usage"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from shadowlab import compare

    compare.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from shadowlab import compare

    return int(compare.main(args))
