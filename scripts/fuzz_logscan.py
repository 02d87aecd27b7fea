"""Fuzz the log parser's C accelerator under AddressSanitizer and UBSan.

    python scripts/fuzz_logscan.py [--rounds 300] [--seed 1]
    python scripts/fuzz_logscan.py --pytest tests/shadowlab/test_logscan.py tests/shadowlab/test_logs.py

Engine logs are untrusted text, and shadowlab/logs/_logscan*.c read them with pointers. This script
compiles the C file with -fsanitize=address,undefined into a temporary directory, re-runs itself
under the sanitizer runtime (LD_PRELOAD), and feeds the sanitized build random logs: real
fixture lines, the same lines with random bytes spliced in, and random bytes around trigger
words and line heads, over random regions of the buffer, with every trigger search the CPU has.
Each result must equal the pure-Python parser's (logparse without the accelerator). A memory
error aborts with the sanitizer's report. Needs gcc with libasan / libubsan; Linux only.
(tests/shadowlab/test_logscan.py runs the same comparisons without the sanitizers in CI.)

`--pytest ARGS...` runs pytest (with --capture=no, so that a report is not lost with the
process) with the sanitized build in place of the tree's: the fold's tests (three-way reads of
generated, real, mutated and hostile logs, prompt-cache lines, side notes, traces) are its
fuzzing; the random logs above reach scan() only.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
SOURCES = [ROOT / "shadowlab" / "logs" / name for name in ("_logscan.c", "_logscan_scan.c", "_logscan_fold.c",
                                                        "_logscan_figures.c")]


def build(into: Path) -> Path:
    target = into / "_logscan_sanitized.so"
    subprocess.run(
        ["gcc", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-std=c11", "-shared",
         "-fPIC", f"-I{sysconfig.get_paths()['include']}", *map(str, SOURCES), "-o", str(target)],
        check=True,
    )
    return target


def load_sanitized(module_path: Path):
    """The sanitized build, as the module shadowlab.logs._logscan (not yet in sys.modules)."""
    spec = importlib.util.spec_from_file_location("shadowlab.logs._logscan", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_log(rng: random.Random, candidates: list[bytes], pieces: list[bytes]) -> bytes:
    lines = []
    for _ in range(rng.randrange(1, 400)):
        r = rng.random()
        if r < 0.4:
            line = rng.choice(candidates)
        elif r < 0.7:
            line = b"".join(
                rng.choice(pieces) if rng.random() < 0.6 else rng.randbytes(rng.randrange(40))
                for _ in range(rng.randrange(1, 6))
            )
        else:
            line = rng.choice(candidates)
            i = rng.randrange(len(line) + 1)
            line = line[:i] + rng.randbytes(rng.randrange(5)) + line[i + rng.randrange(3) :]
        lines.append(line)
    return b"\n".join(lines)


def fuzz(module_path: Path, rounds: int, seed: int) -> None:
    sys.path.insert(0, str(ROOT))
    from shadowlab.logs import parse as lp, reading

    sanitized = load_sanitized(module_path)
    lines = [line for path in sorted(FIXTURES.glob("*/*.log")) for line in path.read_bytes().splitlines()]
    candidates = [line for line in lines if any(t in line for t in lp._TRIGGERS)]
    pieces = list(lp._TRIGGERS) + [b"| task ", b"id  0 ", b" | ", b"0.01.234.567 I ", b"srv  ", b"\n",
                                   b"load:  - found better prompt with f_keep = 0.5, f_sim = 0.5",
                                   b"prompt with length 12, lcp = 1, f_keep = 0.5, f_sim = 0.5"]
    variants = []
    for variant in (1, 2, 3, 4):
        try:
            sanitized.scan(b"x\n", 0, 2, 0, 0, lp._ACCEL_CLASSES, lp._ACCEL_METHODS, variant)
            variants.append(variant)
        except ValueError:
            pass
    rng = random.Random(seed)
    for _ in range(rounds):
        data = random_log(rng, candidates, pieces)
        lo = rng.randrange(0, max(1, len(data) // 4))
        hi = data.rfind(b"\n", lo, rng.randrange(lo, len(data) + 1)) + 1 or len(data)
        reading._logscan = sanitized
        for variant in variants:
            got = sanitized.scan(data, lo, hi, 0, 0, lp._ACCEL_CLASSES, lp._ACCEL_METHODS, variant)
            assert got == sanitized.scan(data, lo, hi, 0, 0, lp._ACCEL_CLASSES, lp._ACCEL_METHODS, 1)
        with_c = lp.parse(data[lo:hi].split(b"\n"), "llama.cpp")
        reading._logscan = None
        pure = lp.parse(data[lo:hi].split(b"\n"), "llama.cpp")
        assert (with_c.events, with_c.counts, with_c.unknown_count) == (pure.events, pure.counts, pure.unknown_count)
    print(f"fuzz_logscan: {rounds} rounds, search variants {variants}: no sanitizer report, C == Python")


def under_pytest(module_path: Path, pytest_args: list[str]) -> int:
    """pytest with the sanitized build as shadowlab.logs._logscan (imported before reading.py is)."""
    sys.path.insert(0, str(ROOT))
    sanitized = load_sanitized(module_path)
    sys.modules["shadowlab.logs._logscan"] = sanitized
    from shadowlab.logs import reading

    if reading._logscan is not sanitized:
        print(f"fuzz_logscan: the sanitized build was not taken (ABI {getattr(sanitized, 'ABI', None)})",
              file=sys.stderr)
        return 2
    import pytest

    return int(pytest.main(["--capture=no", "-p", "no:cacheprovider", *pytest_args]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--module", type=Path, help=argparse.SUPPRESS)  # set when re-run under the sanitizers
    ap.add_argument("--pytest", nargs=argparse.REMAINDER, default=None,
                    help="run pytest with these arguments on the sanitized build instead of fuzzing")
    args = ap.parse_args()
    if args.module is not None and args.pytest is not None:
        return under_pytest(args.module, args.pytest)
    if args.module is not None:
        fuzz(args.module, args.rounds, args.seed)
        return 0
    with tempfile.TemporaryDirectory(prefix="shadowlab-fuzz-") as tmp:
        module = build(Path(tmp))
        runtimes = [subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True,
                                   check=True).stdout.strip() for lib in ("libasan.so", "libubsan.so")]
        env = dict(os.environ, LD_PRELOAD=":".join(runtimes), ASAN_OPTIONS="detect_leaks=0",
                   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
        command = [sys.executable, __file__, "--module", str(module), "--rounds", str(args.rounds),
                   "--seed", str(args.seed)]
        if args.pytest is not None:
            command += ["--pytest", *args.pytest]
        return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
