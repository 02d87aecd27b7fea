"""verdicts.compute() on run directories built here from REAL engine logs (the reference-engine
captures in tests/fixtures/logs/reference/, with the responses the engine gave in the same run),
plus the transcribed llama.cpp / ik logs. Each check is also shown failing on a broken engine
(the engine's `--fault stale-restore` / `--fault skip-cascade` captures) or a doctored record."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from shadowlab.results import records
from shadowlab.errors import RunDirError
from shadowlab.judge.verdicts import IdentityStatus, Outcome, RunVerdict, compute, loaded, read

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REF = LOGS / "reference"


def _capture_module():
    spec = importlib.util.spec_from_file_location("capture", REF / "capture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CAP = _capture_module()
PROMPTS = {"A": CAP.A, "C": CAP.C, "B": CAP.B, "A_PLUS": CAP.A_PLUS}


# ---------------------------------------------------------------- building run directories


def task_spans(log: bytes) -> dict[int, list[int]]:
    """[start, end) byte span of each task, as the runner's log_offsets are: contiguous, each
    turn's span starting where the previous one ended (slot selection and prompt-cache lines,
    printed before the task owns the slot, fall into the turn that caused them)."""
    spans: dict[int, list[int]] = {}
    offset = 0
    for line in log.splitlines(keepends=True):
        m = re.search(rb"\| task (\d+) \||id_task=(\d+)", line)
        if m:
            task = int(m.group(1) or m.group(2))
            span = spans.setdefault(task, [offset, offset + len(line)])
            span[1] = offset + len(line)
        offset += len(line)
    ordered = sorted(spans.values())
    for previous, span in zip(ordered, ordered[1:]):
        span[0] = previous[1]
    return spans


def make_cell(
    run: Path,
    cell_id: str,
    *,
    kind: str,
    log: bytes,
    prompt_ids: list[str],
    answers: list[dict],
    configuration: str = "policy0",
    sequence: str = "",
    cold_cells: dict[int, str] | None = None,
    control_of: str | None = None,
    family: str = "reference",
    tasks: list[int] | None = None,
    edit=None,
) -> None:
    layout = records.RunLayout(run)
    layout.cell_dir(cell_id).mkdir(parents=True, exist_ok=True)
    layout.engine_log(cell_id).write_bytes(log)
    spans = task_spans(log)
    tasks = tasks if tasks is not None else list(range(len(prompt_ids)))
    turns = []
    for index, (pid, answer) in enumerate(zip(prompt_ids, answers)):
        tokens = PROMPTS[pid]
        timings = answer["timings"]
        text = answer.get("content") or ""
        turns.append(records.TurnRecord(
            index=index, prompt_id=pid, prompt_sha256=records.sha256_json(tokens), prompt_tokens=len(tokens),
            prompt_token_ids=list(tokens), messages=None, endpoint="/completion", http_status=200, error=None,
            timings=timings, reused_tokens=timings.get("cache_n"), processed_tokens=timings.get("prompt_n"),
            prefill_ms=timings.get("prompt_ms"), ttft_ms=None, response_ms=None,
            completion=records.Completion(text=text, tokens=list(answer["tokens"]),
                                          sha256=hashlib.sha256(text.encode()).hexdigest(), stop_type="limit"),
            log_offsets=spans[tasks[index]], log_complete=True, task_ids=[tasks[index]], response_file=None,
        ))
    cell = {
        "id": cell_id, "kind": kind, "engine": "reference", "configuration": configuration,
        "sequence": sequence or None,
        "turns": [{"index": i, "prompt_id": p, "endpoint": "completion",
                   "cold_cell": (cold_cells or {}).get(i)} for i, p in enumerate(prompt_ids)],
        "flags": [], "env": {}, "depends_on": None, "control_of": control_of,
    }
    meta = records.CellMeta(
        schema_version=records.SCHEMA_VERSION, run_id=run.name, cell_id=cell_id, cell=cell,
        status=records.CellStatus.OK, reason=None, log_tail=None, command=["shadowlab-engine"],
        env_delta={}, scratch_dir="scratch", cores=None, gpu=None, port=None, port_attempts=1, pid=None,
        engine=records.EngineRecord(name="reference", kind="reference", log_family=family, binary_path="x",
                                    binary_sha256="0", version="0", model_path="m", model_sha256="0",
                                    props={}, extra={}),
        started_at=None, health_ms=None, startup_ms=None, elapsed_ms=None, stop=None, turns=turns,
    )
    if edit is not None:
        edit(meta)
    records.write_meta(layout, meta)


def capture(name: str) -> tuple[bytes, list[dict]]:
    return (REF / f"{name}.log").read_bytes(), json.loads((REF / f"{name}.json").read_text())


def policy0_run(tmp_path: Path, warm_capture: str = "policy0-A-C-B-C", prompts=("A", "C", "B", "C"),
                warm_edit=None, control_edit=None, family: str = "reference") -> Path:
    run = tmp_path / "run-1"
    log, answers = capture(warm_capture)
    colds = {1: "reference.policy0.cold.C", 2: "reference.policy0.cold.B", 3: "reference.policy0.cold.C"}
    make_cell(run, "reference.policy0.warm", kind="warm", log=log, prompt_ids=list(prompts), answers=answers,
              sequence="A-C-B-C", cold_cells={i: c for i, c in colds.items() if i < len(prompts)}, edit=warm_edit,
              family=family)
    log, answers = capture("policy0-cold-C")
    make_cell(run, "reference.policy0.cold.C", kind="cold", log=log, prompt_ids=["C"], answers=answers)
    log, answers = capture("policy0-control-C")
    make_cell(run, "reference.policy0.control.C", kind="control", log=log, prompt_ids=["C"], answers=answers,
              control_of="reference.policy0.cold.C", edit=control_edit)
    return run


def ns(refs) -> list[int]:
    return [c.n_tokens for c in refs]


# ---------------------------------------------------------------- healthy engine


def test_restore_then_silent_resets_on_a_real_reference_run(tmp_path):
    run = policy0_run(tmp_path)
    verdict = compute(run)
    warm = verdict.cell("reference.policy0.warm")
    a, c, b, c2 = warm.turns
    assert warm.reuse_source == "api+log" and warm.unknown_lines == 0

    assert a.outcome is Outcome.COLD and ns(a.created) == [2048, 4044, 4096, 4556] and a.alive_at_start == ()

    assert c.outcome is Outcome.RESTORED
    assert c.divergence_point == 2531 and c.cached_tokens == 4560 + 16
    assert (c.re_entry_point, c.re_entry_source) == (2048, "restore")
    assert (c.reused_api, c.reused_log, c.processed_api, c.processed_log) == (2048, 2048, 2899, 2899)
    assert c.disagreements == ()
    assert c.saved_fraction == pytest.approx(2048 / 4947)
    assert ns(c.alive_at_start) == [2048, 4044, 4096, 4556]
    assert ns(c.alive_below_divergence) == [2048] and ns(c.alive_above_divergence) == [4044, 4096, 4556]
    assert ns(c.erased_cascade) == [4044, 4096, 4556] and c.cascade_missed == ()
    assert ns(c.created) == [4096, 4431, 4943]
    assert c.restored.n_tokens == 2048 and c.restore_ms is not None and c.restore_mib == pytest.approx(0.346)
    assert c.create_ms is not None and c.create_mib == pytest.approx(3 * 0.346)

    # B shares nothing: everything re-processed, no forcing line, the cascade empties the ring
    assert b.outcome is Outcome.SILENT_RESET and b.divergence_point == 0 and not b.forcing_line
    assert ns(b.alive_at_start) == [2048, 4096, 4431, 4943] and ns(b.erased_cascade) == [2048, 4096, 4431, 4943]
    # C after B: A's checkpoints are gone; only B's one is alive, and it is useless
    assert c2.outcome is Outcome.SILENT_RESET and ns(c2.alive_at_start) == [95]
    assert c2.reused_tokens == 0 and c2.saved_fraction == 0


def test_identity_and_control_on_the_real_run(tmp_path):
    verdict = compute(policy0_run(tmp_path))
    a, c, b, c2 = verdict.cell("reference.policy0.warm").turns
    assert a.identity is None
    assert c.identity.status is IdentityStatus.IDENTICAL and c.identity.reused_tokens == 2048
    assert c.identity.reference_cell == "reference.policy0.cold.C"
    assert c2.identity.status is IdentityStatus.IDENTICAL_NO_REUSE  # re-prefilled: proves nothing
    assert b.identity.status is IdentityStatus.NO_REFERENCE  # its cold cell was not run
    (control,) = verdict.controls
    assert control.status is IdentityStatus.IDENTICAL and verdict.nondeterministic_engines == ()


def test_forced_and_append_restore_on_the_default_policy(tmp_path):
    run = tmp_path / "run-2"
    log, answers = capture("defaults-A-C-append")
    make_cell(run, "reference.defaults.warm", kind="warm", log=log, prompt_ids=["A", "C", "A", "A_PLUS"],
              answers=answers, configuration="defaults")
    a, c, a2, plus = compute(run).cell("reference.defaults.warm").turns
    assert c.outcome is Outcome.FORCED and c.forcing_line and c.divergence_point == 2531
    assert c.alive_below_divergence == () and ns(c.alive_above_divergence) == [4044, 4556]
    assert (c.re_entry_point, c.reused_tokens) == (0, 0) and ns(c.erased_cascade) == [4044, 4556]
    assert a2.outcome is Outcome.FORCED and ns(a2.alive_above_divergence) == [4431, 4943]
    assert plus.outcome is Outcome.RESTORED and plus.divergence_point >= 4560
    assert plus.reused_tokens == 4556 and plus.processed_tokens == 210
    assert plus.saved_fraction == pytest.approx(4556 / 4766)


def test_verdicts_json_is_written_and_reads_back_equal(tmp_path):
    run = policy0_run(tmp_path)
    verdict = compute(run)
    assert read(run) == verdict
    data = json.loads((run / "verdicts.json").read_text())
    assert data["schema_version"] == 4
    (warm,) = [c for c in data["cells"] if c["cell_id"] == "reference.policy0.warm"]
    assert warm["turns"][1]["outcome"] == "restored"
    with pytest.raises(RunDirError, match="verdicts.json schema_version 99 is newer than this shadowlab understands"):
        RunVerdict.from_dict({**data, "schema_version": 99})  # the run directory's one version chain


def test_a_v3_verdicts_json_reads_with_no_triage(tmp_path):
    """v3 files have no `triage` (issue 16): every turn reads as None, the rest unchanged."""
    run = policy0_run(tmp_path)
    verdict = compute(run)
    data = json.loads((run / "verdicts.json").read_text())
    for cell in data["cells"]:
        for turn in cell["turns"]:
            turn["triage"] = {"cls": "corrupted_state", "detail": "x"}
    assert RunVerdict.from_dict(data) != verdict  # the field is read when present
    for cell in data["cells"]:
        for turn in cell["turns"]:
            del turn["triage"]
    old = RunVerdict.from_dict({**data, "schema_version": 3})
    assert old == verdict and old.schema_version == 4
    assert all(t.triage is None for c in old.cells for t in c.turns)


def test_a_v1_verdicts_json_is_upgraded_with_the_cascade_judgement_compute_makes(tmp_path):
    """v1 files have no `cascade_checked`; reading one derives it, so a declared `cascade: true`
    gated from an old verdicts.json alone is judged, not failed as unknown."""
    run = policy0_run(tmp_path)
    verdict = compute(run)
    data = json.loads((run / "verdicts.json").read_text())
    for cell in data["cells"]:
        for turn in cell["turns"]:
            del turn["cascade_checked"]
    upgraded = RunVerdict.from_dict({**data, "schema_version": 1})
    checked = [(c.cell_id, t.index, t.cascade_checked) for c in verdict.cells for t in c.turns]
    assert [(c.cell_id, t.index, t.cascade_checked) for c in upgraded.cells for t in c.turns] == checked
    assert any(flag for _, _, flag in checked) and not all(flag for _, _, flag in checked)
    assert upgraded == verdict


def test_a_v2_verdicts_json_is_upgraded_and_re_judged_for_impossible_figures(tmp_path):
    """v2 files have no `implausible` nor `divergence_lower_bound`: reading one derives the flag
    from compute's note and applies the plausibility rules to the turn's own figures."""
    run = policy0_run(tmp_path)
    verdict = compute(run)
    data = json.loads((run / "verdicts.json").read_text())
    for cell in data["cells"]:
        for turn in cell["turns"]:
            del turn["implausible"], turn["divergence_lower_bound"]
    assert loaded({**data, "schema_version": 2}) == verdict
    (warm,) = [c for c in data["cells"] if c["cell_id"] == "reference.policy0.warm"]
    warm["turns"][1]["reused_api"] = 10 * warm["turns"][1]["prompt_tokens"]  # a lie an old gate let pass
    warm["turns"][1]["notes"] = ["divergence point 7 is a lower bound: ..."]
    # the schema alone upgrades; the judge's reader applies the plausibility rules again
    assert RunVerdict.from_dict({**data, "schema_version": 2}).cell("reference.policy0.warm").turns[1].implausible == ()
    upgraded = loaded({**data, "schema_version": 2}).cell("reference.policy0.warm").turns[1]
    assert any("tokens reused of a" in p for p in upgraded.implausible), upgraded.implausible
    assert upgraded.divergence_lower_bound


# ---------------------------------------------------------------- broken engines


def test_stale_restore_fault_is_flagged_from_the_log(tmp_path):
    run = policy0_run(tmp_path, warm_capture="fault-stale-restore", prompts=("A", "C"))
    c = compute(run).cell("reference.policy0.warm").turns[1]
    assert c.outcome is Outcome.RESTORED and c.re_entry_point == 2049
    assert any("covers only n_tokens = 2048" in d for d in c.disagreements)
    # the re-entry lies within the shared prefix, so the divergence check itself stays quiet
    assert c.implausible == ()  # an honest report of its own bug: identity judges it, not plausibility


def test_stale_restore_output_mismatch_shows_token_and_byte(tmp_path):
    """The engine's stale-restore run really answered differently from the cold run."""
    warm = json.loads((REF / "fault-stale-restore.json").read_text())[1]
    cold = json.loads((REF / "policy0-cold-C.json").read_text())[0]
    expected_token = next(i for i, (a, b) in enumerate(zip(warm["tokens"], cold["tokens"])) if a != b)
    run = policy0_run(tmp_path, warm_capture="fault-stale-restore", prompts=("A", "C"))
    check = compute(run).cell("reference.policy0.warm").turns[1].identity
    assert check.status is IdentityStatus.MISMATCH and not check.inconclusive
    assert check.first_diff_token == expected_token
    assert check.first_diff_byte is not None
    assert check.text.encode()[: check.first_diff_byte] == check.reference_text.encode()[: check.first_diff_byte]
    assert check.text.encode()[check.first_diff_byte] != check.reference_text.encode()[check.first_diff_byte]
    assert list(check.tokens) == warm["tokens"] and list(check.reference_tokens) == cold["tokens"]
    assert check.reused_tokens == 2049


