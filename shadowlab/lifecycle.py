"""The checkpoint lifecycle replayed from a parsed engine log alone: rings, cascade, requests.

    replay = Replay(clock=None)
    for ev in logparse.iter_events(path, family):
        for request in replay.feed(ev):      # each request once it is complete
            ...
    rest = replay.finish()

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
that starts: they change the ring before that request's restore decision. A task id lower than
one already started means the server restarted: every slot is emptied.

The ring
--------
Per slot, the checkpoints alive: ``created`` adds one (replacing one at the same n_tokens),
``erased_invalidated`` / ``erased_old`` / ``erased_too_close`` / ``erased_superseded`` remove it,
``cache_saved`` copies the ring into the prompt-cache entry of that length and ``cache_loaded``
swaps the entry's ring in. An erase of a checkpoint never seen created (a log that starts
mid-stream) is noted, not fatal.

Per request
-----------
``prompt_tokens``: ``new prompt, ... task.n_tokens``; builds without that line (ik_llama.cpp) give
re-entry + processed (``prompt_derived``). ``shared_prefix``: the longest common prefix of the
prompt with the slot's cache where the log states it (b11434's ``checking sim = x (LCP/N)`` slot
line, ``shared_source = "lcp"``), else the re-entry point, labelled ``shared_source =
"re_entry"``. ``re_entry`` = ``reused``: the restore's n_past, else the task's first ``cached
n_tokens`` / ``kv cache rm [p0`` line. ``processed``: ``prompt eval time = X ms / N tokens`` (the
last one of the task). Outcome: ``restored`` (a restore line), ``forced`` (the forcing line),
``extended`` (reused > 0 without a restore), ``cold`` (the first request on a slot in this
stream, nothing reused, nothing erased), else ``silent_reset`` (nothing reused, no forcing line:
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

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

BASELINE_TOKENS = 512
OUTCOMES = ("cold", "extended", "restored", "forced", "silent_reset")
ERASE_KINDS = ("erased_invalidated", "erased_old", "erased_too_close", "erased_superseded")
CACHE_KINDS = ("cache_saved", "cache_loaded")
_HELD = frozenset(CACHE_KINDS + ("slot_selected",))


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A ``checking sim = x (lcp/n_tokens)`` line: the slot's cache shares ``lcp`` tokens with the
    next prompt of ``n_tokens``. Fed to ``Replay.feed`` like an event."""

    slot: int
    lcp: int
    n_tokens: int
    offset: int = 0
    line: int = 0
    kind: str = "shared_prefix"
    task: int | None = None


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
    shared_source: str | None  # "lcp" (stated by the log) | "re_entry" (not stated) | None
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

    @property
    def erased(self) -> tuple[Any, ...]:
        return self.erased_cascade + self.erased_other


class Ring:
    """The checkpoints alive in one slot (and the prompt-cache entries saved from it)."""

    __slots__ = ("alive", "saved", "notes")

    def __init__(self) -> None:
        self.alive: list[Any] = []
        self.saved: dict[int | None, list[Any]] = {}
        self.notes: list[str] = []

    def apply(self, ev: Any) -> Any | None:
        """Apply one event; return the checkpoint it erased (the erase event itself when the
        checkpoint was never seen created)."""
        kind = ev.kind
        if kind == "created":
            n = ev.n_tokens
            alive = self.alive
            if alive and any(c.n_tokens == n for c in alive):
                self.alive = alive = [c for c in alive if c.n_tokens != n]
            alive.append(ev)
            return None
        if kind == "erased_superseded":
            return self._remove(lambda c: c.n_tokens == ev.n_tokens, ev)
        if kind in ERASE_KINDS:
            key = (ev.pos_min, ev.pos_max, ev.n_tokens)
            return self._remove(lambda c: (c.pos_min, c.pos_max, c.n_tokens) == key, ev)
        if kind == "cache_saved":  # a copy: the slot keeps its checkpoints until the cascade
            self.saved[ev.n_tokens] = list(self.alive)
        elif kind == "cache_loaded":  # the slot takes the entry's checkpoints instead of its own
            if ev.n_tokens in self.saved:
                self.alive = self.saved.pop(ev.n_tokens)
            else:
                self.alive = []
                self._note(f"line {ev.line}: prompt cache load of an entry saved before the log began")
        return None

    def _remove(self, match: Callable[[Any], bool], ev: Any) -> Any:
        for i, c in enumerate(self.alive):
            if match(c):
                return self.alive.pop(i)
        self._note(f"line {ev.line}: {ev.kind} of a checkpoint never seen created")
        return ev

    def _note(self, text: str) -> None:
        if len(self.notes) < 20:  # a log that starts mid-stream repeats this for every slot
            self.notes.append(text)


