"""Parser throughput against `grep -c "context checkpoint"` on the same large log, same run.

    python benchmarks/bench_logparse.py [--mode real,dense] [--size-mb 1100] [--repeat 3] [--pure] [--parse]
                                        [--baseline /tmp/logparse_old.py] [--keep] [--dir /tmp]
    python benchmarks/bench_logparse.py --mode hostile [--hostile-kib 64,256,1024] [--repeat 3]
                                        [--baseline /tmp/logparse_old.py --baseline-max-kib 64]

Modes (each writes its own log under --dir, deleted afterwards unless --keep):

  real       the headline. The request part of the real llama.cpp b11434 `-lv 4` captures in
             tests/fixtures/logs/llama.cpp-b11434/ (every line from the end of start-up to the
             last `all slots are idle`, i.e. whole requests: slot selection, `checking
             checkpoint` traces, restores and cascades, cache trims, checkpoints, print_timing,
             prompt-cache lines with -cram) after one real start-up header, repeated with task
             ids shifted per copy. Event density and mix are those of the captures (~37% of
             lines are events; the start-up header is ~190 lines, 0.002% of a 1 GB log).
  dense      worst case: only the event lines of those captures, in capture order (100% of
             lines are events; the parser's cost is per event, so this is its slowest case).
  synthetic  the generator this benchmark used before (a made-up b11434-like request with the
             older multi-line print_timing form, 36% events), kept to compare with old figures.
  hostile    time per line, not throughput: one log per shape and size, holding one line of
             that many bytes (at most MAX_LINE, so every byte is read) that a hostile engine
             could print: a checkpoint line followed by word characters, spaces, `a=` pairs.
             Parsed with parse(), accelerated and pure Python (and the --baseline parser up to
             --baseline-max-kib: an O(n^2) one takes hours at 1 MiB). Linear: the time grows
             as the size does (64 -> 256 -> 1024 KiB: 4x, 16x).

Per mode: one warm-up read so the page cache serves every tool alike, then --repeat rounds of
`grep -c "context checkpoint"` (the issue's baseline), `grep -c -F` with every trigger word
(the same line search the parser does: its count must equal the parser's candidate lines),
the parser (through iter_events: streaming), the same parser without its C accelerator if
--pure, logparse.parse() (keeps every event, as verdicts do) if --parse, and the --baseline
parser (another logparse.py, e.g. the previous version) if given. Medians are printed, with the machine and the load average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from shadowlab.run import environment
from shadowlab.logs import parse as logparse, reading

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = ROOT / "tests" / "fixtures" / "logs" / "llama.cpp-b11434"
GREP_WORD = "context checkpoint"


# --------------------------------------------------------------------------- logs


def _capture_parts() -> tuple[bytes, list[bytes]]:
    """(a real start-up header, the request lines of every b11434 capture)."""
    header = b""
    requests: list[bytes] = []
    for path in sorted(CAPTURES.glob("*.log")):
        lines = path.read_bytes().splitlines(keepends=True)
        idle = [i for i, line in enumerate(lines) if b"all slots are idle" in line]
        if len(idle) < 2:
            continue
        if not header:
            header = b"".join(lines[: idle[0] + 1])
        requests.extend(lines[idle[0] + 1 : idle[-1] + 1])
    if not requests:
        raise SystemExit(f"no b11434 captures under {CAPTURES}")
    return header, requests


def _event_lines(requests: list[bytes]) -> list[bytes]:
    events = logparse.parse([line.rstrip(b"\n") for line in requests], "llama.cpp").events
    return [requests[e.line - 1] for e in events]


_TASK = re.compile(rb"(\| task )(\d+)( \|)")


def _shifted(lines: list[bytes], copies: int) -> bytes:
    """`copies` copies of `lines`, task ids shifted by 1000 per copy (they repeat after that)."""
    text = b"".join(lines)
    return b"".join(
        _TASK.sub(lambda m, k=k: m.group(1) + str(int(m.group(2)) + 1000 * k).encode() + m.group(3), text)
        for k in range(copies)
    )


def _write(path: Path, head: bytes, unit: bytes, size_mb: int) -> None:
    target = size_mb << 20
    with open(path, "wb") as fh:
        fh.write(head)
        written = len(head)
        while written < target:
            fh.write(unit)
            written += len(unit)


def _synthetic_request(rng: random.Random, task: int, t: list[float]) -> list[str]:
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


def generate(path: Path, size_mb: int, mode: str = "real", seed: int = 0) -> None:
    """Write ~size_mb MiB of `mode` log (a unit rendered once, then repeated: fast to write)."""
    if mode == "synthetic":
        rng, t = random.Random(seed), [0.0]
        unit = ("\n".join(line for task in range(4096) for line in _synthetic_request(rng, task, t)) + "\n").encode()
        _write(path, b"", unit, size_mb)
        return
    header, requests = _capture_parts()
    if mode == "real":
        _write(path, header, _shifted(requests, 64), size_mb)
    elif mode == "dense":
        _write(path, b"", _shifted(_event_lines(requests), 64), size_mb)
    else:
        raise ValueError(f"unknown mode {mode!r}")


# --------------------------------------------------------------------------- timing


def _read_through(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(16 << 20):
            pass


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time_cmd(cmd: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, the count printed)"""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if out.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr}")
    return elapsed, cpu, int(out.stdout.strip() or 0)


