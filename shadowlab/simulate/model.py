"""The simulator's cache model: what one policy does with each request, without an engine.

A token-level model over segments (shadowlab/traffic/model.py; no token list is built) of the cache
mechanics of the two engines shadowlab replays on, rule for rule (docs/DESIGN.md §10):

- the reference engine (engine/shadowlab_engine/checkpoints.py is the source of truth; the
  rules both share, checkpoint placement `plan_checkpoints` and the prompt-cache entry choice
  `choose_entry`, live in the neutral package `shadowlab_cache` that both import, so nothing is
  copied and the harness never imports the engine): slot selection by LCP similarity / LRU,
  `-cram` save and load, the affinity and retention fixes, restore (newest checkpoint with
  n_tokens <= n_past), cascade (`pos_max >= re-entry`), ring eviction;
- llama.cpp b11434's llama-server (tools/server/server-context.cpp, server-task.cpp): the
  prompt batch loop that places checkpoints at batch starts (L-4-n_ubatch, L-4, user-message
  starts, `--checkpoint-min-step`), the restore search, the cascade (`pos_max > pos_next`),
  the ring's too-close and oldest eviction, the RAM prompt cache (`-cram`: alloc/load/update
  and its token limit), `--cache-idle-slots`, LRU with ties to the last slot.

Requests are served one after another (each finishes before the next starts). Where a real
engine's behaviour depends on timing — a request that arrives while another is still running on
a server with several slots — the turn is listed as timing-dependent in every output.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shadowlab import traffic
from shadowlab.errors import TrafficError
from shadowlab.traffic import Request, Segment, common_prefix, truncate
from shadowlab_cache import CacheConfig, choose_entry, plan_checkpoints

# "refused": the prompt does not fit the policy's context (n_ctx); nothing was computed for it.
OUTCOMES = ("cold", "extended", "restored", "forced", "silent_reset", "refused")
MIB = 1024 * 1024


def _bounded(default: Any, low: float, high: float) -> Any:
    """A policy parameter and the closed range [low, high] it must lie in (finite). The bounds
    are what any engine could be configured with or measured at: beyond them a figure is a typo
    or a hostile input, never a policy (a negative cost, 10^8 slots)."""
    return field(default=default, metadata={"bounds": (low, high)})


TOKENS = float(traffic.MAX_PROMPT_TOKENS)  # no context holds more
TIB_MIB = float(1 << 20)  # a TiB, in MiB: beyond any host's RAM or any checkpoint
HOUR_MS = 3_600_000.0  # an hour, in ms: beyond any checkpoint's creation or restore


@dataclass(frozen=True)
class Policy:
    """One engine configuration to simulate. Flags keep llama-server's names; the cost side
    (per-checkpoint MiB and ms, state sizes) defaults to the case study's 35B measurements.
    Every number is bounded where it is declared (`_bounded`); a Policy outside them is refused."""

    name: str
    engine: str = "reference"  # "reference" | "llama.cpp"
    slots: int = _bounded(1, 1, 256)  # -np
    n_batch: int = _bounded(2048, 1, TOKENS)  # -b
    n_ubatch: int = _bounded(512, 1, TOKENS)  # -ub
    ctx_checkpoints: int = _bounded(64, 0, 4096)  # --ctx-checkpoints
    checkpoint_min_step: int = _bounded(8192, 0, TOKENS)  # --checkpoint-min-step
    prompt_policy: int = _bounded(1, 0, 1)  # PXA_CKPT_PROMPT_POLICY (reference engine)
    prompt_end: int = _bounded(0, 0, 1)  # PXA_CKPT_PROMPT_END (reference engine)
    cache_ram_mib: float = _bounded(0, -1, TIB_MIB)  # -cram (0 off; llama.cpp: -1 no limit)
    similarity: float = _bounded(0.1, 0, 1)  # --slot-prompt-similarity
    cache_idle_slots: bool = True  # llama.cpp --cache-idle-slots (with -cram and a unified KV)
    affinity: bool = False  # SHADOWLAB_SLOT_AFFINITY (reference engine)
    retain_mib: float = _bounded(0, 0, TIB_MIB)  # SHADOWLAB_CKPT_RETAIN_MIB (reference engine)
    chat: bool = False  # requests carry user-message starts (chat / message_delimiters); a captured
    # chat request (kind "chat") was sent as one, so its starts count whatever this says
    n_ctx: int = _bounded(8192, 1, TOKENS)  # -c: a prompt of n_ctx tokens or more is refused; llama.cpp's
    # prompt-cache token limit starts at n_ctx too
    # cost model (case study, 35B): per checkpoint and per token of attention KV
    checkpoint_mib: float = _bounded(62.9, 0, TIB_MIB)
    create_ms: float = _bounded(63.0, 0, HOUR_MS)
    restore_ms: float = _bounded(24.5, 0, HOUR_MS)  # 12-37 ms measured: the middle
    kv_mib_per_token: float = _bounded(0.02, 0, 1024)  # assumption (not measured): ~20 KiB/token
    state_mib: float = _bounded(62.9, 0, TIB_MIB)  # a slot's recurrent state in a -cram entry

    ENGINES = ("reference", "llama.cpp")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if "bounds" in f.metadata:
                _check_bound(self.name, f.name, getattr(self, f.name), *f.metadata["bounds"])


def _check_bound(policy: str, key: str, value: Any, low: float, high: float) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not low <= value <= high:  # NaN fails every test
        lo, hi = _shown_bound(low), _shown_bound(high)
        raise TrafficError(f"policy {policy!r}: {key} = {value!r} is outside its bounds [{lo}, {hi}]",
                           hint=f"give {key} a value from {lo} to {hi}")


def _shown_bound(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


# The case study's flags. Its prompts reached 258,037 tokens, so its context held them: 262,144
# is its model's training context (Qwen3.5-35B-A3B), what llama-server's `-c 0` default takes.
CASE_STUDY_CONTEXT = 262_144
PRODUCTION = dict(ctx_checkpoints=64, cache_ram_mib=0, slots=1, n_ctx=CASE_STUDY_CONTEXT)
PRESETS: dict[str, dict[str, Any]] = {
    "baseline": dict(PRODUCTION),
    "policy0": dict(PRODUCTION, prompt_policy=0),
    "prompt-end": dict(PRODUCTION, prompt_end=1),
    "cram": dict(PRODUCTION, cache_ram_mib=8192),
    "slots4": dict(PRODUCTION, slots=4),
    "affinity": dict(PRODUCTION, slots=4, affinity=True),
    "affinity+policy0": dict(PRODUCTION, slots=4, affinity=True, prompt_policy=0),
    "retention": dict(PRODUCTION, retain_mib=8192),
    "retention+policy0": dict(PRODUCTION, retain_mib=8192, prompt_policy=0),
    "llama-1slot": dict(PRODUCTION, engine="llama.cpp"),
    "llama-cram": dict(PRODUCTION, engine="llama.cpp", cache_ram_mib=8192),
    "llama-slots4": dict(PRODUCTION, engine="llama.cpp", slots=4),
    "llama-defaults": dict(engine="llama.cpp", slots=4, ctx_checkpoints=32, cache_ram_mib=8192,
                           n_ctx=CASE_STUDY_CONTEXT),
}
_FIELDS = {f.name: f for f in dataclasses.fields(Policy)}


def parse_policy(text: str) -> Policy:
    """`NAME` (a preset) or `NAME:key=value,key=value` (a preset with parameters changed)."""
    name = text.partition(":")[0]
    if name not in PRESETS:
        raise TrafficError(f"unknown policy {name!r}", hint="presets: " + ", ".join(PRESETS))
    kw: dict[str, Any] = dict(PRESETS[name])
    for key, value in _params(text):
        kw[key] = _value(key, value, text)
    policy = Policy(name=text, **kw)
    _check_policy(policy)
    return policy


def _params(text: str) -> list[tuple[str, str]]:
    """The `key=value` items after a policy's `NAME:`, keys with `-` read as `_`."""
    out = []
    for item in filter(None, text.partition(":")[2].split(",")):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in _FIELDS or key == "name":
            raise TrafficError(f"policy {text!r}: {item!r} is not key=value with a known key",
                               hint="keys: " + ", ".join(k for k in _FIELDS if k != "name"))
        out.append((key, value.strip()))
    return out


