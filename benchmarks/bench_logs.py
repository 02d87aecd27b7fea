"""shadowlab logs: lines/s on a large production-shaped log, side by side with grep / zcat | grep.

    python benchmarks/bench_logs.py [--gb 1.0] [--dir /tmp/bench_logs]

Writes a b11434 log of the given size (scripts/make_prodlogs.py traffic, repeated with growing
times), its .gz, then times in the same run: `grep -c "context checkpoint"`, `shadowlab logs
--json` (parse + replay + aggregation), `zcat | grep -c`, `shadowlab logs` on the .gz; and the
peak RSS of `shadowlab logs` on the first 0.1 GB and on the whole file (flat: within 50 MiB).
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_prodlogs  # noqa: E402


def build(path: Path, size: int) -> None:
    seed_dir = path.parent / "seed"
    make_prodlogs.generate(seed_dir, "b11434", seed=0, requests=2000, slots=2, pieces=1, days=1)
    block = (seed_dir / "server0.log").read_bytes()
    with open(path, "wb") as out:
        while out.tell() < size:
            out.write(block)  # a restart per copy: elapsed time starts again (a realistic rotation)


def timed(cmd: str) -> tuple[float, int]:
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", "sh", "-c", cmd], capture_output=True, text=True)
    rss_kib = int(p.stderr.strip().splitlines()[-1])
    return time.perf_counter() - t, rss_kib


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_logs"))
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    big, small = a.dir / "big.log", a.dir / "small.log"
    build(big, int(a.gb * 1e9))
    with open(big, "rb") as src, open(small, "wb") as dst:
        dst.write(src.read(int(0.1e9)).rsplit(b"\n", 1)[0] + b"\n")
    with open(big, "rb") as src, gzip.open(str(big) + ".gz", "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 8 << 20)
    lines = sum(chunk.count(b"\n") for chunk in iter(lambda f=open(big, "rb"): f.read(8 << 20), b""))
    sl = f"{sys.executable} -m shadowlab logs --json"
    g, _ = timed(f'grep -c "context checkpoint" {big} >/dev/null')
    s, rss_big = timed(f"{sl} {big} >/dev/null")
    zg, _ = timed(f'zcat {big}.gz | grep -c "context checkpoint" >/dev/null')
    zs, _ = timed(f"{sl} {big}.gz >/dev/null")
    _, rss_small = timed(f"{sl} {small} >/dev/null")
    print(f"log {big.stat().st_size / 1e9:.2f} GB, {lines:,} lines; load average {os.getloadavg()}")
    print(f"grep -c: {g:.2f} s; shadowlab logs: {s:.2f} s = {lines / s / 1e6:.2f}M lines/s; ratio to grep {g / s:.2f}x")
    print(f"zcat | grep -c: {zg:.2f} s; shadowlab logs .gz: {zs:.2f} s; ratio {zg / zs:.2f}x")
    print(f"peak RSS: 0.1 GB {rss_small / 1024:.0f} MiB, {a.gb} GB {rss_big / 1024:.0f} MiB, "
          f"difference {(rss_big - rss_small) / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
