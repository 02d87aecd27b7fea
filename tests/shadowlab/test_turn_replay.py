"""lifecycle.Replay.turns: the checkpoint rings of a run directory's cell, replayed turn by turn
(the one replay verdicts use; tests/shadowlab/test_stored_verdicts.py holds it to every stored
run's verdicts). Events are built as the parser makes them (logparse's event classes)."""

from __future__ import annotations

from shadowlab.logs import lifecycle
from shadowlab.logs import parse as lp


def created(offset: int, task: int, n: int, slot: int = 0) -> lp.CheckpointCreated:
    return lp.CheckpointCreated(line=offset, offset=offset, slot=slot, task=task, pos_min=n - 1, pos_max=n - 1,
                                n_tokens=n)


def erased(offset: int, task: int, n: int, slot: int = 0) -> lp.CheckpointErased:
    return lp.CheckpointErased(line=offset, offset=offset, slot=slot, task=task, pos_min=n - 1, pos_max=n - 1,
                               n_tokens=n)


def test_alive_and_erased_carry_the_turn_that_created_each_checkpoint():
    assigned = [(created(10, 1, 100), 0), (created(11, 1, 200), 0),
                (lp.NewPrompt(line=20, offset=20, slot=0, task=2, n_tokens=150), 1),
                (erased(21, 2, 200), 1), (created(22, 2, 148), 1)]
    first, second = lifecycle.Replay.turns(assigned, [0, 1], {0: 10, 1: 20})
    assert first.alive == () and [c.n_tokens for c, _ in first.alive] == []
    assert [(c.n_tokens, turn) for c, turn in second.alive] == [(100, 0), (200, 0)]
    assert [(kind, c.n_tokens, turn) for kind, c, turn in second.erased] == [("erased_invalidated", 200, 0)]
    assert [step.event.offset for step in first.applied] == [10, 11]  # each event once, in its own turn
    assert [step.event.offset for step in second.applied] == [20, 21, 22]


def test_turns_are_replayed_in_the_order_served_not_the_order_sent():
    # turn 1 was served first (concurrent requests): its checkpoint is alive when turn 0 starts
    assigned = [(created(10, 7, 64), 1), (lp.NewPrompt(line=20, offset=20, slot=0, task=8, n_tokens=99), 0)]
    by_index = {s.index: s for s in lifecycle.Replay.turns(assigned, [1, 0], {0: 20, 1: 10})}
    assert [(c.n_tokens, turn) for c, turn in by_index[0].alive] == [(64, 1)]
    assert by_index[1].alive == ()


def test_a_save_that_a_clear_names_goes_to_the_cleared_slot():
    """--cache-idle-slots: slot 1 is saved (a `srv` line naming no slot) then cleared, at the
    start of a task on slot 0. The save is slot 1's content, and slot 0 keeps its checkpoints."""
    assigned = [(created(10, 1, 100, slot=0), 0), (created(11, 2, 300, slot=1), 1),
                (lp.PromptCacheSaved(line=20, offset=20, slot=None, task=None, n_tokens=300), None),
                (lp.PromptCleared(line=21, offset=21, slot=1, task=None, n_tokens=300), None),
                (lp.NewPrompt(line=22, offset=22, slot=0, task=3, n_tokens=120), 2)]
    states = lifecycle.Replay.turns(assigned, [0, 1, 2], {0: 10, 1: 11, 2: 22})
    third = states[2]
    assert third.slot == 0 and [c.n_tokens for c, _ in third.alive] == [100]
    save = next(step for step in third.applied if step.event.kind == "cache_saved")
    assert save.owned_save and save.slot == 1
    assert lifecycle.save_owners([ev for ev, _ in assigned]) == {2: 1}


def test_an_erase_of_a_checkpoint_never_seen_created_is_noted_and_kept():
    assigned = [(lp.NewPrompt(line=1, offset=1, slot=0, task=1, n_tokens=50), 0), (erased(2, 1, 40), 0)]
    (state,) = lifecycle.Replay.turns(assigned, [0], {0: 1})
    ((kind, checkpoint, turn),) = state.erased
    assert (kind, checkpoint.n_tokens, turn) == ("erased_invalidated", 40, None)
    assert state.notes == ("line 2: erased_invalidated of a checkpoint never seen created",)
