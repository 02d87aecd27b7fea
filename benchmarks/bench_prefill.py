"""Prefill speed: llama.cpp's llama-server vs the reference engine, same model shape, one run.

    python benchmarks/bench_prefill.py [--preset small] [--lengths 512 2048 4560] [--reps 3]
                                       [--binary auto] [--out bench-prefill.json]

Both engines are started once, each pinned to its own core (`-t 1`), with the same cache
flags; the requests then alternate between them (llama, reference, llama, …) so both see the
same machine load. Every request is a fresh prompt that shares no token with the previous
one, so the whole prompt is prefilled (checked: `timings.cache_n == 0`). Prefill speed is the
engine's own figure, `timings.prompt_n / timings.prompt_ms`; the median over `--reps` is shown.

Same shape: the GGUF preset `small` (shadowlab/engines/llama_server/gguf_model.py) has the reference engine's
`small` dimensions (d_model 256, 8 layers with attention every 4th, 4 delta-net heads of 64,
8/2 attention heads of 32, d_ff 768); the vocabularies differ (269 vs 260 tokens). Preset
`tiny` is NOT the same shape on both (GGUF tiny is BRIEF §3's 128-wide model).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from shadowlab.run import environment, isolation
from shadowlab.engines.llama_server import gguf_model
from shadowlab.engines import llama_server, sha256_file

FLAGS = ["-c", "8192", "-b", "2048", "-ub", "512", "--kv-unified", "--ctx-checkpoints", "64",
         "-cram", "0", "-np", "1"]


class Server:
    def __init__(self, name: str, argv: list[str], core: int, scratch: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = isolation.lease_port()
        argv = [a.replace("{port}", str(self.port.port)) for a in argv]
        self.proc = isolation.EngineProcess(argv, env=env, cwd=scratch, log_path=scratch / f"{name}.log",
                                            cores=[core], port=self.port.port)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port.port}", timeout=600.0)
        self.core = core

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start-up:\n{self.proc.log_tail()}")
            try:
                if self.client.get("/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready after {timeout_s} s:\n{self.proc.log_tail()}")

    def prefill(self, tokens: list[int]) -> dict[str, float]:
        started = time.monotonic()
        response = self.client.post("/completion", json={
            "prompt": tokens, "n_predict": 1, "temperature": 0, "cache_prompt": True,
            "logit_bias": [[t, False] for t in gguf_model.invalid_utf8_token_ids()]})
        wall_ms = (time.monotonic() - started) * 1000.0
        response.raise_for_status()
        timings = response.json()["timings"]
        if timings.get("cache_n", 0) != 0 or timings["prompt_n"] != len(tokens):
            raise RuntimeError(f"{self.name}: expected a full prefill of {len(tokens)}, got {timings}")
        return {"prompt_n": timings["prompt_n"], "prompt_ms": timings["prompt_ms"],
                "tokens_per_s": timings["prompt_n"] / timings["prompt_ms"] * 1000.0, "wall_ms": wall_ms}

    def close(self) -> None:
        self.client.close()
        try:
            self.proc.stop()
        finally:
            self.port.release()


def fresh_prompt(rng: random.Random, length: int, avoid_first: int | None) -> list[int]:
    """Printable ASCII bytes: one token each on both byte-level tokenizers."""
    tokens = [rng.randrange(32, 127) for _ in range(length)]
    while tokens[0] == avoid_first:
        tokens[0] = rng.randrange(32, 127)
    return tokens


def pick_cores() -> tuple[int, int]:
    cores = isolation.usable_cores()
    if len(cores) < 2:
        raise SystemExit("bench_prefill needs two cores (one per engine)")
    return cores[0], cores[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="model shape (GGUF and reference preset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4560])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--binary", default="auto", help="llama-server: auto, a path, or a name on PATH")
    parser.add_argument("--model-cache", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)

    from shadowlab_engine import weights

    binary, found_by = llama_server.locate_binary(args.binary)
    gguf = gguf_model.ensure_gguf(args.preset, args.seed, args.model_cache).resolve()
    safetensors = Path(weights.ensure_model(args.preset, args.seed, args.model_cache)).resolve()
    core_llama, core_ref = pick_cores()
    env = dict(os.environ) | isolation.thread_env(1) | isolation.gpu_env(None)
    scratch = Path(tempfile.mkdtemp(prefix="bench-prefill-"))
    servers = [
        Server("llama-server", [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", "{port}",
                                "-t", "1", *FLAGS], core_llama, scratch,
               env | {"LD_LIBRARY_PATH": str(binary.parent)}),
        Server("reference", [sys.executable, "-m", "shadowlab_engine", "-m", str(safetensors),
                             "--port", "{port}", "-t", "1", *FLAGS], core_ref, scratch, env),
    ]
    results: dict[str, dict[int, list[dict[str, float]]]] = {s.name: {n: [] for n in args.lengths} for s in servers}
    try:
        for s in servers:
            s.wait_ready()
        rng = random.Random(args.seed)
        last_first = {s.name: None for s in servers}
        for length in args.lengths:
            for _ in range(args.reps + 1):  # the first round warms both up and is dropped
                for s in servers:
                    prompt = fresh_prompt(rng, length, last_first[s.name])
                    last_first[s.name] = prompt[0]
                    results[s.name][length].append(s.prefill(prompt))
            for s in servers:
                results[s.name][length] = results[s.name][length][1:]
    finally:
        for s in servers:
            s.close()

    load = os.getloadavg()
    print(f"prefill tokens/s (median of {args.reps}), preset {args.preset!r}, -t 1, "
          f"llama-server on core {core_llama}, reference on core {core_ref}; "
          f"load average {load[0]:.1f} on {os.cpu_count()} cores (others' work slows both)")
    print(f"{'tokens':>7}  {'llama-server':>13}  {'reference':>10}  {'ratio':>6}")
    summary = []
    for length in args.lengths:
        llama = statistics.median(r["tokens_per_s"] for r in results["llama-server"][length])
        ref = statistics.median(r["tokens_per_s"] for r in results["reference"][length])
        summary.append({"tokens": length, "llama_server_tps": llama, "reference_tps": ref})
        print(f"{length:>7}  {llama:>13.0f}  {ref:>10.0f}  {llama / ref:>5.1f}x")
    if args.out is not None:
        args.out.write_text(json.dumps({
            "preset": args.preset, "seed": args.seed, "reps": args.reps, "summary": summary, "raw": results,
            "load_average": load,
            "llama_server": {"binary": str(binary), "found_by": found_by, "sha256": sha256_file(binary),
                             "model": str(gguf), "model_sha256": sha256_file(gguf), "core": core_llama},
            "reference": {"model": str(safetensors), "model_sha256": sha256_file(safetensors), "core": core_ref},
            "environment": environment.capture() if hasattr(environment, "capture") else {},
        }, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
