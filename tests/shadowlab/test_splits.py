"""splits.py: a restored turn's batch schedule from its log, and whether requests reproduce it.

The request sequence's effect on the real llama-server (its batches and logprobs equal the warm
turn's) is shown live in tests/llama/test_split_control_llama.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from shadowlab.logs import parse as logparse
from shadowlab.judge.identity import Output, TriageClass, triage
from shadowlab.judge.splits import Schedule, request_sequence, unknown_prefix, warm_schedule

IK = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "ik_llama.cpp-0.1.5" / "cells"
B11434 = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "llama.cpp-b11434"


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
    requests, why = request_sequence(s, "ik_llama.cpp")
    assert requests is None
    assert "re-entered at 4555" in why and "not known for the ik_llama.cpp family" in why
    t = triage(Output(warm["completion"]["text"]), Output(cold["completion"]["text"]),
               no_split_control=why)
    assert t.cls is TriageClass.UNDETERMINED and t.warm_vs_cold.first_byte == 0
    assert why in t.detail


def _b11434_append() -> Schedule:
    """The captured b11434 append cell: A (4,560 tokens, task 0) then A + 206 (task 15)."""
    events = logparse.parse(B11434 / "append.cram0.log", "llama.cpp").events
    return warm_schedule(events, 0, 15, 4560, 4766, 512)


def test_b11434_append_schedule_and_its_request_sequence():
    s = _b11434_append()
    # A broke at L-4-ub = 4044 (a checkpoint) and was restored at L-4 = 4556; the append then
    # broke at its own L-4 = 4762. The 4556 checkpoint it re-created is the re-entry, no break.
    assert (s.re_entry, s.prefix_breaks, s.suffix_breaks) == (4556, (4044, 4556), (4762,))
    assert s.split_points == (512, 1024, 1536, 2048, 2560, 3072, 3584, 4044, 4556, 4762)
    assert request_sequence(s, "llama.cpp") == ((4044, 4556, 4762, 4766), "")


def test_a_request_per_break_and_nothing_above_the_prompt():
    # an earlier request's breaks above the re-entry point are not the warm turn's; every other
    # break is one request, the prompt last
    s = Schedule((), 2048, (1000, 2048, 2600), 3000, 2900, (2380, 2892))
    assert request_sequence(s, "llama.cpp") == ((1000, 2048, 2380, 2892, 2900), "")


def test_a_prefix_that_reused_cache_itself_has_no_known_schedule():
    s = dataclasses.replace(_b11434_append(), prefix_reused=2048)
    requests, why = request_sequence(s, "llama.cpp")
    assert requests is None and "itself reused 2048 cached tokens" in why and why == unknown_prefix(s)
    assert unknown_prefix(_b11434_append()) == ""


def test_no_restore_no_schedule():
    events = logparse.parse(IK / "ik.cram0.cold.A_append" / "engine.log", "ik_llama.cpp").events
    assert warm_schedule(events, 1, 1, 4766, 4766, 512) is None


def test_ik_append_verdict_carries_the_undetermined_triage_and_why(tmp_path):
    """The captured run directory through verdicts.compute: the append mismatch is classed,
    with the reason no split control could run and where the outputs part (schema 4)."""
    import shutil

    from shadowlab.results import rundir
    from shadowlab.judge import verdicts

    shutil.copytree(IK.parent, tmp_path / "run")
    v = verdicts.compute(rundir.load(tmp_path / "run", need_matrix=False), write=False)
    classed = {(c.cell_id, t.index): t.triage for c in v.cells for t in c.turns if t.triage}
    t = classed.pop(("ik.cram0.append", 1))
    assert t.cls == "undetermined" and t.split_control_cell is None and t.warm_vs_cold == "byte 0"
    assert "re-entered at 4555" in t.detail and "not known for the ik_llama.cpp family" in t.detail
    assert t.detail.endswith("a live run would add the completion token ids (this record holds text only) "
                             "and the top logprobs where the outputs part (generation.n_probs)")
    assert all(c.cls for c in classed.values())  # every other mismatch is classed too
    assert all(t.triage is None for c in v.cells for t in c.turns
               if t.identity is None or t.identity.status.value != "mismatch")


def test_a_later_prefix_turn_that_reused_cache_gives_no_control_and_says_why():
    """The checkpoint a warm turn restored was created by a turn that itself reused cache (or did
    not say): its batches from 0 are unknown, so no split control is planned; the first turn of a
    fresh process computed from 0 whatever it reported."""
    from shadowlab.results import records
    from shadowlab.judge import attribution as split_controls

    meta = records.read_meta(IK / "ik.cram0.append" / "meta.json")
    events = logparse.parse(IK / "ik.cram0.append" / "engine.log", "ik_llama.cpp").events
    a, append = meta.turns
    assert split_controls.turn_schedule(meta, events, 1).prefix_reused == 0
    a.reused_tokens = None
    assert split_controls.turn_schedule(meta, events, 1).prefix_reused == 0  # turn 0: from 0
    # The same lines as turns 1 and 2 of a longer sequence, A having reused 100 (or unreported).
    earlier = dataclasses.replace(a, index=0, task_ids=[0])
    for reused, said in ((100, "itself reused 100 cached tokens"), (None, "an unreported number of")):
        meta.turns = [earlier, dataclasses.replace(a, index=1, reused_tokens=reused),
                      dataclasses.replace(append, index=2)]
        schedule = split_controls.turn_schedule(meta, events, 2)
        assert schedule.prefix_reused == reused and schedule.re_entry == 4555
        why = split_controls.no_control_reason(meta, schedule, "completion")
        assert said in why and "re-entered at 4555" in why
        meta.engine.kind = "reference"  # the reference engine is refused the same way
        assert split_controls.no_control_reason(meta, schedule, "completion") == why
        meta.engine.kind = "llama-server"
