"""Reference engine benchmark (run by hand; not a test).

    python benchmarks/bench_engine.py [--presets tiny,small] [--repeat 3] [--core 0]

Per preset, on one pinned core (os.sched_setaffinity, torch threads = 1):
- prefill tokens/s of the seed's prompt A (4,560 tokens) through the engine's own slot path
  (`-b 2048 -ub 512`, tail checkpoints created on the way), cold;
- checkpoint create and restore cost (ms) and size (MiB);
- start-up time of a fresh `shadowlab-engine` process to its first /health 503 and to 200.
Prints a Markdown table and the machine it ran on. Targets (issue 2): tiny prefills A in < 1 s
on one core; start-up < 3 s.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from shadowlab.run import environment

REPO = Path(__file__).resolve().parents[1]
A_TOKENS = 4560


def machine() -> str:
    cpu = environment.cpu_model()
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} logical CPUs, load average {load}; "
            f"Python {platform.python_version()}, torch {torch.__version__}, {platform.system()} {platform.release()}")


def prompt_a() -> list[int]:
    rng = random.Random(20261020)
    return [rng.randrange(256) for _ in range(A_TOKENS)]


def bench_in_process(model_path: Path, repeat: int) -> dict[str, float]:
    import torch

    from shadowlab_engine.checkpoints import CacheConfig, Slot
    from shadowlab_engine.model import HybridModel
    from shadowlab_engine.slotlog import EngineLog

    torch.set_num_threads(1)
    model = HybridModel.load(model_path)
    log = EngineLog(verbosity=0, stream=io.StringIO())
    cfg = CacheConfig(n_ctx=8192, n_batch=2048, n_ubatch=512, ctx_checkpoints=64)
    a = prompt_a()
    warm = Slot(0, model, cfg, log)
    warm.prefill(0, a[:600], warm.begin(0, a[:600]))  # first-call allocations out of the timing
    prefill_s, prefill_cpu_s = [], []
    for i in range(repeat):
        slot = Slot(0, model, cfg, log)
        t0, c0 = time.perf_counter(), time.process_time()
        slot.prefill(i, a, slot.begin(i, a))
        prefill_s.append(time.perf_counter() - t0)
        prefill_cpu_s.append(time.process_time() - c0)
    create_ms, restore_ms = [], []
    for _ in range(max(20, repeat)):
        t0 = time.perf_counter()
        snap = model.snapshot(slot.state)
        create_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        model.restore(slot.state, snap)
        model.trim_kv(slot.state, snap.n_past)
        restore_ms.append((time.perf_counter() - t0) * 1e3)
    best = min(prefill_s)
    return {
        "prefill_s": best,
        "prefill_tps": A_TOKENS / best,
        "prefill_median_s": statistics.median(prefill_s),
        "prefill_cpu_s": min(prefill_cpu_s),
        "ckpt_mib": snap.nbytes / 2**20,
        "create_ms": statistics.median(create_ms),
        "restore_ms": statistics.median(restore_ms),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """user + system CPU time a live process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_startup(model_path: Path, core: int, repeat: int) -> dict[str, float]:
    first_503, first_200, cpu_200 = [], [], []
    for _ in range(repeat):
        port = _free_port()
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "shadowlab_engine", "-m", str(model_path), "--port", str(port),
                   "-t", "1", "-cram", "0", "--log-file", str(Path(tmp) / "engine.log")]
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    preexec_fn=lambda: os.sched_setaffinity(0, {core}))
            try:
                saw_503 = None
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2.0) as client:
                    while time.monotonic() - t0 < 120:
                        if proc.poll() is not None:
                            raise RuntimeError(f"engine exited with {proc.returncode}")
                        try:
                            status = client.get("/health").status_code
                        except httpx.TransportError:
                            time.sleep(0.005)
                            continue
                        if status == 503 and saw_503 is None:
                            saw_503 = time.monotonic() - t0
                        if status == 200:
                            first_200.append(time.monotonic() - t0)
                            cpu_200.append(_cpu_seconds(proc.pid))
                            first_503.append(saw_503 if saw_503 is not None else float("nan"))
                            break
                        time.sleep(0.005)
            finally:
                proc.kill()
                proc.wait()
    return {"first_503_s": statistics.median(first_503), "ready_s": statistics.median(first_200),
            "ready_cpu_s": statistics.median(cpu_200)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--core", type=int, default=min(os.sched_getaffinity(0)))
    args = ap.parse_args()

    from shadowlab_engine.weights import ensure_model

    os.sched_setaffinity(0, {args.core})
    print(f"machine: {machine()}")
    print(f"pinned to core {args.core}; torch threads 1; A = {A_TOKENS} tokens; -b 2048 -ub 512; "
          f"best of {args.repeat} prefills, median of start-ups\n")
    rows = []
    for preset in args.presets.split(","):
        path = ensure_model(preset, args.seed, REPO / "models")
        r = bench_in_process(path, args.repeat)
        r.update(bench_startup(path, args.core, args.repeat))
        rows.append((preset, r))
    print("| preset | prefill A wall (s) | prefill A CPU (s) | prefill tokens/s (wall) | ckpt size (MiB) | "
          "ckpt create (ms) | ckpt restore (ms) | start-up to /health 503 (s) | to 200 wall (s) | "
          "to 200 CPU (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for preset, r in rows:
        print(f"| {preset} | {r['prefill_s']:.3f} | {r['prefill_cpu_s']:.3f} | {r['prefill_tps']:.0f} | "
              f"{r['ckpt_mib']:.3f} | {r['create_ms']:.3f} | {r['restore_ms']:.3f} | "
              f"{r['first_503_s']:.2f} | {r['ready_s']:.2f} | {r['ready_cpu_s']:.2f} |")
    print("\nCPU columns: CPU time the work itself used; on a shared, loaded core the wall columns "
          "include time spent waiting for the CPU.")
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
