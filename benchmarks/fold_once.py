"""One `shadowlab logs` read of a log in this process, for a tool that counts or samples it.

    valgrind --tool=callgrind python benchmarks/fold_once.py LOG [--trace] [--build SO]
    perf record -g python benchmarks/fold_once.py LOG --trace

This VM's CPU time moves by +-25 % between processes (benchmarks/README.md, "shadowlab logs"),
so a change of a few per cent to the C fold is measured in instructions: callgrind counts them
the same on every run. `--build` loads another build of the accelerator (a .so built in another
checkout) in place of this tree's, so two builds are counted on the same Python code and the
same log. valgrind runs the AVX2 finder (it has no AVX-512), so the finder's own share is not the
one an AVX-512 machine runs; the rest of the fold is the same code.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "engine")]

from shadowlab.logs import accel, analysis, reading  # noqa: E402


def load_build(path: Path) -> ModuleType:
    """Another build of the accelerator (a `_logscan*.so`); one that speaks another ABI than this
    tree's parse.py is refused (exit 2, the reason on stderr)."""
    spec = importlib.util.spec_from_file_location("shadowlab.logs._logscan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if getattr(module, "ABI", None) != accel.ABI:
        print(f"{path}: ABI {getattr(module, 'ABI', None)}, this tree speaks {accel.ABI}", file=sys.stderr)
        raise SystemExit(2)
    return module


def use_build(module: ModuleType) -> None:
    """Make `module` the accelerator the fold reads with: reading.folder() gives it to
    analysis. Refused (exit 2) when analysis would not take it from there: a switch that
    silently missed (as `logparse.folder` did once the loader moved into reading.py) times a
    build against itself."""
    reading._logscan = module
    if analysis.folder() is not module:
        print("analysis does not read with reading._logscan: this tool's switch no longer works", file=sys.stderr)
        raise SystemExit(2)


def fold(log: Path, trace_path: str | None = None) -> dict:
    """LOG read as `shadowlab logs` reads it (analysis.analyse), the trace written to trace_path
    when one is given (closed before this returns; the file is the caller's to delete)."""
    trace = open(trace_path, "w", encoding="utf-8") if trace_path is not None else None
    try:
        return analysis.analyse([str(log)], analysis.Options(trace=trace))
    finally:
        if trace is not None:
            trace.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--trace", action="store_true", help="write the trace too (to a temporary file)")
    ap.add_argument("--build", type=Path, default=None, help="another build of shadowlab/logs/_logscan*.so")
    a = ap.parse_args()
    if a.build is not None:
        use_build(load_build(a.build))
    with tempfile.TemporaryDirectory() as tmp:
        doc = fold(a.log, os.path.join(tmp, "trace.jsonl") if a.trace else None)
    build = getattr(analysis.folder(), "__file__", None)
    print(f"{doc['lines_read']:,} lines, {doc['overall']['requests']:,} requests; reader {doc['reader']}; build {build}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
