"""The lifecycle replay from a parsed log alone, against real captures and the generator's truth."""

from __future__ import annotations

from pathlib import Path

import pytest
import repo_scripts

from shadowlab.logs import lifecycle, parse as logparse

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "logs"
make_prodlogs = repo_scripts.load("make_prodlogs")


def _requests(path: Path, family: str = "llama.cpp") -> list[lifecycle.Request]:
    return lifecycle.replay(logparse.parse(path, family).events)


def test_real_b11434_a_c_is_forced_with_every_checkpoint_above_the_divergence():
    reqs = _requests(FIX / "llama.cpp-b11434" / "A-C.cram0.log")
    assert [r.outcome for r in reqs] == ["cold", "forced"]
    c = reqs[1]
    assert (c.prompt_tokens, c.reused, c.processed) == (4947, 0, 4947)
    assert len(c.alive_before) == 2 and all(k.n_tokens > 2531 for k in c.alive_before)
    assert c.placement and len(c.erased_cascade) == 2


def test_real_b11434_a_b_a_restores_from_the_prompt_cache():
    reqs = _requests(FIX / "llama.cpp-b11434" / "A-B-A.cram8192.log")
    assert [r.outcome for r in reqs] == ["cold", "silent_reset", "restored"]
    a2 = reqs[2]
    assert a2.cache_loaded == 1 and a2.reused == 4556 and a2.processed == 4
    assert a2.restored.n_tokens == 4556 and a2.shared_source == "re_entry"  # LRU pick: no sim line for A


def test_real_ik_a_c_restores_2048_and_reports_the_re_entry_point():
    reqs = _requests(FIX / "ik_llama.cpp-0.1.5" / "A-C.cram0.log", "ik_llama.cpp")
    assert [r.outcome for r in reqs] == ["cold", "restored"]
    assert reqs[1].prompt_derived and reqs[1].prompt_tokens == 4947
    assert (reqs[1].reused, reqs[1].processed, reqs[1].shared_source) == (2048, 2899, "re_entry")


def test_shared_prefix_note_is_taken_only_for_the_prompt_it_names():
    ev = [logparse.NewPrompt(line=1, offset=10, slot=0, task=1, n_tokens=100),
          logparse.CacheTrim(line=2, offset=20, slot=0, task=1, n_past=0)]
    good = lifecycle.replay([lifecycle.SharedPrefix(0, 7, 100, offset=5)] + ev)
    stale = lifecycle.replay([lifecycle.SharedPrefix(0, 7, 99, offset=5)] + ev)
    assert (good[0].shared_prefix, good[0].shared_source) == (7, "lcp")
    assert (stale[0].shared_prefix, stale[0].shared_source) == (0, "re_entry")


def test_a_task_id_going_back_empties_every_ring():
    mk = lambda line, task, n: logparse.CheckpointCreated(line=line, offset=line, slot=0, task=task, pos_min=n - 1, pos_max=n - 1, n_tokens=n)
    r = lifecycle.Replay()
    out = r.feed_all([mk(1, 5, 10), mk(2, 9, 20), mk(3, 0, 30)])
    assert r.restarts == 1 and out[-1].alive_before == () and out[-1].outcome == "cold"


@pytest.mark.parametrize("fmt", ["b11434", "ik"])
def test_every_request_matches_the_generators_truth(tmp_path, fmt):
    truth = make_prodlogs.generate(tmp_path, fmt, seed=3, requests=160, slots=3, pieces=1)
    rows = truth["servers"][0]["requests"]
    family = "llama.cpp" if fmt == "b11434" else "ik_llama.cpp"
    parsed = logparse.parse(tmp_path / "server0.log", family)
    assert parsed.unknown_count == 0
    sims = []
    if fmt == "b11434":  # what logs.py hands on from the `checking sim` lines
        import re
        data = (tmp_path / "server0.log").read_bytes()
        for m in re.finditer(rb"(?m)^.*?id +(\d+) \| task -1 \| +- checking sim = [\d.]+ \((\d+)/(\d+)\)", data):
            sims.append(lifecycle.SharedPrefix(int(m[1]), int(m[2]), int(m[3]), offset=m.start()))
    events = sorted(sims + parsed.events, key=lambda e: e.offset)
    got = sorted(lifecycle.replay(events), key=lambda r: r.offset)  # closed when the slot moves on
    assert len(got) == len(rows)
    for r, t in zip(got, rows):
        assert (r.slot, r.task, r.prompt_tokens, r.reused, r.processed, r.outcome) == (
            t["slot"], t["task"], t["prompt_tokens"], t["reused"], t["processed"], t["outcome"]), t
        assert (r.shared_prefix, r.shared_source) == (t["shared_prefix"], t["shared_source"])
        assert [c.n_tokens for c in r.alive_before] == t["alive_before"]
        assert (len(r.created), len(r.erased_cascade)) == (t["created"], t["erased_invalidated"])
        assert (r.placement, r.retention, r.baseline_loss) == (t["placement"], t["retention"], t["baseline_loss"])


def _forced_after_check(n_swa):
    """A request forced after `checking checkpoint ... against 300`, with no sim line."""
    ck = dict(pos_min=999, pos_max=999, n_tokens=1000)
    return [
        logparse.NewPrompt(line=1, offset=1, slot=0, task=1, n_tokens=1000),
        logparse.CheckpointCreated(line=2, offset=2, slot=0, task=1, **ck),
        logparse.NewPrompt(line=3, offset=3, slot=0, task=2, n_tokens=2000),
        lifecycle.CheckpointCheck(0, 2, 300, offset=4),
        logparse.ForcedReprocessing(line=5, offset=5, slot=0, task=2),
        logparse.CheckpointErased(line=6, offset=6, slot=0, task=2, n_swa=n_swa, pos_next=0, **ck),
        logparse.CacheTrim(line=7, offset=7, slot=0, task=2, n_past=0),
    ]