def test_reference_prompt_cache_rescues_a_b_a(tmp_path):
    run = tmp_path / "run-cram"
    log, answers = capture("cram8192-A-B-A")
    make_cell(run, "reference.cram.warm", kind="warm", log=log, prompt_ids=["A", "B", "A"], answers=answers,
              configuration="cram")
    a, b, a2 = compute(run).cell("reference.cram.warm").turns
    assert b.outcome is Outcome.SILENT_RESET and ns(b.erased_cascade) == [4044, 4556]
    assert any("prompt cache loaded a saved entry" in n for n in a2.notes)
    assert ns(a2.alive_at_start) == [4044, 4556] and a2.divergence_point == 4560
    assert a2.outcome is Outcome.RESTORED and a2.reused_tokens == 4556 and a2.disagreements == ()


def test_skip_cascade_fault_leaves_checkpoints_above_the_re_entry(tmp_path):
    run = policy0_run(tmp_path, warm_capture="fault-skip-cascade", prompts=("A", "C", "B"))
    a, c, b = compute(run).cell("reference.policy0.warm").turns
    assert c.outcome is Outcome.RESTORED and c.erased_cascade == ()
    assert ns(c.cascade_missed) == [4044, 4096, 4556]
    # every checkpoint alive when B starts should have gone (re-entry 0); none did
    assert b.outcome is Outcome.SILENT_RESET
    assert sorted(ns(b.cascade_missed)) == sorted(ns(b.alive_at_start)) == [2048, 4044, 4096, 4431, 4556, 4943]
    assert (a.cascade_checked, c.cascade_checked, b.cascade_checked) == (False, True, True)
    # the healthy engine: nothing missed, and every turn after the first was judged
    healthy = compute(policy0_run(tmp_path / "h")).cell("reference.policy0.warm").turns
    assert all(t.cascade_missed == () for t in healthy)
    assert [t.cascade_checked for t in healthy] == [False, True, True, True]


