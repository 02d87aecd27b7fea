"""The fold's CPU time round after round in one process, beside controls that do not fold: is it
the fold or the machine that moves under a benchmark?

    python benchmarks/fold_series.py LOG [--rounds 40] [--trace] [--control-mb 100]

Each round, on the process's CPU clock (user + sys, getrusage), on whatever core it runs (pin it:
`taskset -c 0`): the fold (`analysis.analyse` reading LOG as the command does; `--trace`: the
trace written too, to a file deleted after each round) and its minor page faults, then three
controls that touch no new memory:

- count: `bytes.count` of grep's pattern ("context checkpoint") over the first --control-mb MB
  of LOG, held in memory: a streaming search, grep's kind of work;
- sort: sorting 300,000 random floats (a fixed seed): branchy and cache-bound, the fold's kind;
- sha: SHA-256 of 20 MB: arithmetic without branches.

It prints a row per round and, per column, the least, the median and max/least, and the
correlation of the fold's times with each control's. Slow fold rounds with no page faults that
fall where `sort` is slow too and `count` is not say the machine's compute moved (a VM's
neighbour on its host), not the fold: a ratio to `grep -c` measured then is low because grep's
kind of work is the one that did not slow down.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import statistics
import sys
import tempfile
from pathlib import Path

from fold_once import fold  # this directory's (it puts the tree on sys.path)

PATTERN = b"context checkpoint"


def _clock() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--trace", action="store_true", help="write the trace to a file too")
    ap.add_argument("--control-mb", type=float, default=100.0,
                    help="how much of LOG the count control searches (held in memory)")
    a = ap.parse_args()
    if a.rounds < 3:
        ap.error("--rounds: at least 3 (a median and a correlation need them)")
    try:
        with open(a.log, "rb") as fh:
            data = fh.read(int(a.control_mb * 1e6))
    except OSError as exc:
        ap.error(f"{a.log}: {exc.strerror}")
    rng = random.Random(0)
    floats = [rng.random() for _ in range(300_000)]
    blob = data[:20_000_000].ljust(20_000_000, b"\0")
    cols: dict[str, list[float]] = {"fold": [], "count": [], "sort": [], "sha": []}
    faults: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, "trace.jsonl")
        for _ in range(a.rounds):
            t0, f0 = _clock()
            fold(a.log, trace_path if a.trace else None)
            t1, f1 = _clock()
            cols["fold"].append(t1 - t0)
            faults.append(f1 - f0)
            if a.trace:
                os.unlink(trace_path)
            for name, work in (("count", lambda: data.count(PATTERN)), ("sort", lambda: sorted(floats)),
                               ("sha", lambda: hashlib.sha256(blob).digest())):
                t0, _ = _clock()
                work()
                cols[name].append(_clock()[0] - t0)
    size = a.log.stat().st_size
    print(f"{a.log} ({size / 1e9:.2f} GB){' --trace' if a.trace else ''}, {a.rounds} rounds; CPU ms a round "
          f"(count: {len(data) / 1e6:.0f} MB)")
    print("  " + "  ".join(f"{k:>6s}" for k in cols) + "  faults")
    for i in range(a.rounds):
        print("  " + "  ".join(f"{cols[k][i] * 1000:6.1f}" for k in cols) + f"  {faults[i]:6d}")
    for k, v in cols.items():
        least = min(v)
        line = (f"  {k:6s} least {least * 1000:7.1f}  median {statistics.median(v) * 1000:7.1f}  "
                f"max/least {max(v) / least if least > 0 else float('nan'):5.2f}")
        if k != "fold":
            try:
                line += f"  correlation with the fold {statistics.correlation(cols['fold'], v):+.2f}"
            except statistics.StatisticsError:  # a constant column (a clock too coarse)
                line += "  correlation with the fold: none (a constant column)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