def test_a_forced_request_shares_the_n_past_its_checkpoint_check_states_once_n_swa_is_0():
    forced = lifecycle.replay(_forced_after_check(0))[1]
    assert (forced.outcome, forced.shared_prefix, forced.shared_source) == ("forced", 300, "n_past")
    assert forced.baseline_loss  # 300 < 512, stated: counted
    unknown_swa = lifecycle.replay(_forced_after_check(None))[1]  # the line says n_past - n_swa
    assert (unknown_swa.shared_prefix, unknown_swa.shared_source) == (0, "re_entry")
    swa = lifecycle.replay(_forced_after_check(128))[1]
    assert swa.shared_source == "re_entry" and not swa.baseline_loss


def test_a_sim_line_is_stale_once_a_prompt_cache_entry_is_loaded():
    ev = [lifecycle.SharedPrefix(0, 0, 4560, offset=1),
          logparse.PromptCacheLoaded(line=2, offset=2, slot=None, task=None, n_tokens=4570),
          logparse.NewPrompt(line=3, offset=3, slot=0, task=7, n_tokens=4560),
          lifecycle.CheckpointCheck(0, 7, 4559, offset=4),
          logparse.CheckpointRestored(line=5, offset=5, slot=0, task=7, pos_min=4555, pos_max=4555,
                                      n_tokens=4556, n_past=4556)]
    r = lifecycle.Replay()
    r.n_swa = 0  # as an earlier erase line would have said
    got = r.feed_all(ev)[0]
    assert (got.shared_prefix, got.shared_source, got.reused) == (4559, "n_past", 4556)
    assert not got.baseline_loss


# ---------------------------------------------------------------- --cache-idle-slots (prompt_clear)

IDLE = FIX / "llama.cpp-b11434-idle-slots" / "np4-pinned-cram8192.head422.log"


def _idle_replay(text: bytes | None = None) -> tuple[lifecycle.Replay, list[lifecycle.Request]]:
    replay = lifecycle.Replay()
    source = IDLE if text is None else text.splitlines(keepends=True)
    return replay, replay.feed_all(logparse.parse(source, "llama.cpp").events)


def _kept_above_re_entry(reqs: list[lifecycle.Request]) -> list[tuple[int, int, int]]:
    """(slot, task, n_tokens) of every checkpoint the cascade check would call stale."""
    return [(r.slot, r.task, c.n_tokens) for r in reqs if r.outcome != "cold" and r.re_entry is not None
            for c in lifecycle.cascade_missed(r.alive_before, r.erased, r.re_entry)]


def test_real_b11434_idle_slot_clears_leave_the_slot_without_checkpoints():
    """llama-server saves each idle slot to the RAM cache and clears it when a task starts, with
    no erase line: slot 3's checkpoints of task 10 (831, 1343) are gone when task 41 re-enters
    slot 3 at 0, so none is stale; the saves go to the slots they were of."""
    replay, reqs = _idle_replay()
    t41 = next(r for r in reqs if r.task == 41)
    assert (t41.slot, t41.re_entry, t41.alive_before, t41.erased) == (3, 0, (), ())
    assert _kept_above_re_entry(reqs) == []
    assert replay.rings[0].alive == {}  # task 52's 1252 / 1764, cleared with its 1775 tokens at task 63
    assert sorted(replay.rings[0].saved) == [499, 1775] and sorted(replay.rings[0].saved[1775]) == [1252, 1764]
    assert sorted(replay.rings[3].saved) == [924, 1354] and sorted(replay.rings[3].saved[1354]) == [831, 1343]
    assert sorted(replay.rings[3].alive) == [945, 1457]  # task 63 runs on slot 3: never cleared after it
    # a clear is no request's erase, and every save is still counted, by the request it preceded
    assert not any(r.erased for r in reqs)
    assert sum(r.cache_saved for r in reqs) == IDLE.read_bytes().count(b"saving prompt with length") == 6


@pytest.mark.parametrize("edit", ["dropped", "another slot"])
def test_a_checkpoint_that_really_survives_the_re_entry_is_still_stale(edit):
    """The same log without slot 3's clears (1354 tokens at task 21, 0 tokens at task 31 and
    later), or with them naming slot 2: task 10's 831 and 1343 stay in slot 3 when task 41
    re-enters it at 0, which the cascade check must call stale."""
    lines = IDLE.read_bytes().splitlines(keepends=True)
    mine = [k for k, line in enumerate(lines) if b"id  3 | task -1 | clearing prompt with" in line]
    assert len(mine) >= 3
    for k in mine:
        lines[k] = b"" if edit == "dropped" else lines[k].replace(b"id  3 |", b"id  2 |")
    _, reqs = _idle_replay(b"".join(lines))
    stale = _kept_above_re_entry(reqs)
    assert {(3, 41, 831), (3, 41, 1343)} <= set(stale) and {s for s, _, _ in stale} == {3}


def test_verdicts_give_each_idle_slot_save_to_the_slot_the_replay_gives_it():
    """Replay.turns (a run's turns, for verdicts) and Replay streaming (a production log) apply the
    one rule, lifecycle.save_of_clear, each in its own order: they must agree on the real capture."""
    events = logparse.parse(IDLE, "llama.cpp").events
    replay, _ = _idle_replay()
    by_replay = {n: slot for slot, ring in replay.rings.items() for n in ring.saved}  # lengths differ here
    owners = lifecycle.save_owners(events)
    assert {events[i].n_tokens: slot for i, slot in owners.items()} == by_replay
    assert sorted(by_replay.items()) == [(305, 2), (371, 1), (499, 0), (924, 3), (1354, 3), (1775, 0)]
