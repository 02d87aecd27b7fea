"""Every stored run is judged again and must give its stored verdicts.json, byte for byte.

The stored runs (tests/fixtures/runs/, real records of llama.cpp b9093, b11434 and ik_llama.cpp)
keep the verdicts.json shadowlab wrote for them; the docs' runs (tests/fixtures/runs/docs/) keep
only a verdicts.json, judged from that file alone. A change to the judging (the replay of the
checkpoint lifecycle, the verdict schema, the version chain) that moves one field of one turn
fails here, naming the run and the first difference. A test shows the comparison failing on a
changed log.

Regenerate the stored files only when a verdict is meant to change, and say why in the commit:
``python tests/shadowlab/test_stored_verdicts.py``.
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import pytest

from shadowlab.judge import verdicts
from shadowlab.results import records, rundir

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
WITH_CELLS = sorted(p.name for p in RUNS.iterdir() if (p / "cells").is_dir())
DOCS = sorted(p.name for p in (RUNS / "docs").iterdir() if (p / "verdicts.json.gz").is_file())


def judged(run: Path) -> bytes:
    """verdicts.json as `shadowlab report` / `gate` would write it for a copy of ``run``."""
    verdicts.compute(rundir.load(run, need_matrix=False))
    return (run / "verdicts.json").read_bytes()


def first_difference(a: bytes, b: bytes) -> str:
    for n, (x, y) in enumerate(zip(a.decode().splitlines(), b.decode().splitlines()), 1):
        if x != y:
            return f"line {n}: {x.strip()[:120]!r} != {y.strip()[:120]!r}"
    return f"lengths {len(a)} != {len(b)}"


def test_there_are_stored_runs():
    assert len(WITH_CELLS) >= 3 and len(DOCS) >= 4


@pytest.mark.parametrize("name", WITH_CELLS)
def test_a_stored_run_is_judged_as_stored(name, tmp_path):
    run = tmp_path / name  # the run id is the directory's name
    shutil.copytree(RUNS / name, run)
    stored = (RUNS / name / "verdicts.json").read_bytes()
    fresh = judged(run)
    assert fresh == stored, f"{name}: {first_difference(fresh, stored)}"


@pytest.mark.parametrize("name", DOCS)
def test_a_docs_run_reads_back_as_stored(name, tmp_path):
    """A run reduced to its verdicts.json: read (upgraded, re-judged for impossible figures) and
    written again, it is the same file."""
    run = tmp_path / name
    shutil.copytree(RUNS / "docs" / name, run, ignore=shutil.ignore_patterns("*.gz"))
    stored = gzip.decompress((RUNS / "docs" / name / "verdicts.json.gz").read_bytes())
    (run / "verdicts.json").write_bytes(stored)
    again = records.json_bytes(verdicts.judge(rundir.load(run)).to_dict())
    assert again == stored, f"{name}: {first_difference(again, stored)}"


def test_the_comparison_fails_on_a_changed_log(tmp_path):
    """One restore line gone from one engine.log: that turn is judged otherwise, and the bytes
    differ from the stored file."""
    name = "llama.cpp-b9093"
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    log = run / "cells" / "old.cram0.append" / "engine.log"
    lines = log.read_bytes().splitlines(keepends=True)
    restored = [i for i, line in enumerate(lines) if b"restored context checkpoint" in line]
    assert restored
    log.write_bytes(b"".join(line for i, line in enumerate(lines) if i != restored[0]))
    fresh = judged(run)
    assert fresh != (RUNS / name / "verdicts.json").read_bytes()
    append = verdicts.RunVerdict.from_dict(records.parse_json(fresh)).cell("old.cram0.append")
    assert append.turns[1].outcome is not verdicts.Outcome.RESTORED


if __name__ == "__main__":  # regenerate the stored files (only when a verdict is meant to change)
    import tempfile

    for name in WITH_CELLS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / name
            shutil.copytree(RUNS / name, copy)
            (RUNS / name / "verdicts.json").write_bytes(judged(copy))
            print(f"wrote {RUNS / name / 'verdicts.json'}", file=sys.stderr)
