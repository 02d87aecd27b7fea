"""``shadowlab simulate SOURCE``: what each cache policy would reuse on a traffic (no engine)."""

from __future__ import annotations

import argparse

from shadowlab.exitcodes import EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "the traffic was simulated under every policy"),
    (EXIT_USAGE, "bad input: the source, a policy or a parameter (named)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from shadowlab import simulate

    simulate.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from shadowlab import simulate

    return int(simulate.run(args))
