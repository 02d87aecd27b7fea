"""The pieces of the checkpoint lifecycle that ``Replay`` and ``verdicts.py`` share (one replay;
docs/DESIGN.md §7): a slot's ``Ring``, where prefill re-entered (``re_entry_point``), what the
cascade missed (``cascade_missed``), events attributed to a run directory's turns
(``attribute_by_span``, ``turn_slot``), prompt-cache saves a slot clear names (``save_of_clear``,
``save_owners``), and the records ``Replay.turns`` returns (``Applied``, ``TurnState``). Split out
of `shadowlab.logs.lifecycle`, which re-exports every name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from shadowlab.logs import accel

ERASE_KINDS = accel.ERASE_KINDS
CLEARED = "prompt_cleared"  # b11434's `clearing prompt with N tokens`: the slot's ring empties
# Prompt-cache entries one slot's ring keeps (the oldest saved goes first): llama-server's RAM
# cache holds far fewer (its -cram MiB and token limits), and a log that saves without ever
# loading must not grow the replay without bound.
MAX_SAVED = accel.MAX_SAVED


class Ring:
    """The checkpoints alive in one slot (and the prompt-cache entries saved from it). ``alive``
    maps n_tokens to the ``created`` event, oldest first: a slot holds one checkpoint per length
    (a new one at the same n_tokens replaces it), so every erase finds its checkpoint by key."""

    __slots__ = ("alive", "saved", "owners", "content", "notes", "max_notes")

    def __init__(self, max_notes: int | None = accel.MAX_NOTES) -> None:
        self.alive: dict[int, Any] = {}
        self.saved: dict[int | None, dict[int, Any]] = {}
        # Whose prompt the slot holds (a task id; None: nothing, or unknown), and each saved
        # entry's: a prompt-cache load brings that task's prompt back (the trace's shared_with).
        self.content: int | None = None
        self.owners: dict[int | None, int | None] = {}
        self.notes: list[str] = []
        # A production log that starts mid-stream repeats its notes for every slot: capped.
        # verdicts (a run's own log, read whole) keeps every one: None.
        self.max_notes = max_notes

    def apply(self, ev: Any) -> Any | None:
        """Apply one event; return the checkpoint it erased (the erase event itself when the
        checkpoint was never seen created)."""
        kind = ev.kind
        alive = self.alive
        if kind == "created":
            n = ev.n_tokens
            if n in alive:
                del alive[n]  # re-inserted last: it is now the newest
            alive[n] = ev
            return None
        if kind in ERASE_KINDS:
            c = alive.get(ev.n_tokens)
            if c is not None and (kind == "erased_superseded" or (c.pos_min == ev.pos_min and c.pos_max == ev.pos_max)):
                return alive.pop(ev.n_tokens)
            self._note(f"line {ev.line}: {kind} of a checkpoint never seen created")
            return ev
        if kind == "cache_saved":  # a copy: the slot keeps its checkpoints until the cascade
            saved, owners = self.saved, self.owners
            saved.pop(ev.n_tokens, None)  # saved again: now the newest
            saved[ev.n_tokens] = dict(alive)
            owners[ev.n_tokens] = self.content
            if len(saved) > MAX_SAVED:
                oldest = next(iter(saved))
                del saved[oldest], owners[oldest]
        elif kind == "cache_loaded":  # the slot takes the entry's checkpoints instead of its own
            if ev.n_tokens in self.saved:
                self.alive = self.saved.pop(ev.n_tokens)
                self.content = self.owners.pop(ev.n_tokens)
            else:
                self.alive = {}
                self.content = None
                self._note(f"line {ev.line}: prompt cache load of an entry saved before the log began")
        elif kind == CLEARED:  # emptied by the server: its checkpoints left with the save, or nowhere
            self.alive = {}
            self.content = None
        return None

    def _note(self, text: str) -> None:
        if self.max_notes is None or len(self.notes) < self.max_notes:
            self.notes.append(text)


def save_of_clear(save: Any | None, clear: Any) -> bool:
    """Whether ``save`` (the last prompt-cache save before this clear, with no other save, load
    or clear between them) was of the slot ``clear`` empties: llama.cpp saves an idle slot, then
    clears it (``--cache-idle-slots``), and its ``prompt_save`` line names no slot, only the
    length the clear repeats. Such a save is that slot's entry, not the next request's."""
    return save is not None and bool(clear.n_tokens) and save.n_tokens == clear.n_tokens


def re_entry_point(restored: Any | None, trim: int | None, forced: bool) -> int | None:
    """Where prefill re-entered: the restore's n_past (its n_tokens for builds that do not print
    it), else the request's first cache trim (``cached n_tokens`` / ``kv cache rm [p0``), else 0
    for a forced request; None when the log does not say."""
    if restored is not None:
        return restored.n_past if restored.n_past is not None else restored.n_tokens
    if trim is not None:
        return trim
    return 0 if forced else None


def cascade_missed(alive: Iterable[Any], erased: Iterable[Any], re_entry: int) -> tuple[Any, ...]:
    """Checkpoints alive at the restore decision that cover tokens past the re-entry point and
    that no erase line removed. llama.cpp erases every ``pos_max > pos_next``: one ending exactly
    at the re-entry point stays (the boundary is ``>``, not ``>=``)."""
    gone = {(c.pos_min, c.pos_max, c.n_tokens) for c in erased}
    return tuple(c for c in alive if c.pos_max > re_entry and (c.pos_min, c.pos_max, c.n_tokens) not in gone)


class TurnSpan(NamedTuple):
    """A request whose log lines are known by byte span (a run directory's turn): ``[start,
    end)`` into the log, and the task ids recorded for it."""

    index: int
    start: int | None
    end: int | None
    task_ids: tuple[int, ...] = ()


def attribute_by_span(events: Iterable[Any], spans: Iterable[TurnSpan],
                      notes: list[str] | None = None) -> list[tuple[Any, int | None]]:
    """Every event with the turn it belongs to: by byte span, cross-checked with task ids (a
    task id recorded for another turn wins, and the conflict is noted: a late line after its
    span closed, or a misplaced span). None: the event lies outside every span (start-up)."""
    spans = [s for s in spans]
    owners: dict[int, int] = {}
    for s in spans:
        for task in s.task_ids:
            owners.setdefault(task, s.index)
    bounded = [s for s in spans if s.start is not None and s.end is not None]
    out = []
    conflicts = 0
    for ev in events:
        turn = next((s.index for s in bounded if s.start <= ev.offset < s.end), None)
        if ev.task is not None and ev.task in owners and owners[ev.task] != turn:
            conflicts += 1
            if notes is not None and conflicts <= 3:
                where = f"turn {turn}'s log span" if turn is not None else "no turn's log span"
                notes.append(f"line {ev.line} ({ev.kind}, task {ev.task}) lies in {where}; "
                             f"its task id belongs to turn {owners[ev.task]}")
            turn = owners[ev.task]
        out.append((ev, turn))
    if notes is not None and conflicts > 3:
        notes.append(f"{conflicts} events in all were attributed by task id against their log span")
    return out


# The lines that name the slot a request ran on (llama-server may pick any of its slots).
SLOT_EVIDENCE = frozenset(
    {"new_prompt", "cache_trim", "restored", "forced", "created", "erased_invalidated", "prompt_eval", "slot_selected"}
)


def turn_slot(events: Iterable[Any], fallback: int | None) -> int | None:
    """The slot a request ran on, from its own lines; ``fallback`` when none says."""
    for ev in events:
        if ev.slot is not None and ev.kind in SLOT_EVIDENCE:
            return ev.slot
    return fallback


class Applied(NamedTuple):
    """One event as ``Replay.turns`` applied it: to which slot's ring, whether it was a prompt-cache
    save that a slot clear names (that slot's content), and what it erased (the checkpoint, or the
    erase event itself when the checkpoint was never seen created, with the turn that created it)."""

    event: Any
    turn: int | None
    slot: int | None
    owned_save: bool
    erased: tuple[Any, int | None] | None


class TurnState(NamedTuple):
    """One turn as ``Replay.turns`` replayed it: its slot and own events (log order), the
    checkpoints alive at its restore decision (each with the turn that created it), what its own
    later lines erased (kind, checkpoint, creating turn), every event applied since the turn
    before it (earlier turns', unattributed ones, its own), and the ring's notes of the turn."""

    index: int
    slot: int | None
    events: tuple[Any, ...]
    alive: tuple[tuple[Any, int | None], ...]
    erased: tuple[tuple[str, Any, int | None], ...]
    applied: tuple[Applied, ...]
    notes: tuple[str, ...]


def save_owners(events: Sequence[Any]) -> dict[int, int | None]:
    """Index of each prompt-cache save that a slot clear names (``save_of_clear``: the last save
    before the clear, with no other save, load or clear between them) -> the slot it was of. The
    rule ``Replay`` applies as it streams, for a replay that takes the events in another order."""
    owners: dict[int, int | None] = {}
    last: int | None = None
    for i, ev in enumerate(events):
        if ev.kind == "cache_saved" and ev.slot is None:
            last = i
        elif ev.kind == "cache_loaded":
            last = None
        elif ev.kind == CLEARED:
            if last is not None and save_of_clear(events[last], ev):
                owners[last] = ev.slot
            last = None
    return owners
