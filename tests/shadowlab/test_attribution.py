"""shadowlab/judge/attribution.py on hand-written llama.cpp log lines: a turn is tied to the one task
whose lines state its figures, never guessed when two tasks state them or none does; claims of
a task id are checked like any figure; task-less lines go to the task launched next on their
slot; the schedule follows launch and release lines. (Live engines: test_traffic_concurrent.py
and tests/llama/test_traffic_concurrent_llama.py.)"""

from __future__ import annotations

from pathlib import Path

from shadowlab.judge import attribution
from shadowlab.logs import parse as logparse
from shadowlab.judge.attribution import Claim

LINES = [
    "slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1",
    "slot launch_slot_: id  1 | task 7 | processing task, is_child = 0",
    "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1",
    "slot launch_slot_: id  0 | task 8 | processing task, is_child = 0",
    "slot update_slots: id  0 | task 8 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 300",
    "slot update_slots: id  1 | task 7 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 500",
    "slot print_timing: id  0 | task 8 | prompt eval time =      40.25 ms /   300 tokens (    0.13 ms per token,  7453.42 tokens per second)",
    "slot      release: id  0 | task 8 | stop processing: n_tokens = 304, truncated = 0",
    "slot print_timing: id  1 | task 7 | prompt eval time =      61.10 ms /   500 tokens (    0.12 ms per token,  8183.31 tokens per second)",
    "slot      release: id  1 | task 7 | stop processing: n_tokens = 504, truncated = 0",
]


def _log(tmp_path: Path, lines=LINES) -> Path:
    path = tmp_path / "engine.log"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _tasks(path: Path):
    return attribution.tasks(logparse.parse(path, "llama.cpp").events)


def test_each_turn_is_tied_to_the_task_that_states_its_figures(tmp_path):
    by_task = _tasks(_log(tmp_path))
    claims = [Claim(0, 500, 500, 61.1012, slot=1), Claim(1, 300, 300, 40.2549)]
    tied = attribution.tie(claims, by_task)
    assert not tied.untied
    assert {i: t.task for i, t in tied.tasks.items()} == {0: 7, 1: 8}


def test_figures_that_no_task_states_are_not_guessed(tmp_path):
    by_task = _tasks(_log(tmp_path))
    off_by_a_hundredth = Claim(0, 500, 500, 61.11)
    wrong_slot = Claim(1, 300, 300, 40.25, slot=1)
    tied = attribution.tie([off_by_a_hundredth, wrong_slot], by_task)
    assert not tied.tasks
    assert "no task in engine.log states turn 0's figures (500 prompt tokens, 500 processed in 61.11 ms)" \
        == tied.untied[0]
    assert "slot 1" in tied.untied[1]


def test_a_claimed_task_id_is_checked_like_any_figure(tmp_path):
    by_task = _tasks(_log(tmp_path))
    assert attribution.tie([Claim(0, 300, 300, 40.25, task=8)], by_task).tasks[0].task == 8
    lie = attribution.tie([Claim(0, 300, 300, 40.25, task=7)], by_task)
    assert not lie.tasks and "claimed task 7" in lie.untied[0]


def test_two_tasks_stating_the_same_figures_leave_both_turns_untied(tmp_path):
    twin = [line.replace("task 7", "task 9").replace("61.10 ms /   500", "40.25 ms /   300")
            .replace("task.n_tokens = 500", "task.n_tokens = 300") for line in LINES]
    tied = attribution.tie([Claim(0, 300, 300, 40.25), Claim(1, 300, 300, 40.25)], _tasks(_log(tmp_path, twin)))
    assert not tied.tasks
    assert "2 tasks of engine.log (task 8, 9) state turn 0's figures" in tied.untied[0]


def test_a_tie_elsewhere_settles_an_ambiguity(tmp_path):
    """Turn 1 could be either task by its figures alone; turn 0's slot says which is its own."""
    twin = [line.replace("task 7", "task 9").replace("61.10 ms /   500", "40.25 ms /   300")
            .replace("task.n_tokens = 500", "task.n_tokens = 300") for line in LINES]
    tied = attribution.tie([Claim(0, 300, 300, 40.25, slot=1), Claim(1, 300, 300, 40.25)],
                           _tasks(_log(tmp_path, twin)))
    assert not tied.untied and {i: t.task for i, t in tied.tasks.items()} == {0: 9, 1: 8}


def test_a_task_that_never_finished_its_prefill_ties_nothing(tmp_path):
    cut = [line for line in LINES if "task 8 | prompt eval" not in line]
    tied = attribution.tie([Claim(0, 300, 300, 40.25)], _tasks(_log(tmp_path, cut)))
    assert 0 in tied.untied


def test_task_less_lines_belong_to_the_task_launched_next_on_their_slot(tmp_path):
    path = _log(tmp_path)
    events = list(logparse.parse(path, "llama.cpp").events)
    marks = attribution.markers(path)
    assert marks.launched == {7: len(LINES[0]) + 1, 8: sum(len(x) + 1 for x in LINES[:3])}
    assert marks.slots == {7: 1, 8: 0}
    assigned = attribution.assign(events, marks, {7: 0, 8: 1})
    selected = [(ev.slot, turn) for ev, turn in assigned if ev.kind == "slot_selected"]
    assert selected == [(1, 0), (0, 1)]  # the line on slot 1 is task 7's, on slot 0 task 8's


def test_the_schedule_follows_launch_and_release_lines(tmp_path):
    path = _log(tmp_path)
    tied = attribution.tie([Claim(0, 500, 500, 61.10), Claim(1, 300, 300, 40.25)], _tasks(path))
    assert attribution.schedule(tied.tasks, attribution.markers(path)) == [
        ("start", 0), ("start", 1), ("end", 1), ("end", 0)]


def test_spans_partition_the_log_by_the_order_tasks_finished(tmp_path):
    path = _log(tmp_path)
    tied = attribution.tie([Claim(0, 500, 500, 61.10), Claim(1, 300, 300, 40.25)], _tasks(path))
    ends = {t.task: t.last + 1 for t in tied.tasks.values()}
    spans = attribution.spans(tied.tasks, ends, 0)
    assert spans[1][0] == 0 and spans[1][1] == spans[0][0] and spans[0][1] > spans[1][1]


def test_processing_order_puts_turns_without_lines_last():
    assert attribution.processing_order({0: 50, 1: 10, 2: None}, [0, 1, 2]) == [1, 0, 2]
