"""Cache mechanics of a slot: checkpoint ring, placement, restore rule, erase cascade, the
RAM prompt cache (`-cram`), and issue 12's two candidate fixes, off by default: conversation
affinity in slot selection and the per-slot checkpoint retention store.

A slot holds one sequence. Its attention KV cache can be trimmed to any position; its recurrent
(conv + gated-delta) state sits at the last processed position and can be moved back only by
restoring a *context checkpoint*, a snapshot of that state taken while the prompt was prefilled.
The rules here are the ones of the case study's fork (docs/DESIGN.md §1 "Cache mechanics",
BRIEF §1–3), in llama.cpp's words: `n_past`, `pos_min`/`pos_max`, `n_tokens`, re-entry point.

This module is pure logic over the abstract `Model` below; it never touches HTTP. The rules
the simulator shares with it (the flags, checkpoint placement, the prompt-cache entry choice, the
batch breaks) live in the neutral package `shadowlab_cache`, which both import: the harness never
imports the engine it tests.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

from shadowlab_cache import CacheConfig, batch_ends, choose_entry, plan_checkpoints

from . import slotlog
from .faults import PERTURB_SCALE, Faults
from .slotlog import INFO, TRACE, WARN, EngineLog


_NOISE_COUNTER = itertools.count()  # the nondeterministic fault: two batches never share a seed


class Model(Protocol):
    """The part of `HybridModel` (model.py) that the cache mechanics use."""

    def new_state(self, n_ctx: int) -> Any: ...
    def forward(self, state: Any, tokens: list[int], pos: int) -> Any: ...
    def snapshot(self, state: Any) -> Any: ...
    def restore(self, state: Any, snap: Any) -> None: ...
    def trim_kv(self, state: Any, n_tokens: int) -> None: ...
    def save_kv(self, state: Any, n_tokens: int) -> Any: ...  # retention only; has .nbytes
    def load_kv(self, state: Any, prefix: Any) -> None: ...
    def perturb(self, state: Any, seed: int, scale: float) -> None: ...  # numerics faults only


@dataclass(frozen=True)
class Checkpoint:
    """A recurrent-state snapshot covering the first `n_tokens` tokens of the slot's sequence."""

    n_tokens: int
    snapshot: Any = field(repr=False, compare=False)
    nbytes: int
    # Where the model state really was when snapped; differs from n_tokens only under the
    # stale-restore fault, which shifts the sequence by one token.
    state_pos: int

    @property
    def pos_min(self) -> int:
        return self.n_tokens - 1

    @property
    def pos_max(self) -> int:
        return self.n_tokens - 1


@dataclass(frozen=True)
class Reuse:
    """What a slot decided to reuse for a new prompt (steps 1–3 of the cache mechanics)."""

    outcome: str  # "cold" | "extended" | "restored" | "forced" | "silent_reset"
    lcp: int  # longest common prefix with the slot's cached tokens
    n_past: int  # min(lcp, len(prompt) - 1)
    re_entry: int  # prompt index where prefill restarts = tokens reused (timings.cache_n)
    restored: Checkpoint | None = None
    erased: int = 0  # checkpoints erased by the cascade


