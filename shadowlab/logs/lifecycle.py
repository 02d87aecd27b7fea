"""The checkpoint lifecycle replayed from a parsed engine log alone: rings, cascade, requests.

    replay = Replay(clock=None)
    for ev in logparse.iter_events(path, family):
        for request in replay.feed(ev):      # each request once it is complete
            ...
    rest = replay.finish()

    replay.run(events, emit, side)           # the same, streamed: emit(record) per request

The pieces are public and shared with ``verdicts.py`` (one replay; docs/DESIGN.md §7; rings.py):
``Ring``, ``re_entry_point``, ``cascade_missed``, ``attribute_by_span`` (a run directory's turns
own byte spans of the log), ``turn_slot`` and ``HELD_KINDS``; and ``Replay.turns``, the same
rings replayed turn by turn for a run directory's cell, whose events are attributed to its turns
(by byte span, or by task for turns sent concurrently).

No run directory and no prompt tokens are needed: everything comes from the lines llama-server
(b11434 and older upstream), ik_llama.cpp and the reference engine print. The words are
llama.cpp's: slot, task, n_past (where prefill re-enters), pos_min / pos_max, n_tokens (tokens a
checkpoint covers).

Attribution
-----------
An event belongs to the request (slot, task) that printed it. A slot runs one task at a time, so
a request is complete when its slot starts another task (or at the end of the log). Lines that
come before a task prints anything and carry no task of their own (task -1 ``selected slot by``,
the ``srv`` prompt-cache save / load lines) are held and applied to the slot of the next request
that starts: they change the ring before that request's restore decision.

Restarts
--------
A new server process empties every slot. It is known from the server's own start-up line
(logparse's ``server_start``: ``model loaded``, printed exactly once per start by every family,
before any request), and, where a log lacks it (a rotated piece that begins after it), from a
task id lower than one already started. Either closes every open request and forgets every ring,
held line, side note, and the n_swa the server stated; a start line is counted as a restart
when a start line or a request came before it in the stream (the log's own first start is not). The common single-request session starts again
at a task id no lower than the last session's: only its start line tells it apart. Times are no
evidence either way: a Unix clock stepped back (or rotated pieces out of time order) is data.

The ring
--------
Per slot, the checkpoints alive: ``created`` adds one (replacing one at the same n_tokens),
``erased_invalidated`` / ``erased_old`` / ``erased_too_close`` / ``erased_superseded`` remove it,
``cache_saved`` copies the ring into the prompt-cache entry of that length and ``cache_loaded``
swaps the entry's ring in. ``prompt_cleared`` (b11434's ``clearing prompt with N tokens``, task
-1: ``--cache-idle-slots`` empties each idle slot when a task starts) empties its slot's ring at
once, counted as no request's erase; the ``prompt_save`` of N tokens printed just before it
(``save_of_clear``) was that slot's content, so that save goes to that slot's entries, not to the
next request's slot. Entries are kept per slot: an entry loaded into another slot than the one
it was saved from is noted as unknown and loads no checkpoint. An erase of a checkpoint never seen created (a log that starts
mid-stream) is noted, not fatal.

Per request
-----------
``prompt_tokens``: ``new prompt, ... task.n_tokens``; builds without that line (ik_llama.cpp) give
re-entry + processed (``prompt_derived``). ``shared_prefix``: the longest common prefix of the
prompt with the slot's cache where the log states it: b11434's ``checking sim = x (LCP/N)`` slot
line (``shared_source = "lcp"``) when it names this prompt's length, no prompt-cache entry was
loaded into the slot after it, and it is not below what the request reused; else the engine's
n_past as its ``checking checkpoint with [..] against N`` lines state it (``"n_past"``: the LCP,
or L - 1 when the whole prompt matched; taken only once the server has printed ``n_swa = 0``,
since the line states n_past - n_swa); else the re-entry point, labelled ``shared_source =
"re_entry"``. ``re_entry`` = ``reused``: the restore's n_past, else the task's first ``cached
n_tokens`` / ``kv cache rm [p0`` line. ``processed``: ``prompt eval time = X ms / N tokens`` (the
last one of the task). Outcome: ``restored`` (a restore line), ``forced`` (the forcing line),
``extended`` (reused > 0 without a restore), ``cold`` (the first request on a slot in this
stream, nothing reused, nothing erased but checkpoints it created itself: a ring of one or two
evicts its own during the first prefill), else ``silent_reset`` (nothing reused, no forcing line:
b11434 prints the forcing line only when n_past > 0).

The three failure conditions of the case study, as flags on a request that is not cold:

- ``placement``: the request was forced (the engine found a shared prefix of at least one token
  but no checkpoint below it) while the ring held at least one checkpoint: every live checkpoint
  lay above the re-entry point it needed.
- ``retention``: the request reused nothing (forced or silent reset) and the previous request on
  its slot erased (by its cascade or ring eviction) at least one checkpoint that an earlier
  request had created and that covered fewer tokens than this prompt. Without prompt tokens the
  log cannot say whether this prompt continues the one that made the checkpoint, so this counts
  every request the erasure *could* have served: an upper bound.
- ``baseline_loss``: the request shared fewer than ``BASELINE_TOKENS`` (512) tokens with the slot's
  cache. Where the log does not state the shared prefix, a request that was not forced and
  re-entered below 512 counts (a forced one shared an unknown amount): a lower bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from shadowlab.logs import accel
from shadowlab.logs.rings import (
    ERASE_KINDS, CLEARED, MAX_SAVED, Ring, save_of_clear, re_entry_point, cascade_missed, TurnSpan,
    attribute_by_span, SLOT_EVIDENCE, turn_slot, Applied, TurnState, save_owners,
)

BASELINE_TOKENS = accel.BASELINE_TOKENS
OUTCOMES = accel.OUTCOMES
CACHE_KINDS = ("cache_saved", "cache_loaded")
STARTED = "server_start"  # the server's start-up line (`model loaded`): a new process
# Printed before the task owns its slot, and applied before its restore decision (a clear names
# its own slot: Replay applies it at once instead of holding it).
HELD_KINDS = frozenset(CACHE_KINDS + ("slot_selected", CLEARED))
_HELD = HELD_KINDS
_PENDING_CHECKS = accel.PENDING_CHECKS  # `checking checkpoint` notes of tasks not closed yet
_NONE: Any = object()  # "no request being read"


class SharedPrefix(NamedTuple):
    """A ``checking sim = x (lcp/n_tokens)`` line: the slot's cache shares ``lcp`` tokens with the
    next prompt of ``n_tokens``. Fed to ``Replay.feed`` like an event. (Notes are named tuples, as
    events are: one is made per slot per request.)"""

    slot: int
    lcp: int
    n_tokens: int
    offset: int = 0
    line: int = 0
    kind: str = "shared_prefix"
    task: int | None = None


class CheckpointCheck(NamedTuple):
    """A ``checking checkpoint with [pos_min, pos_max] against N...`` line of ``task``: the engine
    looked for a checkpoint below N = n_past - n_swa. Fed to ``Replay.feed`` like an event."""

    slot: int
    task: int
    against: int
    offset: int = 0
    line: int = 0
    kind: str = "checkpoint_check"


@dataclass(frozen=True, slots=True)
class Request:
    """One task on one slot as the log tells it. Checkpoints are the parser's ``created`` events
    (pos_min, pos_max, n_tokens, size_mib, took_ms, task, line)."""

    slot: int | None
    task: int | None
    line: int
    offset: int
    time: float | None
    prompt_tokens: int | None
    prompt_derived: bool
    shared_prefix: int | None
    shared_source: str | None  # "lcp" | "n_past" (stated by the log) | "re_entry" (not stated) | None
    re_entry: int | None
    reused: int | None
    processed: int | None
    prefill_ms: float | None
    outcome: str
    forced: bool
    alive_before: tuple[Any, ...]
    created: tuple[Any, ...]
    restored: Any | None
    erased_cascade: tuple[Any, ...]
    erased_other: tuple[Any, ...]
    erase_counts: dict[str, int]  # erase lines of this request by event kind
    cache_saved: int
    cache_loaded: int
    placement: bool
    retention: bool
    baseline_loss: bool
    notes: tuple[str, ...] = ()
    shared_with: int | None = None  # the task whose prompt the slot held when shared_prefix was measured

    @property
    def erased(self) -> tuple[Any, ...]:
        return self.erased_cascade + self.erased_other

    @classmethod
    def of(cls, r: Served) -> Request:
        """The frozen copy of a served record."""
        return cls(
            slot=r.slot, task=r.task, line=r.line, offset=r.offset, time=r.time, prompt_tokens=r.prompt_tokens,
            prompt_derived=r.prompt_derived, shared_prefix=r.shared_prefix, shared_source=r.shared_source,
            re_entry=r.re_entry, reused=r.reused, processed=r.processed, prefill_ms=r.prefill_ms, outcome=r.outcome,
            forced=r.forced, alive_before=r.alive_before, created=tuple(r.created), restored=r.restored,
            erased_cascade=tuple(r.erased_cascade), erased_other=tuple(r.erased_other),
            erase_counts=dict(r.erase_counts), cache_saved=r.cache_saved, cache_loaded=r.cache_loaded,
            placement=r.placement, retention=r.retention, baseline_loss=r.baseline_loss, notes=r.notes,
            shared_with=r.shared_with,
        )


class Served:
    """A request being read, then (once ``Replay`` emits it) the request as read: the fields of
    ``Request`` (lists where Request has tuples), mutable and uncopied, so that streaming a log
    costs one object per request. ``Request.of`` freezes one."""

    __slots__ = (
        "slot", "task", "line", "offset", "time", "prompt_tokens", "prompt_derived", "shared_prefix",
        "shared_source", "re_entry", "reused", "processed", "prefill_ms", "outcome", "forced", "alive_before",
        "created", "restored", "erased_cascade", "erased_other", "erase_counts", "cache_saved", "cache_loaded",
        "placement", "retention", "baseline_loss", "notes", "shared_with",
        "n_prompt", "lcp", "trim", "fresh", "ring_notes",
    )

    def __init__(self, ev: Any, time: float | None, lcp: SharedPrefix | None, alive: tuple, fresh: bool, notes: int):
        self.slot, self.task, self.line, self.offset, self.time = ev.slot, ev.task, ev.line, ev.offset, time
        self.n_prompt: int | None = None
        self.lcp = lcp
        self.trim: int | None = None
        self.restored: Any = None
        self.forced = False
        self.processed: int | None = None
        self.prefill_ms: float | None = None
        self.created: list[Any] = []
        self.erased_cascade: list[Any] = []
        self.erased_other: list[Any] = []
        self.erase_counts: dict[str, int] = {}
        self.cache_saved = self.cache_loaded = 0
        self.alive_before = alive
        self.fresh = fresh
        self.ring_notes = notes
        self.shared_with: int | None = None


class Replay:
    """Streams events into requests. ``clock(offset)`` (optional) gives the time of the line at a
    byte offset; it is asked once per request, for its first line."""

    def __init__(self, clock: Callable[[int], float | None] | None = None):
        self.clock = clock
        self.rings: dict[int | None, Ring] = {}
        self._open: dict[int | None, Served] = {}
        self._held: list[Any] = []
        self._last_save: Any = None  # the held save a clear may name (save_of_clear)
        self._placed: set[int] = set()  # ids of held saves already applied to the slot cleared after them
        self._lcp: dict[int, SharedPrefix] = {}
        self._checks: dict[tuple[int, int], int] = {}  # (slot, task) -> `against`, the task's first
        self._last_task: int = -1
        self._erased_by_last: dict[int | None, list[Any]] = {}  # what each slot's last request erased
        self.n_swa: int | None = None  # as the server's erase lines state it
        self.restarts = 0
        self._began = False  # a server was seen: a start line, or a request
        self.notes: list[str] = []

    def feed(self, ev: Any) -> list[Request]:
        """Take one event; return the requests it completed (usually none)."""
        out: list[Served] = []
        self.run((ev,), out.append)
        return [Request.of(r) for r in out]

    def feed_all(self, events: Iterable[Any]) -> list[Request]:
        out: list[Served] = []
        self.run(events, out.append)
        self._finish(out.append)
        return [Request.of(r) for r in out]

    def finish(self, side: deque | None = None) -> list[Request]:
        """Close every open request (the end of the log)."""
        out: list[Served] = []
        self._finish(out.append, side)
        return [Request.of(r) for r in out]

    def run(self, events: Iterable[Any], emit: Callable[[Served], Any], side: deque | None = None) -> None:
        """Feed every event, in log order; ``emit`` each request as it completes (a ``Served``,
        which the caller may keep: the replay forgets it). ``side``: ``SharedPrefix`` /
        ``CheckpointCheck`` notes in offset order, taken as the events reach them (a deque the
        caller may fill while ``events`` is read)."""
        opened = self._open
        cur: Any = None
        cur_slot = cur_task = _NONE
        for ev in events:
            task = ev.task
            slot = ev.slot
            kind = ev.kind
            if task != cur_task or slot != cur_slot:  # another request's line (rare): the long way
                if side:
                    self._drain(side, ev.offset)
                if kind == "shared_prefix" or kind == "checkpoint_check":
                    self._take_note(ev)
                    continue
                if kind == STARTED:  # a new process: the next line, whatever its task, starts anew
                    self._restart(ev, emit, f"line {ev.line}: the server started again" if self._began else None)
                    cur, cur_slot, cur_task = None, _NONE, _NONE
                    continue
                if task is None or task < 0 or (kind in _HELD and slot not in opened):
                    if kind == CLEARED:
                        self._clear(ev)
                    elif kind in _HELD:
                        self._held.append(ev)
                        if kind in CACHE_KINDS:
                            self._last_save = ev if kind == "cache_saved" else None
                    continue
                cur = opened.get(slot)
                if cur is None or cur.task != task:
                    if task < self._last_task and (cur is None or task < cur.task):
                        self._restart(ev, emit, f"line {ev.line}: task {task} after task {self._last_task}: "
                                                "server restarted")
                        cur = None
                    if cur is not None:
                        emit(self._close(cur))
                    cur = self._start(ev)
                cur_slot, cur_task = slot, task
            # the lines of the request being read, most frequent first
            if kind == "cache_trim":
                if cur.trim is None:
                    cur.trim = ev.n_past
            elif kind == "created":
                self.rings[slot].apply(ev)
                cur.created.append(ev)
            elif kind == "prompt_eval":
                cur.processed, cur.prefill_ms = ev.n_tokens, ev.ms
            elif kind == "new_prompt":
                if cur.n_prompt is None:
                    cur.n_prompt = ev.n_tokens
            elif kind in ERASE_KINDS:
                gone = self.rings[slot].apply(ev)
                (cur.erased_cascade if kind == "erased_invalidated" else cur.erased_other).append(gone)
                cur.erase_counts[kind] = cur.erase_counts.get(kind, 0) + 1
                if kind == "erased_invalidated" and ev.n_swa is not None:
                    self.n_swa = ev.n_swa
            elif kind == "restored":
                if cur.restored is None:
                    cur.restored = ev
            elif kind == "forced":
                cur.forced = True
            elif kind in CACHE_KINDS:
                ring = self.rings[slot]
                if kind == "cache_saved":
                    ring.apply(ev)
                    cur.cache_saved += 1
                else:  # the slot's content is now the entry's: what this request shares with
                    ring.apply(ev)
                    cur.shared_with = ring.content
                    ring.content = cur.task
                    cur.cache_loaded += 1
            elif kind == "shared_prefix" or kind == "checkpoint_check":
                self._take_note(ev)

    # ------------------------------------------------------------------ internals

    def _drain(self, side: deque, offset: int) -> None:
        while side and side[0].offset < offset:
            self._take_note(side.popleft())

    def _take_note(self, note: Any) -> None:
        if note.kind == "shared_prefix":
            self._lcp[note.slot] = note
            return
        if len(self._checks) >= _PENDING_CHECKS:
            self._checks.clear()
        self._checks.setdefault((note.slot, note.task), note.against)

    def _clear(self, ev: Any) -> None:
        """An idle slot emptied by the server (no request of its own, no erase line): its ring
        empties; a held save it names goes to its ring now, not to the next request's slot."""
        save, self._last_save = self._last_save, None
        ring = self.rings.get(ev.slot)
        if save_of_clear(save, ev) and any(h is save for h in self._held):
            self._placed.add(id(save))  # still counted by the next request, as every held save
            if ring is not None:
                ring.apply(save)
        if ring is not None:
            ring.apply(ev)
        self._lcp.pop(ev.slot, None)  # a `checking sim` line about the content just dropped

    def _finish(self, emit: Callable[[Served], Any], side: deque | None = None) -> None:
        if side:
            self._drain(side, float("inf"))
        for o in sorted(self._open.values(), key=lambda o: o.offset):
            emit(self._close(o))
        self._open.clear()

    def _restart(self, ev: Any, emit: Callable[[Served], Any], note: str | None) -> None:
        """A new server process: every open request closes, every slot and what the server
        stated (n_swa) is forgotten. `note` None: the log's first start line (no server before
        it to restart), not counted."""
        self._finish(emit)
        self.rings.clear()
        self._held.clear()
        self._placed.clear()
        self._last_save = None
        self._lcp.clear()
        self._checks.clear()
        self._erased_by_last.clear()
        self.n_swa = None
        self._began = True
        if note is not None:
            self.restarts += 1
            if len(self.notes) < accel.MAX_NOTES:
                self.notes.append(note)
        self._last_task = -1

    def _start(self, ev: Any) -> Served:
        slot = ev.slot
        fresh = slot not in self.rings
        ring = self.rings.setdefault(slot, Ring())
        notes_before = len(ring.notes)
        held, self._held = self._held, []
        placed, self._placed = self._placed, set()
        self._last_save = None
        saved = loaded = 0
        for h in held:  # prompt-cache swaps come before the restore decision
            if id(h) not in placed:
                ring.apply(h)
            saved += h.kind == "cache_saved"
            loaded += h.kind == "cache_loaded"
        lcp = self._lcp.get(slot) if slot is not None else None
        self._lcp.clear()  # each slot selection prints fresh lines; older ones are stale
        o = Served(ev, self.clock(ev.offset) if self.clock else None, lcp, tuple(ring.alive.values()), fresh,
                   notes_before)
        o.cache_saved, o.cache_loaded = saved, loaded
        o.shared_with, ring.content = ring.content, ev.task  # what it found; then its own prompt
        self._open[slot] = o
        self._last_task = max(self._last_task, ev.task)
        self._began = True
        return o

    def _close(self, o: Served) -> Served:
        restored = o.restored
        re_entry = re_entry_point(restored, o.trim, o.forced)
        prompt, derived = o.n_prompt, False
        if prompt is None and re_entry is not None and o.processed is not None:
            prompt, derived = re_entry + o.processed, True
        shared, source = self._shared(o, prompt, re_entry)
        reused = re_entry
        erased_any = bool(o.erased_cascade or o.erased_other)
        own = o.created
        # what it erased of checkpoints made before it (a fresh slot's own ring evicting its own
        # checkpoints, --ctx-checkpoints 1 or 2, is no sign the slot held anything)
        foreign = [c for c in o.erased_cascade + o.erased_other if not _among(c, own)] if erased_any else []
        if restored is not None:
            outcome = "restored"
        elif o.forced:
            outcome = "forced"
        elif reused:
            outcome = "extended"
        elif o.fresh and not foreign:
            outcome = "cold"
        else:
            outcome = "silent_reset"
        warm = outcome != "cold"
        earlier = self._erased_by_last.get(o.slot, ())
        o.retention = (
            outcome in ("forced", "silent_reset")
            and prompt is not None
            and any(c.kind == "created" and c.n_tokens < prompt for c in earlier)
        )
        if source == "re_entry":  # a forced request shared an unknown amount
            o.baseline_loss = warm and not o.forced and shared is not None and shared < BASELINE_TOKENS
        else:
            o.baseline_loss = warm and shared is not None and shared < BASELINE_TOKENS
        if erased_any or earlier:  # what this request erased of older checkpoints: the next one's retention
            self._erased_by_last[o.slot] = foreign
        if self._open.get(o.slot) is o:
            del self._open[o.slot]
        ring = self.rings.get(o.slot)
        o.notes = tuple(ring.notes[o.ring_notes:]) if ring is not None and len(ring.notes) > o.ring_notes else ()
        o.prompt_tokens, o.prompt_derived, o.shared_prefix, o.shared_source = prompt, derived, shared, source
        o.re_entry = o.reused = re_entry
        o.outcome = outcome
        o.placement = outcome == "forced" and bool(o.alive_before)
        return o

    def _shared(self, o: Served, prompt: int | None, re_entry: int | None) -> tuple[int | None, str | None]:
        """The prefix shared with the slot's cache and where it comes from (module docstring)."""
        lcp = o.lcp
        if lcp is not None and (
            o.cache_loaded  # the slot's content changed after the `checking sim` line
            or (prompt is not None and lcp.n_tokens != prompt)
            or (re_entry is not None and lcp.lcp < re_entry)  # shares less than it reused: not this cache
        ):
            lcp = None
        against = self._checks.pop((o.slot, o.task), None)
        if against is not None and (self.n_swa != 0 or (re_entry is not None and against < re_entry)):
            against = None  # n_past - n_swa with n_swa unknown, or impossible
        if lcp is not None and against is not None and prompt is not None and against != min(lcp.lcp, prompt - 1):
            lcp = None  # the engine's own n_past says the sim line was about other content
        if lcp is not None:
            return lcp.lcp, "lcp"
        if against is not None:
            return against, "n_past"
        return re_entry, ("re_entry" if re_entry is not None else None)

    # ------------------------------------------------------------------ turn by turn

    @classmethod
    def turns(cls, assigned: Sequence[tuple[Any, int | None]], order: Sequence[int],
              starts: Mapping[int, int | None]) -> list[TurnState]:
        """The rings of a run directory's cell replayed turn by turn: ``assigned`` is every event
        of its log with the turn it belongs to (``attribute_by_span``, or the judge's attribution
        by task; None: no turn's), ``order`` the turns in the order the engine served them,
        ``starts`` each turn's first byte in the log (None: its first event's).

        Before a turn, every event of a turn served earlier and every unattributed event before
        its start is applied (each once, in log order); then the turn's own slot selection,
        prompt-cache lines and ``new prompt`` (they precede the restore decision); what is alive
        then is the turn's ``alive``; its other lines follow, and what they erase is ``erased``.
        An event names its slot; one that does not (the ``srv`` prompt-cache lines) goes to the
        slot of its turn, else to the slot of the last turn replayed, and a save that a slot
        clear names (``save_owners``) to the slot it was of. Rings keep every note."""
        rank = {index: k for k, index in enumerate(order)}
        rings: dict[int | None, Ring] = {}
        made_in: dict[int, int | None] = {}  # a created event's offset -> the turn that created it
        owners = save_owners([ev for ev, _ in assigned])
        turn_slots: dict[int, int | None] = {}
        last_slot = next((ev.slot for ev, _ in assigned if ev.slot is not None), None)
        done: set[int] = set()
        out: list[TurnState] = []

        def apply(i: int, ev: Any, turn: int | None, log: list[Applied]) -> Applied:
            slot = ev.slot if ev.slot is not None else turn_slots.get(turn, last_slot) if turn is not None else last_slot
            if i in owners:  # an idle slot's save: its content, not the slot of the next request
                slot = owners[i]
            if ev.kind == "created":
                made_in[ev.offset] = turn
            gone = rings.setdefault(slot, Ring(max_notes=None)).apply(ev)
            done.add(i)
            step = Applied(ev, turn, slot, i in owners,
                           None if gone is None else (gone, None if gone is ev else made_in.get(gone.offset)))
            log.append(step)
            return step

        for index in order:
            mine = [ev for ev, turn in assigned if turn == index]
            slot = turn_slot(mine, last_slot)
            turn_slots[index] = slot
            start = starts.get(index)
            if start is None:
                start = min((ev.offset for ev in mine), default=None)
            log: list[Applied] = []
            for i, (ev, turn) in enumerate(assigned):
                earlier = turn is not None and rank.get(turn, turn) < rank[index]
                before = turn is None and start is not None and ev.offset < start
                if i not in done and (earlier or before):
                    apply(i, ev, turn, log)
            ring = rings.setdefault(slot, Ring(max_notes=None))
            notes_before = len(ring.notes)
            own = [(i, ev) for i, (ev, turn) in enumerate(assigned) if turn == index]
            lead = 0
            while lead < len(own) and (own[lead][1].kind in HELD_KINDS or own[lead][1].kind == "new_prompt"):
                apply(own[lead][0], own[lead][1], index, log)
                lead += 1
            alive = tuple((c, made_in.get(c.offset)) for c in ring.alive.values())
            erased = []
            for i, ev in own[lead:]:
                step = apply(i, ev, index, log)
                if step.erased is not None:
                    erased.append((ev.kind, *step.erased))
            out.append(TurnState(index, slot, tuple(mine), alive, tuple(erased), tuple(log),
                                 tuple(ring.notes[notes_before:])))
            last_slot = slot
        return out


def _among(c: Any, items: list[Any]) -> bool:
    return any(c is x for x in items)


def replay(events: Iterable[Any], clock: Callable[[int], float | None] | None = None) -> list[Request]:
    """Every request of a parsed log (``logparse.parse(...).events``), in the order they closed."""
    return Replay(clock).feed_all(events)


# the lifecycle's public names; those of rings.py re-exported
__all__ = [
    "Applied", "BASELINE_TOKENS", "CACHE_KINDS", "CLEARED", "CheckpointCheck", "ERASE_KINDS", "HELD_KINDS",
    "MAX_SAVED", "OUTCOMES", "Replay", "Request", "Ring", "SLOT_EVIDENCE", "STARTED", "Served",
    "SharedPrefix", "TurnSpan", "TurnState", "attribute_by_span", "cascade_missed", "re_entry_point",
    "replay", "save_of_clear", "save_owners", "turn_slot",
]