def test_api_and_log_disagreement_is_flagged(tmp_path):
    def lie(meta):
        meta.turns[1].reused_tokens = 2000
        meta.turns[1].processed_tokens = 2947

    c = compute(policy0_run(tmp_path, warm_edit=lie)).cell("reference.policy0.warm").turns[1]
    assert "reused: API says 2000, log says 2048" in c.disagreements
    assert "processed: API says 2947, log says 2899" in c.disagreements
    assert c.reused_tokens == 2000  # the API figure is kept and the conflict shown


def test_control_mismatch_marks_warm_mismatches_inconclusive(tmp_path):
    def noisy(meta):
        meta.turns[0].completion.tokens[0] += 1

    def corrupt(meta):
        meta.turns[1].completion.tokens[3] += 1

    verdict = compute(policy0_run(tmp_path, control_edit=noisy, warm_edit=corrupt))
    (control,) = verdict.controls
    assert control.status is IdentityStatus.MISMATCH and control.first_diff_token == 0
    assert verdict.nondeterministic_engines == ("reference",)
    check = verdict.cell("reference.policy0.warm").turns[1].identity
    assert check.status is IdentityStatus.MISMATCH and check.inconclusive


def test_failed_turn_is_an_error_outcome_and_identity_error(tmp_path):
    def fail(meta):
        meta.turns[1].http_status = 500
        meta.turns[1].error = "HTTP 500: invalid UTF-8"
        meta.turns[1].completion = None

    c = compute(policy0_run(tmp_path, warm_edit=fail)).cell("reference.policy0.warm").turns[1]
    assert c.outcome is Outcome.ERROR and c.error == "HTTP 500: invalid UTF-8"
    assert c.identity.status is IdentityStatus.ERROR
    assert not c.cascade_checked  # a failed turn says nothing about the cascade


