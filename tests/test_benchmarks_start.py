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
