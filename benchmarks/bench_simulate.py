"""`shadowlab simulate` speed and memory, the command as a team runs it (a subprocess each):

1. Linear time, bounded memory: the case study's shape (`TrafficShape.case_study`) at three
   sizes, ~10k, ~100k and ~1M requests (scale 3, 29, 286: more conversations and jobs, the same
   mix), one policy (`--policy baseline`, the table: no per-turn lists). Prints requests per
   second (wall and CPU) and peak RSS at each size, and the ratios between sizes.
2. A 4x3 sweep (`--sweep cram=... --sweep np=...` on `llama-cram`) over the ~100k trace:
   `--jobs 2` against `--jobs 1`, wall-clock speed-up and CPU time of both (the machine may be
   shared: the CPU ratio says whether the pool added work, the wall ratio what a user waits).

    python benchmarks/bench_simulate.py [--sizes 3,29,286] [--sweep-scale 29] [--skip-sweep]

The machine and its load (`os.getloadavg`) are printed before and after each measurement: on a
loaded machine the wall-clock figures are the load's as much as the simulator's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shadowlab import traffic

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["--policy", "llama-cram", "--sweep", "cram=0,1024,4096,16384", "--sweep", "np=1,2,4"]


def shape_file(scale: int, folder: Path) -> Path:
    """The case study's shape at `scale`, as a shape file `simulate` reads (YAML is JSON's superset)."""
    shape = traffic.TrafficShape.case_study(scale=scale)
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(shape):
        v = getattr(shape, f.name)
        if isinstance(v, traffic.Dist):
            v = dataclasses.asdict(v)
        elif f.name in ("preamble", "interloper_kinds"):
            v = {str(k): w for k, w in v}
        doc[f.name] = v
    path = folder / f"case-study-x{scale}.json"
    path.write_text(json.dumps(doc))
    return path


def run(args: list[str], tree: Path = REPO) -> dict[str, Any]:
    """Wall seconds, CPU seconds (user + system, its worker processes included) and peak RSS (MiB,
    the largest of it and its workers) of one `shadowlab simulate` of `tree`'s code, and what it
    printed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "engine"),
                                                       os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        # cwd = the tree: `python -m` puts the working directory first on sys.path
        proc = subprocess.Popen([sys.executable, "-m", "shadowlab", "simulate", *args], stdout=out, stderr=err,
                                env=env, cwd=tree)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"simulate failed ({proc.returncode}): {err.read().decode()[-2000:]}")
        return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_mib": ru.ru_maxrss / 1024.0,
                "stdout": out.read().decode()}


def load() -> str:
    return "load %.1f %.1f %.1f" % os.getloadavg()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="3,29,286", help="case-study scales (x3,500 requests)")
    ap.add_argument("--sweep-scale", type=int, default=29)
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--mooncake", default="", metavar="N,...",
                    help="also Mooncake-shaped traces of N requests with session ids "
                         "(scripts/make_mooncake_conversations.py --truth), one policy")
    ap.add_argument("--before", type=Path, default=None, metavar="TREE",
                    help="also run each size with TREE's code (an older checkout), side by side")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}; {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = []
        for scale in (int(s) for s in args.sizes.split(",")):
            # Children's rusage accumulates: measure each run in its own fork of this process.
            r = run([str(shape_file(scale, folder)), "--policy", "baseline"])
            cpu = r["cpu_s"]
            n = int(r["stdout"].split(" requests")[0].rsplit(" ", 1)[-1].replace(",", ""))
            rows.append((scale, n, r["wall_s"], cpu, r["maxrss_mib"]))
            print(f"x{scale:>3}: {n:>9,} requests  wall {r['wall_s']:7.1f} s  CPU {cpu:7.1f} s  "
                  f"{n / cpu:8,.0f} requests/s CPU  {n / r['wall_s']:8,.0f} requests/s wall  "
                  f"peak RSS {r['maxrss_mib']:6.0f} MiB   ({load()})", flush=True)
            if args.before is not None:
                b = run([str(shape_file(scale, folder)), "--policy", "baseline"], args.before)
                print(f"      before ({args.before}): CPU {b['cpu_s']:7.1f} s, peak RSS {b['maxrss_mib']:6.0f} MiB; "
                      f"now / before: CPU x{cpu / b['cpu_s']:.2f}, RSS x{r['maxrss_mib'] / b['maxrss_mib']:.2f}",
                      flush=True)
        for n in (int(x) for x in args.mooncake.split(",") if x):
            trace = folder / f"mooncake-{n}.jsonl"
            subprocess.run([sys.executable, str(REPO / "scripts" / "make_mooncake_conversations.py"), "--requests",
                            str(n), "--out", str(folder / "blind.jsonl"), "--truth", str(trace)], check=True,
                           capture_output=True)
            for tree in (REPO, *(() if args.before is None else (args.before,))):
                r = run([str(trace), "--policy", "baseline"], tree)
                print(f"mooncake {n:>9,} requests ({'now' if tree == REPO else tree}): wall {r['wall_s']:7.1f} s  "
                      f"CPU {r['cpu_s']:7.1f} s  {n / r['cpu_s']:8,.0f} requests/s CPU  peak RSS "
                      f"{r['maxrss_mib']:6.0f} MiB   ({load()})", flush=True)
        for (s0, n0, _, c0, _), (s1, n1, _, c1, _) in zip(rows, rows[1:]):
            print(f"x{s0} -> x{s1}: requests x{n1 / n0:.1f}, CPU x{c1 / c0:.1f} (linear: the same ratio)")
        if args.skip_sweep:
            return
        path = str(shape_file(args.sweep_scale, folder))
        times = {}
        for jobs in (1, 2):
            r = run([path, *SWEEP, "--jobs", str(jobs), "--json"])
            times[jobs] = (r["wall_s"], r["cpu_s"], r["stdout"])
            print(f"4x3 sweep, --jobs {jobs}: wall {r['wall_s']:.1f} s, CPU {times[jobs][1]:.1f} s ({load()})",
                  flush=True)
        same = times[1][2] == times[2][2]
        print(f"--jobs 2 vs --jobs 1: wall speed-up x{times[1][0] / times[2][0]:.2f}, CPU ratio "
              f"x{times[2][1] / times[1][1]:.2f} (jobs 2 / jobs 1); JSON identical: {same}")


if __name__ == "__main__":
    main()
