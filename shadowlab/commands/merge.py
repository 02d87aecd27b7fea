"""``shadowlab merge DIR... --out DIR``: the parts of a sharded run as one run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shadowlab.exitcodes import EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "merged: `shadowlab report` and `shadowlab gate` read the result"),
    (EXIT_USAGE, "the parts are refused (not parts of one run, a shard missing or twice, --out in use)"),
    (EXIT_INFRASTRUCTURE, "the merged directory could not be written"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("parts", type=Path, nargs="+", metavar="DIR",
                        help="the run directories `shadowlab run --shard I/N` wrote, one per shard")
    parser.add_argument("--out", type=Path, required=True, help="the merged run directory (new or empty)")


def main(args: argparse.Namespace) -> int:
    from shadowlab.results import merge

    outcome = merge.merge(args.parts, args.out)
    print(f"shadowlab: merged {len(outcome.parts)} parts ({outcome.cells} cells) into {outcome.out}; "
          f"`shadowlab report` and `shadowlab gate` read it", file=sys.stderr)
    return EXIT_QUALIFIED