@dataclass(frozen=True)
class Decision:
    """What the slot's own content allows for a prompt (steps 1-2), before anything changes."""

    outcome: str
    re_entry: int
    restore: Checkpoint | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Slot:
    """One sequence: the model state, the tokens it holds, and its checkpoint ring.

    Invariant outside a task: the model state has processed exactly `tokens` (prompt plus the
    generated tokens that were evaluated), unless the stale-restore fault shifted it.
    """

    def __init__(
        self, id: int, model: Model, cfg: CacheConfig, log: EngineLog, faults: Faults = Faults()
    ) -> None:
        self.id = id
        self.model = model
        self.cfg = cfg
        self.log = log
        self.faults = faults
        self.state = model.new_state(cfg.n_ctx)
        self.tokens: list[int] = []
        self.checkpoints: list[Checkpoint] = []  # oldest first
        self.t_last = 0.0  # for LRU slot selection
        self.busy = False
        self.store = RetentionStore(cfg, faults) if cfg.retain_mib > 0 else None

    # -- logging ---------------------------------------------------------------------------

    def _log(self, level: int, func: str, task: int, message: str) -> None:
        self.log.slot(level, func, self.id, task, message)

    # -- per request: reuse decision, restore, cascade -------------------------------------

    def begin(self, task: int, prompt: Sequence[int], cache_prompt: bool = True) -> Reuse:
        """Decide what to reuse for `prompt`, restore or reset the state, run the cascade."""
        self._log(INFO, "operator()", task, slotlog.new_prompt(self.cfg.n_ctx, 0, len(prompt)))
        lcp = common_prefix(self.tokens, prompt) if cache_prompt else 0
        n_past = min(lcp, len(prompt) - 1)
        decision = self._decide(n_past)
        if self.store is not None:
            better = self.store.take_better(prompt, decision.re_entry) if cache_prompt else None
            self._retain(task, decision, better)
            if better is not None:
                return self._use_entry(task, prompt, better)
        restored, re_entry = decision.restore, decision.re_entry
        if decision.outcome == "forced":
            self._log(WARN, "operator()", task, slotlog.forcing())
        elif restored is not None:
            re_entry = self._restore(task, restored, len(prompt))
        return self._finish_begin(task, prompt, Reuse(decision.outcome, lcp, n_past, re_entry, restored))

    def _decide(self, n_past: int) -> Decision:
        if not self.tokens:
            return Decision("cold", 0)
        if n_past == len(self.tokens):
            return Decision("extended", n_past)
        if n_past == 0:
            return Decision("silent_reset", 0)
        ckpt = newest_within(self.checkpoints, n_past)
        if ckpt is None:
            return Decision("forced", 0)
        return Decision("restored", ckpt.n_tokens, ckpt)

    def _finish_begin(self, task: int, prompt: Sequence[int], reuse: Reuse) -> Reuse:
        """The cascade, the reset or trim, and the `cached n_tokens` line (step 3)."""
        re_entry = reuse.re_entry
        erased = self._cascade(task, re_entry)
        if re_entry == 0:
            self.state = self.model.new_state(self.cfg.n_ctx)
        self.tokens = list(prompt[:re_entry])
        self._log(INFO, "operator()", task, slotlog.cached_tokens(re_entry))
        return dataclasses.replace(reuse, erased=erased)

    # -- retention (SHADOWLAB_CKPT_RETAIN_MIB) ---------------------------------------------

    def _retain(self, task: int, decision: Decision, better: Candidate | None) -> None:
        """Save the slot as a store entry when its checkpoints are about to be lost: erased by
        its own cascade, or replaced by the entry `better` (docs/DESIGN.md §1, retention 3)."""
        assert self.store is not None
        if better is None and all(c.pos_max < decision.re_entry for c in self.checkpoints):
            return  # nothing would be lost (an empty ring included)
        n = min(max((c.n_tokens for c in self.checkpoints), default=0), len(self.tokens))
        ring = [c for c in self.checkpoints if c.n_tokens <= n]
        if not ring:
            return
        if better is not None and better.entry.n_tokens == n:
            return  # the log names entries by n: a save now would shadow the one being loaded
        entry = Entry(tuple(self.tokens[:n]), self.model.save_kv(self.state, n), tuple(ring))
        for gone in self.store.remove_length(n):
            self._log(INFO, "retain_save", task, slotlog.retained_replaced(gone.n_tokens, gone.nbytes))
        self.store.add(entry)
        self._log(
            INFO, "retain_save", task,
            slotlog.prompt_cache_saved(n, len(ring), entry.nbytes, len(self.store.entries)),
        )
        for gone in self.store.evict():
            self._log(INFO, "retain_save", task, slotlog.retained_evicted(gone.n_tokens, gone.nbytes))

    def _use_entry(self, task: int, prompt: Sequence[int], better: Candidate) -> Reuse:
        """Take the entry's tokens, KV and ring, then restore its checkpoint like step 2."""
        entry, ckpt = better.entry, better.checkpoint
        self.tokens, self.checkpoints = list(entry.tokens), list(entry.checkpoints)
        self.model.load_kv(self.state, entry.kv)
        self._log(
            INFO, "retain_load", task,
            slotlog.prompt_cache_loaded(
                entry.n_tokens, len(entry.checkpoints), better.lcp / entry.n_tokens, better.lcp / len(prompt)
            ),
        )
        re_entry = self._restore(task, ckpt, len(prompt))
        n_past = min(better.lcp, len(prompt) - 1)
        return self._finish_begin(task, prompt, Reuse("restored", better.lcp, n_past, re_entry, ckpt))

    def _restore(self, task: int, ckpt: Checkpoint, n_prompt: int) -> int:
        """Restore `ckpt` into the state; return the re-entry point."""
        t0 = time.perf_counter()
        self.model.restore(self.state, ckpt.snapshot)
        self.model.trim_kv(self.state, ckpt.state_pos)
        ms = (time.perf_counter() - t0) * 1e3
        re_entry = ckpt.n_tokens
        if self.faults.stale_restore and re_entry + 1 < n_prompt:
            re_entry += 1  # the fault: the token at the checkpoint position is never processed
        self._log(
            TRACE,
            "operator()",
            task,
            slotlog.restored_checkpoint(
                ckpt.pos_min, ckpt.pos_max, ckpt.n_tokens, re_entry, ckpt.nbytes, ms
            ),
        )
        return re_entry

    def _cascade(self, task: int, re_entry: int) -> int:
        """Erase every checkpoint with pos_max >= re_entry; return how many."""
        if self.faults.skip_cascade:
            return 0
        keep, erased = [], 0
        for ckpt in self.checkpoints:
            if ckpt.pos_max >= re_entry:
                erased += 1
                self._log(
                    TRACE,
                    "operator()",
                    task,
                    slotlog.erased_invalidated(
                        ckpt.pos_min, ckpt.pos_max, ckpt.n_tokens, 0, re_entry, ckpt.nbytes
                    ),
                )
            else:
                keep.append(ckpt)
        self.checkpoints = keep
        return erased

    # -- prefill with placement ------------------------------------------------------------

    def prefill(
        self,
        task: int,
        prompt: Sequence[int],
        reuse: Reuse,
        user_starts: Iterable[int] = (),
        split_points: Sequence[int] | None = None,
    ) -> Any:
        """Process prompt[re_entry:] in n_ubatch-sized forward() calls, split additionally at
        each planned checkpoint so a snapshot covers exactly n_tokens tokens. Returns the
        logits of the last prompt token.

        `split_points` (a request's explicit schedule): batches break at exactly these points
        (those above the re-entry point) and at n_ubatch inside longer spans, nowhere else, so
        a fresh process can replay the batch schedule of a warm turn; a planned checkpoint is
        then created only where it falls on one of these breaks."""
        last = self.checkpoints[-1].n_tokens if self.checkpoints else 0
        planned = plan_checkpoints(self.cfg, len(prompt), reuse.re_entry, user_starts, last)
        stops = set(planned) if split_points is None else set(split_points)
        logits = None
        i = reuse.re_entry
        for end in batch_ends(i, stops | {len(prompt)}, self.cfg.n_ubatch):
            logits = self.model.forward(self.state, list(prompt[i:end]), self._pos())
            self.tokens.extend(prompt[i:end])
            i = end
            self._after_batch(end)
            if end in planned:
                self._create_checkpoint(task, end)
        return logits

    def _after_batch(self, end: int) -> None:
        """The numerics faults, applied where a batch ends and before any snapshot of it."""
        if self.faults.split_noise:
            self.model.perturb(self.state, end, PERTURB_SCALE)
        if self.faults.nondeterministic:
            seed = (time.time_ns() ^ (os.getpid() << 32) ^ next(_NOISE_COUNTER)) & (2**63 - 1)
            self.model.perturb(self.state, seed, PERTURB_SCALE)

    def _pos(self) -> int:
        return int(self.state.n_past)

    def _create_checkpoint(self, task: int, n_tokens: int) -> None:
        t0 = time.perf_counter()
        snap = self.model.snapshot(self.state)
        ms = (time.perf_counter() - t0) * 1e3
        ckpt = Checkpoint(n_tokens, snap, int(snap.nbytes), self._pos())
        while len(self.checkpoints) >= self.cfg.ctx_checkpoints:
            old = self.checkpoints.pop(0)
            self._log(
                INFO,
                "create_check",
                task,
                slotlog.erasing_old(old.pos_min, old.pos_max, old.n_tokens, old.nbytes),
            )
        self.checkpoints.append(ckpt)
        self._log(
            TRACE,
            "create_check",
            task,
            slotlog.created_checkpoint(
                len(self.checkpoints),
                self.cfg.ctx_checkpoints,
                ckpt.pos_min,
                ckpt.pos_max,
                n_tokens,
                ckpt.nbytes,
                ms,
            ),
        )

    # -- generation --------------------------------------------------------------------------

    def evaluate(self, token: int) -> Any:
        """Process one generated token; it joins the slot's cached tokens."""
        logits = self.model.forward(self.state, [token], self._pos())
        self.tokens.append(token)
        return logits

    def release(self, task: int, truncated: bool) -> None:
        self._log(INFO, "release", task, slotlog.stop_processing(len(self.tokens), truncated))
        self.t_last = time.monotonic()

    def describe(self) -> dict:
        """The slot as `/slots` shows it."""
        retained = {} if self.store is None else {"retained": [
            {"n_tokens": e.n_tokens, "checkpoints": len(e.checkpoints), "nbytes": e.nbytes}
            for e in self.store.entries
        ]}
        return {
            "id": self.id,
            "n_ctx": self.cfg.n_ctx,
            "is_processing": self.busy,
            "n_tokens": len(self.tokens),
            "checkpoints": [
                {"pos_min": c.pos_min, "pos_max": c.pos_max, "n_tokens": c.n_tokens,
                 "nbytes": c.nbytes}
                for c in self.checkpoints
            ],
            **retained,
        }


