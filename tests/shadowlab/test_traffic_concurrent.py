"""Requests sent concurrently (a traffic's `in_flight`, docs/DESIGN.md §2) on the live reference
engine: each turn tied to its task by the figures its answer and the log both state, the engine's
realised overlap read back as a schedule, and the simulator exact on it turn by turn; then the
whole path through `shadowlab run`, where a broken engine still fails the gate and a log that is
not the answers' fails the cell instead of being guessed at.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shadowlab import cli, simulate, traffic
from shadowlab.judge import attribution, gate
from shadowlab.logs import parse as logparse
from shadowlab.judge.identity import IdentityStatus
from shadowlab.matrix import load as load_matrix

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
import engine_process  # noqa: E402
import test_traffic_replay as replay_tests  # noqa: E402
from test_simulate import ENGINE_FLAGS, REFERENCE, VOCAB, exactness_shape, reference_policy  # noqa: E402

IN_FLIGHT = 3


@pytest.fixture(scope="module")
def model() -> Path:
    return engine_process.tiny_model()


def send_concurrently(engine, requests, seed: int | traffic.Materialiser, workers: int = IN_FLIGHT) -> list[dict]:
    """Every request's answer, `workers` in flight at a time, sent in traffic order. The prompts
    are materialised in traffic order before any is sent (a Materialiser's tokens depend on the
    requests it has seen, so never on thread timing); pass a Materialiser to go on from its
    requests."""
    m = seed if isinstance(seed, traffic.Materialiser) else traffic.Materialiser(VOCAB, seed)
    prompts = [m.prompt(r) for r in requests]

    def one(r, prompt):
        body = {"prompt": prompt, "n_predict": r.output_length, "temperature": 0, "cache_prompt": True}
        if r.conversation is not None:
            body["prompt_cache_key"] = r.conversation
        resp = engine.post("/completion", body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, requests, prompts))


def tie_answers(log: Path, requests, answers) -> attribution.Tied:
    claims = [attribution.Claim(i, r.prompt_tokens, a["timings"]["prompt_n"], a["timings"]["prompt_ms"],
                                a.get("id_slot"), a.get("id_task")) for i, (r, a) in enumerate(zip(requests, answers))]
    return attribution.tie(claims, attribution.tasks(logparse.parse(log, "llama.cpp").events))


@pytest.mark.parametrize("config", ["policy0", "retention", "slots3", "affinity"])
def test_the_simulator_is_exact_on_the_schedule_the_engine_ran(config, model, tmp_path):
    """Several requests in flight: slot choice depends on which slots were busy, LRU on the
    order they were released. Given the schedule read from the log, the simulator agrees
    turn by turn (reuse and slot); the order the engine served them is recorded, not assumed."""
    flags, env, policy = REFERENCE[config]
    requests = traffic.generate(exactness_shape(2))
    with engine_process.running(model, [*ENGINE_FLAGS, *flags], tmp_path, env=env) as engine:
        m = traffic.Materialiser(VOCAB, 2)
        answers = send_concurrently(engine, requests, m)
        log = engine.log_file
        # Whether a concurrent turn lands on the slot holding its conversation depends on timing,
        # so some schedules reuse nothing. The turn the engine served last, sent again once every
        # slot is idle, finds its prompt held: the reuse arithmetic is checked on every schedule,
        # after slots whose content the concurrency decided.
        served = tie_answers(log, requests, answers).tasks
        last = max(served, key=lambda i: served[i].first)
        requests = [*requests, dataclasses.replace(requests[last], time=requests[-1].time + 1.0)]
        answers += send_concurrently(engine, requests[-1:], m, workers=1)
        tied = tie_answers(log, requests, answers)
        assert not tied.untied and len(tied.tasks) == len(requests)
        assert all(tied.tasks[i].task == a["id_task"] for i, a in enumerate(answers))  # the claim checked out
        schedule = attribution.schedule(tied.tasks, attribution.markers(log))
    if "-np" in flags:  # several slots: requests ran side by side (one slot serves one at a time)
        assert _overlapping(schedule), "no request overlapped another: the test did not exercise concurrency"
    else:
        assert not _overlapping(schedule)
    measured = [(a["timings"]["cache_n"], a["id_slot"]) for a in answers]
    want = [(t.reused, t.slot) for t in simulate.simulate(requests, reference_policy(policy), schedule)]
    assert measured == want
    assert measured[-1][0] > 0, "the repeat reused nothing: the reuse arithmetic went unchecked"


def _overlapping(schedule) -> list[int]:
    """Requests that started while another had not ended."""
    live, out = set(), []
    for step, i in schedule:
        if step == "start":
            if live:
                out.append(i)
            live.add(i)
        else:
            live.discard(i)
    return out


def test_a_schedule_is_needed_where_slots_overlap(model, tmp_path):
    """The sequential model is not the concurrent truth on several slots: without the schedule
    the prediction differs from what the engine did (so the schedule carries information)."""
    flags, env, policy = REFERENCE["slots3"]
    requests = traffic.generate(exactness_shape(2))
    with engine_process.running(model, [*ENGINE_FLAGS, *flags], tmp_path, env=env) as engine:
        answers = send_concurrently(engine, requests, 2)
    measured = [(a["timings"]["cache_n"], a["id_slot"]) for a in answers]
    assert measured != [(t.reused, t.slot) for t in simulate.simulate(requests, reference_policy(policy))]


def test_a_log_that_is_not_the_answers_ties_nothing(model, tmp_path):
    requests = traffic.generate(exactness_shape(1))[:12]
    flags, env, _ = REFERENCE["policy0"]
    with engine_process.running(model, [*ENGINE_FLAGS, "--fault", "log-timing-skew"], tmp_path, env=env) as engine:
        answers = send_concurrently(engine, requests, 1)
        tied = tie_answers(engine.log_file, requests, answers)
    assert not tied.tasks and set(tied.untied) == set(range(len(requests)))
    assert "no task in engine.log states turn 0's figures" in tied.untied[0]


# ---------------------------------------------------------------- through `shadowlab run`

# test_traffic_replay's small traffic and engine, sent IN_FLIGHT at a time.
MATRIX = replay_tests.MATRIX.replace("    kind: traffic\n", "    kind: traffic\n    in_flight: {in_flight}\n", 1)
assert MATRIX != replay_tests.MATRIX
CONFIGURATIONS = {
    "policy0": "{flags: [-np, 1], env: {PXA_CKPT_PROMPT_POLICY: 0}}",
    "affinity": "{flags: [-np, 3], env: {PXA_CKPT_PROMPT_POLICY: 0, SHADOWLAB_SLOT_AFFINITY: 1}}",
    "retention": "{flags: [-np, 1], env: {PXA_CKPT_PROMPT_POLICY: 0, SHADOWLAB_CKPT_RETAIN_MIB: 64}}",
}


def write_matrix(path: Path, names: tuple[str, ...], name: str = "traffic-concurrent") -> Path:
    confs = "\n".join(f"  {n}: {CONFIGURATIONS[n]}" for n in names)
    path.write_text(MATRIX.format(name=name, b=replay_tests.B, n_predict=replay_tests.N_PREDICT,
                                  configurations=confs, in_flight=IN_FLIGHT))
    return path


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("concurrent")
    matrix = write_matrix(tmp / "m.yaml", tuple(CONFIGURATIONS))
    code = cli.main(["run", str(matrix), "--out", str(tmp / "run")])
    return code, gate.evaluate(tmp / "run"), load_matrix(matrix).sequences["traffic"].requests


def test_concurrent_traffic_qualifies_with_every_turn_tied_and_checked(healthy):
    code, result, requests = healthy
    assert code == 0, result.summary()
    run = result.inputs.run
    for configuration in CONFIGURATIONS:
        warm = run.metas[f"reference.{configuration}.traffic"]
        assert [t.index for t in warm.turns] == list(range(len(requests)))
        assert all(t.log_attribution == "task" and len(t.task_ids) == 1 and t.log_complete for t in warm.turns)
        assert len({t.task_ids[0] for t in warm.turns}) == len(requests)
        # Sent without waiting on each other: the traffic's first two requests are of
        # different conversations, so the second went out while the first was in flight.
        assert requests[0].conversation != requests[1].conversation
        assert warm.turns[1].in_flight == 2 and max(t.in_flight for t in warm.turns) <= IN_FLIGHT
        verdict = result.inputs.verdict.cell(f"reference.{configuration}.traffic")
        # Every turn has a reference, turn 0 too: any request may find the cache first.
        assert all(t.identity is not None and t.identity.status in (IdentityStatus.IDENTICAL,
                                                                    IdentityStatus.IDENTICAL_NO_REUSE)
                   for t in verdict.turns), configuration
        ranks = sorted(t.processing_rank for t in verdict.turns)
        assert ranks == list(range(len(requests)))
    assert any(t.reused_tokens for t in run.metas["reference.affinity.traffic"].turns)


def test_one_slot_serves_concurrent_requests_one_task_at_a_time(healthy):
    """On -np 1 the tied tasks' lines never interleave: each span holds its own task's lines."""
    _, result, _ = healthy
    run = result.inputs.run
    meta = run.metas["reference.policy0.traffic"]
    events = logparse.parse(run.layout.engine_log(meta.cell_id), "llama.cpp").events
    for t in meta.turns:
        a, b = t.log_offsets
        tasks = {ev.task for ev in events if a <= ev.offset < b and ev.task is not None}
        assert tasks == set(t.task_ids), t.index


def test_wrong_conversation_restore_under_concurrency_fails_the_gate(tmp_path):
    matrix = write_matrix(tmp_path / "m.yaml", ("retention",), name="concurrent-fault")
    code = cli.main(["run", str(matrix), "--out", str(tmp_path / "run"), "--fault", "wrong-conversation-restore"])
    result = gate.evaluate(tmp_path / "run")
    assert code == 1, result.summary()
    assert {c.check for c in result.failures} == {"identity"}, result.summary()


@pytest.mark.parametrize("fault", ["log-timing-skew", "wrong-task-id"])
def test_turns_that_cannot_be_tied_fail_the_cell(fault, tmp_path):
    matrix = write_matrix(tmp_path / "m.yaml", ("policy0",), name="concurrent-untied")
    code = cli.main(["run", str(matrix), "--out", str(tmp_path / "run"), "--fault", fault])
    result = gate.evaluate(tmp_path / "run")
    assert code == 3, result.summary()
    meta = json.loads((tmp_path / "run" / "cells" / "reference.policy0.traffic" / "meta.json").read_text())
    assert meta["status"] == "failed"
    assert "requests sent concurrently: no task in engine.log states turn" in meta["reason"]


# ---------------------------------------------------------------- a real b11434 run, offline

BUSY_SLOT_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "llama.cpp-b11434-busy-slot-load"


def test_a_prompt_cache_load_into_a_busy_slot_explains_the_mismatch_and_spares_the_cascade(tmp_path):
    """traffic-llama's np4_pinned_cram sent four at a time on llama-server b11434: two turns
    that reused nothing differ from cold. The log shows why (the prompt cache loaded another
    prompt into slot 3 while their task ran there), the triage says so, and the checkpoints of
    a ring replaced under a running task are not held against the engine's cascade."""
    run = tmp_path / "run"
    shutil.copytree(BUSY_SLOT_RUN, run)
    result = gate.evaluate(run)
    assert result.exit_code == 1
    failed = sorted((c.check, c.subject) for c in result.checks if not c.passed)
    assert [check for check, _ in failed] == ["identity", "identity"]
    cell = result.inputs.verdict.cell("llama.np4_pinned_cram.traffic_in_flight")
    mismatched = {t.index: t for t in cell.turns if t.identity.status is IdentityStatus.MISMATCH}
    assert sorted(mismatched) == [9, 12] and not any(mismatched[i].reused_tokens for i in mismatched)
    for index, line in ((9, 617), (12, 817)):
        triage = mismatched[index].triage
        assert triage.cls == "corrupted_state"
        assert f"line {line}: the prompt cache loaded a saved prompt" in triage.detail
        assert "into slot 3 while it was processing task" in triage.detail
    later = [t for t in cell.turns if any("slot 3's checkpoints are unknown since line 617" in n for n in t.notes)]
    assert later and not any(t.cascade_checked for t in later)
    log = run / "cells" / cell.cell_id / "engine.log"
    hits = attribution.loads_into_busy_slots(logparse.parse(log, "llama.cpp").events, attribution.markers(log))
    assert [(ev.line, slot) for ev, slot, _ in hits] == [(617, 3), (681, 3), (817, 3)]


