"""shadowlab logs: lines/s on a large production-shaped log, side by side with grep / zcat | grep.

    python benchmarks/bench_logs.py [--gb 1.0] [--dense] [--repeat 3] [--dir /tmp/bench_logs]

Writes a b11434 log of the given size (scripts/make_prodlogs.py traffic, repeated; each copy
starts again at task 0 and time 0, which the replay reads as a restart), its .gz, reads both once
so that every command below reads from the page cache (said in the output), then times in the
same run: `grep -c "context checkpoint"`, `shadowlab logs --json` (parse + replay + aggregation),
`zcat | grep -c`, `shadowlab logs` on the .gz; and the peak RSS of `shadowlab logs` on the first
0.1 GB and on the whole file (flat: within 50 MiB). Every output goes to a file: GNU grep
given /dev/null as its output stops at the first match and times nothing.

Times are wall clock and CPU (user + sys) of each command: on a shared machine the wall clock
mostly measures the other load, so the ratios are given for both. The plain-file pair (grep,
then shadowlab) runs --repeat times, interleaved; the figures are the medians, every run listed. --dense: a log of the
lifecycle lines only (0.72 events per line; a real server at -lv 4 prints about 0.4), the
reader's worst case.

shadowlab's modules are byte-compiled before the timing, as `pip install` does: where
PYTHONDONTWRITEBYTECODE is set (this project's machines), every start would otherwise compile
~20 modules from source (~0.3 s). The start-up alone (`shadowlab logs --help`: the interpreter
and the CLI's imports) is timed too, since on 1 GB it is a fifth of the command.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_prodlogs  # noqa: E402


def build(path: Path, size: int, dense: bool) -> None:
    seed_dir = path.parent / ("seed-dense" if dense else "seed")
    make_prodlogs.generate(seed_dir, "b11434", seed=0, requests=2000, slots=2, pieces=1, days=1, chatter=not dense)
    block = (seed_dir / "server0.log").read_bytes()
    with open(path, "wb") as out:
        while out.tell() < size:
            out.write(block)


def timed(cmd: str, out: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KiB) of a shell command whose stdout goes to `out`."""
    with open(out, "wb") as fh:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", "sh", "-c", cmd], stdout=fh, stderr=subprocess.PIPE,
                           text=True, check=True)
    wall, user, system, rss = p.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(system), int(rss)


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(8 << 20):
            pass


def median_run(runs: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """The run of median CPU time (its wall clock and RSS with it)."""
    return sorted(runs, key=lambda r: r[1])[len(runs) // 2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_logs"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    big, small, res = a.dir / "big.log", a.dir / "small.log", a.dir / "out.txt"
    build(big, int(a.gb * 1e9), a.dense)
    with open(big, "rb") as src, open(small, "wb") as dst:
        dst.write(src.read(int(0.1e9)).rsplit(b"\n", 1)[0] + b"\n")
    with open(big, "rb") as src, gzip.open(str(big) + ".gz", "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 8 << 20)
    for p in (big, Path(str(big) + ".gz"), small):
        warm(p)
    for package in (ROOT / "shadowlab", ROOT / "engine"):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True, stdout=subprocess.DEVNULL)
    with open(big, "rb") as fh:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(8 << 20), b""))
    load0 = os.getloadavg()
    sl = f"{sys.executable} -m shadowlab logs --json"
    pairs = [(timed(f'grep -c "context checkpoint" {big}', res), timed(f"{sl} {big}", res)) for _ in range(a.repeat)]
    g, s = median_run([p[0] for p in pairs]), median_run([p[1] for p in pairs])
    zg = timed(f'zcat {big}.gz | grep -c "context checkpoint"', res)
    zs = timed(f"{sl} {big}.gz", res)
    sm = timed(f"{sl} {small}", res)
    start = timed(f"{sys.executable} -m shadowlab logs --help", res)
    load1 = os.getloadavg()
    print(f"log {big.stat().st_size / 1e9:.2f} GB ({'dense' if a.dense else 'realistic'}), {lines:,} lines, "
          f"read from the page cache (each file read once just before); nproc {os.cpu_count()}; "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    for name, (gw, gc), (sw, sc) in (("grep -c", g[:2], s[:2]), ("zcat | grep -c", zg[:2], zs[:2])):
        print(f"{name}: {gw:.2f} s wall, {gc:.2f} s CPU; shadowlab logs: {sw:.2f} s wall, {sc:.2f} s CPU = "
              f"{lines / sw / 1e6:.2f}M lines/s wall, {lines / sc / 1e6:.2f}M lines/s CPU; "
              f"ratio {gw / sw:.2f}x wall, {gc / sc:.2f}x CPU")
    print("runs (CPU s, grep / shadowlab): " + ", ".join(f"{x[1]:.2f} / {y[1]:.2f}" for x, y in pairs))
    print(f"start-up (shadowlab logs --help): {start[0]:.2f} s wall, {start[1]:.2f} s CPU")
    print(f"peak RSS: 0.1 GB {sm[2] / 1024:.0f} MiB, {a.gb} GB {s[2] / 1024:.0f} MiB (.gz {zs[2] / 1024:.0f} MiB), "
          f"difference {(s[2] - sm[2]) / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
