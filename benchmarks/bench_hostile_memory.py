"""Peak memory of shadowlab while an engine writes one enormous line per turn (issue 9, item 2).

    python benchmarks/bench_hostile_memory.py [--line-bytes 1000000000] [--dir DIR] [--no-report]

Runs ``shadowlab run`` as a user would (a subprocess; verdicts, report and gate included
unless --no-report) on tests/shadowlab/hostile_engine.py in mode ``flood-line=N``: every
completion first writes N bytes of ``z`` with no newline to the engine's log (in 1 MiB writes,
so the engine itself stays small). The matrix has one warm cell of two turns and its cold
cell, so the log spans cross one such line per turn. Side by side, the same run with a line
of 0 bytes gives shadowlab's baseline. The figure is the peak resident set of the shadowlab
process itself (``VmHWM`` of /proc/self/status at its exit; the engines are other
processes), and the ratio peak / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shadowlab.run import environment

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "tests" / "shadowlab" / "hostile_engine.py"

MATRIX = """\
version: 1
name: hostile-memory
engines:
  flood:
    kind: openai
    binary: {python}
    command: ['{{binary}}', {script}, --port, '{{port}}', --mode, 'flood-line={line}']
    log_family: llama.cpp
    ready_timeout_s: 30
    threads: 1
prompts:
  A: {{kind: random, tokens: 24, seed: 1}}
  B: {{kind: random, tokens: 24, seed: 2}}
sequences:
  A-B: [A, B]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1, max_log_mib: 4096}}  # two turns' lines fit under the log cap
identity: {{control: false}}
"""

# The shadowlab process reports its own peak RSS (bytes) into argv[1] when it ends.
PEAK_RSS = """\
import sys
from shadowlab import cli
code = cli.main(sys.argv[2:])
# VmHWM is this image's own high-water mark. Not getrusage's ru_maxrss: Linux carries the
# pre-exec image's peak into it, so a child forked from a big pytest reported pytest's RSS.
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
open(sys.argv[1], "w").write(str(int(hwm.split()[1]) * 1024))
sys.exit(code)
"""


def measure(line_bytes: int, work: Path, report: bool) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    matrix = work / "m.yaml"
    matrix.write_text(MATRIX.format(python=json.dumps(sys.executable), script=json.dumps(str(HOSTILE)),
                                    line=line_bytes))
    out, rss = work / "run", work / "peak-rss"
    args = ["run", str(matrix), "--out", str(out), "--request-timeout", "600"]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(rss), *args,
                           *([] if report else ["--no-report"])], capture_output=True, text=True)
    wall = time.monotonic() - started
    logs = sorted(out.glob("cells/*/engine.log"))
    return {"line_bytes": line_bytes, "exit": proc.returncode, "wall_s": round(wall, 1),
            "peak_rss_bytes": int(rss.read_text()) if rss.exists() else None,
            "log_bytes": sum(p.stat().st_size for p in logs), "cells": len(logs),
            "stderr_tail": proc.stderr[-600:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line-bytes", type=int, default=1_000_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed)")
    parser.add_argument("--no-report", action="store_true", help="the run stage alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hostile-memory-") as tmp:
        work = args.dir or Path(tmp)
        baseline = measure(0, work / "baseline", not args.no_report)
        flood = measure(args.line_bytes, work / "flood", not args.no_report)
    print(f"machine: {environment.cpu_model()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    for result in (baseline, flood):
        peak = result["peak_rss_bytes"]
        print(f"line {result['line_bytes']:>13,} B: exit {result['exit']}, {result['cells']} cells, "
              f"engine.log total {result['log_bytes']:,} B, wall {result['wall_s']} s, "
              f"shadowlab peak RSS {peak / 2**20 if peak else float('nan'):.1f} MiB")
        if result["exit"] not in (0, 1):
            print(result["stderr_tail"])
    if baseline["peak_rss_bytes"] and flood["peak_rss_bytes"]:
        ratio = flood["peak_rss_bytes"] / baseline["peak_rss_bytes"]
        grown = (flood["peak_rss_bytes"] - baseline["peak_rss_bytes"]) / 2**20
        print(f"peak RSS with the line / without: {ratio:.2f} (+{grown:.1f} MiB for "
              f"{flood['log_bytes'] / 2**20:.0f} MiB of log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