def _value(key: str, value: str, text: str) -> Any:
    kind = {"int": int, "float": float, "bool": bool, "str": str}[str(_FIELDS[key].type)]
    try:
        if kind is bool:
            if value.lower() not in ("0", "1", "true", "false"):
                raise ValueError
            return value.lower() in ("1", "true")
        return kind(value)  # bounds (finite, in range) are checked by Policy itself
    except ValueError:
        what = {int: "an integer", float: "a number", bool: "true or false (1 or 0)"}.get(kind, "text")
        raise TrafficError(f"policy {text!r}: {key}={value!r} is not {what}") from None


def _check_policy(p: Policy) -> None:
    if p.engine not in Policy.ENGINES:
        raise TrafficError(f"policy {p.name!r}: engine must be one of {Policy.ENGINES}")
    if p.engine == "llama.cpp" and (p.affinity or p.retain_mib or p.prompt_policy != 1 or p.prompt_end):
        raise TrafficError(f"policy {p.name!r}: affinity, retention and the fork's POLICY/PROMPT_END knobs "
                           "exist only in the reference engine")


# --------------------------------------------------------------------------- state


@dataclass
class _Slot:
    id: int
    tokens: tuple[Segment, ...] = ()
    n: int = 0  # tokens the slot's state has processed (prompt + evaluated output)
    ckpts: list[tuple[int, int]] = field(default_factory=list)  # (n_tokens, task), oldest first
    t_last: int = -1  # llama.cpp: -1 never used; the reference engine uses 0
    store: list[tuple[tuple[Segment, ...], int, tuple[tuple[int, int], ...]]] = field(default_factory=list)


