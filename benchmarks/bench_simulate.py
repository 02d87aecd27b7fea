"""`shadowlab simulate` speed: the case study's shape (`TrafficShape.case_study()`: ~3,500 turns,
~61M prompt tokens) under five policies, and the same shape at 10x (10x the conversations and
jobs, so 10x the turns and tokens).

    python benchmarks/bench_simulate.py [--scale 10] [--repeat 3] [--shape case-study-interleaved]

Prints generation, ideal and per-policy times (CPU seconds of this process, one core: the
simulator is single-threaded) and the ratio of the larger trace's time to the smaller one's.
"""

from __future__ import annotations

import argparse
import platform
import time

from shadowlab import simulate, traffic

POLICIES = ("baseline", "policy0", "affinity+policy0", "retention+policy0", "llama-defaults")


def measure(shape: str, scale: int) -> dict[str, float]:
    t0 = time.process_time()
    requests = traffic.generate(traffic.PRESETS[shape](scale=scale))
    t1 = time.process_time()
    loaded = traffic.Loaded(tuple(requests), (), "bench", "shape")
    doc = simulate.run_policies(loaded, [simulate.parse_policy(p) for p in POLICIES], 2200.0, per_turn=False)
    t2 = time.process_time()
    return {"requests": len(requests), "tokens": doc["shape"]["prompt_tokens"], "generate_s": t1 - t0,
            "simulate_s": t2 - t1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shape", choices=sorted(traffic.PRESETS), default="case-study")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    best: dict[int, dict[str, float]] = {}
    for scale in (1, args.scale):
        runs = [measure(args.shape, scale) for _ in range(args.repeat)]
        best[scale] = min(runs, key=lambda r: r["simulate_s"])
        r = best[scale]
        print(f"scale {scale:>2}: {r['requests']:,} requests, {r['tokens'] / 1e6:,.1f}M prompt tokens; "
              f"generate {r['generate_s']:.2f} s, ideal + 5 policies {r['simulate_s']:.2f} s CPU (best of {args.repeat})")
    ratio = best[args.scale]["simulate_s"] / best[1]["simulate_s"]
    print(f"time x{ratio:.1f} for x{best[args.scale]['requests'] / best[1]['requests']:.1f} requests")


if __name__ == "__main__":
    main()
