"""Slot selection of the reference engine: which slot a request runs on (llama-server's rule:
the idle slot whose cache shares the longest prefix, else the least recently used), saving to
and loading from the RAM prompt cache (checkpoints.PromptCache) (docs/DESIGN.md §1 "Cache mechanics")."""

from __future__ import annotations

import threading
from typing import Sequence

from .checkpoints import PromptCache, Slot, common_prefix
from .slotlog import INFO, EngineLog


class SlotPool:
    """Hands out idle slots like llama-server's get_available_slot, and runs the prompt-cache
    update when the chosen slot is about to lose most of its context.

    With `affinity` (SHADOWLAB_SLOT_AFFINITY=1) a request's `prompt_cache_key` owns the slot it
    was last assigned: its next request goes there, and requests that own no slot take the
    unowned slots first (docs/DESIGN.md §1, affinity)."""

    SIMILARITY = 0.1  # llama-server --slot-prompt-similarity default

    def __init__(
        self, slots: list[Slot], prompt_cache: PromptCache | None, log: EngineLog, affinity: bool = False
    ):
        self.slots = slots
        self.prompt_cache = prompt_cache
        self.log = log
        self.affinity = affinity
        self.owner: dict[str, int] = {}  # prompt_cache_key -> the slot it was last assigned
        self._cond = threading.Condition()

    def acquire(self, prompt: Sequence[int], id_slot: int, task: int, key: str | None = None) -> Slot:
        with self._cond:
            while True:
                slot, update_cache = self._select(prompt, id_slot, task, key)
                if slot is not None:
                    break
                self._cond.wait()
            slot.busy = True
            if self.affinity:
                self._assign(slot, key)
        if update_cache and self.prompt_cache is not None and slot.tokens:
            try:
                self.prompt_cache.save(slot, task)
                self.prompt_cache.load(slot, prompt, task)
            except BaseException:
                self.release(slot)  # never leave a slot marked busy
                raise
        return slot

    def release(self, slot: Slot, task: int | None = None, truncated: bool = False) -> None:
        """Free the slot; after a finished task (``task``) its `stop processing` line first."""
        with self._cond:
            if task is not None:
                slot.release(task, truncated)
            slot.busy = False
            self._cond.notify_all()

    def _assign(self, slot: Slot, key: str | None) -> None:
        """The slot now serves `key` (or no conversation): every other claim on it ends."""
        for other in [k for k, s in self.owner.items() if s == slot.id]:
            del self.owner[other]
        if key is not None:
            self.owner[key] = slot.id

    def _select(
        self, prompt: Sequence[int], id_slot: int, task: int, key: str | None = None
    ) -> tuple[Slot | None, bool]:
        if id_slot >= 0:
            slot = self.slots[id_slot]
            return (None, False) if slot.busy else (slot, False)
        if self.affinity and key in self.owner:
            return self._owned(self.slots[self.owner[key]], prompt, task)
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None, False
        if self.affinity:
            owned = set(self.owner.values())
            idle = [s for s in idle if s.id not in owned] or idle
        return self._by_similarity_or_lru(idle, prompt, task)

    def _owned(self, slot: Slot, prompt: Sequence[int], task: int) -> tuple[Slot | None, bool]:
        if slot.busy:
            return None, False
        lcp = common_prefix(slot.tokens, prompt)
        f_keep = lcp / len(slot.tokens) if slot.tokens else 0.0
        self.log.slot(
            INFO, "get_availabl", slot.id, task,
            f"selected slot by affinity, sim_best = {lcp / len(prompt):.3f}, f_keep = {f_keep:.3f}",
        )
        return slot, f_keep < 0.5

    def _by_similarity_or_lru(
        self, idle: list[Slot], prompt: Sequence[int], task: int
    ) -> tuple[Slot | None, bool]:
        best, sim_best = None, 0.0
        for slot in idle:
            if not slot.tokens:
                continue
            sim = common_prefix(slot.tokens, prompt) / len(prompt)
            if sim > sim_best and sim > self.SIMILARITY:
                best, sim_best = slot, sim
        if best is not None:
            f_keep = sim_best * len(prompt) / len(best.tokens)
            self.log.slot(
                INFO, "get_availabl", best.id, task,
                f"selected slot by LCP similarity, sim_best = {sim_best:.3f} "
                f"(> {self.SIMILARITY:.3f} thold), f_keep = {f_keep:.3f}",
            )
            return best, f_keep < 0.5
        lru = min(idle, key=lambda s: s.t_last)
        self.log.slot(
            INFO, "get_availabl", lru.id, task, f"selected slot by LRU, t_last = {int(lru.t_last * 1e6)}"
        )
        return lru, True
