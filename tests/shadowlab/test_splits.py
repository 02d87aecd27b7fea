"""splits.py: a restored turn's batch schedule from its log, and whether requests reproduce it."""

from __future__ import annotations

import json
from pathlib import Path

from shadowlab import logparse
from shadowlab.identity import Output, TriageClass, triage
from shadowlab.splits import Schedule, request_sequence, warm_schedule

IK = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "ik_llama.cpp-0.1.5" / "cells"


def _turns(cell: str) -> list[dict]:
    return json.loads((IK / cell / "meta.json").read_text())["turns"]


def test_ik_append_schedule_from_the_captured_log():
    events = logparse.parse(IK / "ik.cram0.append" / "engine.log", "ik_llama.cpp").events
    prefix, warm = _turns("ik.cram0.append")
    s = warm_schedule(events, prefix["task_ids"][0], warm["task_ids"][0],
                      prefix["prompt_tokens"], warm["prompt_tokens"], 512)
    # A's -b checkpoints (2048, 4096) and its n-5 checkpoint 4555, where the append re-entered;
    # then the append's own n-5 checkpoint 4761
    assert s.re_entry == 4555 and s.prefix_breaks == (2048, 4096, 4555)
    assert s.split_points == (512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 4555, 4761)


def test_ik_append_mismatch_is_undetermined_with_the_reason_and_the_evidence():
    events = logparse.parse(IK / "ik.cram0.append" / "engine.log", "ik_llama.cpp").events
    prefix, warm = _turns("ik.cram0.append")
    (cold,) = _turns("ik.cram0.cold.A_append")
    s = warm_schedule(events, 1, 14, prefix["prompt_tokens"], warm["prompt_tokens"], 512)
    requests, why = request_sequence(s, 2048, 512)
    assert requests is None
    assert "re-entered at 4555" in why and "4550" in why  # a 4,555-token request breaks at 4550
    t = triage(Output(warm["completion"]["text"]), Output(cold["completion"]["text"]),
               no_split_control=why)
    assert t.cls is TriageClass.UNDETERMINED and t.warm_vs_cold.first_byte == 0
    assert why in t.detail


def test_a_prefix_request_that_breaks_where_the_earlier_one_did_reproduces_the_schedule():
    # an engine that broke only at -b multiples: a first request of r = 2048 tokens breaks the same
    s = Schedule((512, 1024, 1536, 2048, 2560), 2048, (2048,), 4096, 3000)
    assert request_sequence(s, 2048, 512) == ((2048, 3000), "")
    # the same with a tail checkpoint 4 tokens before the earlier end: a 2048-token request
    # would break at 2044 too
    s = Schedule((512, 1024, 1536, 2048, 2560), 2048, (2048, 4092), 4096, 3000)
    requests, why = request_sequence(s, 2048, 512)
    assert requests is None and "2044" in why


def test_no_restore_no_schedule():
    events = logparse.parse(IK / "ik.cram0.cold.A_append" / "engine.log", "ik_llama.cpp").events
    assert warm_schedule(events, 1, 1, 4766, 4766, 512) is None


def test_ik_append_verdict_carries_the_undetermined_triage_and_why(tmp_path):
    """The captured run directory through verdicts.compute: the append mismatch is classed,
    with the reason no split control could run and where the outputs part (schema 4)."""
    import shutil

    from shadowlab import rundir, verdicts

    shutil.copytree(IK.parent, tmp_path / "run")
    v = verdicts.compute(rundir.load(tmp_path / "run", need_matrix=False), write=False)
    classed = {(c.cell_id, t.index): t.triage for c in v.cells for t in c.turns if t.triage}
    t = classed.pop(("ik.cram0.append", 1))
    assert t.cls == "undetermined" and t.split_control_cell is None and t.warm_vs_cold == "byte 0"
    assert "re-entered at 4555" in t.detail and "no request sequence reproduces" in t.detail
    assert t.detail.endswith("a live run would add the completion token ids (this record holds text only)")
    assert all(c.cls for c in classed.values())  # every other mismatch is classed too
    assert all(t.triage is None for c in v.cells for t in c.turns
               if t.identity is None or t.identity.status.value != "mismatch")
