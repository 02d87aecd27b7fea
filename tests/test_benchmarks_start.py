"""Every benchmark script still starts: its imports resolve and `--help` answers.

Benchmarks are run by hand, not in CI, so a module moved under them (the restructure moved
`gguf_model` into `engines/llama_server/`) broke `bench_capture.py` without a test noticing.
This runs each script's `--help` in a fresh interpreter from the repository root."""

from __future__ import annotations

import importlib.util
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
    if "\nimport torch" in script.read_text() and importlib.util.find_spec("torch") is None:
        pytest.skip(f"{script.name} needs torch (the engine extra), not installed here; CI's test venv has it")
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


def test_fold_series_prints_a_row_a_round_and_the_controls(tmp_path):
    """fold_series.py is the tool that tells the machine's drift from the fold's: a row per
    round (fold, count, sort, sha, faults) and each column's least / median / spread, the
    controls' correlation with the fold; bad input refused with the option or path named."""
    log = ROOT / "tests/fixtures/logs/llama.cpp-b11434/A-B-C.cram8192.log"
    done = subprocess.run([sys.executable, "benchmarks/fold_series.py", str(log), "--rounds", "3", "--trace",
                           "--control-mb", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    header = next(i for i, line in enumerate(out) if line.split() == ["fold", "count", "sort", "sha", "faults"])
    rows = [line.split() for line in out[header + 1:header + 4]]
    assert all(len(r) == 5 and all(float(x) >= 0 for x in r) for r in rows), out
    summary = {line.split()[0]: line for line in out[header + 4:]}
    assert set(summary) == {"fold", "count", "sort", "sha"}, out
    assert all("correlation with the fold" in summary[k] for k in ("count", "sort", "sha")), out
    for args, named in (([str(log), "--rounds", "2"], "--rounds"), ([str(tmp_path / "nope.log")], "nope.log")):
        bad = subprocess.run([sys.executable, "benchmarks/fold_series.py", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, check=False)
        assert bad.returncode == 2 and named in bad.stderr, bad.stderr