@dataclass(frozen=True)
class Turn:
    """What one request did under one policy."""

    index: int
    slot: int
    outcome: str
    prompt_tokens: int
    reused: int
    processed: int
    created: int
    restored: bool
    erased: int
    loaded: str = ""  # "cram" | "retention" when a saved entry was loaded


class _Sim:
    """One policy over one traffic, request by request."""

    def __init__(self, policy: Policy) -> None:
        self.p = policy
        self.llama = policy.engine == "llama.cpp"
        first_t = -1 if self.llama else 0
        self.slots = [_Slot(i, t_last=first_t) for i in range(policy.slots)]
        self.clock = 0
        self.busy: set[int] = set()  # slots serving a request (a schedule's starts without their ends)
        self.scheduled = False  # t_last then moves at each request's end, as the engines release
        self.owner: dict[str, int] = {}
        self.cram: list[tuple[tuple[Segment, ...], int, tuple[tuple[int, int], ...]]] = []
        self.cfg = CacheConfig(n_batch=policy.n_batch, n_ubatch=policy.n_ubatch,
                               ctx_checkpoints=policy.ctx_checkpoints,
                               checkpoint_min_step=policy.checkpoint_min_step,
                               prompt_policy=policy.prompt_policy, prompt_end=policy.prompt_end)

    # -- one request ---------------------------------------------------------------------

    def serve(self, index: int, r: Request) -> Turn:
        prompt, L = r.segments, r.prompt_tokens
        if L >= self.p.n_ctx and not self.llama:
            # The reference engine refuses it while reading the request (HTTP 400
            # exceed_context_size_error): no slot is chosen, nothing changes.
            return Turn(index, -1, "refused", L, 0, 0, 0, False, 0)
        slot, update = self._select(prompt, L, r.conversation)
        loaded = ""
        if update and self.p.cache_ram_mib and (slot.n or self.llama):
            self._cram_save(slot)
            loaded = "cram" if self._cram_load(slot, prompt, L) else ""
        if self.llama and self.p.cache_ram_mib and self.p.cache_idle_slots:
            for other in self.slots:
                if other is not slot and other.id not in self.busy:
                    if other.n:
                        self._cram_save(other)
                    other.tokens, other.n, other.ckpts = (), 0, []
        if self.llama and L >= self.p.n_ctx:
            # llama-server b11434 refuses it only once the task reached its slot (update_slots:
            # "request (%d tokens) exceeds the available context size (%d tokens), try increasing
            # it", HTTP 400 exceed_context_size_error): the slot was chosen and the prompt cache
            # saved and loaded for it, the slot is released as it is.
            if not self.scheduled:
                self.end(slot)
            return Turn(index, slot.id, "refused", L, 0, 0, 0, False, 0, loaded)
        if self.llama:
            outcome, re_entry, restored, erased = self._begin_llama(slot, prompt, L)
            created = self._place_llama(slot, index, r, re_entry)
        else:
            outcome, re_entry, restored, erased, from_store = self._begin_reference(slot, prompt, L)
            loaded = "retention" if from_store else loaded
            created = self._place_reference(slot, index, r, re_entry)
        out = max(0, r.output_length - 1)  # the last sampled token is never evaluated
        slot.tokens = prompt + ((Segment(traffic.output_block(index), 0, out),) if out else ())
        slot.n = L + out
        if not self.scheduled:
            self.end(slot)
        return Turn(index, slot.id, outcome, L, re_entry, L - re_entry, created, restored, erased, loaded)

    def end(self, slot: _Slot) -> None:
        """A request on `slot` ended: the slot is free and the most recently used."""
        self.busy.discard(slot.id)
        self.clock += 1
        slot.t_last = self.clock

    # -- slot selection ------------------------------------------------------------------

    def _select(self, prompt: tuple[Segment, ...], L: int, key: str | None) -> tuple[_Slot, bool]:
        if self.p.affinity and key in self.owner:
            slot = self.slots[self.owner[key]]
            f_keep = common_prefix(slot.tokens, prompt) / slot.n if slot.n else 0.0
            return slot, f_keep < 0.5
        idle = [s for s in self.slots if s.id not in self.busy] or self.slots
        candidates = idle
        if self.p.affinity:
            owned = set(self.owner.values())
            candidates = [s for s in idle if s.id not in owned] or idle
        slot, update = self._by_similarity_or_lru(candidates, prompt, L)
        if self.p.affinity:
            for k in [k for k, s in self.owner.items() if s == slot.id]:
                del self.owner[k]
            if key is not None:
                self.owner[key] = slot.id
        return slot, update

    def _by_similarity_or_lru(self, slots: list[_Slot], prompt: tuple[Segment, ...], L: int) -> tuple[_Slot, bool]:
        best, sim_best = None, 0.0
        if self.p.similarity:
            for s in slots:
                if not s.n:
                    continue
                sim = _f32(common_prefix(s.tokens, prompt) / L) if self.llama else common_prefix(s.tokens, prompt) / L
                if sim > sim_best and sim > self.p.similarity:
                    best, sim_best = s, sim
        if best is not None:
            return best, sim_best * L / best.n < 0.5
        if self.llama:  # `t_last_used <= t_last`: ties go to the last slot
            lru = slots[0]
            for s in slots[1:]:
                if s.t_last <= lru.t_last:
                    lru = s
            return lru, True
        return min(slots, key=lambda s: s.t_last), True

    # -- RAM prompt cache ------------------------------------------------------------------

    def _entry_mib(self, n: int, ckpts: Sequence[Any]) -> float:
        kv = self.p.kv_mib_per_token * n if self.llama else 0.0  # the reference saves a fixed-size state
        return self.p.state_mib + kv + len(ckpts) * self.p.checkpoint_mib

    def _cram_save(self, slot: _Slot) -> None:
        if not slot.n or any(common_prefix(e[0], slot.tokens) == slot.n for e in self.cram):
            return
        size, limit = self._entry_mib(slot.n, slot.ckpts), self.p.cache_ram_mib
        if self.llama:
            if limit > 0 and size > limit:
                return
            self.cram = [e for e in self.cram if common_prefix(e[0], slot.tokens) < e[1]]
            while limit > 0 and self.cram and self._cram_mib() + size > limit:
                self.cram.pop(0)
            self.cram.append((slot.tokens, slot.n, tuple(slot.ckpts)))
            self._cram_update()
            return
        self.cram = [e for e in self.cram if common_prefix(e[0], slot.tokens) < e[1]]
        if size > limit:
            return
        self.cram.append((slot.tokens, slot.n, tuple(slot.ckpts)))
        while self._cram_mib() > limit:
            self.cram.pop(0)

    def _cram_mib(self) -> float:
        return sum(self._entry_mib(e[1], e[2]) for e in self.cram)

    def _cram_update(self) -> None:
        """llama.cpp's server_prompt_cache::update: the size limit, then the token limit
        (n_ctx, raised to what the size limit holds at the cache's bytes per token)."""
        limit = self.p.cache_ram_mib
        while limit > 0 and self.cram and self._cram_mib() > limit:
            self.cram.pop(0)
        n_tokens = sum(e[1] for e in self.cram)
        per_token = max(1.0, self._cram_mib() * MIB / max(1, n_tokens))
        limit_tokens = max(self.p.n_ctx, int(limit * MIB / per_token)) if limit > 0 else self.p.n_ctx
        while self.cram and sum(e[1] for e in self.cram) > limit_tokens:
            self.cram.pop(0)

    def _cram_load(self, slot: _Slot, prompt: tuple[Segment, ...], L: int) -> bool:
        best, _, _ = choose_entry(common_prefix(slot.tokens, prompt), slot.n, L,
                                  ((common_prefix(e[0], prompt), e[1], e) for e in self.cram),
                                  empty_keep=-1.0 if self.llama else 0.0, rounding=_f32 if self.llama else float)
        if best is None:
            return False
        self.cram.remove(best)
        slot.tokens, slot.n, slot.ckpts = best[0], best[1], list(best[2])
        return True

    # -- reference engine: restore decision, retention, cascade, placement ---------------

    def _begin_reference(self, slot: _Slot, prompt: tuple[Segment, ...], L: int):
        lcp = common_prefix(slot.tokens, prompt)
        n_past = min(lcp, L - 1)
        outcome, re_entry, ckpt = self._decide_reference(slot, n_past)
        if self.p.retain_mib > 0:
            better = self._take_better(slot, prompt, L, re_entry)
            self._retain(slot, re_entry, better)
            if better is not None:
                tokens, _, ring, c = better
                slot.tokens, slot.ckpts = tokens, list(ring)
                erased = self._cascade(slot, c)
                return "restored", c, True, erased, True
        erased = self._cascade(slot, re_entry)
        return outcome, re_entry, ckpt is not None, erased, False

    def _decide_reference(self, slot: _Slot, n_past: int) -> tuple[str, int, int | None]:
        if not slot.n:
            return "cold", 0, None
        if n_past == slot.n:
            return "extended", n_past, None
        if n_past == 0:
            return "silent_reset", 0, None
        for n, _ in reversed(slot.ckpts):
            if n <= n_past:
                return "restored", n, n
        return "forced", 0, None

    def _cascade(self, slot: _Slot, re_entry: int) -> int:
        """Erase the checkpoints above the re-entry point: the reference engine erases
        pos_max >= re-entry, llama.cpp pos_max > pos_next (pos_max = n_tokens - 1)."""
        keep = [c for c in slot.ckpts if (c[0] - 1 <= re_entry if self.llama else c[0] - 1 < re_entry)]
        erased = len(slot.ckpts) - len(keep)
        slot.ckpts = keep
        return erased

    def _take_better(self, slot: _Slot, prompt: tuple[Segment, ...], L: int, re_entry: int):
        best = None
        for e in slot.store:  # oldest first: `>=` keeps the newest of equals
            lcp = common_prefix(e[0], prompt)
            n_past = min(lcp, L - 1)
            c = next((n for n, _ in reversed(e[2]) if n <= n_past), None)
            if c is not None and (best is None or c >= best[3]):
                best = (*e, c)
        if best is None or best[3] <= re_entry:
            return None
        slot.store.remove(best[:3])
        return best

    def _retain(self, slot: _Slot, re_entry: int, better: Any) -> None:
        """docs/DESIGN.md §1 retention 3: save the ring when it is about to be lost."""
        if better is None and all(n - 1 < re_entry for n, _ in slot.ckpts):
            return
        n = min(max((c[0] for c in slot.ckpts), default=0), slot.n)
        ring = tuple(c for c in slot.ckpts if c[0] <= n)
        if not ring or (better is not None and better[1] == n):
            return
        slot.store = [e for e in slot.store if e[1] != n]
        slot.store.append((truncate(slot.tokens, n), n, ring))
        size = lambda e: len(e[2]) * self.p.checkpoint_mib + e[1] * self.p.kv_mib_per_token  # noqa: E731
        while slot.store and (sum(len(e[2]) for e in slot.store) > self.p.ctx_checkpoints
                              or sum(size(e) for e in slot.store) > self.p.retain_mib):
            slot.store.pop(0)

    def _place_reference(self, slot: _Slot, task: int, r: Request, re_entry: int) -> int:
        last = slot.ckpts[-1][0] if slot.ckpts else 0
        starts = r.user_starts if self.p.chat or r.kind == "chat" else ()
        planned = plan_checkpoints(self.cfg, r.prompt_tokens, re_entry, starts, last)
        for n in planned:
            while len(slot.ckpts) >= self.p.ctx_checkpoints:
                slot.ckpts.pop(0)
            slot.ckpts.append((n, task))
        return len(planned)

    # -- llama.cpp b11434 ------------------------------------------------------------------

    def _begin_llama(self, slot: _Slot, prompt: tuple[Segment, ...], L: int):
        n_past = common_prefix(slot.tokens, prompt)
        thold = max(0, n_past - (0 if n_past < L else 1))
        outcome, restored = ("cold" if not slot.n else "silent_reset"), False
        if 0 < n_past <= slot.n:
            outcome = "extended"
            if slot.n - 1 >= thold:  # the recurrent state sits past the shared prefix
                found = next((n for n, _ in reversed(slot.ckpts)
                              if n - 1 <= n_past and (n - 1 < thold or n - 1 == 0)), None)
                if found is None:
                    outcome, n_past = "forced", 0
                else:
                    outcome, n_past, restored = "restored", min(n_past, found), True
        erased = self._cascade(slot, n_past)
        if n_past == L and n_past > 0:
            n_past -= 1  # [TAG_PROMPT_LOGITS]: at least one token is evaluated
        return outcome, n_past, restored, erased

    def _place_llama(self, slot: _Slot, task: int, r: Request, p0: int) -> int:
        """The prompt batch loop of update_slots: a checkpoint is taken at a batch's start
        (before it is decoded) when the batch ends the prompt, starts near its end (within
        n_ubatch), or starts a user message; batches break at L-4-n_ubatch, L-4 and at user
        starts."""
        if self.p.ctx_checkpoints <= 0:
            return 0
        p, L = self.p, r.prompt_tokens
        starts = sorted(s for s in r.user_starts if s > 0) if p.chat or r.kind == "chat" else []
        user = set(starts)
        last_user = starts[-1] if starts else -1
        tails = sorted({L - min(p.n_batch, 4 + p.n_ubatch), L - min(p.n_batch, 4)})
        created, n = 0, p0
        while n < L:
            start = n
            end = min(L, start + p.n_batch)
            end = min([end, *(t for t in tails if t > start)])
            for u in starts:
                if start < u < end and (u == last_user or not slot.ckpts or u > slot.ckpts[-1][0] + p.checkpoint_min_step):
                    end = u
                    break
            near_end = L < end + p.n_ubatch
            do = end == L or start in user or near_end
            do = do and start > 0  # an empty memory has nothing to checkpoint (pos_min < 0)
            do = do and (not slot.ckpts or start == last_user or near_end
                         or start > slot.ckpts[-1][0] + p.checkpoint_min_step)
            if do:
                self._create_llama(slot, task, start)
                created += 1
            n = end
        return created

    def _create_llama(self, slot: _Slot, task: int, n_tokens: int) -> None:
        """create_checkpoint: when the ring is (nearly) full, first drop other tasks'
        checkpoints too close to the one before them, then the oldest; a checkpoint at the same
        n_tokens is superseded."""
        p, ring = self.p, list(slot.ckpts)
        i, last = 0, -1
        while len(ring) + 1 >= p.ctx_checkpoints and i < len(ring):
            n, owner = ring[i]
            if owner != task and last >= 0 and n <= last + p.checkpoint_min_step:
                del ring[i]
                continue
            last, i = n, i + 1
        while len(ring) >= p.ctx_checkpoints:
            ring.pop(0)
        ring = [c for c in ring if c[0] != n_tokens]
        ring.append((n_tokens, task))
        slot.ckpts = ring


