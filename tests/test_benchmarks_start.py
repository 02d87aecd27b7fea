"""Every benchmark script still starts: its imports resolve and `--help` answers.

Benchmarks are run by hand, not in CI, so a module moved under them (the restructure moved
`gguf_model` into `engines/llama_server/`) broke `bench_capture.py` without a test noticing.
This runs each script's `--help` in a fresh interpreter from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_there_are_benchmarks_to_check():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_a_benchmark_starts_and_answers_help(script):
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower(), done.stdout[:500]


def test_fold_once_reads_with_the_build_it_is_given(tmp_path):
    """`fold_once.py --build SO` (and fold_ab.py, through the same switch) must fold with that
    build: once the loader moved into reading.py, the old switch was ignored and every A/B timed
    the tree's build against itself, printing ratios that meant nothing."""
    from shadowlab.logs import reading

    built = reading.folder()
    if built is None:
        pytest.skip("the C accelerator is not built here")
    copy = tmp_path / Path(built.__file__).name
    copy.write_bytes(Path(built.__file__).read_bytes())
    log = ROOT / "tests/fixtures/logs/llama.cpp-b11434/A-B-C.cram8192.log"
    done = subprocess.run([sys.executable, "benchmarks/fold_once.py", str(log), "--build", str(copy)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'c_fold': 1" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith(f"build {copy}"), done.stdout