def test_events_follow_their_task_when_a_span_is_misplaced(tmp_path):
    def shift(meta):
        # turn 1's span closed before its lines were written; its task id still claims them
        start = meta.turns[1].log_offsets[0]
        meta.turns[1].log_offsets = [start, start + 1]

    cell = compute(policy0_run(tmp_path, warm_edit=shift)).cell("reference.policy0.warm")
    c = cell.turns[1]
    assert c.outcome is Outcome.RESTORED and c.processed_log == 2899 and ns(c.erased_cascade) == [4044, 4096, 4556]
    assert any("its task id belongs to turn 1" in n for n in cell.notes)


def test_engine_without_log_family_uses_the_api_only(tmp_path):
    warm = compute(policy0_run(tmp_path, family="none")).cell("reference.policy0.warm")
    a, c, b, c2 = warm.turns
    assert warm.reuse_source == "api" and warm.event_counts == {}
    assert c.outcome is Outcome.RESTORED and c.reused_tokens == 2048 and c.reused_log is None
    assert any("API only" in n for n in c.notes)
    assert c.alive_at_start == () and c.cascade_missed == ()
    assert not any(t.cascade_checked for t in warm.turns)  # an empty cascade_missed proves nothing here
    assert b.outcome is Outcome.SILENT_RESET