def newest_within(checkpoints: Sequence[Checkpoint], n_past: int) -> Checkpoint | None:
    """The newest checkpoint with pos_max < n_past (n_tokens <= n_past): the restore rule."""
    for ckpt in reversed(checkpoints):
        if ckpt.n_tokens <= n_past:
            return ckpt
    return None


# --- checkpoint retention (SHADOWLAB_CKPT_RETAIN_MIB) ----------------------------------------


@dataclass(frozen=True)
class Entry:
    """What a later restore of a lost ring needs: the tokens it covers, their attention KV and
    the checkpoints. Never changed after saving."""

    tokens: tuple[int, ...] = field(repr=False)
    kv: Any = field(repr=False)
    checkpoints: tuple[Checkpoint, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.checkpoints) + int(self.kv.nbytes)


@dataclass(frozen=True)
class Candidate:
    entry: Entry
    lcp: int  # the prompt's common prefix with the entry's tokens
    checkpoint: Checkpoint  # the entry's newest checkpoint with n_tokens <= n_past


class RetentionStore:
    """One slot's retained entries, oldest first, bounded by the ring size (checkpoints in all)
    and `retain_mib`. Loading an entry removes it, so save order is recency order."""

    def __init__(self, cfg: CacheConfig, faults: Faults = Faults()) -> None:
        self.max_checkpoints = cfg.ctx_checkpoints
        self.limit_bytes = cfg.retain_mib * 1024 * 1024
        self.by_position_only = faults.wrong_conversation_restore
        self.entries: list[Entry] = []

    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def take_better(self, prompt: Sequence[int], re_entry: int) -> Candidate | None:
        """Remove and return the entry that re-enters furthest, if further than `re_entry`."""
        best: Candidate | None = None
        for entry in self.entries:  # oldest first: `>=` keeps the newest of equals
            cand = self._candidate(entry, prompt)
            if cand is not None and (best is None or cand.checkpoint.n_tokens >= best.checkpoint.n_tokens):
                best = cand
        if best is None or best.checkpoint.n_tokens <= re_entry:
            return None
        self.entries.remove(best.entry)
        return best

    def _candidate(self, entry: Entry, prompt: Sequence[int]) -> Candidate | None:
        # the wrong-conversation-restore fault trusts positions and never compares tokens
        lcp = entry.n_tokens if self.by_position_only else common_prefix(entry.tokens, prompt)
        ckpt = newest_within(entry.checkpoints, min(lcp, len(prompt) - 1))
        return None if ckpt is None else Candidate(entry, lcp, ckpt)

    def remove_length(self, n_tokens: int) -> list[Entry]:
        gone = [e for e in self.entries if e.n_tokens == n_tokens]
        self.entries = [e for e in self.entries if e.n_tokens != n_tokens]
        return gone

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)

    def evict(self) -> list[Entry]:
        """Drop the oldest entries until both bounds hold; return them in eviction order."""
        gone = []
        while self.entries and (
            sum(len(e.checkpoints) for e in self.entries) > self.max_checkpoints
            or self.total_bytes() > self.limit_bytes
        ):
            gone.append(self.entries.pop(0))
        return gone


