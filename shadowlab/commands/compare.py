"""``shadowlab compare BASELINE_RUN CANDIDATE_RUN``: deltas with their noise band."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shadowlab.exitcodes import EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "the comparison was printed"),
    (EXIT_USAGE, "the runs are refused as not comparable (each difference named), or usage"),
)


def main(args: argparse.Namespace) -> int:
    """Print the comparison (exit 0); the runs refused as not comparable: CompareRefused, exit 2."""
    from shadowlab import compare  # the judge's modules load only when a command needs them
    from shadowlab.errors import ShadowlabError
    from shadowlab.results import rundir

    unknown = [a for a in args.allow if a not in compare.ALLOWABLE]
    if unknown:
        raise ShadowlabError(f"--allow {unknown[0]!r}: expected one of {', '.join(compare.ALLOWABLE)}")
    base = rundir.load(args.baseline)
    cand = base if args.candidate == args.baseline else rundir.load(args.candidate)
    result = compare.compare(base, cand, baseline_configuration=args.baseline_config,
                             candidate_configuration=args.candidate_config, allow=tuple(args.allow),
                             impossible="exclude" if args.exclude_impossible else "refuse")
    print(json.dumps(compare.to_dict(result), indent=1) if args.json else compare.render_text(result))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from shadowlab import compare

    parser.add_argument("baseline", type=_path, metavar="BASELINE_RUN")
    parser.add_argument("candidate", type=_path, metavar="CANDIDATE_RUN",
                        help="may be BASELINE_RUN again, with --baseline-config/--candidate-config")
    parser.add_argument("--baseline-config", default=None, metavar="NAME",
                        help="the baseline run's configuration to compare (default: match configurations)")
    parser.add_argument("--candidate-config", default=None, metavar="NAME")
    parser.add_argument("--allow", action="append", default=[], metavar="|".join(compare.ALLOWABLE),
                        help="a difference between the runs that is the point of the comparison (repeatable)")
    parser.add_argument("--exclude-impossible", action="store_true",
                        help="leave out (and name) cells whose engine reported impossible figures, instead of "
                             "refusing the comparison (exit 3)")
    parser.add_argument("--json", action="store_true", help="the comparison as JSON")


def _path(text: str) -> Path:
    return Path(text)
