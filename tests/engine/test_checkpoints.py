"""Unit tests of the cache mechanics (placement, restore rule, cascade, ring, RAM prompt cache,
and issue 12's affinity and retention fixes).

The model here is a stand-in whose recurrent "state" is a digest of every token it processed,
at the positions it processed them: a wrong restore, a skipped token or a stale checkpoint all
show as a digest that differs from a cold run. The same mechanics are exercised against the real
model through HTTP in test_case_study.py.
"""

from __future__ import annotations

import hashlib
import io
import random

import pytest
import torch

from shadowlab_engine.checkpoints import (
    CacheConfig,
    PromptCache,
    Slot,
    common_prefix,
    plan_checkpoints,
)
from shadowlab_engine.faults import Faults
from shadowlab_engine.slots import SlotPool
from shadowlab_engine.slotlog import EngineLog


class DigestState:
    def __init__(self) -> None:
        self.n_past = 0
        self.kv: list[int] = []
        self.digest = b""


class DigestSnapshot:
    def __init__(self, n_past: int, digest: bytes) -> None:
        self.n_past = n_past
        self.digest = digest
        self.nbytes = 32 * 1024


class DigestKV:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.nbytes = 128 * len(tokens)


class DigestModel:
    """Recurrent state = chained sha256 over (position, token)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (pos, n_tokens) of each forward()

    def new_state(self, n_ctx: int) -> DigestState:
        return DigestState()

    def forward(self, state: DigestState, tokens: list[int], pos: int) -> torch.Tensor:
        assert pos == state.n_past == len(state.kv), "state must be at pos"
        self.calls.append((pos, len(tokens)))
        for i, tok in enumerate(tokens):
            state.digest = hashlib.sha256(state.digest + f"{pos + i}:{tok}".encode()).digest()
        state.kv.extend(tokens)
        state.n_past += len(tokens)
        return torch.tensor(list(state.digest[:8]), dtype=torch.float32)

    def snapshot(self, state: DigestState) -> DigestSnapshot:
        return DigestSnapshot(state.n_past, state.digest)

    def restore(self, state: DigestState, snap: DigestSnapshot) -> None:
        state.n_past, state.digest = snap.n_past, snap.digest

    def trim_kv(self, state: DigestState, n_tokens: int) -> None:
        del state.kv[n_tokens:]

    def save_kv(self, state: DigestState, n_tokens: int) -> DigestKV:
        return DigestKV(state.kv[:n_tokens])

    def load_kv(self, state: DigestState, prefix: DigestKV) -> None:
        state.kv = list(prefix.tokens)


SEED_FLAGS = dict(n_ctx=8192, n_batch=2048, n_ubatch=512, ctx_checkpoints=64)


def make_prompts() -> tuple[list[int], list[int], list[int]]:
    rng = random.Random(0)
    a = [rng.randrange(0, 256) for _ in range(4560)]
    c = a[:2531] + [rng.randrange(0, 256) for _ in range(4947 - 2531)]
    c[2531] = (a[2531] + 1) % 256  # diverge exactly at 2531
    b = [300 + rng.randrange(0, 200) for _ in range(99)]  # disjoint id range: zero overlap
    return a, b, c


A, B, C = make_prompts()


def make_slot(faults: Faults = Faults(), **cfg) -> tuple[Slot, io.StringIO]:
    out = io.StringIO()
    log = EngineLog(verbosity=4, stream=out)
    slot = Slot(0, DigestModel(), CacheConfig(**{**SEED_FLAGS, **cfg}), log, faults)
    return slot, out


def run(slot: Slot, prompt: list[int], task: int, generated: int = 0):
    """One request: reuse decision, prefill, then `generated` evaluated tokens."""
    reuse = slot.begin(task, prompt)
    slot.prefill(task, prompt, reuse)
    for i in range(generated):
        slot.evaluate(500 + i)
    return reuse


def cold_digest(prompt: list[int]) -> bytes:
    slot, _ = make_slot()
    run(slot, prompt, 0)
    return slot.state.digest


def positions(slot: Slot) -> list[int]:
    return [c.n_tokens for c in slot.checkpoints]


# --- placement ------------------------------------------------------------------------------


def test_placement_tail_only_by_default():
    assert plan_checkpoints(CacheConfig(**SEED_FLAGS), 4560, 0) == [4044, 4556]
    assert plan_checkpoints(CacheConfig(**SEED_FLAGS), 4947, 0) == [4431, 4943]
    assert plan_checkpoints(CacheConfig(**SEED_FLAGS), 99, 0) == [95]


def test_placement_policy0_adds_batch_boundaries_and_prompt_end_adds_L():
    cfg = CacheConfig(**SEED_FLAGS, prompt_policy=0)
    assert plan_checkpoints(cfg, 4560, 0) == [2048, 4044, 4096, 4556]
    cfg = CacheConfig(**SEED_FLAGS, prompt_end=1)
    assert plan_checkpoints(cfg, 4560, 0) == [4044, 4556, 4560]


def test_placement_only_above_re_entry_and_off_with_zero_capacity():
    cfg = CacheConfig(**SEED_FLAGS, prompt_policy=0)
    assert plan_checkpoints(cfg, 4947, 2048) == [4096, 4431, 4943]
    assert plan_checkpoints(CacheConfig(**{**SEED_FLAGS, "ctx_checkpoints": 0}), 4560, 0) == []


def test_placement_chat_user_starts_spaced_by_min_step_and_always_the_last():
    cfg = CacheConfig(**{**SEED_FLAGS, "checkpoint_min_step": 1000})
    got = plan_checkpoints(cfg, 6000, 0, user_starts=[10, 900, 1500, 2000, 3000])
    # 10 and 900 are within 1000 of 0; 1500 is the first > 1000; 2000 within 1000 of 1500;
    # 3000 is the last one (kept regardless)
    assert got == [1500, 3000, 6000 - 4 - 512, 6000 - 4]


# --- restore rule and cascade ---------------------------------------------------------------


def test_defaults_a_then_c_is_forced_and_cascade_erases_all():
    slot, out = make_slot()
    run(slot, A, 0, generated=4)
    assert positions(slot) == [4044, 4556]
    reuse = run(slot, C, 1)
    assert (reuse.outcome, reuse.lcp, reuse.re_entry, reuse.erased) == ("forced", 2531, 0, 2)
    log = out.getvalue()
    assert "task 1 | forcing full prompt re-processing due to lack of cache data" in log
    assert "erased invalidated context checkpoint (pos_min = 4043, pos_max = 4043, n_tokens = 4044, n_swa = 0, pos_next = 0, size = 0.031 MiB)" in log
    assert "task 1 | cached n_tokens = 0, memory_seq_rm [0, end)" in log
    assert positions(slot) == [4431, 4943]
    assert slot.state.digest == cold_digest(C)


def test_policy0_a_then_c_restores_2048():
    slot, out = make_slot(prompt_policy=0)
    run(slot, A, 0, generated=4)
    assert positions(slot) == [2048, 4044, 4096, 4556]
    n_calls = len(slot.model.calls)
    reuse = run(slot, C, 1)
    assert (reuse.outcome, reuse.re_entry, reuse.erased) == ("restored", 2048, 3)
    log = out.getvalue()
    assert "restored context checkpoint (pos_min = 2047, pos_max = 2047, n_tokens = 2048, n_past = 2048, size = 0.031 MiB, took " in log
    assert log.count("pos_next = 2048") == 3
    assert "forcing" not in log
    assert positions(slot) == [2048, 4096, 4431, 4943]
    assert slot.state.digest == cold_digest(C)
    # prefill restarted at 2048 and was split at the checkpoints
    calls = slot.model.calls[n_calls:]
    assert calls[0][0] == 2048 and sum(n for _, n in calls) == 4947 - 2048


def test_zero_overlap_is_a_silent_reset_that_clears_the_ring():
    slot, out = make_slot(prompt_policy=0)
    run(slot, A, 0, generated=4)
    reuse = run(slot, B, 1, generated=4)
    assert (reuse.outcome, reuse.re_entry, reuse.erased) == ("silent_reset", 0, 4)
    assert "forcing" not in out.getvalue()
    assert positions(slot) == [95]
    reuse = run(slot, C, 2)
    assert (reuse.outcome, reuse.re_entry) == ("silent_reset", 0)
    assert slot.state.digest == cold_digest(C)


def test_append_restores_the_tail_checkpoint_and_pure_extension_restores_nothing():
    extra = [7] * 206
    slot, _ = make_slot()
    run(slot, A, 0, generated=5)
    reuse = run(slot, A + extra, 1)
    assert (reuse.outcome, reuse.re_entry) == ("restored", 4556)
    assert slot.state.digest == cold_digest(A + extra)

    slot, _ = make_slot()
    run(slot, A, 0, generated=0)
    reuse = run(slot, A + extra, 1)
    assert (reuse.outcome, reuse.re_entry, reuse.erased) == ("extended", 4560, 0)
    assert slot.state.digest == cold_digest(A + extra)


def test_repeated_prompt_re_evaluates_at_least_one_token():
    slot, _ = make_slot(prompt_end=1)
    run(slot, A, 0)
    reuse = run(slot, A, 1)
    # n_past = L - 1 = 4559: the prompt-end checkpoint (4560) is above it, 4556 is not
    assert (reuse.n_past, reuse.outcome, reuse.re_entry) == (4559, "restored", 4556)
    assert slot.state.digest == cold_digest(A)


def test_first_round_probe_misses_the_batch_checkpoint_by_91_tokens():
    probe = A[:1956] + [(A[1956] + 1) % 256] + A[1957:]
    slot, _ = make_slot(prompt_policy=0)
    run(slot, A, 0, generated=2)
    reuse = run(slot, probe, 1)
    assert (reuse.lcp, reuse.outcome, reuse.re_entry) == (1956, "forced", 0)


def test_cache_prompt_false_reuses_nothing():
    slot, _ = make_slot()
    run(slot, A, 0)
    reuse = slot.begin(1, A + [1, 2], cache_prompt=False)
    assert (reuse.outcome, reuse.re_entry) == ("silent_reset", 0)


def test_ring_bounded_oldest_erased_with_log_line():
    slot, out = make_slot(prompt_policy=0, ctx_checkpoints=2)
    run(slot, A, 0)
    assert positions(slot) == [4096, 4556]
    log = out.getvalue()
    assert "erasing old context checkpoint (pos_min = 2047, pos_max = 2047, n_tokens = 2048, size = 0.031 MiB)" in log
    assert "created context checkpoint 2 of 2 (pos_min = 4555, pos_max = 4555, n_tokens = 4556, size = 0.031 MiB, took " in log


def test_zero_capacity_disables_checkpoints():
    slot, out = make_slot(ctx_checkpoints=0)
    run(slot, A, 0, generated=1)
    assert positions(slot) == []
    assert run(slot, A + [1], 1).outcome == "forced"


def test_prefill_is_split_by_ubatch_and_at_each_checkpoint():
    slot, _ = make_slot(prompt_policy=0)
    run(slot, A, 0)
    ends = []
    for pos, n in slot.model.calls:
        ends.append(pos + n)
        assert n <= 512
    for n_tokens in (2048, 4044, 4096, 4556):
        assert n_tokens in ends
    snaps = {c.n_tokens: c.snapshot.n_past for c in slot.checkpoints}
    assert snaps == {2048: 2048, 4044: 4044, 4096: 4096, 4556: 4556}


# --- faults ---------------------------------------------------------------------------------


def test_stale_restore_re_enters_one_token_late_and_breaks_identity():
    slot, out = make_slot(Faults(stale_restore=True), prompt_policy=0)
    run(slot, A, 0, generated=3)
    reuse = run(slot, C, 1)
    assert (reuse.outcome, reuse.re_entry) == ("restored", 2049)
    assert "n_tokens = 2048, n_past = 2049" in out.getvalue()
    assert slot.state.digest != cold_digest(C)


def test_skip_cascade_keeps_invalid_checkpoints_and_a_later_turn_restores_one():
    z = C[:4300] + [(C[4300] + 1) % 256] + C[4301:]
    healthy, _ = make_slot()
    broken, out = make_slot(Faults(skip_cascade=True))
    for slot in (healthy, broken):
        run(slot, A, 0, generated=2)
        run(slot, C, 1, generated=2)
    assert "erased invalidated" not in out.getvalue()
    assert positions(broken) == [4044, 4556, 4431, 4943]
    assert run(healthy, z, 2).outcome == "forced"
    reuse = run(broken, z, 2)
    assert (reuse.outcome, reuse.re_entry) == ("restored", 4044)  # A's snapshot, stale
    assert healthy.state.digest == cold_digest(z) != broken.state.digest


# --- RAM prompt cache and slot selection ----------------------------------------------------


def make_pool(cram_mib: int, **cfg) -> tuple[SlotPool, io.StringIO]:
    slot, out = make_slot(**cfg)
    cache = PromptCache(cram_mib, slot.log) if cram_mib else None
    return SlotPool([slot], cache, slot.log), out


def pooled(pool: SlotPool, prompt: list[int], task: int):
    slot = pool.acquire(prompt, -1, task)
    try:
        return run(slot, prompt, task, generated=3), slot
    finally:
        slot.release(task, False)
        pool.release(slot)


def test_cram_rescues_a_b_a():
    pool, out = make_pool(8192)
    pooled(pool, A, 0)
    pooled(pool, B, 1)
    reuse, slot = pooled(pool, A, 2)
    assert (reuse.outcome, reuse.re_entry) == ("restored", 4556)
    assert "prompt cache: loaded n_tokens = 4563, checkpoints = 2" in out.getvalue()
    cold, _ = make_slot()
    run(cold, A, 0, generated=3)
    assert slot.state.digest == cold.state.digest


def test_without_cram_a_b_a_is_a_full_reprefill():
    pool, out = make_pool(0)
    pooled(pool, A, 0)
    pooled(pool, B, 1)
    reuse, _ = pooled(pool, A, 2)
    assert (reuse.outcome, reuse.re_entry) == ("silent_reset", 0)
    assert "prompt cache" not in out.getvalue()


def test_cram_a_b_c_loads_a_but_its_checkpoints_are_above_the_divergence():
    pool, _ = make_pool(8192)
    pooled(pool, A, 0)
    pooled(pool, B, 1)
    reuse, slot = pooled(pool, C, 2)
    assert (reuse.lcp, reuse.outcome) == (2531, "forced")
    pool, _ = make_pool(8192, prompt_policy=0)
    pooled(pool, A, 0)
    pooled(pool, B, 1)
    reuse, _ = pooled(pool, C, 2)
    assert (reuse.outcome, reuse.re_entry) == ("restored", 2048)


def test_cram_skips_entries_that_would_keep_under_a_quarter():
    pool, out = make_pool(8192)
    pooled(pool, A, 0)
    pooled(pool, B, 1)
    short = A[:1000] + [9] * 50  # keeps 1000/4563 < 25% of A's entry
    reuse, _ = pooled(pool, short, 2)
    assert "prompt cache: loaded" not in out.getvalue()
    assert reuse.outcome == "silent_reset"


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("prompt", [A, C])
def test_restore_gives_the_cold_state_at_every_checkpoint(prompt):
    """Restoring any checkpoint and re-prefilling from it reaches the cold state."""
    for n_tokens in plan_checkpoints(CacheConfig(**SEED_FLAGS, prompt_policy=0), len(prompt), 0):
        slot, _ = make_slot(prompt_policy=0)
        run(slot, prompt, 0, generated=2)
        variant = prompt[:n_tokens] + [(prompt[n_tokens] + 1) % 256] + prompt[n_tokens + 1 :] \
            if n_tokens < len(prompt) else prompt
        reuse = run(slot, variant, 1)
        assert reuse.re_entry <= n_tokens
        assert slot.state.digest == cold_digest(variant)


def test_two_slots_selected_by_lcp_similarity_then_lru():
    out = io.StringIO()
    log = EngineLog(verbosity=4, stream=out)
    cfg = CacheConfig(**SEED_FLAGS)
    slots = [Slot(i, DigestModel(), cfg, log) for i in range(2)]
    pool = SlotPool(slots, None, log)
    _, s_a = pooled(pool, A, 0)
    _, s_b = pooled(pool, B, 1)
    assert (s_a.id, s_b.id) == (0, 1)  # B shares nothing with slot 0: the idle LRU slot
    reuse, s_c = pooled(pool, C, 2)
    assert s_c.id == 0 and reuse.lcp == 2531  # C is > 10% similar to A
    assert "selected slot by LCP similarity, sim_best = 0.512 (> 0.100 thold)" in out.getvalue()
    held = pool.acquire(A, 1, 3)  # explicit id_slot
    assert held.id == 1
    pool.release(held)


def test_log_line_shape_and_levels():
    import re

    slot, out = make_slot(ctx_checkpoints=1)
    run(slot, A, 0, generated=1)
    run(slot, C, 1)
    lines = out.getvalue().splitlines()
    shape = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] slot [ a-z_()]{12}: id  0 \| task [01] \| \S")
    assert all(shape.match(line) for line in lines), lines
    forcing = [l for l in lines if "forcing" in l]
    assert forcing == [l for l in lines if l.endswith(
        " W slot   operator(): id  0 | task 1 | forcing full prompt re-processing due to lack of cache "
        "data (likely due to SWA or hybrid/recurrent memory, see "
        "https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)")]
    assert len(forcing) == 1
    # at the default level (3) the TRACE checkpoint lines are not printed; the rest are
    quiet = io.StringIO()
    slot = Slot(0, DigestModel(), CacheConfig(**{**SEED_FLAGS, "ctx_checkpoints": 1}),
                EngineLog(verbosity=3, stream=quiet))
    run(slot, A, 0, generated=1)
    run(slot, C, 1)
    text = quiet.getvalue()
    assert "created context" not in text and "erased invalidated" not in text
    assert "erasing old context checkpoint" in text and "forcing full prompt" in text
    assert "cached n_tokens = 0, memory_seq_rm [0, end)" in text


# --- issue 12: retention and affinity (off by default) -------------------------------------

RETAIN = dict(prompt_policy=0, retain_mib=64)


def test_retention_rescues_a_b_c_from_a_retained_mid_prompt_checkpoint():
    slot, out = make_slot(**RETAIN)
    run(slot, A, 0)
    run(slot, B, 1)  # B's cascade would erase A's ring: it is saved first
    reuse = run(slot, C, 2)
    assert (reuse.outcome, reuse.re_entry, reuse.erased) == ("restored", 2048, 3)
    assert slot.state.digest == cold_digest(C) and slot.state.kv == C
    text = out.getvalue()
    assert "task 1 | prompt cache: saved n_tokens = 4556, checkpoints = 4, size = 0.681 MiB, entries = 1" in text
    assert "task 2 | prompt cache: saved n_tokens = 95, checkpoints = 1" in text  # B's ring, displaced
    assert "task 2 | prompt cache: loaded n_tokens = 4556, checkpoints = 4, f_keep = 0.556, sim = 0.512" in text
    assert [e.n_tokens for e in slot.store.entries] == [95]
    # and the same sequence without retention is today's: C reuses nothing, nothing is saved
    plain, out = make_slot(prompt_policy=0)
    run(plain, A, 0)
    run(plain, B, 1)
    assert run(plain, C, 2).outcome == "silent_reset"
    assert "prompt cache" not in out.getvalue() and "cache size limit" not in out.getvalue()


def test_retention_prefers_the_slot_when_it_re_enters_as_far():
    slot, out = make_slot(**RETAIN)
    run(slot, A, 0)
    reuse = run(slot, C, 1)  # the slot restores 2048 itself; A's ring is saved (tail erased)
    assert (reuse.outcome, reuse.re_entry) == ("restored", 2048)
    assert "prompt cache: loaded" not in out.getvalue()
    reuse = run(slot, A, 2)  # A again: its retained entry re-enters at 4556, the slot at 2048
    assert (reuse.outcome, reuse.re_entry) == ("restored", 4556)
    assert slot.state.digest == cold_digest(A)


def test_retention_evicts_the_oldest_entry_beyond_the_budget_and_the_ring_size():
    rng = random.Random(5)
    D = [300 + rng.randrange(200) for _ in range(4400)]  # unrelated to A, B and C
    slot, out = make_slot(prompt_policy=0, retain_mib=1)  # one A-sized entry (0.681 MiB) fits
    for task, prompt in enumerate((A, D, B)):
        run(slot, prompt, task)
    assert "task 2 | - cache size limit reached, removing oldest entry (n_tokens = 4556, size = 0.681 MiB)" in out.getvalue()
    assert [e.n_tokens for e in slot.store.entries] == [4396]  # D's
    assert run(slot, C, 3).outcome == "silent_reset"  # A's checkpoints are gone
    slot, out = make_slot(prompt_policy=0, retain_mib=64, ctx_checkpoints=4)  # the ring bound
    for task, prompt in enumerate((A, D, B)):
        run(slot, prompt, task)
    assert "removing oldest entry (n_tokens = 4556" in out.getvalue()
    assert sum(len(e.checkpoints) for e in slot.store.entries) <= 4


def test_retention_replaces_an_entry_of_the_same_length():
    slot, out = make_slot(**RETAIN)
    D = [(t + 1) % 256 for t in A]  # A's length, nothing shared
    for task, prompt in enumerate((A, B, D, B)):
        run(slot, prompt, task)
    assert "task 3 | - cache entry replaced by a newer one of the same length (n_tokens = 4556" in out.getvalue()
    assert [e.tokens[:3] for e in slot.store.entries if e.n_tokens == 4556] == [tuple(D[:3])]


def test_wrong_conversation_restore_fault_restores_another_prefix_and_breaks_identity():
    broken, _ = make_slot(Faults(wrong_conversation_restore=True), **RETAIN)
    healthy, _ = make_slot(**RETAIN)
    for slot in (broken, healthy):
        for task, prompt in enumerate((A, B)):
            run(slot, prompt, task)
    assert run(broken, C, 2).re_entry == 4556  # A's tail checkpoint: C diverged at 2531
    assert run(healthy, C, 2).re_entry == 2048
    assert healthy.state.digest == cold_digest(C) != broken.state.digest


def make_pool_of(n: int, affinity: bool, **cfg) -> tuple[SlotPool, io.StringIO]:
    out = io.StringIO()
    log = EngineLog(verbosity=4, stream=out)
    slots = [Slot(i, DigestModel(), CacheConfig(**{**SEED_FLAGS, **cfg}), log) for i in range(n)]
    return SlotPool(slots, None, log, affinity=affinity), out


def keyed(pool: SlotPool, prompt: list[int], task: int, key: str | None):
    slot = pool.acquire(prompt, -1, task, key)
    try:
        return run(slot, prompt, task), slot
    finally:
        slot.release(task, False)
        pool.release(slot)


def test_affinity_keeps_a_conversation_on_its_slot_while_interlopers_take_the_other():
    rng = random.Random(7)
    X1 = [300 + rng.randrange(200) for _ in range(300)]
    X2 = [300 + rng.randrange(200) for _ in range(300)]
    outcomes = {}
    for affinity in (False, True):
        pool, out = make_pool_of(2, affinity, prompt_policy=0)
        keyed(pool, A, 0, "a")
        keyed(pool, X1, 1, None)
        _, x2_slot = keyed(pool, X2, 2, None)
        reuse, slot = keyed(pool, C, 3, "a")
        outcomes[affinity] = (x2_slot.id, slot.id, reuse.outcome, reuse.re_entry)
        if affinity:
            assert slot.state.digest == cold_digest(C)
            assert "task 3 | selected slot by affinity, sim_best = 0.512, f_keep = 0.555" in out.getvalue()
    assert outcomes[False] == (0, 1, "silent_reset", 0)  # X2 took A's slot by LRU
    assert outcomes[True] == (1, 0, "restored", 2048)


def test_affinity_ownership_one_slot_per_key_and_lru_when_all_are_owned():
    pool, out = make_pool_of(2, True)
    assert keyed(pool, A, 0, "a")[1].id == 0
    assert keyed(pool, B, 1, "b")[1].id == 1  # a new key: the unowned slot, not A's
    assert pool.owner == {"a": 0, "b": 1}
    assert keyed(pool, C, 2, None)[1].id == 0  # all owned: LCP similarity over every idle slot
    assert pool.owner == {"b": 1}  # an interloper ends a's claim
    assert keyed(pool, A, 3, "a")[1].id == 0  # a owns nothing now: unowned slot 0 first
    held = pool.acquire(B, 0, 4, "b")  # id_slot pins, and moves b's claim
    pool.release(held)
    assert pool.owner == {"b": 0}
