"""``shadowlab logs FILE...``: production llama-server logs → the figures that decide what to
qualify (shadowlab/logs/analysis.py does the reading; docs/DESIGN.md §7)."""

from __future__ import annotations

import argparse
import sys

from shadowlab.errors import LogSourceError
from shadowlab.exitcodes import EXIT_NOT_VERBOSE, EXIT_QUALIFIED, EXIT_USAGE
from shadowlab.logs.reading import FAMILIES
from shadowlab.logs.source import open_log
from shadowlab.logs.analysis import STDIN, Options, UsageError, analyse, parse_time, render_html, summary
from shadowlab.logs.outputs import json_text
from shadowlab.escape import visible as terminal_safe  # records' terminal_safe, without importing records

EXITS = (
    (EXIT_QUALIFIED, "every file was read (the summary, --json, --out, --trace written)"),
    (EXIT_USAGE, "usage error, or a file that cannot be opened (each one's reason printed, no summary)"),
    (EXIT_NOT_VERBOSE, "read, but a server's log holds no checkpoint lifecycle lines: start llama-server with "
                       "-lv 4 (a warning says which; the summary is written)"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="llama-server logs (plain or .gz; rotated pieces); - reads standard input")
    # paths as given (pathlib is imported only to write --out: ~5% of a start)
    p.add_argument("--out", default=None, metavar="DIR", help="write logs.html and logs.json into DIR")
    p.add_argument("--json", action="store_true", help="print the JSON document (version 1) instead of the summary")
    p.add_argument("--trace", default=None, metavar="TRACE.jsonl",
                   help="one JSON line per request (docs/trace.md); - writes it to standard output "
                        "(the summary then goes to standard error)")
    p.add_argument("--since", default=None, metavar="T", help="duration since the first request (36h) or ISO date")
    p.add_argument("--until", default=None, metavar="T", help="as --since")
    p.add_argument("--slot", type=int, default=None, metavar="N", help="only requests of slot N")
    p.add_argument("--family", default=None, choices=[f for f in FAMILIES if f != "none"],
                   help="log family (default: recognised per server)")


def _usage(args: argparse.Namespace) -> Options:
    """The options, or UsageError: a filter that selects nothing, `-` twice, --json and the
    trace both on standard output."""
    options = Options(family=args.family, slot=args.slot,
                      since=parse_time(args.since) if args.since else None,
                      until=parse_time(args.until) if args.until else None)
    options.check()
    if args.files.count(STDIN) > 1:
        raise UsageError("- (standard input) can be read once")
    if args.json and str(args.trace) == STDIN:
        raise UsageError("--json and --trace - both write to standard output: give --trace a file")
    return options


def _unopenable(files: list[str]) -> list[str]:
    """Why each file that cannot be opened cannot (missing, a directory, a FIFO, no permission)."""
    out = []
    for path in files:
        if path == STDIN:
            continue
        try:
            open_log(path).close()
        except LogSourceError as exc:
            out.append(f"cannot read {path}: {exc.message}")
    return out


def main(args: argparse.Namespace) -> int:
    """0 when every file was read, 2 on usage errors or a file that cannot be opened, 4 when a
    server's log holds no lifecycle lines (not verbose enough)."""
    files = [str(f) for f in args.files]
    try:
        options = _usage(args)
    except UsageError as exc:
        print(f"shadowlab logs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    missing = _unopenable(files)
    if missing:  # an error, and no summary of what the other files hold
        sys.stderr.write(terminal_safe("".join(f"shadowlab logs: {m}\n" for m in missing)))
        return EXIT_USAGE
    options.stdin = sys.stdin.buffer
    to_stdout = str(args.trace) == STDIN
    trace_fh = None
    try:
        if to_stdout:
            options.trace = sys.stdout
        elif args.trace is not None:
            try:
                trace_fh = open(args.trace, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                print(f"shadowlab logs: cannot write --trace {terminal_safe(str(args.trace))}: {exc.strerror}", file=sys.stderr)
                return EXIT_USAGE
            options.trace = trace_fh
        doc = analyse(files, options)
    finally:
        if trace_fh is not None:
            trace_fh.close()
    if not doc["readable_files"]:  # the reasons, and no summary of nothing
        sys.stderr.write(terminal_safe("".join(f"unreadable: {u['path']}: {u['why']}\n" for u in doc["unreadable_files"])))
        print("shadowlab logs: no readable input", file=sys.stderr)
        return EXIT_USAGE
    hist = doc.pop("_hist", None)
    text = json_text(doc) if args.json or args.out is not None else ""
    if args.out is not None:
        from pathlib import Path

        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "logs.json").write_text(text + "\n", encoding="utf-8")
            doc["_hist"] = hist
            (out / "logs.html").write_text(render_html(doc), encoding="utf-8")
            doc.pop("_hist", None)
        except OSError as exc:
            print(f"shadowlab logs: cannot write --out {terminal_safe(str(args.out))}: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
    (sys.stderr if to_stdout else sys.stdout).write(text + "\n" if args.json else summary(doc))
    for w in doc["warnings"]:
        sys.stderr.write(terminal_safe(f"shadowlab logs: warning: {w['server']}: {w['why']}\n"))
    return EXIT_NOT_VERBOSE if doc["warnings"] else EXIT_QUALIFIED

