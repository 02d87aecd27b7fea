"""Cache mechanics shared by the reference engine and the harness, in neither of them.

The reference engine (engine/shadowlab_engine/checkpoints.py) runs these rules on real model
state; the simulator (shadowlab/simulate/model.py) on segments; the split controls
(shadowlab/judge/splits.py) rebuild a turn's batches with them. Keeping them here means the
harness never imports the engine under test (issue 22 step 4), and the simulator cannot drift
from the engine: it calls the very functions the engine calls. Pure functions and one frozen
dataclass, no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

__all__ = ["CacheConfig", "batch_ends", "choose_entry", "plan_checkpoints"]


@dataclass(frozen=True)
class CacheConfig:
    """The flags and env knobs that decide a slot's cache behaviour."""

    n_ctx: int = 8192
    n_batch: int = 2048
    n_ubatch: int = 512
    ctx_checkpoints: int = 32
    checkpoint_min_step: int = 8192
    prompt_policy: int = 1  # PXA_CKPT_PROMPT_POLICY: 1 = tail-only placement
    prompt_end: int = 0  # PXA_CKPT_PROMPT_END: 1 = one more at the prompt end
    retain_mib: int = 0  # SHADOWLAB_CKPT_RETAIN_MIB: retention store budget, 0 = off


def batch_ends(start: int, stops: Iterable[int], n_ubatch: int) -> list[int]:
    """The end (as n_tokens) of each forward() call that prefills from `start` to the largest
    stop: a break at every stop above `start`, and at most `n_ubatch` tokens per call."""
    ends, i = [], start
    for stop in sorted(p for p in set(stops) if p > start):
        while i < stop:
            i = min(i + n_ubatch, stop)
            ends.append(i)
    return ends


def plan_checkpoints(
    cfg: CacheConfig,
    n_prompt: int,
    re_entry: int,
    user_starts: Iterable[int] = (),
    last_checkpoint: int = 0,
) -> list[int]:
    """Positions (as n_tokens) where checkpoints are created while prefilling a prompt.

    POLICY=1: L-4-n_ubatch and L-4. POLICY=0: also every multiple of n_batch below L.
    PROMPT_END=1: also L. Chat: each user-message start spaced more than checkpoint_min_step
    from the previous checkpoint, and always the last one. Only positions above the re-entry
    point are created.
    """
    if cfg.ctx_checkpoints <= 0:
        return []
    positions = {n_prompt - 4 - cfg.n_ubatch, n_prompt - 4}
    if cfg.prompt_policy == 0:
        positions.update(range(cfg.n_batch, n_prompt, cfg.n_batch))
    if cfg.prompt_end:
        positions.add(n_prompt)
    starts = sorted(s for s in set(user_starts) if re_entry < s <= n_prompt)
    previous = last_checkpoint
    for i, start in enumerate(starts):
        if i == len(starts) - 1 or start - previous > cfg.checkpoint_min_step:
            positions.add(start)
            previous = start
    return sorted(p for p in positions if re_entry < p <= n_prompt and p > 0)


def choose_entry(slot_lcp: int, slot_len: int, prompt_len: int, candidates: Iterable[tuple[int, int, Any]],
                 empty_keep: float = 0.0, rounding: Callable[[float], float] = float) -> tuple[Any, float, float]:
    """The prompt-cache entry a request loads, as llama.cpp's `prompt_load` chooses it: the one
    that keeps more of itself (f_keep = lcp / its length, at least 25 %) AND matches more of the
    prompt (sim = lcp / prompt length) than the slot's own tokens and every earlier candidate.
    `candidates` yields (lcp with the prompt, length, entry). `empty_keep` is an empty slot's
    f_keep (llama.cpp: -1) and `rounding` the precision candidates are compared in (llama.cpp:
    float32); shadowlab.simulate passes both for llama-server. Returns (entry or None, f_keep, sim)."""
    f_keep_best = slot_lcp / slot_len if slot_len else empty_keep
    sim_best, best = slot_lcp / prompt_len, None
    for lcp, length, entry in candidates:
        f_keep, sim = rounding(lcp / length), rounding(lcp / prompt_len)
        if f_keep < 0.25:
            continue
        if f_keep_best < f_keep and sim_best < sim:
            f_keep_best, sim_best, best = f_keep, sim, entry
    return best, f_keep_best, sim_best
