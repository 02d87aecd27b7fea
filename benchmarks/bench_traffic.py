"""Traffic replay benchmark (issue 12): shadowlab's time per turn beyond the engine's own, and the
wall time of matrices/traffic.yaml.

    python benchmarks/bench_traffic.py [--matrix matrices/traffic.yaml] [--jobs 2] [--run-dir DIR]

Runs ``shadowlab run`` on the matrix as a user would (a subprocess, report and gate included),
times it, then reads every cell's meta.json. Per cell:

    cell        lease → engine stopped (meta.json elapsed_ms)
    start-up    spawn → ready (startup_ms), stop (stop.stop_ms)
    turns       client-side time of the turns' HTTP requests (Σ response_ms): the engine's share;
                for requests sent concurrently (`in_flight`) their wall span, first send to last
                answer (max of sent_ms + response_ms), so the harness figure then includes the
                log attribution after the last answer
    harness     (cell − start-up − stop − turns) / turns: building each request, writing its
                response and record, waiting for its log span, the liveness and loopback checks
                after it. An upper bound per turn: the ready probe and lease bookkeeping (once
                per cell) are in it too.
    http        per turn, response_ms − the engine's own prompt_ms + predicted_ms (timings): the
                HTTP and JSON of both sides, reported apart (it is not shadowlab's alone); with
                requests in flight it includes the time a request waited behind the others

A cell's harness time is once-per-cell work (lease, ready probe, meta.json) plus per-turn work; the
least-squares line through (turns, harness ms) of all cells separates them: its slope is the
harness time per turn, its intercept the time per cell (a one-turn control cell's "per turn"
figure is mostly the latter).

With ``--run-dir`` it only analyses an existing run directory. Target (issue 12): harness < 5 ms
per turn (the slope).

``--listeners`` times the per-turn loopback check alone, side by side on one live process tree (a
child holding listeners): shadowlab/run/listeners.py against the psutil scan it replaced (children
recursive + net_connections per process), alternated, median of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_runner: the shared matrix runner
from bench_runner import machine_line, run_matrix  # noqa: E402

from shadowlab.results import records, rundir  # noqa: E402

HARNESS_TARGET_MS = 5.0


def per_turn(run_dir: Path) -> list[tuple[str, int, float, float]]:
    """(cell, turns, harness ms per turn, median http ms per turn) of every cell that ran."""
    rows = []
    for cell_id, meta in rundir.read_cell_metas(run_dir).items():
        if meta.status is not records.CellStatus.OK or not meta.turns:
            continue
        if any(t.sent_ms is not None for t in meta.turns):  # sent concurrently: the turns' wall span
            turns_ms = max((t.sent_ms or 0.0) + (t.response_ms or 0.0) for t in meta.turns)
        else:
            turns_ms = sum(t.response_ms or 0.0 for t in meta.turns)
        stop_ms = meta.stop.stop_ms if meta.stop else 0.0
        rest = (meta.elapsed_ms or 0.0) - (meta.startup_ms or 0.0) - stop_ms - turns_ms
        http = [t.response_ms - (t.timings.get("prompt_ms", 0.0) + t.timings.get("predicted_ms", 0.0))
                for t in meta.turns if t.response_ms is not None and isinstance(t.timings, dict)]
        rows.append((cell_id, len(meta.turns), rest / len(meta.turns), statistics.median(http) if http else 0.0))
    return rows


LISTENER_CHILD = """
import socket, sys
held = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
print("ready", flush=True)
sys.stdin.read()
"""


def listener_check_ms(rounds: int = 200) -> tuple[float, float]:
    """Median ms of one loopback check, (kernel reads, psutil), on this process and a child."""
    import subprocess
    import time

    import psutil

    from shadowlab.run import isolation, listeners

    child = subprocess.Popen([sys.executable, "-c", LISTENER_CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        me = psutil.Process()

        def new() -> object:
            return listeners.listeners([me.pid, *listeners.descendants(me.pid)])

        def old() -> object:
            return isolation._psutil_listeners([me, *me.children(recursive=True)])

        assert {e.port for e in new()} >= {e.port for e in old() if e.ip == "127.0.0.1"}
        times: dict[object, list[float]] = {new: [], old: []}
        for _ in range(rounds):
            for check in (new, old):
                t0 = time.perf_counter()
                check()
                times[check].append((time.perf_counter() - t0) * 1000.0)
        return statistics.median(times[new]), statistics.median(times[old])
    finally:
        child.kill()
        child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=Path("matrices/traffic.yaml"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--run-dir", type=Path, help="analyse this run directory instead of running")
    parser.add_argument("--listeners", action="store_true", help="time the loopback check alone")
    args = parser.parse_args()
    print(machine_line())
    if args.listeners:
        new_ms, old_ms = listener_check_ms()
        print(f"loopback check: {new_ms:.3f} ms (listeners.py) vs {old_ms:.3f} ms (psutil), "
              f"×{old_ms / new_ms:.0f}")
        return 0
    if args.run_dir is None:
        out = Path(tempfile.mkdtemp(prefix="bench-traffic-")) / "run"
        wall, code = run_matrix(args.matrix, args.jobs, out)
        print(f"shadowlab run {args.matrix} --jobs {args.jobs}: {wall:.1f} s wall, exit {code}")
        run_dir = out
    else:
        run_dir = args.run_dir
    rows = per_turn(run_dir)
    print(f"{'cell':<40} {'turns':>5} {'harness ms/turn':>16} {'http ms/turn':>13}")
    for cell, n, harness, http in rows:
        print(f"{cell:<40} {n:>5} {harness:>16.2f} {http:>13.2f}")
    weighted = sum(n * h for _, n, h, _ in rows) / sum(n for _, n, _, _ in rows)
    per_turn_ms, per_cell_ms = fit_per_turn([(n, n * h) for _, n, h, _ in rows])
    print(f"harness: {per_turn_ms:.2f} ms per turn + {per_cell_ms:.2f} ms per cell (least squares over "
          f"{len(rows)} cells); {weighted:.2f} ms per turn with the per-cell part spread over the turns "
          f"(target < {HARNESS_TARGET_MS:.0f} ms per turn: {'met' if per_turn_ms < HARNESS_TARGET_MS else 'NOT met'})")
    return 0


def fit_per_turn(cells: list[tuple[int, float]]) -> tuple[float, float]:
    """(slope, intercept) of harness ms against turns over (turns, harness ms) per cell; with one
    turn count only, no slope can be told apart: (mean per turn, 0)."""
    mean_n = statistics.fmean(n for n, _ in cells)
    mean_h = statistics.fmean(h for _, h in cells)
    var = sum((n - mean_n) ** 2 for n, _ in cells)
    if var == 0:
        return mean_h / mean_n, 0.0
    slope = sum((n - mean_n) * (h - mean_h) for n, h in cells) / var
    return slope, mean_h - slope * mean_n


if __name__ == "__main__":
    raise SystemExit(main())
