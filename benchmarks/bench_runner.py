"""Runner benchmark: wall time of a matrix and shadowlab's own overhead per cell.

    python benchmarks/bench_runner.py [--matrix matrices/ckpt.yaml] [--jobs 2] [--run-dir DIR]

Runs ``shadowlab run`` on the matrix as a user would (a subprocess, report and gate
included) and times it, then reads every cell's meta.json and engine.log:

    cell time   lease → engine stopped (meta.json elapsed_ms)
    engine      the engine's own start-up, as it logs it: the timestamp of its
                "starting the main loop" line (its clock starts once Python is up and
                its modules are imported)
    turns       client-side time of the turns' HTTP requests (response_ms)
    overhead    cell time − engine − turns: spawn, readiness polling, the ready probe,
                log-span waits, stop and its checks, lease bookkeeping — and the engine
                interpreter's boot before its log clock starts, which no log reports
    boot        that boot, measured separately in the same run (median of 3 runs of
                `python -m shadowlab_engine --version` pinned to one core);
                "net" = overhead − boot is shadowlab's own share

With ``--run-dir`` it only analyses an existing run directory.
Targets (issue 3): overhead < 0.5 s per cell; the whole ckpt matrix < 2 min on 2 cores
with the tiny preset.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shadowlab.run import environment
from shadowlab.results import records, rundir

REPO = Path(__file__).resolve().parent.parent
# `0.03.802.812` = minutes.seconds.milliseconds.microseconds since the engine started.
MAIN_LOOP_RE = re.compile(rb"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) .*starting the main loop", re.M)
OVERHEAD_TARGET_S = 0.5
WALL_TARGET_S = 120.0


def engine_startup_ms(log: Path) -> float | None:
    match = MAIN_LOOP_RE.search(log.read_bytes()[:65536])
    if match is None:
        return None
    minutes, seconds, millis, micros = (int(g) for g in match.groups())
    return (minutes * 60 + seconds) * 1000.0 + millis + micros / 1000.0


def interpreter_boot_s(samples: int = 3) -> float:
    """Seconds for the engine's interpreter to start and import its CLI (pinned to one core)."""
    core = sorted(os.sched_getaffinity(0))[0]
    times = []
    for _ in range(samples):
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "shadowlab_engine", "--version"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       preexec_fn=lambda: os.sched_setaffinity(0, {core}))
        times.append(time.monotonic() - started)
    return statistics.median(times)


def run_matrix(matrix: Path, jobs: int, out: Path) -> tuple[float, int]:
    command = [sys.executable, "-m", "shadowlab", "run", str(matrix), "--out", str(out), "--jobs", str(jobs)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - started
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr)
    return wall, done.returncode


def cell_rows(run_dir: Path) -> list[tuple[str, float, float, float, float, float]]:
    layout = records.RunLayout(run_dir)
    rows = []
    for cell_id, meta in rundir.read_cell_metas(run_dir).items():
        if meta.status is not records.CellStatus.OK:
            continue
        engine_ms = engine_startup_ms(layout.engine_log(cell_id)) or 0.0
        turns_ms = sum(t.response_ms or 0.0 for t in meta.turns)
        stop_ms = meta.stop.stop_ms if meta.stop else 0.0
        cell_ms = meta.elapsed_ms or 0.0
        rows.append((cell_id, cell_ms, engine_ms, turns_ms, stop_ms, cell_ms - engine_ms - turns_ms))
    return rows


def machine_line() -> str:
    env = environment.capture()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{env['host']}: {env['cpu']['model']}, {env['cpu']['logical_cores']} logical cores "
            f"(usable {env['cpu']['usable_cores']}), load average {load}, "
            f"Python {env['python']['version']}, torch {env['packages'].get('torch')}, "
            f"shadowlab {env['shadowlab']['commit'] or '?'}{'+dirty' if env['shadowlab']['dirty'] else ''}")


def print_table(rows: list[tuple[str, float, float, float, float, float]]) -> None:
    width = max([len(r[0]) for r in rows] + [4])
    print(f"{'cell':<{width}}  {'cell s':>7}  {'engine s':>8}  {'turns s':>7}  {'stop s':>6}  {'overhead s':>10}")
    for cell_id, cell_ms, engine_ms, turns_ms, stop_ms, overhead_ms in rows:
        print(f"{cell_id:<{width}}  {cell_ms / 1e3:7.2f}  {engine_ms / 1e3:8.2f}  {turns_ms / 1e3:7.2f}  "
              f"{stop_ms / 1e3:6.2f}  {overhead_ms / 1e3:10.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", type=Path, default=REPO / "matrices" / "ckpt.yaml")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--run-dir", type=Path, default=None, help="analyse this run directory; run nothing")
    args = parser.parse_args()

    print(f"machine: {machine_line()}")
    wall = None
    if args.run_dir is None:
        run_dir = Path(tempfile.mkdtemp(prefix="bench-runner-")) / "run"
        wall, code = run_matrix(args.matrix, args.jobs, run_dir)
        print(f"matrix: {args.matrix} --jobs {args.jobs}: exit {code}, wall {wall:.1f} s "
              f"(target < {WALL_TARGET_S:.0f} s) -> {run_dir}")
    else:
        run_dir = args.run_dir
    rows = cell_rows(run_dir)
    if not rows:
        print("no finished cells to analyse")
        return 1
    print()
    print_table(rows)
    overheads = [r[5] / 1e3 for r in rows]
    engines = [r[2] / 1e3 for r in rows]
    boot = interpreter_boot_s()
    net = [o - boot for o in overheads]
    print()
    print(f"cells: {len(rows)}; engine start-up (logged) mean {statistics.mean(engines):.2f} s; "
          f"engine interpreter boot {boot:.3f} s")
    print(f"overhead per cell incl. boot: mean {statistics.mean(overheads):.3f} s, "
          f"median {statistics.median(overheads):.3f} s, max {max(overheads):.3f} s")
    print(f"overhead per cell net of boot: mean {statistics.mean(net):.3f} s, "
          f"median {statistics.median(net):.3f} s, max {max(net):.3f} s (target < {OVERHEAD_TARGET_S} s)")
    print(f"load average now: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ok = statistics.median(net) < OVERHEAD_TARGET_S and (wall is None or wall < WALL_TARGET_S)
    print("targets met" if ok else "targets NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