# ---------------------------------------------------------------- other log families


def _lcp_prompts(shared: int, length: int, base: list[int], seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return base[:shared] + [rng.randrange(300, 400) for _ in range(length - shared)]


def test_llama_cpp_b11434_forced_and_silent(tmp_path, monkeypatch):
    a = list(range(1000, 1000 + 4560))
    c = _lcp_prompts(2531, 4947, a, 1)
    b = [500 + i for i in range(99)]
    monkeypatch.setitem(PROMPTS, "A", a)
    monkeypatch.setitem(PROMPTS, "C", c)
    monkeypatch.setitem(PROMPTS, "B", b)
    answers = [{"timings": {"cache_n": 0, "prompt_n": n}, "tokens": [7, 8, 9], "content": "xyz"} for n in (4560, 4947, 99, 4947)]
    run = tmp_path / "run-l"
    make_cell(run, "llama.defaults.warm", kind="warm", log=(LOGS / "transcribed" / "llama.cpp-b11434-A-C-B-C.log").read_bytes(),
              prompt_ids=["A", "C", "B", "C"], answers=answers, family="llama.cpp")
    a_t, c_t, b_t, c2_t = compute(run).cell("llama.defaults.warm").turns
    assert c_t.outcome is Outcome.FORCED and c_t.forcing_line and ns(c_t.alive_above_divergence) == [4044, 4556]
    assert c_t.reused_log == 0 and c_t.processed_log == 4947 and c_t.disagreements == ()
    assert b_t.outcome is Outcome.SILENT_RESET and ns(b_t.erased_cascade) == [4431, 4943]
    assert c2_t.outcome is Outcome.SILENT_RESET and ns(c2_t.alive_at_start) == [95]


def _llama_capture_run(tmp_path: Path, name: str, prompt_ids: list[str], monkeypatch) -> RunVerdict:
    spec = importlib.util.spec_from_file_location("llama_capture", LOGS / "llama-server" / "capture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for pid in set(prompt_ids):
        monkeypatch.setitem(PROMPTS, pid, getattr(module, pid))
    log = (LOGS / "llama-server" / f"{name}.log").read_bytes()
    answers = json.loads((LOGS / "llama-server" / f"{name}.json").read_text())
    tasks = [int(t) for t in re.findall(rb"\| task (\d+) \| new prompt", log)]
    run = tmp_path / name
    make_cell(run, "llama.x.warm", kind="warm", log=log, prompt_ids=prompt_ids, answers=answers,
              family="llama.cpp", tasks=tasks)
    return compute(run)


def test_real_llama_server_run_forced_then_silent(tmp_path, monkeypatch):
    a, c, b, c2 = _llama_capture_run(tmp_path, "cram0-A-C-B-C", ["A", "C", "B", "C"], monkeypatch).cell("llama.x.warm").turns
    assert c.outcome is Outcome.FORCED and c.divergence_point == 2531 and ns(c.alive_above_divergence) == [4044, 4556]
    assert (c.reused_api, c.reused_log, c.processed_api, c.processed_log) == (0, 0, 4947, 4947)
    assert c.disagreements == () and ns(c.erased_cascade) == [4044, 4556]
    assert b.outcome is Outcome.SILENT_RESET and c2.outcome is Outcome.SILENT_RESET and ns(c2.alive_at_start) == [95]


def test_real_llama_server_prompt_cache_rescues_a_b_a(tmp_path, monkeypatch):
    cell = _llama_capture_run(tmp_path, "cram8192-A-B-A", ["A", "B", "A"], monkeypatch).cell("llama.x.warm")
    a, b, a2 = cell.turns
    assert b.outcome is Outcome.SILENT_RESET and ns(b.erased_cascade) == [4044, 4556]
    # the slot saved A (with its checkpoints) to the prompt cache, and loads it back for the third
    # turn before deciding: A's checkpoints are what the restore can use, and A is what it matches
    assert any("prompt cache loaded a saved entry of 4567 tokens" in n for n in a2.notes)
    assert ns(a2.alive_at_start) == [4044, 4556] and ns(a2.alive_below_divergence) == [4044, 4556]
    assert a2.divergence_point == 4560 and a2.cached_tokens == 4560 + 8
    assert a2.outcome is Outcome.RESTORED and a2.restored.n_tokens == 4556 and a2.reused_tokens == 4556
    assert a2.processed_log == 4 and a2.disagreements == () and a2.cascade_missed == ()
    assert not any("never seen created" in n for t in cell.turns for n in t.notes)


def test_ik_restore_without_n_past_uses_the_checkpoint_coverage(tmp_path, monkeypatch):
    a = list(range(1000, 1000 + 4560))
    c = _lcp_prompts(2531, 4947, a, 1)
    monkeypatch.setitem(PROMPTS, "A", a)
    monkeypatch.setitem(PROMPTS, "C", c)
    answers = [{"timings": {"prompt_n": 4560}, "tokens": [1], "content": "a"},
               {"timings": {"prompt_n": 2899}, "tokens": [1], "content": "a"}]

    def ik_api(meta):  # ik has no cache_n: the adapter derives reuse from tokens_evaluated
        meta.turns[0].reused_tokens = 0
        meta.turns[1].reused_tokens = 2048

    run = tmp_path / "run-ik"
    make_cell(run, "ik.defaults.warm", kind="warm", log=(LOGS / "transcribed" / "ik_llama.cpp-A-C.log").read_bytes(),
              prompt_ids=["A", "C"], answers=answers, family="ik_llama.cpp", tasks=[1, 21], edit=ik_api)
    cell = compute(run).cell("ik.defaults.warm")
    c_t = cell.turns[1]
    assert c_t.outcome is Outcome.RESTORED and c_t.re_entry_point == 2048 and c_t.restore_ms == pytest.approx(0.21)
    assert ns(c_t.erased_cascade) == [4096, 4555] and c_t.disagreements == ()
    assert cell.unknown_lines == 2  # the `cache :` / `prompt:` dumps, reported


# ---------------------------------------------------------------- end to end: the real runner


def e2e_matrix(repo_root: Path) -> str:
    """matrices/ckpt.yaml reduced to its POLICY=0 cells (A→C, A→B→C, cold C and B, control),
    without its expectations: the verdicts are under test here, not the gate."""
    text = (repo_root / "matrices" / "ckpt.yaml").read_text()
    head, rest = text.split("cells:\n", 1)
    rest = rest[rest.index("generation:"):]
    rest = rest[: rest.index("expectations:")] if "expectations:" in rest else rest
    cells = "cells:\n  include:\n    - {configuration: policy0, sequence: A-C}\n    - {configuration: policy0, sequence: A-B-C}\n\n"
    return head + cells + rest


def _model_cache(repo_root: Path) -> Path:
    """A model cache keyed by the engine's weights code, so a file generated by an older
    init under models/ is never picked up."""
    import shadowlab_engine

    package = Path(shadowlab_engine.__file__).parent
    code = b"".join((package / name).read_bytes() for name in ("config.py", "weights.py", "model.py"))
    return repo_root / "models" / "tests" / hashlib.sha256(code).hexdigest()[:12]


def _real_run(tmp_path: Path, repo_root: Path, faults: tuple[str, ...] = ()) -> RunVerdict:
    from shadowlab import run
    from shadowlab.judge import attribution

    tmp_path.mkdir(parents=True, exist_ok=True)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(e2e_matrix(repo_root))
    outcome = run.run(run.RunOptions(matrix_path=matrix, out=tmp_path / "run", faults=faults,
                                     model_cache=_model_cache(repo_root), progress=lambda line: None,
                                     judging=attribution.RUN_JUDGING))
    assert outcome.all_ran, outcome.statuses
    return compute(outcome.run_dir)


@pytest.mark.slow
def test_real_run_healthy_then_each_fault_fails_its_check(tmp_path, repo_root):
    """Runner → run directory → verdicts on the reference engine with the case study's prompts:
    healthy, then with the engine's stale-restore and skip-cascade faults."""
    healthy = _real_run(tmp_path / "healthy", repo_root)
    a, c = healthy.cell("reference.policy0.A-C").turns
    assert ns(a.created) == [2048, 4044, 4096, 4556]
    assert c.outcome is Outcome.RESTORED and c.divergence_point == 2531 and c.re_entry_point == 2048
    assert ns(c.erased_cascade) == [4044, 4096, 4556] and c.cascade_missed == () and c.disagreements == ()
    assert c.identity.status is IdentityStatus.IDENTICAL
    _, b, c2 = healthy.cell("reference.policy0.A-B-C").turns
    assert b.outcome is Outcome.SILENT_RESET and c2.outcome is Outcome.SILENT_RESET
    assert c2.identity.status is IdentityStatus.IDENTICAL_NO_REUSE
    assert [x.status for x in healthy.controls] == [IdentityStatus.IDENTICAL]

    stale = _real_run(tmp_path / "stale", repo_root, ("stale-restore",))
    c = stale.cell("reference.policy0.A-C").turns[1]
    assert c.re_entry_point == 2049 and any("covers only n_tokens = 2048" in d for d in c.disagreements)
    assert c.identity.status is IdentityStatus.MISMATCH and c.identity.first_diff_token is not None
    assert [x.status for x in stale.controls] == [IdentityStatus.IDENTICAL]  # so it is conclusive

    skip = _real_run(tmp_path / "skip", repo_root, ("skip-cascade",))
    c = skip.cell("reference.policy0.A-C").turns[1]
    assert c.outcome is Outcome.RESTORED and ns(c.cascade_missed) == [4044, 4096, 4556]
    b = skip.cell("reference.policy0.A-B-C").turns[1]
    assert ns(b.cascade_missed) == [2048, 4044, 4096, 4556]


def test_several_slots_keep_their_own_checkpoints_and_cache(tmp_path, monkeypatch):
    """llama-server with -np 2: B lands on the idle slot 1 (a fresh slot: cold), so A's slot 0
    keeps its checkpoints and C restores there. Lines in b11434's words."""
    a = list(range(1000, 1000 + 4560))
    c = _lcp_prompts(2531, 4947, a, 1)
    monkeypatch.setitem(PROMPTS, "A", a)
    monkeypatch.setitem(PROMPTS, "C", c)
    monkeypatch.setitem(PROMPTS, "B", [500 + i for i in range(99)])

    def line(slot: int, task: int, msg: str) -> str:
        return f"0.01.000.000 I slot   operator(): id  {slot} | task {task} | {msg}"

    def ckpt(verb: str, n: int, extra: str = "") -> str:
        return f"{verb} context checkpoint{extra} (pos_min = {n - 1}, pos_max = {n - 1}, n_tokens = {n}"

    log = "\n".join([
        line(0, -1, "selected slot by LRU, t_last = -1"),
        line(0, 0, "new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 4560"),
        line(0, 0, "cached n_tokens = 0, memory_seq_rm [0, end)"),
        *(line(0, 0, ckpt("created", n, f" {k} of 64") + ", size = 0.032 MiB)") for k, n in enumerate((2000, 4044, 4556), 1)),
        line(0, 0, "prompt eval time =     380.12 ms /  4560 tokens (    0.08 ms per token, 11996.00 tokens per second)"),
        line(1, -1, "selected slot by LRU, t_last = -1"),
        line(1, 5, "new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 99"),
        line(1, 5, "cached n_tokens = 0, memory_seq_rm [0, end)"),
        line(1, 5, ckpt("created", 95, " 1 of 64") + ", size = 0.032 MiB)"),
        line(1, 5, "prompt eval time =       9.80 ms /    99 tokens (    0.10 ms per token, 10102.04 tokens per second)"),
        line(0, -1, "selected slot by LCP similarity, f_sim_best = 0.512 (> 0.100 thold), f_keep = 0.555"),
        line(0, 9, "new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 4947"),
        line(0, 9, ckpt("restored", 2000) + ", n_past = 2000, size = 0.032 MiB)"),
        *(line(0, 9, ckpt("erased invalidated", n) + ", n_swa = 0, pos_next = 2000, size = 0.032 MiB)") for n in (4044, 4556)),
        line(0, 9, "cached n_tokens = 2000, memory_seq_rm [2000, end)"),
        line(0, 9, ckpt("created", 4431, " 2 of 64") + ", size = 0.032 MiB)"),
        line(0, 9, "prompt eval time =     250.00 ms /  2947 tokens (    0.08 ms per token, 11788.00 tokens per second)"),
    ]) + "\n"
    answers = [{"timings": {"cache_n": r, "prompt_n": n}, "tokens": [7, 8], "content": "xy"}
               for r, n in ((0, 4560), (0, 99), (2000, 2947))]
    run = tmp_path / "run-np2"
    make_cell(run, "llama.np2.warm", kind="warm", log=log.encode(), prompt_ids=["A", "B", "C"], answers=answers,
              family="llama.cpp", tasks=[0, 5, 9])
    a_t, b_t, c_t = compute(run).cell("llama.np2.warm").turns
    assert b_t.outcome is Outcome.COLD and b_t.alive_at_start == () and any("slot 1" in n for n in b_t.notes)
    assert c_t.outcome is Outcome.RESTORED and c_t.divergence_point == 2531 and c_t.cached_tokens == 4562
    assert ns(c_t.alive_at_start) == [2000, 4044, 4556] and ns(c_t.alive_below_divergence) == [2000]
    assert ns(c_t.erased_cascade) == [4044, 4556] and c_t.cascade_missed == () and c_t.disagreements == ()


@pytest.mark.parametrize("kind,expected", [("warm", "s"), ("cold", None)])
def test_a_verdicts_json_without_conversations_reads_them_from_its_cells(kind, expected):
    """Written before turns carried `conversation`: a warm cell's turns belong to its (ordered)
    sequence, a cold turn to none."""
    data = {"schema_version": 3, "run_id": "r", "cells": [
        {"cell_id": "x", "kind": kind, "engine": "e", "configuration": "c", "sequence": "s", "status": "ok",
         "turns": [{"index": 0, "prompt_id": "A", "outcome": "cold"}]}]}
    assert RunVerdict.from_dict(data).cells[0].turns[0].conversation == expected
