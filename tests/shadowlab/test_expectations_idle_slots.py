"""The default cascade check ("no stale checkpoint kept") on a real `--cache-idle-slots` run:
llama-server empties each idle slot (`clearing prompt with N tokens`) without an erase line, so
the check must pass there, and still fail where a cleared slot's checkpoints are kept.

The run directory is built from tests/fixtures/logs/llama.cpp-b11434-idle-slots/: the cell's
engine.log cut after its 7th turn, and its meta.json cut to those 7 turns (see that README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowlab.results import records
from shadowlab.judge import verdicts
from shadowlab.judge.expectations import CheckStatus, cascade_checks

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "llama.cpp-b11434-idle-slots"
LOG = FIX / "np4-pinned-cram8192.head422.log"
META = FIX / "np4-pinned-cram8192.head422.meta.json"


def _run(tmp_path: Path, log: bytes) -> verdicts.RunVerdict:
    meta = json.loads(META.read_text())
    layout = records.RunLayout(tmp_path / "run")
    cell = meta["cell_id"]
    layout.cell_dir(cell).mkdir(parents=True)
    layout.engine_log(cell).write_bytes(log)
    layout.meta(cell).write_text(json.dumps(meta))
    return verdicts.compute(tmp_path / "run")


def test_cascade_check_passes_where_idle_slots_were_cleared(tmp_path):
    verdict = _run(tmp_path, LOG.read_bytes())
    (cell,) = verdict.cells
    turn4 = cell.turns[4]  # task 41 on slot 3, which task 10 left with 831 and 1343 before its clear
    assert (turn4.cascade_checked, turn4.alive_at_start, turn4.cascade_missed) == (True, (), ())
    assert turn4.divergence_point == 0 and not turn4.implausible  # the cleared slot holds no tokens
    (check,) = cascade_checks(verdict)
    assert (check.status, check.actual) == (CheckStatus.PASS, "none kept")


@pytest.mark.parametrize("slot", [b"2", b"1"])
def test_cascade_check_fails_where_a_cleared_slots_checkpoints_are_kept(tmp_path, slot):
    """The same log with slot 3's clears naming another slot (same bytes, so the turns' log spans
    still fit): slot 3 keeps task 10's checkpoints, and turn 4 re-enters it at 0."""
    log = LOG.read_bytes().replace(b"id  3 | task -1 | clearing", b"id  " + slot + b" | task -1 | clearing")
    verdict = _run(tmp_path, log)
    missed = [(t.index, c.n_tokens) for t in verdict.cells[0].turns for c in t.cascade_missed]
    assert {(4, 831), (4, 1343)} <= set(missed)
    (check,) = cascade_checks(verdict)
    assert check.status is CheckStatus.FAIL and "turn 4: pos_max 830, 1342" in check.message