class _Open:
    """A request being read (mutable; frozen into a Request when its slot moves on)."""

    __slots__ = (
        "slot", "task", "line", "offset", "time", "n_prompt", "lcp", "trim", "restored", "forced", "evals",
        "ms", "created", "cascade", "other", "kinds", "saved", "loaded", "alive", "fresh", "ring_notes",
    )

    def __init__(self, ev: Any, time: float | None, lcp: SharedPrefix | None, alive: tuple, fresh: bool, notes: int):
        self.slot, self.task, self.line, self.offset, self.time = ev.slot, ev.task, ev.line, ev.offset, time
        self.n_prompt: int | None = None
        self.lcp = lcp
        self.trim: int | None = None
        self.restored: Any = None
        self.forced = False
        self.evals: int | None = None
        self.ms: float | None = None
        self.created: list[Any] = []
        self.cascade: list[Any] = []
        self.other: list[Any] = []
        self.kinds: dict[str, int] = {}
        self.saved = self.loaded = 0
        self.alive = alive
        self.fresh = fresh
        self.ring_notes = notes


class Replay:
    """Streams events into requests. ``clock(offset)`` (optional) gives the time of the line at a
    byte offset; it is asked once per request, for its first line."""

    def __init__(self, clock: Callable[[int], float | None] | None = None):
        self.clock = clock
        self.rings: dict[int | None, Ring] = {}
        self._open: dict[int | None, _Open] = {}
        self._held: list[Any] = []
        self._lcp: dict[int, SharedPrefix] = {}
        self._last_task: int = -1
        self._erased_by_last: dict[int | None, list[Any]] = {}  # what each slot's last request erased
        self.restarts = 0
        self.notes: list[str] = []

    def feed(self, ev: Any) -> list[Request]:
        """Take one event; return the requests it completed (usually none)."""
        kind = ev.kind
        task = ev.task
        if kind == "shared_prefix":
            self._lcp[ev.slot] = ev
            return []
        if task is None or task < 0 or (kind in _HELD and ev.slot not in self._open):
            if kind in _HELD:
                self._held.append(ev)
            return []
        slot = ev.slot
        current = self._open.get(slot)
        done: list[Request] = []
        if current is None or current.task != task:
            if task < self._last_task and (current is None or task < current.task):
                done += self._restart(ev)
                current = None
            if current is not None:
                done.append(self._close(current))
            current = self._start(ev)
        self._attach(current, ev)
        return done

    def feed_all(self, events: Iterable[Any]) -> list[Request]:
        out: list[Request] = []
        for ev in events:
            out += self.feed(ev)
        return out + self.finish()

    def finish(self) -> list[Request]:
        """Close every open request (the end of the log)."""
        done = [self._close(o) for o in sorted(self._open.values(), key=lambda o: o.offset)]
        self._open.clear()
        return done

    # ------------------------------------------------------------------ internals

    def _restart(self, ev: Any) -> list[Request]:
        done = self.finish()
        self.rings.clear()
        self._held.clear()
        self._lcp.clear()
        self._erased_by_last.clear()
        self.restarts += 1
        if len(self.notes) < 20:
            self.notes.append(f"line {ev.line}: task {ev.task} after task {self._last_task}: server restarted")
        self._last_task = -1
        return done

    def _start(self, ev: Any) -> _Open:
        slot = ev.slot
        fresh = slot not in self.rings
        ring = self.rings.setdefault(slot, Ring())
        notes_before = len(ring.notes)
        held, self._held = self._held, []
        saved = loaded = 0
        for h in held:  # prompt-cache swaps come before the restore decision
            ring.apply(h)
            saved += h.kind == "cache_saved"
            loaded += h.kind == "cache_loaded"
        lcp = self._lcp.get(slot) if slot is not None else None
        self._lcp.clear()  # each slot selection prints fresh lines; older ones are stale
        o = _Open(ev, self.clock(ev.offset) if self.clock else None, lcp, tuple(ring.alive), fresh, notes_before)
        o.saved, o.loaded = saved, loaded
        self._open[slot] = o
        self._last_task = max(self._last_task, ev.task)
        return o

    def _attach(self, o: _Open, ev: Any) -> None:
        kind = ev.kind
        ring = self.rings[o.slot]
        if kind == "cache_trim":
            if o.trim is None:
                o.trim = ev.n_past
        elif kind == "prompt_eval":
            o.evals, o.ms = ev.n_tokens, ev.ms
        elif kind == "new_prompt":
            if o.n_prompt is None:
                o.n_prompt = ev.n_tokens
        elif kind == "created":
            ring.apply(ev)
            o.created.append(ev)
        elif kind in ERASE_KINDS:
            gone = ring.apply(ev)
            (o.cascade if kind == "erased_invalidated" else o.other).append(gone)
            o.kinds[kind] = o.kinds.get(kind, 0) + 1
        elif kind == "restored":
            if o.restored is None:
                o.restored = ev
        elif kind == "forced":
            o.forced = True
        elif kind in CACHE_KINDS:
            ring.apply(ev)
            if kind == "cache_saved":
                o.saved += 1
            else:
                o.loaded += 1

    def _close(self, o: _Open) -> Request:
        restored = o.restored
        if restored is not None:
            re_entry = restored.n_past if restored.n_past is not None else restored.n_tokens
        elif o.trim is not None:
            re_entry = o.trim
        else:
            re_entry = 0 if o.forced else None
        prompt, derived = o.n_prompt, False
        if prompt is None and re_entry is not None and o.evals is not None:
            prompt, derived = re_entry + o.evals, True
        lcp = o.lcp
        if lcp is not None and (prompt is None or lcp.n_tokens == prompt):
            shared, source = lcp.lcp, "lcp"
        else:
            shared, source = re_entry, ("re_entry" if re_entry is not None else None)
        reused = re_entry
        erased_any = bool(o.cascade or o.other)
        if restored is not None:
            outcome = "restored"
        elif o.forced:
            outcome = "forced"
        elif reused:
            outcome = "extended"
        elif o.fresh and not erased_any:
            outcome = "cold"
        else:
            outcome = "silent_reset"
        warm = outcome != "cold"
        placement = outcome == "forced" and bool(o.alive)
        earlier = self._erased_by_last.get(o.slot, ())
        retention = (
            outcome in ("forced", "silent_reset")
            and prompt is not None
            and any(c.kind == "created" and c.n_tokens < prompt for c in earlier)
        )
        if source == "lcp":
            baseline = warm and shared is not None and shared < BASELINE_TOKENS
        else:
            baseline = warm and not o.forced and shared is not None and shared < BASELINE_TOKENS
        # what this request erased of checkpoints made before it: the next request's retention
        own = {id(c) for c in o.created}
        self._erased_by_last[o.slot] = [c for c in o.cascade + o.other if id(c) not in own]
        if self._open.get(o.slot) is o:
            del self._open[o.slot]
        ring = self.rings.get(o.slot)
        notes = tuple(ring.notes[o.ring_notes:]) if ring is not None else ()
        return Request(
            slot=o.slot, task=o.task, line=o.line, offset=o.offset, time=o.time,
            prompt_tokens=prompt, prompt_derived=derived, shared_prefix=shared, shared_source=source,
            re_entry=re_entry, reused=reused, processed=o.evals, prefill_ms=o.ms, outcome=outcome,
            forced=o.forced, alive_before=o.alive, created=tuple(o.created), restored=restored,
            erased_cascade=tuple(o.cascade), erased_other=tuple(o.other), erase_counts=o.kinds, cache_saved=o.saved,
            cache_loaded=o.loaded, placement=placement, retention=retention, baseline_loss=baseline,
            notes=notes,
        )


def replay(events: Iterable[Any], clock: Callable[[int], float | None] | None = None) -> list[Request]:
    """Every request of a parsed log (``logparse.parse(...).events``), in the order they closed."""
    return Replay(clock).feed_all(events)