def test_an_engine_that_dies_with_requests_in_flight_fails_the_cell_and_the_run_ends(tmp_path):
    """The requests still in flight when one fails are waited for (they fail too), nothing
    more is sent, every answered turn is kept, and the cell fails with the crash."""
    matrix = write_matrix(tmp_path / "m.yaml", ("policy0",), name="concurrent-crash")
    code = cli.main(["run", str(matrix), "--out", str(tmp_path / "run"), "--fault", "crash-after-requests=5"])
    assert code == 3
    meta = json.loads((tmp_path / "run" / "cells" / "reference.policy0.traffic" / "meta.json").read_text())
    assert meta["status"] == "failed" and "engine exited with code" in meta["reason"], meta["reason"]
    answered = [t for t in meta["turns"] if t["error"] is None]
    assert len(answered) == 5 and len(meta["turns"]) <= 5 + IN_FLIGHT


def test_the_report_says_how_the_traffic_was_sent(healthy):
    _, result, _ = healthy
    md = (result.inputs.run.layout.root / "report.md").read_text(encoding="utf-8")
    assert f"Sent with up to {IN_FLIGHT} requests in flight (reached: " in md
    html = (result.inputs.run.layout.root / "report.html").read_text(encoding="utf-8")
    assert f"Sent with up to {IN_FLIGHT} requests in flight" in html