def _grep_all_triggers(path: Path) -> list[str]:
    cmd = ["grep", "-c", "-F"]
    for word in logparse._TRIGGERS:
        cmd += ["-e", word.decode()]
    return cmd + [str(path)]


def _switch(module: ModuleType) -> Any:
    """What holds a parser's accelerator switch (`_logscan`): this tree's reading.py, or the
    --baseline file itself (an older, one-file parser holds its own)."""
    return module if hasattr(module, "_logscan") else reading


def _time_parser(module: ModuleType, path: Path, pure: bool = False) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds, (stats, events)); pure: without the C accelerator"""
    if pure:
        holder = _switch(module)
        saved, holder._logscan = holder._logscan, None
        try:
            return _time_parser(module, path)
        finally:
            holder._logscan = saved
    stats = module.ParseStats()
    cpu0, t0 = time.process_time(), time.perf_counter()
    n_events = 0
    for _ in module.iter_events(path, "llama.cpp", stats=stats):
        n_events += 1
    return time.perf_counter() - t0, time.process_time() - cpu0, (stats, n_events)


def _time_parse_call(path: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, events) of `logparse.parse`, which keeps every event (what
    verdicts call); freeing them is not timed."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    parsed = logparse.parse(path, "llama.cpp")
    timing = time.perf_counter() - t0, time.process_time() - cpu0, len(parsed.events)
    del parsed
    return timing


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("logparse_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _machine() -> str:
    cpu = environment.cpu_model()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    grep = subprocess.run(["grep", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    locale = os.environ.get("LC_ALL") or os.environ.get("LC_CTYPE") or os.environ.get("LANG") or "C"
    return (f"{cpu}; {usable} usable of {os.cpu_count()} cores; Python {platform.python_version()}; "
            f"{grep[0] if grep else 'grep ?'}; locale {locale}")


def _load_avg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def _rate(lines: int, seconds: float) -> str:
    return f"{seconds:8.2f} s {lines / seconds / 1e6:8.3f} M lines/s"


# --------------------------------------------------------------------------- hostile lines

_HOSTILE_HEAD = b"0.01.000.000 I slot create_check: id  0 | task 3 | "
# name -> (text before the run, the repeated run, text after it)
HOSTILE_SHAPES = {
    "checkpoint + z*n": (_HOSTILE_HEAD + b"created context checkpoint 1 of 8 (", b"z", b")"),
    "bare checkpoint + z*n": (b"created context checkpoint ", b"z", b""),
    "INFO + spaces": (b"INFO [ update_slots] kv cache rm ", b" ", b"z"),
    "INFO | + z*n": (b"INFO [ update_slots] kv cache rm | ", b"z", b""),
    "checking + spaces + |": (_HOSTILE_HEAD + b"checking checkpoint with [", b" ", b"|z"),
    "prompt cache + a=": (b"prompt cache: ", b"a=", b""),
}


def _hostile_line(shape: str, size: int) -> bytes:
    """A line of `size` bytes (newline excluded) of that shape."""
    head, run, tail = HOSTILE_SHAPES[shape]
    room = size - len(head) - len(tail)
    return head + (run * (room // len(run) + 1))[:room] + tail


def _time_hostile(module: ModuleType, path: Path, pure: bool) -> float:
    holder = _switch(module)
    saved = holder._logscan
    if pure:
        holder._logscan = None
    try:
        t0 = time.process_time()
        parsed = module.parse(path, "llama.cpp")
        seconds = time.process_time() - t0
    finally:
        holder._logscan = saved
    if parsed.events:
        raise SystemExit(f"{path}: a hostile line gave events: {parsed.events[:3]}")
    return seconds


def run_hostile(args: argparse.Namespace, baseline: ModuleType | None) -> None:
    sizes = [int(k) << 10 for k in args.hostile_kib.split(",")]
    if max(sizes) > logparse.MAX_LINE:
        raise SystemExit(f"--hostile-kib: at most {logparse.MAX_LINE >> 10} (MAX_LINE; longer lines are cut, not read)")
    print(f"== mode hostile == load avg {_load_avg()}; CPU seconds of parse(), median of {args.repeat}")
    print(f"{'shape':24} {'KiB':>5} {'accelerated':>12} {'pure':>9} {'us/KiB':>7}" + ("  baseline" if baseline else ""))
    path = args.dir / "shadowlab-bench-logparse-hostile.log"
    try:
        for shape in HOSTILE_SHAPES:
            for size in sizes:
                path.write_bytes(_hostile_line(shape, size) + b"\n")
                fast = statistics.median(_time_hostile(logparse, path, False) for _ in range(args.repeat))
                pure = statistics.median(_time_hostile(logparse, path, True) for _ in range(args.repeat))
                row = f"{shape:24} {size >> 10:5} {fast:10.3f} s {pure:7.3f} s {1e6 * pure / (size >> 10):7.1f}"
                if baseline is not None and size <= args.baseline_max_kib << 10:
                    row += f"  {_time_hostile(baseline, path, True):8.3f} s"
                print(row, flush=True)
    finally:
        path.unlink(missing_ok=True)
    print(f"load avg after: {_load_avg()}", flush=True)


# --------------------------------------------------------------------------- one mode


def run_mode(mode: str, args: argparse.Namespace, baseline: ModuleType | None) -> dict[str, Any]:
    path = args.dir / f"shadowlab-bench-logparse-{mode}.log"
    if not path.exists() or path.stat().st_size < (args.size_mb << 20):
        print(f"[{mode}] generating {args.size_mb} MiB at {path} ...", flush=True)
        generate(path, args.size_mb, mode)
    try:
        size = path.stat().st_size
        _read_through(path)
        load_before = _load_avg()
        grep, grep_all, parser, old, pure, collect = [], [], [], [], [], []
        result = None
        for _ in range(args.repeat):
            grep.append(_time_cmd(["grep", "-c", GREP_WORD, str(path)]))
            grep_all.append(_time_cmd(_grep_all_triggers(path)))
            *timing, result = _time_parser(logparse, path)
            parser.append(timing)
            if baseline is not None and len(old) < args.baseline_repeat:
                old.append(_time_parser(baseline, path))
            if args.pure and not pure:
                pure.append(_time_parser(logparse, path, pure=True))
            if args.parse:
                collect.append(_time_parse_call(path))
        load_after = _load_avg()
        stats, n_events = result
        lines = stats.lines
        med = lambda runs, i: statistics.median(r[i] for r in runs)  # noqa: E731
        g, g_cpu, ga, ga_cpu = med(grep, 0), med(grep, 1), med(grep_all, 0), med(grep_all, 1)
        p, p_cpu = med(parser, 0), med(parser, 1)
        checkpoints = sum(stats.kinds[k] for k in (
            "created", "restored", "erased_invalidated", "erased_old", "erased_too_close", "erased_superseded"))
        print(f"== mode {mode} ==")
        print(f"load avg (1/5/15 min): {load_before} before, {load_after} after; {args.repeat} rounds, medians")
        print(f"log            : {path} ({size / 1e9:.3f} GB, {lines:,} lines, {size / lines:.0f} bytes/line)")
        print(f"event density  : {n_events / lines:.1%} of lines are events ({n_events:,}; "
              f"{checkpoints / lines:.1%} checkpoint events), {stats.candidate_lines / lines:.1%} hold a trigger word, "
              f"{stats.unknown_count} unknown")
        print("mix            : " + ", ".join(f"{k} {v / n_events:.0%}" for k, v in stats.kinds.most_common()))
        print(f"grep -c        : {_rate(lines, g)}  cpu {g_cpu:6.2f} s  ({grep[0][2]:,} lines hold {GREP_WORD!r}; "
              f"the issue's baseline)")
        print(f"grep -c -F all : {_rate(lines, ga)}  cpu {ga_cpu:6.2f} s  ({grep_all[0][2]:,} lines hold a trigger word)")
        print(f"shadowlab parse: {_rate(lines, p)}  cpu {p_cpu:6.2f} s  ({1e6 * p / n_events:.2f} us per event; "
              f"{stats.candidate_lines:,} candidate lines)  runs: " + ", ".join(f"{r[0]:.2f}" for r in parser))
        row = {"mode": mode, "size": size, "lines": lines, "density": n_events / lines, "grep": g, "grep_all": ga,
               "parse": p, "load": (load_before, load_after)}
        if old:
            o, o_cpu = med(old, 0), med(old, 1)
            old_stats, old_events = old[0][2]
            same = (old_events, old_stats.unknown_count, dict(old_stats.kinds)) == (n_events, stats.unknown_count, dict(stats.kinds))
            print(f"baseline parse : {_rate(lines, o)}  cpu {o_cpu:6.2f} s  ({1e6 * o / old_events:.2f} us per event; "
                  f"{'same' if same else 'DIFFERENT'} events and counts)  -> {o / p:.2f}x faster now ({o_cpu / p_cpu:.2f}x in cpu)")
            row["baseline"] = o
        if collect:
            c, c_cpu = med(collect, 0), med(collect, 1)
            print(f"parse()        : {_rate(lines, c)}  cpu {c_cpu:6.2f} s  (keeps all {collect[0][2]:,} events, as verdicts "
                  f"do)  -> {g / c:.3f} x grep -c wall")
            row["parse_call"] = c
        if pure:
            (u, u_cpu, (pure_stats, pure_events)), = pure
            same = (pure_events, pure_stats.unknown_count, dict(pure_stats.kinds)) == (n_events, stats.unknown_count, dict(stats.kinds))
            print(f"pure Python    : {_rate(lines, u)}  cpu {u_cpu:6.2f} s  (the same parser without its C accelerator; "
                  f"{'same' if same else 'DIFFERENT'} events and counts)  -> the accelerator is {u / p:.1f}x faster")
            row["pure"] = u
        ratio = g / p
        print(f"ratio          : parser = {ratio:.3f} x grep -c wall (target 0.25: {'met' if ratio >= 0.25 else 'NOT met'}), "
              f"{g_cpu / p_cpu:.3f} x in cpu; {ga / p:.3f} x grep -c -F of every trigger word")
        print(flush=True)
        return row
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="real,dense", help="comma-separated: real (headline), dense, synthetic, hostile")
    ap.add_argument("--size-mb", type=int, default=1100, help="log size in MiB (default 1100, > 1 GB)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the logs are written")
    ap.add_argument("--keep", action="store_true", help="keep the logs afterwards (and reuse them next time)")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds per tool (the median is printed)")
    ap.add_argument("--baseline", type=Path, help="another logparse.py to time on the same files")
    ap.add_argument("--baseline-repeat", type=int, default=1, help="timed runs of the baseline (it is slow)")
    ap.add_argument("--pure", action="store_true", help="also time this parser without its C accelerator (one run)")
    ap.add_argument("--parse", action="store_true",
                    help="also time logparse.parse(), which keeps every event (memory grows with the log)")
    ap.add_argument("--hostile-kib", default="64,256,1024", help="hostile mode: line sizes in KiB (at most 1024)")
    ap.add_argument("--baseline-max-kib", type=int, default=64,
                    help="hostile mode: the largest line the --baseline parser is timed on")
    args = ap.parse_args(argv)
    baseline = _load(args.baseline) if args.baseline else None
    print(f"machine        : {_machine()}", flush=True)
    print(f"parser         : {'C accelerator (shadowlab._logscan)' if logparse.accelerated() else 'pure Python (no C accelerator built)'}",
          flush=True)
    for mode in [m.strip() for m in args.mode.split(",") if m.strip()]:
        if mode == "hostile":
            run_hostile(args, baseline)
        else:
            run_mode(mode, args, baseline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