def _f32(x: float) -> float:
    """llama.cpp computes similarities in float: round like it does."""
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


# --------------------------------------------------------------------------- a whole run


def simulate(requests: Sequence[Request], policy: Policy,
             schedule: Sequence[tuple[str, int]] | None = None) -> list[Turn]:
    """Each request's turn under the policy, by request index. Without a schedule the requests
    run one after another in their order. A ``schedule`` (`schedule_of` a run's log) gives
    requests that overlapped: ``("start", i)`` and ``("end", i)`` in the order the engine
    started and released them; a request starts on a slot no unfinished request holds."""
    sim = _Sim(policy)
    if schedule is None:
        return [sim.serve(i, r) for i, r in enumerate(requests)]
    sim.scheduled = True
    turns: dict[int, Turn] = {}
    for step, i in schedule:
        if step == "start":
            turns[i] = sim.serve(i, requests[i])
            if turns[i].slot >= 0:  # a request the reference engine refused held no slot
                sim.busy.add(turns[i].slot)
        elif step == "end" and i in turns:
            if turns[i].slot >= 0:
                sim.end(sim.slots[turns[i].slot])
        else:
            raise ValueError(f"schedule step {(step, i)!r}: not a start, or the end of a request not started")
    missing = sorted(set(range(len(requests))) - set(turns))
    if missing:
        raise ValueError(f"the schedule starts no request {missing[0]} ({len(missing)} requests missing)")
    return [turns[i] for i in range(len(requests))]


TURN_CLASSES = ("after_own_turn", "after_other_request", "interloper")


def turn_class(requests: Sequence[Request], i: int) -> str:
    """Where a request stands in the lane: a conversation turn right after its own conversation's
    previous request (the A→C pair), a conversation turn after some other request (A→B→C: the
    erase cascade's victim), or an interloper."""
    r = requests[i]
    if r.conversation is None:
        return "interloper"
    if i > 0 and requests[i - 1].conversation == r.conversation:
        return "after_own_turn"
    return "after_other_request"