def test_repeated_cells_are_labelled_by_repeat():
    from shadowlab.report.traffic import TrafficRow

    row = dict(configuration="affinity", prompt=1, ideal=1, reused=0, share=0.0, y=0, processed_w=0,
               reused_w=0, ideal_x=0, erasures=())
    assert TrafficRow(cell_id="reference.affinity.traffic.r2", **row).label == "affinity r2"
    assert TrafficRow(cell_id="reference.affinity.traffic", **row).label == "affinity"


SIM_FLAGS = f"n_batch={replay_tests.B},n_ubatch=32,ctx_checkpoints=64"


@pytest.mark.parametrize("configuration, policy", [
    ("policy0", f"policy0:{SIM_FLAGS}"),
    ("affinity", f"affinity+policy0:slots=3,{SIM_FLAGS}"),
    ("retention", f"retention+policy0:retain_mib=64,{SIM_FLAGS}"),
])
def test_simulate_replays_a_concurrent_cell_exactly_from_its_run_directory(healthy, configuration, policy, capsys):
    """`shadowlab simulate RUN/cells/CELL`: the cell's traffic on the schedule its engine served
    it on (sizes from its /props); the policy that describes the cell's flags reuses exactly what
    the cell reused, turn by turn, and one that does not (one slot for the affinity cell) differs."""
    _, result, requests = healthy
    cell = result.inputs.run.layout.root / "cells" / f"reference.{configuration}.traffic"
    wrong = f"policy0:slots=1,{SIM_FLAGS}"
    assert simulate.main([str(cell), "--policy", policy, "--policy", wrong, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schedule"] and doc["measured_reused"] == [t.reused_tokens for t in result.inputs.run.metas[cell.name].turns]
    right, other = doc["policies"]
    assert right["versus_run"] == {"equal_turns": len(requests), "turns": len(requests), "first_difference": None}
    if configuration != "policy0":  # one slot without a fix: the interlopers leave nothing to reuse
        assert any(doc["measured_reused"])
    if configuration == "affinity":
        assert other["versus_run"]["first_difference"] is not None


def test_simulate_refuses_a_cell_that_is_no_warm_traffic_cell(healthy, capsys):
    _, result, _ = healthy
    cell = result.inputs.run.layout.root / "cells" / "reference.policy0.cold.traffic"
    assert simulate.main([str(cell)]) == 2
    err = capsys.readouterr().err
    assert "not a warm cell of a traffic sequence" in err and "Traceback" not in err


def test_a_run_cells_sizes_fill_only_what_the_policy_text_leaves_unset():
    """Sizes from the cell's /props replace the policy's defaults, never a size the policy
    names, however it spells the key (parse_policy reads `-` as `_`)."""
    cell = simulate.RunCell(traffic.Loaded(()), None, (), {"checkpoint_mib": 0.5, "kv_mib_per_token": 0.01,
                                                          "state_mib": 0.0})
    own = cell.sized(simulate.parse_policy("retention:checkpoint-mib=62.9"))
    assert (own.checkpoint_mib, own.kv_mib_per_token, own.state_mib) == (62.9, 0.01, 0.0)
    assert cell.sized(simulate.parse_policy("retention")).checkpoint_mib == 0.5