# --- RAM prompt cache (-cram) ---------------------------------------------------------------


def _tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by the tensors reachable from `obj` (attributes, lists, dicts)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        return int(obj.element_size() * obj.nelement())
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return sum(_tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


@dataclass
class CacheEntry:
    tokens: list[int]
    state: Any
    checkpoints: list[Checkpoint]
    nbytes: int


class PromptCache:
    """llama.cpp's RAM prompt cache: slot states saved with their checkpoints, loaded back for
    the prompt they serve best. Bounded by `limit_mib` (oldest entries evicted first)."""

    def __init__(self, limit_mib: int, log: EngineLog) -> None:
        self.limit_bytes = limit_mib * 1024 * 1024
        self.log = log
        self.entries: list[CacheEntry] = []

    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def save(self, slot: Slot, task: int) -> bool:
        tokens = slot.tokens
        if any(common_prefix(e.tokens, tokens) == len(tokens) for e in self.entries):
            return False  # already in the cache
        # drop entries fully contained in the one being saved
        self.entries = [e for e in self.entries if common_prefix(e.tokens, tokens) < len(e.tokens)]
        state = copy.deepcopy(slot.state)
        nbytes = _tensor_bytes(state) + sum(c.nbytes for c in slot.checkpoints)
        if nbytes > self.limit_bytes:
            return False
        self.entries.append(CacheEntry(list(tokens), state, list(slot.checkpoints), nbytes))
        while self.total_bytes() > self.limit_bytes:
            self.entries.pop(0)
        slot._log(
            INFO,
            "prompt_save",
            task,
            slotlog.prompt_cache_saved(len(tokens), len(slot.checkpoints), nbytes, len(self.entries)),
        )
        return True

    def load(self, slot: Slot, prompt: Sequence[int], task: int) -> bool:
        """Swap in the entry that keeps more of itself and matches more of `prompt` than the
        slot's own tokens do; skip entries that would keep < 25% of themselves."""
        best, f_keep_best, sim_best = choose_entry(
            common_prefix(slot.tokens, prompt), len(slot.tokens), len(prompt),
            ((common_prefix(e.tokens, prompt), len(e.tokens), e) for e in self.entries))
        if best is None:
            return False
        self.entries.remove(best)
        slot.tokens, slot.state, slot.checkpoints = list(best.tokens), best.state, list(best.checkpoints)
        slot._log(
            INFO,
            "prompt_load",
            task,
            slotlog.prompt_cache_loaded(len(best.tokens), len(best.checkpoints), f_keep_best, sim_best),
        )
        return True
