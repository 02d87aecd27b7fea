"""logparse on real engine logs (reference-engine captures), on llama.cpp b11434 / older upstream /
ik_llama.cpp lines as the BRIEF and the server sources print them, and on hostile input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowlab.logs import parse as lp, reading

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REF = LOGS / "reference"
TRANSCRIBED = LOGS / "transcribed"
REAL_LLAMA = sorted((LOGS / "llama.cpp-b11434").glob("*.log")) if (LOGS / "llama.cpp-b11434").is_dir() else []


def kinds(parsed: lp.ParsedLog) -> list[str]:
    return [e.kind for e in parsed.events]


def by_task(parsed: lp.ParsedLog, task: int, kind: str) -> list[lp.Event]:
    return [e for e in parsed.events if e.task == task and e.kind == kind]


# ---------------------------------------------------------------- reference engine (real captures)


def test_reference_restore_and_cascade_match_the_engines_own_timings():
    parsed = lp.parse(REF / "policy0-A-C-B-C.log", "reference")
    answers = json.loads((REF / "policy0-A-C-B-C.json").read_text())
    assert parsed.unknown_count == 0
    # A under POLICY=0: -b boundaries 2048, 4096 and the tail L-4-512, L-4
    assert [e.n_tokens for e in by_task(parsed, 0, "created")] == [2048, 4044, 4096, 4556]
    (restored,) = by_task(parsed, 1, "restored")
    assert (restored.pos_max, restored.n_tokens, restored.n_past) == (2047, 2048, 2048)
    assert restored.took_ms is not None and restored.size_mib == pytest.approx(0.346)
    # the cascade erases everything above the re-entry point, each line names pos_next
    erased = by_task(parsed, 1, "erased_invalidated")
    assert [e.n_tokens for e in erased] == [4044, 4096, 4556]
    assert {e.pos_next for e in erased} == {2048}
    # log figures agree with the API's timings of the same run
    for task, answer in enumerate(answers):
        (trim,) = by_task(parsed, task, "cache_trim")
        (evaluated,) = by_task(parsed, task, "prompt_eval")
        assert trim.n_past == answer["timings"]["cache_n"]
        assert evaluated.n_tokens == answer["timings"]["prompt_n"]
    # B (zero overlap) erases all four of C's checkpoints without a forcing line
    assert len(by_task(parsed, 2, "erased_invalidated")) == 4 and not by_task(parsed, 2, "forced")


def test_reference_forced_line_when_no_checkpoint_is_below_the_divergence():
    parsed = lp.parse(REF / "defaults-A-C-append.log", "reference")
    assert [e.n_tokens for e in by_task(parsed, 0, "created")] == [4044, 4556]
    assert len(by_task(parsed, 1, "forced")) == 1
    assert by_task(parsed, 1, "cache_trim")[0].n_past == 0


def test_reference_stale_restore_fault_is_visible_in_the_restore_line():
    parsed = lp.parse(REF / "fault-stale-restore.log", "reference")
    (restored,) = parsed.of("restored")
    assert restored.n_past == restored.n_tokens + 1


def test_reference_skip_cascade_fault_logs_no_erase():
    parsed = lp.parse(REF / "fault-skip-cascade.log", "reference")
    assert parsed.counts.get("restored") == 1
    assert "erased_invalidated" not in parsed.counts


def test_reference_prompt_cache_lines():
    parsed = lp.parse(REF / "cram8192-A-B-A.log", "reference")
    saved = parsed.of("cache_saved")
    assert [(e.n_tokens, e.n_checkpoints) for e in saved] == [(4575, 2), (114, 1)]
    (loaded,) = parsed.of("cache_loaded")
    assert (loaded.n_tokens, loaded.n_checkpoints) == (4575, 2) and loaded.similarity == pytest.approx(1.0)
    assert parsed.unknown_count == 0


# ---------------------------------------------------------------- llama.cpp b11434 (BRIEF §3 lines)


def test_b11434_brief_example_line_exactly():
    line = ("0.03.375.876 I slot create_check: id  0 | task 0 | created context checkpoint 1 of 64 "
            "(pos_min = 4043, pos_max = 4043, n_tokens = 4044, size = 0.032 MiB)")
    (ev,) = lp.parse([line], "llama.cpp").events
    assert isinstance(ev, lp.CheckpointCreated)
    assert (ev.slot, ev.task, ev.index, ev.capacity) == (0, 0, 1, 64)
    assert (ev.pos_min, ev.pos_max, ev.n_tokens, ev.n_tokens_derived) == (4043, 4043, 4044, False)
    assert ev.size_mib == pytest.approx(0.032) and ev.took_ms is None


def test_b11434_forced_then_silent_sequence():
    parsed = lp.parse(TRANSCRIBED / "llama.cpp-b11434-A-C-B-C.log", "llama.cpp")
    assert parsed.unknown_count == 0
    assert by_task(parsed, 1, "forced") and not by_task(parsed, 2, "forced") and not by_task(parsed, 3, "forced")
    assert [e.pos_max for e in by_task(parsed, 1, "erased_invalidated")] == [4043, 4555]
    # several `cached n_tokens` lines per task (one per batch): the first one is the re-entry
    assert [e.n_past for e in by_task(parsed, 0, "cache_trim")] == [0, 4044, 4556]
    selected = parsed.of("slot_selected")
    assert [s.method for s in selected] == ["lru", "lcp", "lru", "lru"]
    assert selected[1].similarity == pytest.approx(0.512) and selected[1].f_keep == pytest.approx(0.555)
    assert selected[0].task is None  # `task -1`: chosen before the task owns the slot
    (new_prompt,) = by_task(parsed, 2, "new_prompt")
    assert (new_prompt.n_ctx_slot, new_prompt.n_keep, new_prompt.n_tokens) == (8192, 0, 99)
    assert [e.n_tokens for e in parsed.of("prompt_eval")] == [4560, 4947, 99, 4947]


def test_b11434_restore_and_erase_lines_with_every_field():
    lines = [
        "0.05.000.000 I slot   operator(): id  0 | task 2 | restored context checkpoint (pos_min = 2047, pos_max = 2047, "
        "n_tokens = 2048, n_past = 2048, size = 0.032 MiB)",
        "0.05.000.001 I slot   operator(): id  0 | task 2 | erased invalidated context checkpoint (pos_min = 4043, "
        "pos_max = 4043, n_tokens = 4044, n_swa = 0, pos_next = 2048, size = 0.032 MiB)",
        "0.05.000.002 W slot create_check: id  3 | task 9 | erasing old context checkpoint (pos_min = 10, pos_max = 10, "
        "n_tokens = 11, size = 0.032 MiB)",
        "0.05.000.003 I slot create_check: id  3 | task 9 | erasing context checkpoint too close to an earlier one "
        "(pos_min = 20, pos_max = 20, n_tokens = 21, size = 0.032 MiB)",
        "0.05.000.004 I slot create_check: id  3 | task 9 | superseding context checkpoint at n_tokens = 21",
    ]
    restored, erased, old, close, superseded = lp.parse(lines, "llama.cpp").events
    assert restored.n_past == 2048 and erased.pos_next == 2048 and erased.n_swa == 0
    assert isinstance(old, lp.CheckpointErasedOld) and old.slot == 3 and old.task == 9
    assert isinstance(close, lp.CheckpointErasedTooClose) and close.n_tokens == 21
    assert superseded.kind == "erased_superseded" and superseded.n_tokens == 21


@pytest.mark.skipif(not REAL_LLAMA, reason="no real llama-server capture under tests/fixtures/logs/llama.cpp-b11434/")
@pytest.mark.parametrize("path", REAL_LLAMA, ids=lambda p: p.name)
def test_real_llama_server_captures_parse_without_unknown_checkpoint_lines(path):
    parsed = lp.parse(path, "llama.cpp")
    text = path.read_bytes().decode("utf-8", "replace")
    assert parsed.counts.get("created", 0) == text.count("created context checkpoint")
    assert parsed.counts.get("prompt_eval", 0) == text.count("prompt eval time") - text.count("perf_context_print")
    assert parsed.unknown_count == 0, parsed.unknown_samples


# ---------------------------------------------------------------- llama-server b11434 (real captures)

LLAMA = LOGS / "llama-server"


def test_real_llama_server_forced_then_silent():
    parsed = lp.parse(LLAMA / "cram0-A-C-B-C.log", "llama.cpp")
    answers = json.loads((LLAMA / "cram0-A-C-B-C.json").read_text())
    assert parsed.unknown_count == 0, parsed.unknown_samples
    tasks = [e.task for e in parsed.of("new_prompt")]
    assert len(tasks) == 4 and tasks[0] == 0  # task ids are not 0, 1, 2, 3: internal tasks count too
    assert [e.n_tokens for e in by_task(parsed, tasks[0], "created")] == [4044, 4556]
    assert by_task(parsed, tasks[1], "forced") and not by_task(parsed, tasks[2], "forced")
    assert [e.n_tokens for e in by_task(parsed, tasks[1], "erased_invalidated")] == [4044, 4556]
    assert {e.pos_next for e in parsed.of("erased_invalidated")} == {0}
    for task, answer in zip(tasks, answers):
        assert by_task(parsed, task, "cache_trim")[0].n_past == answer["timings"]["cache_n"]
        (evaluated,) = by_task(parsed, task, "prompt_eval")
        assert evaluated.n_tokens == answer["timings"]["prompt_n"]
    assert [s.method for s in parsed.of("slot_selected")] == ["lru", "lcp", "lru", "lru"]


def test_real_llama_server_prompt_cache_save_load_restore():
    parsed = lp.parse(LLAMA / "cram8192-A-B-A.log", "llama.cpp")
    assert parsed.unknown_count == 0, parsed.unknown_samples
    saved = parsed.of("cache_saved")
    assert [e.n_tokens for e in saved] == [4567, 106] and saved[0].size_mib == pytest.approx(2.446)
    (loaded,) = parsed.of("cache_loaded")
    assert loaded.n_tokens == 4567 and loaded.f_keep == pytest.approx(0.998)  # named by the candidate line
    (restored,) = parsed.of("restored")
    assert (restored.n_tokens, restored.n_past) == (4556, 4556)
    (superseded,) = parsed.of("erased_superseded")
    assert superseded.n_tokens == 4556 and superseded.task == restored.task


IDLE_SLOTS = LOGS / "llama.cpp-b11434-idle-slots" / "np4-pinned-cram8192.head422.log"


@pytest.mark.parametrize("path", ["fast", "tolerant"])
def test_real_llama_server_idle_slot_clears_are_events(path, monkeypatch):
    """`--cache-idle-slots`: `prompt_clear: id S | task -1 | clearing prompt with N tokens` (no
    trigger word before this event: the line was neither read nor counted unknown)."""
    if path == "tolerant":
        _tolerant_only(monkeypatch)
    parsed = lp.parse(IDLE_SLOTS, "llama.cpp")
    assert parsed.unknown_count == 0, parsed.unknown_samples
    cleared = parsed.of("prompt_cleared")
    assert len(cleared) == IDLE_SLOTS.read_bytes().count(b"clearing prompt with") == 21
    assert all(isinstance(e, lp.PromptCleared) and e.task is None for e in cleared)
    assert [(e.slot, e.n_tokens) for e in cleared if e.n_tokens] == [
        (0, 499), (3, 1354), (1, 371), (2, 305), (3, 924), (0, 1775)]


@pytest.mark.parametrize("line", [
    "0.00.400.884 I slot prompt_clear: id  0 | task -1 | clearing prompt with 49x9 tokens",
    "0.00.400.884 I slot prompt_clear: id  0 | task -1 | clearing prompt with tokens",
    "0.00.400.884 I slot prompt_clear: id  0 | task -1 | clearing prompt with 499",
])
def test_a_broken_clearing_count_is_unknown_not_a_clear(line, monkeypatch):
    for tolerant in (False, True):
        if tolerant:
            _tolerant_only(monkeypatch)
        parsed = lp.parse([line], "llama.cpp")
        assert (parsed.events, parsed.unknown_count) == ([], 1), tolerant


REAL_EXPECTED = LOGS / "llama.cpp-b11434" / "expected.json"
REAL_CASES = sorted(json.loads(REAL_EXPECTED.read_text()).items()) if REAL_EXPECTED.exists() else []


@pytest.mark.skipif(not REAL_CASES, reason="no tests/fixtures/logs/llama.cpp-b11434/expected.json")
@pytest.mark.parametrize("name,expected", REAL_CASES, ids=[n for n, _ in REAL_CASES])
def test_real_llama_server_reuse_per_turn_equals_the_api(name, expected):
    """The llama-server work's captures (one warm cell's engine.log each) with the API figures
    its meta.json recorded: the log alone must give the same reuse and prefill per turn."""
    parsed = lp.parse(LOGS / "llama.cpp-b11434" / name, "llama.cpp")
    assert parsed.unknown_count == 0, parsed.unknown_samples
    for turn in expected["turns"]:
        tasks = set(turn["task_ids"])
        trims = [e for e in parsed.of("cache_trim") if e.task in tasks]
        evals = [e for e in parsed.of("prompt_eval") if e.task in tasks]
        restored = [e for e in parsed.of("restored") if e.task in tasks]
        assert trims[0].n_past == turn["timings_cache_n"], turn
        assert evals[-1].n_tokens == turn["timings_prompt_n"], turn
        if restored:
            assert restored[0].n_past == turn["timings_cache_n"]


# ---------------------------------------------------------------- older upstream and ik_llama.cpp


def test_legacy_lines_with_fewer_fields():
    parsed = lp.parse(TRANSCRIBED / "llama.cpp-legacy-A-C.log", "llama.cpp-legacy")
    assert parsed.unknown_count == 0
    created = parsed.of("created")
    assert all(c.n_tokens_derived and c.n_tokens == c.pos_max + 1 for c in created)
    (restored,) = parsed.of("restored")
    assert restored.n_past is None and restored.n_tokens == 2048
    (erased,) = parsed.of("erased_invalidated")
    assert erased.pos_next is None and erased.n_swa == 0
    assert [e.n_past for e in parsed.of("cache_trim")] == [0, 2048]  # `n_past = N, memory_seq_rm`
    assert [e.n_tokens for e in parsed.of("new_prompt")] == [4560, 4947]  # `n_prompt_tokens`
    assert parsed.of("slot_selected")[1].method == "lcs"
    # multi-line print_timing: the timings line takes the slot/task of its header line;
    # llama_perf_context_print's process total is not a turn
    assert [(e.task, e.n_tokens) for e in parsed.of("prompt_eval")] == [(0, 4560), (5, 2899)]


def test_ik_lines_took_before_fields_and_interleaved_stdout():
    parsed = lp.parse(TRANSCRIBED / "ik_llama.cpp-A-C.log", "ik_llama.cpp")
    (restored,) = parsed.of("restored")
    assert restored.took_ms == pytest.approx(0.21) and restored.task == 21
    assert restored.n_tokens == 2048 and restored.n_tokens_derived
    first = parsed.of("created")[0]
    assert (first.task, first.took_ms, first.n_tokens) == (1, pytest.approx(0.12), 2048)
    # an INFO line between the print_timing header and the timings does not steal them
    assert [(e.task, e.n_tokens) for e in parsed.of("prompt_eval")] == [(1, 4560), (21, 2899), (30, 99)]
    # stdout `kv cache rm [p0, end) | ... id_task=21 p0=2048`
    (trim,) = parsed.of("cache_trim")
    assert (trim.slot, trim.task, trim.n_past) == (0, 21, 2048)
    assert [e.task for e in parsed.of("forced")] == [30]
    assert [e.kind for e in by_task(parsed, 30, "erased_old")] == ["erased_old"]


def test_ik_prompt_dumps_are_never_events():
    """`cache :` / `prompt:` dumps hold engine text with control bytes, newlines and even the
    event phrases; they must not become events, and are reported as unknown lines."""
    parsed = lp.parse(TRANSCRIBED / "ik_llama.cpp-A-C.log", "ik_llama.cpp")
    assert all(e.pos_min != 1 for e in parsed.of("created"))  # the phrase inside `cache :`
    assert [e.task for e in parsed.of("forced")] == [30]  # the phrase inside `prompt:`
    assert parsed.unknown_count == 2
    assert any("cache :" in text for _, text in parsed.unknown_samples)


# ---------------------------------------------------------------- hostile input


def test_unknown_lines_are_counted_with_samples_not_fatal():
    lines = [f"slot update_slots: id  0 | task {i} | restored context checkpoint in a new fork format {i}" for i in range(9)]
    lines.append("slot update_slots: id  0 | task 9 | cached n_tokens = 5, memory_seq_rm [5, end)")
    parsed = lp.parse(lines, "llama.cpp")
    assert parsed.unknown_count == 9
    assert len(parsed.unknown_samples) == lp.MAX_SAMPLES
    assert parsed.unknown_samples[0][0] == 1 and "new fork format 0" in parsed.unknown_samples[0][1]
    assert kinds(parsed) == ["cache_trim"]


def test_truncated_lines_are_unknown_not_wrong():
    lines = [
        "slot create_check: id  0 | task 1 | created context checkpoint 1 of 64 (pos_min = 2047, pos_m",
        "slot print_timing: id  0 | task 1 | prompt eval time =    12.",
        "slot create_check: id  0 | task 1 | created context checkpoint 2 of 64 (pos_min = 9, pos_max = 9, n_tokens = 10, size = 0.1 MiB)",
    ]
    parsed = lp.parse(lines, "llama.cpp")
    assert [(e.kind, e.n_tokens) for e in parsed.events] == [("created", 10)]
    assert parsed.unknown_count == 2


def test_control_bytes_nul_cr_and_invalid_utf8(tmp_path):
    data = (
        b"\x00\x00garbage \xff\xfe\x80 bytes\r\n"
        b"0.01.000.000 I slot create_check: id  0 | task 4 | created context checkpoint 1 of 64 "
        b"(pos_min = 7, pos_max = 7, n_tokens = 8, size = 0.1 MiB)\r\n"
        b"\x1b[34m0.01.000.001\x1b[0m \x1b[32mI \x1b[0mslot   operator(): id  0 | task 4 | cached n_tokens = 8, memory_seq_rm [8, end)\r\n"
        b"slot create_check: id  0 | task 4 | created \x00context checkpoint 2 of 64 (pos_min = 9, pos_max = 9, n_tokens = 10, size = 0.1 MiB)\n"
        b"\xc3\x28 slot x: id  0 | task 4 | restored context checkpoint (pos_min = 7, pos_max = 7, n_tokens = 8, n_past = 8, size = 0.1 MiB)\n"
    )
    path = tmp_path / "engine.log"
    path.write_bytes(data)
    parsed = lp.parse(path, "llama.cpp")
    assert [(e.kind, e.line) for e in parsed.events] == [
        ("created", 2), ("cache_trim", 3), ("created", 4), ("restored", 5)
    ]
    assert parsed.events[2].n_tokens == 10  # the NUL inside the phrase is dropped
    assert parsed.lines == 5


def test_two_lines_interleaved_into_one_yield_both_events():
    line = (
        "0.01.0 I slot create_check: id  0 | task 3 | created context checkpoint 1 of 64 (pos_min = 1, pos_max = 1, "
        "n_tokens = 2, size = 0.1 MiB)0.01.1 I slot update_slots: id  1 | task 7 | cached n_tokens = 0, memory_seq_rm [0, end)"
    )
    created, trim = lp.parse([line], "llama.cpp").events
    assert (created.task, created.n_tokens) == (3, 2)
    assert (trim.slot, trim.task, trim.n_past) == (1, 7, 0)


def test_slot_prefix_split_across_lines():
    lines = [
        "0.02.0 I slot create_check: id  0 | ta",
        "sk 3 | created context checkpoint 2 of 64 (pos_min = 5, pos_max = 5, n_tokens = 6, size = 0.1 MiB)",
    ]
    (ev,) = lp.parse(lines, "llama.cpp").events
    assert ev.n_tokens == 6 and ev.task is None and ev.line == 2


def test_ten_megabyte_line_is_survived_and_offsets_stay_exact(tmp_path):
    head = b"0.00.1 I slot create_check: id  0 | task 1 | created context checkpoint 1 of 64 (pos_min = 1, pos_max = 1, n_tokens = 2, size = 0.1 MiB)\n"
    big = b"cache : " + b"x" * (10 << 20) + b" created context checkpoint 5 of 5 (pos_min = 3, pos_max = 3)\n"
    tail = b"0.00.2 I slot update_slots: id  0 | task 2 | cached n_tokens = 4, memory_seq_rm [4, end)\n"
    path = tmp_path / "big.log"
    path.write_bytes(head + big + tail)
    parsed = lp.parse(path, "llama.cpp")
    assert kinds(parsed) == ["created", "cache_trim"]
    assert parsed.events[1].offset == len(head) + len(big)
    assert parsed.events[1].line == 3
    assert parsed.overlong_lines == 1
    assert parsed.bytes == len(head + big + tail) and parsed.lines == 3


def test_offsets_are_byte_offsets_of_line_starts(tmp_path):
    path = tmp_path / "engine.log"
    lines = [
        "héllo wörld (not an event)\n",
        "slot a: id  0 | task 1 | cached n_tokens = 3, memory_seq_rm [3, end)\n",
        "x\n",
        "slot a: id  0 | task 1 | prompt eval time =      1.00 ms /     3 tokens (    0.33 ms per token,  3000.00 tokens per second)\n",
    ]
    raw = "".join(lines).encode()
    path.write_bytes(raw)
    trim, ev = lp.parse(path, "llama.cpp").events
    assert raw[trim.offset:].startswith(b"slot a: id  0 | task 1 | cached")
    assert raw[ev.offset:].startswith(b"slot a: id  0 | task 1 | prompt eval")
    # the same events from an iterable of lines, and from a path split into tiny blocks
    assert [e.offset for e in lp.parse(lines, "llama.cpp").events] == [trim.offset, ev.offset]


def test_block_boundaries_do_not_change_the_result(monkeypatch):
    path = REF / "policy0-A-C-B-C.log"
    whole = lp.parse(path, "reference").events
    monkeypatch.setattr(lp, "BLOCK_SIZE", 97)  # split lines everywhere
    assert lp.parse(path, "reference").events == whole


def test_memory_stays_bounded_by_the_block_size_not_the_file(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(lp, "BLOCK_SIZE", 1 << 20)
    path = tmp_path / "long.log"
    event = b"0.1 I slot update_slots: id  0 | task 1 | cached n_tokens = 5, memory_seq_rm [5, end)\n"
    filler = b"0.1 I srv  log_server_r: done request: POST /completion 127.0.0.1 200\n" * 2000
    with open(path, "wb") as fh:
        for _ in range(150):  # ~21 MB
            fh.write(filler + event)
    tracemalloc.start()
    n = sum(1 for _ in lp.iter_events(path, "llama.cpp"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == 150
    assert path.stat().st_size > 20 << 20
    assert peak < 5 << 20, f"peak {peak} bytes while streaming a {path.stat().st_size}-byte file"


def test_family_none_and_unknown_family():
    assert lp.parse(REF / "policy0-A-C-B-C.log", "none").events == []
    with pytest.raises(ValueError):
        lp.parse([], "vllm")


def test_extra_pattern_for_another_fork():
    pattern = lp.ExtraPattern.from_regex(
        r"(?P<restored>)ckpt-restore slot=(?P<slot>\d+) task=(?P<task>\d+) range=(?P<pos_min>\d+)\.\.(?P<pos_max>\d+) reentry=(?P<n_past>\d+)"
    )
    lines = ["[fork] ckpt-restore slot=1 task=44 range=100..199 reentry=200", "[fork] ckpt-restore garbled"]
    parsed = lp.parse(lines, "llama.cpp", [pattern])
    (ev,) = parsed.events
    assert isinstance(ev, lp.CheckpointRestored)
    assert (ev.slot, ev.task, ev.pos_min, ev.pos_max, ev.n_tokens, ev.n_past) == (1, 44, 100, 199, 200, 200)
    with pytest.raises(ValueError):
        lp.ExtraPattern.from_regex(r"no kind group (?P<pos_max>\d+)")
    # a matrix's `log_patterns` entries are plain strings
    assert lp.parse(lines, "llama.cpp", [pattern.regex]).events == parsed.events


# ---------------------------------------------------------------- fast path = tolerant path


def _tolerant_only(monkeypatch):
    """Route every candidate line through the tolerant rules (no whole-line regexes, no
    `_fast_line`, no C accelerator)."""
    monkeypatch.setattr(reading, "_logscan", None)
    monkeypatch.setattr(lp, "_FAST_BY_WORD", tuple((None, None) for _ in lp._FAST_BY_WORD))
    monkeypatch.setattr(lp, "_fast_line", lambda raw, line_no, offset: None)


ALL_LOGS = sorted(LOGS.glob("*/*.log"))


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fast_path_gives_the_tolerant_paths_events_line_by_line(path, monkeypatch):
    """The fast path reads the frequent b11434 / reference lines whole without decoding them;
    for every line of every fixture it must give what the tolerant rules give."""
    family = ("reference" if path.parent.name == "reference"
              else "ik_llama.cpp" if "ik_" in path.parent.name + path.name else "llama.cpp")
    fast = lp.parse(path, family)
    with monkeypatch.context() as m:
        _tolerant_only(m)
        slow = lp.parse(path, family)
    assert fast.events == slow.events
    # (ignored_count may differ: the tolerant rules count a benign `checking checkpoint` trace
    # as understood, the fast path as ignored)
    assert (fast.unknown_count, fast.counts) == (slow.unknown_count, slow.counts)


@pytest.mark.parametrize("accelerated", [True, False], ids=["C", "python"])
def test_fast_path_lines_from_a_prompt_cache_run_are_read_fast(monkeypatch, accelerated):
    """The b11434 lines of a -cram run reach the tolerant path only for start-up messages and,
    without the C accelerator, `found better prompt` (the Python fast path leaves it to the
    tolerant rules, which look for the candidate lines before it)."""
    if accelerated and not lp.accelerated():
        pytest.skip("the C accelerator is not built here (tests/shadowlab/test_logscan.py fails in CI)")
    if not accelerated:
        monkeypatch.setattr(reading, "_logscan", None)
    seen = []
    original = lp._Scanner._line

    def spy(self, raw, *args):
        seen.append(raw)
        return original(self, raw, *args)

    monkeypatch.setattr(lp._Scanner, "_line", spy)
    parsed = lp.parse(LOGS / "llama.cpp-b11434" / "A-B-A.cram8192.log", "llama.cpp")
    start_up = (b"load_model", b"init:", b"model loaded")  # once per start: the tolerant rules read them
    requests = [raw for raw in seen if not any(w in raw for w in start_up)]
    if accelerated:
        assert requests == []
        assert parsed.counts["cache_loaded"] > 0
    else:
        assert requests and all(b"found better prompt" in raw for raw in requests), requests
    assert parsed.unknown_count == 0


def test_a_number_too_long_for_int_is_an_unknown_line_not_a_crash():
    digits = "9" * 5000
    lines = [
        f"0.01.000.000 I slot create_check: id  0 | task 4 | created context checkpoint 1 of 64 "
        f"(pos_min = {digits}, pos_max = 7, n_tokens = 8, size = 0.1 MiB)",
        f"0.01.000.001 I slot get_availabl: id  0 | task -1 | superseding context checkpoint at n_tokens = {digits}",
        "0.01.000.002 I slot update_slots: id  0 | task 4 | cached n_tokens = 8, memory_seq_rm [8, end)",
    ]
    parsed = lp.parse(lines, "llama.cpp")
    assert kinds(parsed) == ["cache_trim"] and parsed.unknown_count == 2


@pytest.mark.parametrize("reader", ["c", "python"])
def test_a_number_no_engine_prints_is_not_believed(reader, monkeypatch):
    """A number of 10**MAX_DIGITS or more (a token count, position, slot or task id, MiB or ms
    past anything an engine holds; `9` * 400 reads as an inf float) makes its line not
    understood on both readers; one digit less is read, and so are leading zeros."""
    from shadowlab.logs import accel

    if reader == "python":
        monkeypatch.setattr(reading, "_logscan", None)
    big, most = "1" + "0" * accel.MAX_DIGITS, "9" * accel.MAX_DIGITS
    head = "0.01.000.000 I slot update_slots: id  0 | task 4 | "
    lines = [
        f"{head}created context checkpoint 1 of 64 (pos_min = 7, pos_max = {big}, n_tokens = 8, size = 0.1 MiB)",
        f"{head}new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = {big}",
        f"{head}cached n_tokens = {big}, memory_seq_rm [8, end)",
        f"0.01.000.000 I slot update_slots: id  {big} | task 4 | cached n_tokens = 8, memory_seq_rm [8, end)",
        f"0.01.000.000 I slot update_slots: id  0 | task {big} | forcing full prompt re-processing due to lack of cache data",
        f"{head}restored context checkpoint (pos_min = 0, pos_max = 7, n_tokens = 8, n_past = 8, size = 0.{big} MiB)",
        f"{head}cached n_tokens = {most}, memory_seq_rm [{most}, end)",
        f"{head}prompt eval time = 5.00 ms / {'0' * 30}7 tokens (    0.71 ms per token,  1400.00 tokens per second)",
        f"{head}created context checkpoint 1 of 64 (pos_min = 7, pos_max = 7, n_tokens = 8, size = {'9' * 400}.0 MiB)",
        f"{head}prompt eval time = {big}.5 ms / 7 tokens (    0.71 ms per token,  1400.00 tokens per second)",
        f"{head}prompt eval time = {most[1:]}.5 ms / 7 tokens (    0.71 ms per token,  1400.00 tokens per second)",
    ]
    parsed = lp.parse(lines, "llama.cpp")
    assert parsed.unknown_count == 7, parsed.unknown_samples
    assert [(e.kind, e.line) for e in parsed.events] == [
        ("restored", 6), ("cache_trim", 7), ("prompt_eval", 8), ("prompt_eval", 11)]
    assert parsed.events[1].n_past == int(most) and parsed.events[2].n_tokens == 7
    assert parsed.events[3].ms == float(most[1:] + ".5")


# ---------------------------------------------------------------- events: a frozen record's API


def test_events_keep_the_frozen_keyword_only_record_api():
    import copy
    import dataclasses
    import pickle

    ev = lp.CheckpointCreated(line=1, offset=0, slot=0, task=2, pos_min=3, pos_max=3, n_tokens=4, size_mib=0.5, index=1)
    assert (ev.kind, ev.capacity, ev.n_tokens_derived, ev.took_ms) == ("created", None, False, None)
    assert ev.to_dict() == {
        "kind": "created", "line": 1, "offset": 0, "slot": 0, "task": 2, "pos_min": 3, "pos_max": 3, "n_tokens": 4,
        "n_tokens_derived": False, "size_mib": 0.5, "took_ms": None, "index": 1, "capacity": None,
    }
    assert repr(ev).startswith("CheckpointCreated(line=1, offset=0, slot=0, task=2, pos_min=3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.n_tokens = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        lp.CacheTrim(line=1, offset=0)  # n_past is required
    with pytest.raises(TypeError):
        lp.CacheTrim(1, 0, n_past=3)  # keyword-only
    with pytest.raises(TypeError):
        _ = ev < ev  # no order
    same = lp.CheckpointCreated(**{k: v for k, v in ev.to_dict().items() if k != "kind"})
    assert ev == same and hash(ev) == hash(same) and not ev != same
    assert ev != tuple(ev) and tuple(ev) != ev  # equal only to an event of the same kind
    old = lp.CheckpointErasedOld(line=1, offset=0, pos_min=3, pos_max=3, n_tokens=4)
    close = lp.CheckpointErasedTooClose(line=1, offset=0, pos_min=3, pos_max=3, n_tokens=4)
    assert old != close and isinstance(old, lp.CheckpointEvent) and isinstance(close, lp.Event)
    assert pickle.loads(pickle.dumps(ev)) == ev and copy.deepcopy(ev) == ev
    assert {ev, same} == {ev}


# ---------------------------------------------------------------- cut lines, broken values, hostile lines


def test_a_last_line_without_its_newline_is_cut_never_read(tmp_path):
    line = b"slot a: id  0 | task 1 | created context checkpoint 1 of 64 (pos_min = 9, pos_max = 9, n_tokens = 10, size = 0.1 MiB)"
    path = tmp_path / "engine.log"
    path.write_bytes(line + b"\n" + line)  # even a last line that looks complete may have been cut
    parsed = lp.parse(path, "llama.cpp")
    assert [e.line for e in parsed.events] == [1]
    assert (parsed.unknown_count, parsed.cut_lines, parsed.lines, parsed.bytes) == (1, 1, 2, 2 * len(line) + 1)
    path.write_bytes(line + b"\n" + b"0.01 I srv  update: all slots are idle")  # no trigger word: not unknown
    parsed = lp.parse(path, "llama.cpp")
    assert (len(parsed.events), parsed.unknown_count, parsed.cut_lines, parsed.lines) == (1, 0, 0, 2)
    # an iterable's items are whole lines, with or without their newline
    assert len(lp.parse([line, line], "llama.cpp").events) == 2


def test_an_overlong_line_is_cut_at_the_cap_never_read(tmp_path, monkeypatch):
    monkeypatch.setattr(lp, "MAX_LINE", 4096)
    trim = b"0.1 I slot update_slots: id  0 | task 1 | cached n_tokens = 5, memory_seq_rm [5, end)"
    cut = b"0.1 I slot x: id  0 | task 1 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 45"
    cut = cut + b"6" * (4096 - len(cut)) + b"0" * 10  # the cap falls inside the number
    path = tmp_path / "engine.log"
    for block in (1 << 20, 1000):  # the line within one block, and across blocks
        monkeypatch.setattr(lp, "BLOCK_SIZE", block)
        path.write_bytes(trim + b"\n" + cut + b"\n" + trim + b"\n")
        parsed = lp.parse(path, "llama.cpp")
        assert [e.kind for e in parsed.events] == ["cache_trim", "cache_trim"], block
        assert (parsed.overlong_lines, parsed.cut_lines, parsed.unknown_count) == (1, 1, 1), block


@pytest.mark.parametrize("value, read", [
    ("4560,", 4560), ("4560)", 4560), ("4560 ", 4560), ("4560", 4560),
    ("456<junk>0,", None), ("4560x,", None), ("45.6.0,", None), ("4560\N{REPLACEMENT CHARACTER}", None),
])
def test_a_value_is_read_only_when_its_delimiter_follows(value, read):
    line = f"slot x: id  0 | task 1 | superseding context checkpoint at n_tokens = {value}"
    parsed = lp.parse([line], "llama.cpp")
    assert [e.n_tokens for e in parsed.events] == ([] if read is None else [read])
    assert parsed.unknown_count == (1 if read is None else 0)


def test_info_lines_read_as_the_old_backtracking_regex_read_them():
    """`_segments` reads `INFO [ f] message | k=v` lines without the old regex (quadratic on
    runs of spaces); on every fixture INFO line and on odd spacing it finds what that regex found."""
    import re

    old_line = re.compile(r"\s*(?:INFO|VERB|WARN|ERR|ERROR|DEBUG)\s*\[[^\]]*\]\s*(.*?)(?:\s\|\s(.*))?\s*$")
    old_kv = re.compile(r"(\w+)=(-?\d+)\b")
    lines = {line.decode("utf-8", "replace") for path in ALL_LOGS for line in path.read_bytes().splitlines()
             if line.lstrip().startswith((b"INFO", b"WARN", b"ERR", b"VERB", b"DEBUG"))}
    assert len(lines) > 100
    lines |= {"INFO [x]   kv cache rm [p0, end)   ", "INFO [x] msg  |  | id_slot=1 id_task=2 p0=3  ",
              "INFO [x] | id_slot=1", "INFO [x] a |b | id_slot=1", "WARN [x]msg\t|\tp0=7"}
    for text in lines:
        m = old_line.match(text)
        (slot, task, message, _), = lp._segments(text)
        kv = dict(old_kv.findall(m.group(2) or ""))
        want = m.group(1).replace("[p0, end)", f"[{kv['p0']}, end)") if "p0" in kv else m.group(1)
        assert (message, slot, task) == (want, int(kv["id_slot"]) if "id_slot" in kv else None,
                                         int(kv["id_task"]) if "id_task" in kv and int(kv["id_task"]) >= 0 else None), text


def test_matrix_patterns_see_the_first_characters_of_a_line_only():
    pattern = r"(?P<restored>)ckpt (?P<pos_min>\d+)-(?P<pos_max>\d+)"
    near, far = "ckpt 1-2 " + "x" * 100, "x" * lp.EXTRA_PATTERN_CHARS + " ckpt 1-2"
    parsed = lp.parse([near, far], "llama.cpp", [pattern])
    assert [e.line for e in parsed.events] == [1] and parsed.unknown_count == 1  # the far one: not matched


def test_a_binary_stream_read_in_tiny_pieces_gives_the_files_events():
    import io

    class Trickle(io.RawIOBase):  # a pipe: each read returns what the writer wrote, here 7 bytes
        def __init__(self, data: bytes) -> None:
            self.data, self.pos = data, 0

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            n = min(7, len(self.data) - self.pos, len(b))
            b[:n] = self.data[self.pos : self.pos + n]
            self.pos += n
            return n

    path = REF / "policy0-A-C-B-C.log"
    whole = lp.parse(path, "reference")
    trickled = lp.parse(Trickle(path.read_bytes()), "reference")
    assert (trickled.events, trickled.lines, trickled.bytes) == (whole.events, whole.lines, whole.bytes)
    assert len(whole.events) > 20
