"""Two or more builds of the log accelerator, timed against each other in one process.

    python benchmarks/fold_ab.py LOG NAME=BUILD.so NAME=BUILD.so ... [--rounds N] [--trace]

Each round reads LOG once with each build (`analysis.analyse`, the same Python code, the order
reversed every other round) and times it; the table gives each build's least and median time and
its ratio to the first build's, round by round. This VM's CPU time moves by up to 40 % between
processes and minutes (benchmarks/README.md, "shadowlab logs"), so a change of a few per cent to
the C code is measured here, where both builds share a process, a page cache and a minute: the
least times of two runs agree within ~1 %. A build is a `_logscan*.so` built in another checkout
(`git worktree add ../base HEAD~1 && cd ../base && python setup.py build_ext --inplace`) or copied
aside before a rebuild; it must speak this tree's ABI. `--trace` writes the trace to a file too
(deleted after each read, untimed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "engine")]

from fold_once import fold, load_build, use_build  # noqa: E402  (this directory: the script's own)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("builds", nargs="+", metavar="NAME=BUILD.so")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--trace", action="store_true", help="write the trace to a file too")
    a = ap.parse_args()
    builds = {}
    for item in a.builds:
        name, sep, path = item.partition("=")
        if not sep or not name:
            ap.error(f"{item!r}: NAME=BUILD.so expected")
        builds[name] = load_build(Path(path))
    times: dict[str, list[float]] = {name: [] for name in builds}
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, "trace.jsonl")
        for r in range(a.rounds):
            order = list(builds.items())
            for name, module in order if r % 2 == 0 else reversed(order):
                use_build(module)
                t0 = time.perf_counter()
                fold(a.log, trace_path if a.trace else None)
                times[name].append(time.perf_counter() - t0)
                if a.trace:
                    os.unlink(trace_path)
    first = next(iter(times))
    print(f"{a.log} ({a.log.stat().st_size / 1e9:.2f} GB){' --trace' if a.trace else ''}, {a.rounds} rounds")
    for name, v in times.items():
        ratio = statistics.median(x / y for x, y in zip(v, times[first]))
        print(f"  {name:12s} least {min(v) * 1000:7.1f} ms  median {statistics.median(v) * 1000:7.1f} ms"
              f"  / {first}, round by round: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
