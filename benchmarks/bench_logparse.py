"""Parser throughput against `grep -c "context checkpoint"` on the same large synthetic log.

    python benchmarks/bench_logparse.py [--size-mb 1100] [--path /tmp/shadowlab-bench.log] [--keep]

The log imitates a busy llama.cpp b11434 server at `-lv 4` serving a hybrid model (the request
shape of a real capture: slot selection, `checking checkpoint` traces, restore + cascade, cache
trim, prompt processing progress, 2-4 checkpoints per request, decode progress, the multi-line
`print_timing` block, request log lines), with varying numbers. Both tools read the same file in
the same run, after one warm-up read so the page cache treats them alike. Prints lines/s of
each, the ratio, and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from shadowlab import logparse


def _request(rng: random.Random, task: int, t: list[float]) -> list[str]:
    def ts() -> str:
        t[0] += rng.random() * 0.05
        us = int(t[0] * 1e6)
        return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"

    slot = rng.randrange(4)
    n = rng.randrange(2000, 60000)
    cached = rng.randrange(1, n)
    ck = [rng.randrange(0, cached) for _ in range(3)]
    lines = [
        f"{ts()} I srv  params_from_: Chat format: peg-native",
        f"{ts()} I slot get_availabl: id  {slot} | task -1 | selected slot by LCP similarity, "
        f"sim_best = {rng.random():.3f} (> 0.100 thold), f_keep = {rng.random():.3f}",
        f"{ts()} I slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0",
        f"{ts()} I slot update_slots: id  {slot} | task {task} | new prompt, n_ctx_slot = 65536, "
        f"n_keep = 0, task.n_tokens = {n}",
    ]
    for c in ck:
        lines.append(f"{ts()} I slot update_slots: id  {slot} | task {task} | checking checkpoint with [{c}, {c}] against {cached}...")
    r = min(ck)
    lines += [
        f"{ts()} I slot   operator(): id  {slot} | task {task} | restored context checkpoint (pos_min = {r}, "
        f"pos_max = {r}, n_tokens = {r + 1}, n_past = {r + 1}, size = {rng.random() * 200:.3f} MiB)",
        f"{ts()} I slot   operator(): id  {slot} | task {task} | erased invalidated context checkpoint "
        f"(pos_min = {ck[1]}, pos_max = {ck[1]}, n_tokens = {ck[1] + 1}, n_swa = 0, pos_next = {r + 1}, "
        f"size = {rng.random() * 200:.3f} MiB)",
        f"{ts()} I slot update_slots: id  {slot} | task {task} | cached n_tokens = {r + 1}, memory_seq_rm [{r + 1}, end)",
    ]
    for k in range(rng.randrange(2, 5)):
        p = rng.randrange(r + 1, n)
        lines += [
            f"{ts()} I slot print_timing: id  {slot} | task {task} | prompt processing, n_tokens = {p:6d}, "
            f"progress = {p / n:.2f}, t = {rng.random() * 9:6.2f} s / {rng.random() * 3000:.2f} tokens per second",
            f"{ts()} I slot create_check: id  {slot} | task {task} | created context checkpoint {k + 1} of 32 "
            f"(pos_min = {p}, pos_max = {p}, n_tokens = {p + 1}, size = {rng.random() * 200:.3f} MiB)",
        ]
    for k in range(rng.randrange(1, 4)):
        lines.append(f"{ts()} I slot print_timing: id  {slot} | task {task} | n_decoded = {100 * (k + 1):6d}, tg = {rng.random() * 100:6.2f} t/s")
    lines += [
        f"{ts()} I slot print_timing: id  {slot} | task {task} | ",
        f"prompt eval time = {rng.random() * 9000:10.2f} ms / {n - r - 1:5d} tokens (    0.50 ms per token,  2009.08 tokens per second)",
        f"       eval time = {rng.random() * 9000:10.2f} ms / {rng.randrange(900):5d} tokens (   12.09 ms per token,    82.72 tokens per second)",
        f"      total time = {rng.random() * 9000:10.2f} ms / {n:5d} tokens",
        f"{ts()} I slot      release: id  {slot} | task {task} | stop processing: n_tokens = {n}, truncated = 0",
        f"{ts()} I srv  update_slots: all slots are idle",
        f"{ts()} I srv  log_server_r: done request: POST /v1/chat/completions 127.0.0.1 200",
    ]
    return lines


def generate(path: Path, size_mb: int, seed: int = 0) -> None:
    """Write ~size_mb MiB: 4096 distinct requests rendered once, then repeated (fast to write)."""
    rng = random.Random(seed)
    t = [0.0]
    unit = ("\n".join(line for task in range(4096) for line in _request(rng, task, t)) + "\n").encode()
    target = size_mb << 20
    with open(path, "wb") as fh:
        written = 0
        while written < target:
            fh.write(unit)
            written += len(unit)


def _read_through(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(16 << 20):
            pass


def _time_grep(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = subprocess.run(["grep", "-c", "context checkpoint", str(path)], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, int(out.stdout.strip())


def _time_parser(path: Path) -> tuple[float, logparse.ParseStats, int]:
    stats = logparse.ParseStats()
    t0 = time.perf_counter()
    n_events = 0
    for _ in logparse.iter_events(path, "llama.cpp", stats=stats):
        n_events += 1
    return time.perf_counter() - t0, stats, n_events


def _machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        avail = len(os.sched_getaffinity(0))
    except AttributeError:
        avail = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}; {avail} usable cores; load avg {load:.2f}; Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1100, help="log size in MiB (default 1100, > 1 GB)")
    ap.add_argument("--path", type=Path, default=Path("/tmp/shadowlab-bench-logparse.log"))
    ap.add_argument("--keep", action="store_true", help="keep the log file afterwards")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each tool (best is kept)")
    args = ap.parse_args(argv)

    if not args.path.exists() or args.path.stat().st_size < (args.size_mb << 20):
        print(f"generating {args.size_mb} MiB synthetic log at {args.path} ...", flush=True)
        generate(args.path, args.size_mb)
    size = args.path.stat().st_size
    _read_through(args.path)

    grep_s, grep_count = min(_time_grep(args.path) for _ in range(args.repeat))
    best = min((_time_parser(args.path) for _ in range(args.repeat)), key=lambda r: r[0])
    parse_s, stats, n_events = best
    lines = stats.lines

    checkpoint_events = sum(
        stats.kinds[k] for k in ("created", "restored", "erased_invalidated", "erased_old", "erased_too_close")
    )
    print(f"machine        : {_machine()}")
    print(f"log            : {args.path} ({size / 1e9:.3f} GB, {lines:,} lines)")
    print(f"grep -c        : {grep_s:7.2f} s  {lines / grep_s:14,.0f} lines/s  ({grep_count:,} matching lines)")
    print(f"shadowlab parse: {parse_s:7.2f} s  {lines / parse_s:14,.0f} lines/s  ({n_events:,} events, "
          f"{checkpoint_events:,} checkpoint events, {stats.unknown_count} unknown)")
    print(f"event density  : {n_events / lines:.1%} of lines are events "
          f"({checkpoint_events / lines:.1%} checkpoint lines); {1e6 * parse_s / n_events:.2f} us per event, "
          f"{1e6 * grep_s / lines:.3f} us per line for grep")
    ratio = grep_s / parse_s
    print(f"ratio          : parser speed = {ratio:.3f} x grep ({'meets' if ratio >= 0.25 else 'BELOW'} the 0.25 target)")
    if checkpoint_events != grep_count:
        print(f"WARNING: parser saw {checkpoint_events} checkpoint events, grep {grep_count} lines", file=sys.stderr)
    if not args.keep:
        args.path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
