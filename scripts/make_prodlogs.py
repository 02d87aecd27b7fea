"""Production-shaped llama-server logs from a known ground truth (seeded, deterministic).

    python scripts/make_prodlogs.py --out DIR [--format b11434|ik] [--seed 0] [--requests 400]
        [--servers 1] [--slots 2] [--conversations 6] [--pieces 3] [--days 3] [--dense]

Writes, per server, the log rotated into pieces (``server0.log`` newest, ``server0.log.1``,
``server0.log.2.gz``, ... oldest; pieces 2+ gzip) and ``truth.json``: every request as the
simulated engine served it, and the figures ``shadowlab logs`` must report.

Traffic: conversations that grow turn by turn (a system prompt, then user / reply pairs; some
carry a re-rendered block right after the system prompt that changes every turn, which moves
their divergence point deep into the prompt), interleaved with interloper jobs of several sizes
that share nothing (or only the 3-token chat header) with anything. Prompts are lists of segments
(id, length): the longest common prefix is counted without materialising tokens.

Engine mechanics (llama.cpp b11434, BRIEF §3, as the real captures in tests/fixtures/logs show):
slot choice by LCP similarity above 0.10, else least recently used; n_past = LCP (L - 1 for a
repeated prompt); a partial match restores the newest checkpoint with pos_max < n_past, else
prints the forcing line when n_past > 0 and re-processes everything (silently when n_past = 0);
then every checkpoint with pos_max > pos_next is erased; checkpoints are created at L-4-n_ubatch
and L-4 (those above n_past), the oldest erased when the ring is full. ik_llama.cpp: the same
restore rule, checkpoints after each 2048-token batch and at L-5, no ``new prompt`` line, time as
Unix seconds on its ``INFO [...]`` lines.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shadowlab.logs import analysis as logs, lifecycle  # noqa: E402 - the figures' definitions, one source of truth

N_UBATCH, N_BATCH, RING, SIZE_MIB = 512, 2048, 32, 62.875
FORCING = ("forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent "
           "memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)")
HEADER = ("hdr", 3)


@dataclass
class Slot:
    cache: list[tuple[Any, int]] = field(default_factory=list)
    ring: list[dict[str, Any]] = field(default_factory=list)  # {"n": n_tokens, "by": request index}
    t_last: int = -1
    erased_by_last: list[dict[str, Any]] = field(default_factory=list)
    used: bool = False


def lcp(a: list[tuple[Any, int]], b: list[tuple[Any, int]]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += x[1]
    return n


def length(p: list[tuple[Any, int]]) -> int:
    return sum(n for _, n in p)


def traffic(rng: random.Random, requests: int, conversations: int) -> list[tuple[str, list]]:
    """(kind, prompt segments) in arrival order."""
    convs = []
    for c in range(conversations):
        convs.append({"id": c, "sys": (f"sys{c}", rng.choice([600, 2500, 6000, 15000])),
                      "volatile": c % 2 == 0, "hist": [], "turn": 0})
    out = []
    for i in range(requests):
        if rng.random() < 0.45:
            size = rng.choice([99, 700, 3000, 9000])
            segs = ([HEADER] if rng.random() < 0.5 else []) + [(f"job{i}", size)]
            out.append(("interloper", segs))
            continue
        c = rng.choice(convs)
        c["turn"] += 1
        user = (f"u{c['id']}.{c['turn']}", rng.randint(20, 400))
        segs = [HEADER, c["sys"]]
        if c["volatile"]:
            segs.append((f"vol{c['id']}.{c['turn']}", rng.randint(40, 200)))
        segs += c["hist"] + [user]
        reply = (f"r{c['id']}.{c['turn']}", 16)
        c["hist"] = c["hist"] + [user, reply]
        out.append((f"conv{c['id']}", segs))
    return out


class Server:
    def __init__(self, fmt: str, slots: int, rng: random.Random, t0: float, span_s: float, n: int,
                 chatter: bool = True):
        self.fmt, self.rng, self.chatter = fmt, rng, chatter
        self.slots = [Slot() for _ in range(slots)]
        self.lines: list[str] = []
        self.t = t0
        self.gap = span_s / max(1, n)
        self.task = 0
        self.truth: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- line shapes
    def ts(self) -> str:
        us = int(self.t * 1e6)
        return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"

    def tick(self, s: float = 0.00002) -> None:
        self.t += s

    def slot_line(self, func: str, sid: int, task: int, msg: str, level: str = "I") -> None:
        self.tick()
        if self.fmt == "b11434":
            self.lines.append(f"{self.ts()} {level} slot {func:>12}: id {sid:2d} | task {task} | {msg}")
        else:
            self.lines.append(f"slot {func}: id {sid:2d} | task {task} | {msg}")

    def srv_line(self, func: str, msg: str) -> None:
        self.tick()
        if self.fmt == "b11434":
            self.lines.append(f"{self.ts()} I srv  {func:>12}: {msg}")

    def info(self, func: str, msg: str, kv: str) -> None:
        self.tick()
        self.lines.append(f'INFO [{func:>24}] {msg} | tid="140178915811968" timestamp={int(self.t)}{" " + kv if kv else ""}')

    def ck(self, n: int, extra: str = "") -> str:
        if self.fmt == "b11434":
            return f"pos_min = {n - 1}, pos_max = {n - 1}, n_tokens = {n}{extra}, size = {SIZE_MIB:.3f} MiB"
        return f"pos_min = {n - 1}, pos_max = {n - 1}, size = {SIZE_MIB:.3f} MiB"

    # ---------------------------------------------------------------- one request
    def serve(self, index: int, kind: str, prompt: list) -> None:
        rng = self.rng
        self.t += self.gap * rng.uniform(0.5, 1.5)
        L = length(prompt)
        sid, shared, method = self.choose(prompt, L)
        slot = self.slots[sid]
        task = self.task
        self.task += rng.randint(1, 20)  # task ids grow with every token batch a server queues
        fresh = not slot.used
        slot.used = True
        alive_before = [c["n"] for c in slot.ring]
        cached = length(slot.cache)
        n_past = min(shared, L - 1)
        restored = None
        forced = False
        erased: list[dict[str, Any]] = []
        if self.fmt == "b11434":
            self.sampler_lines(sid)
            self.slot_line("launch_slot_", sid, task, "processing task, is_child = 0")
            self.slot_line("operator()", sid, task, f"new prompt, n_ctx_slot = 262144, n_keep = 0, task.n_tokens = {L}")
        else:
            self.ik_before(cached)
            self.info("launch_slot_with_task", "slot is processing task", f"id_slot={sid} id_task={task}")
            self.ik_cache(sid, task, cached, n_past, bool(slot.cache and n_past < cached))
        if slot.cache and n_past < cached:  # partial match: the recurrent state cannot rewind
            if n_past > 0:
                for c in reversed(slot.ring):
                    if self.fmt == "b11434":
                        self.slot_line("operator()", sid, task, f"checking checkpoint with [{c['n'] - 1}, {c['n'] - 1}] against {n_past}...")
                    if c["n"] - 1 < n_past:
                        restored = c
                        break
                if restored is not None:
                    n_past = restored["n"]
                    took = round(rng.uniform(12, 37), 2)
                    if self.fmt == "b11434":
                        self.slot_line("operator()", sid, task, f"restored context checkpoint (pos_min = {n_past - 1}, pos_max = {n_past - 1}, n_tokens = {n_past}, n_past = {n_past}, size = {SIZE_MIB:.3f} MiB)")
                    else:
                        self.slot_line("apply_checkp", sid, task, f"restored context checkpoint took {took:5.2f} ms ({self.ck(n_past)})")
                else:
                    forced = True
                    self.slot_line("operator()", sid, task, FORCING)
                    n_past = 0
            for c in list(slot.ring):
                if c is not restored and c["n"] - 1 > n_past:  # llama.cpp: pos_max > pos_next
                    slot.ring.remove(c)
                    erased.append(c)
                    extra = f", n_swa = 0, pos_next = {n_past}"
                    func = "operator()" if self.fmt == "b11434" else "apply_checkp"
                    self.slot_line(func, sid, task, f"erased invalidated context checkpoint ({self.ck(c['n'], extra)})")
        reused = n_past
        self.trim(sid, task, n_past)
        created = self.process(sid, task, index, n_past, L, slot)
        processed = L - n_past
        ms = round(processed / 2200.0 * 1000 * rng.uniform(0.8, 1.25), 2)
        self.timing(sid, task, ms, processed, L)
        slot.cache = prompt + [(f"gen{index}", 16)]
        slot.t_last = index
        if restored is not None:
            outcome = "restored"
        elif forced:
            outcome = "forced"
        elif reused:
            outcome = "extended"
        elif fresh and not erased:
            outcome = "cold"
        else:
            outcome = "silent_reset"
        stated = self.fmt == "b11434" and cached > 0  # a `checking sim` line names every non-empty slot
        retention = outcome in ("forced", "silent_reset") and any(c["n"] < L for c in slot.erased_by_last)
        slot.erased_by_last = [c for c in erased if c["by"] != index]
        true_lcp = shared
        if stated:
            baseline = outcome != "cold" and shared < lifecycle.BASELINE_TOKENS
        else:
            baseline = outcome != "cold" and not forced and reused < lifecycle.BASELINE_TOKENS
            shared = reused if not stated else shared
        self.truth.append({
            "index": index, "kind": kind, "slot": sid, "task": task, "time": round(self.t, 6),
            "prompt_tokens": L, "shared_prefix": shared, "lcp": true_lcp,
            "shared_source": "lcp" if stated else "re_entry", "reused": reused, "processed": processed,
            "prefill_ms": ms, "outcome": outcome, "created": created, "erased_invalidated": len(erased),
            "restored": restored["n"] if restored else None, "alive_before": alive_before, "method": method,
            "placement": forced and bool(alive_before), "retention": retention, "baseline_loss": baseline,
        })

    # ---------------------------------------------------------------- what else -lv 4 prints
    # A real server prints about two lines that are no lifecycle event for every one that is
    # (tests/fixtures/logs: 0.37 events per line after start-up); without them (chatter=False)
    # the log is the dense worst case for the reader (0.72 events per line).
    def sampler_lines(self, sid: int) -> None:
        if not self.chatter:
            return
        self.slot_line("launch_slot_", sid, -1, "sampler chain: logits -> logit-bias -> ?penalties -> ?dry -> "
                       "?top-n-sigma -> top-k -> ?typical -> top-p -> min-p -> ?xtc -> temp-ext -> dist ")
        self.slot_line("launch_slot_", sid, -1, "sampler params: ")
        self.lines += [
            "\trepeat_last_n = 64, repeat_penalty = 1.000, frequency_penalty = 0.000, presence_penalty = 0.000",
            "\tdry_multiplier = 0.000, dry_base = 1.750, dry_allowed_length = 2, dry_penalty_last_n = 64",
            "\ttop_k = 40, top_p = 0.950, min_p = 0.050, xtc_probability = 0.000, xtc_threshold = 0.100, "
            "typical_p = 1.000, top_n_sigma = -1.000, temp = 0.000",
            "\tmirostat = 0, mirostat_lr = 0.100, mirostat_ent = 5.000, adaptive_target = -1.000, adaptive_decay = 0.900",
        ]

    def progress(self, sid: int, task: int, n: int, L: int) -> None:
        if self.chatter and self.fmt == "b11434":
            self.slot_line("print_timing", sid, task, f"prompt processing, n_tokens = {n:6d}, progress = {n / L:.2f}, "
                           f"t = {n / 1100:6.2f} s / 1100.00 tokens per second")

    def ik_before(self, cached: int) -> None:
        if self.chatter:
            self.info("log_server_request", "request", 'remote_addr="127.0.0.1" remote_port=48710 status=200 '
                      'method="POST" path="/completion" params={}')
            self.lines.append(f"======== Prompt cache: cache size: {cached}, n_keep: 0, n_discarded_prompt: 0, "
                              "cache_ram_n_min: 0, f_keep: 0.00, cache_ram_similarity: 0.50")
            self.lines.append("banned strings is not supported by recurrent model, it will be disabled.")

    def ik_cache(self, sid: int, task: int, cached: int, n_past: int, partial: bool) -> None:
        if not self.chatter:
            return
        self.lines.append(f"======== Cache: cache_size = {cached}, n_past0 =  {n_past}, n_past1 =  {n_past}, "
                          f"n_past_prompt1 = {n_past},  n_past2 =  {n_past}, n_past_prompt2 =  {n_past}")
        if partial:
            self.lines.append("Common part does not match fully")

    def choose(self, prompt: list, L: int) -> tuple[int, int, str]:
        best, best_sim = None, 0.0
        if self.chatter and self.fmt == "b11434":
            self.srv_line("server_strea", "conv_id= (empty=1)")
            self.srv_line("operator()", "chat format: peg-native")
        for i, s in enumerate(self.slots):
            if not s.cache:
                if self.fmt == "b11434":
                    self.slot_line("get_availabl", i, -1, " - skipping, slot is empty")
                continue
            shared = lcp(s.cache, prompt)
            sim = shared / L
            if self.fmt == "b11434":
                self.slot_line("get_availabl", i, -1, f" - checking sim = {sim:.3f} ({shared}/{L}) > 0.100")
            if sim > 0.1 and sim > best_sim:
                best, best_sim = i, sim
        if best is not None:
            s = self.slots[best]
            shared = lcp(s.cache, prompt)
            if self.fmt == "b11434":
                self.slot_line("get_availabl", best, -1, f"selected slot by LCP similarity, f_sim_best = {best_sim:.3f} (> 0.100 thold), f_keep = {shared / length(s.cache):.3f}")
            return best, shared, "lcp"
        i = min(range(len(self.slots)), key=lambda k: self.slots[k].t_last)
        if self.fmt == "b11434":
            self.slot_line("get_availabl", i, -1, f"selected slot by LRU, t_last = {self.slots[i].t_last}")
        return i, lcp(self.slots[i].cache, prompt), "lru"

    def trim(self, sid: int, task: int, n: int) -> None:
        if self.fmt == "b11434":
            self.slot_line("operator()", sid, task, f"cached n_tokens = {n}, memory_seq_rm [{n}, end)")
        else:
            self.info("batch_pending_prompt", "kv cache rm [p0, end)", f"id_slot={sid} id_task={task} p0={n}")

    def process(self, sid: int, task: int, index: int, n_past: int, L: int, slot: Slot) -> int:
        if self.fmt == "b11434":
            marks = sorted({n for n in (L - 4 - N_UBATCH, L - 4) if n > n_past})
        else:
            marks = sorted({n for n in range(N_BATCH, L - 5, N_BATCH) if n > n_past} | ({L - 5} if L - 5 > n_past else set()))
        pos, created = n_past, 0
        for m in marks:
            while pos + N_BATCH < m:
                pos += N_BATCH
                self.trim(sid, task, pos)
            pos = m
            if self.fmt == "b11434":
                self.progress(sid, task, pos, L)
                self.trim(sid, task, pos)
            if len(slot.ring) >= RING:
                old = slot.ring.pop(0)
                self.slot_line("create_check", sid, task, f"erasing old context checkpoint ({self.ck(old['n'])})")
            slot.ring.append({"n": m, "by": index})
            took = f", took {self.rng.uniform(50, 70):.2f} ms" if self.fmt == "ik" else ""
            self.slot_line("create_check", sid, task, f"created context checkpoint {len(slot.ring)} of {RING} ({self.ck(m)}{took})")
            created += 1
            if self.fmt == "ik":
                self.trim(sid, task, pos)
        if self.chatter and self.fmt == "b11434":
            self.slot_line("init_sampler", sid, task, f"init sampler, took 0.58 ms, tokens: text = {L}, total = {L}")
        return created

    def timing(self, sid: int, task: int, ms: float, n: int, L: int) -> None:
        per = ms / n if n else 0.0
        rate = n / ms * 1000 if ms else 0.0
        text = f"prompt eval time = {ms:10.2f} ms / {n:5d} tokens ({per:8.2f} ms per token, {rate:8.2f} tokens per second)"
        self.t += ms / 1000
        if self.fmt == "b11434":
            self.slot_line("print_timing", sid, task, text)
            self.slot_line("print_timing", sid, task, f"       eval time =     180.00 ms /    16 tokens (   11.25 ms per token,    88.89 tokens per second)")
            if self.chatter:
                self.slot_line("print_timing", sid, task, f"      total time = {ms + 180:10.2f} ms / {n + 16:5d} tokens")
                self.slot_line("print_timing", sid, task, "   graphs reused =         10")
            self.slot_line("release", sid, task, f"stop processing: n_tokens = {L + 15}, truncated = 0")
            self.srv_line("update_slots", "all slots are idle")
        else:
            self.slot_line("print_timing", sid, task, "")
            self.lines.append(text)
            self.lines.append("       eval time =     180.00 ms /    16 tokens (   11.25 ms per token,    88.89 tokens per second)")
            if self.chatter:
                self.lines.append(f"      total time = {ms + 180:10.2f} ms / {n + 16:5d} tokens")
            self.info("release_slots", "slot released", f"id_slot={sid} id_task={task} n_ctx=262144 n_past={L + 16} n_system_tokens=0 n_cache_tokens={L + 16} truncated=false")
            if self.chatter:
                self.info("slots_idle", "all slots are idle", "")


def truth_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What shadowlab logs must report for these requests, computed from the simulation."""
    warm = [r for r in rows if r["outcome"] != "cold"]
    shared = [r["shared_prefix"] for r in warm]
    ms = sum(r["prefill_ms"] for r in rows)
    processed = sum(r["processed"] for r in rows)
    rate = processed / (ms / 1000) if ms else None
    avoid = sum(max(0, r["shared_prefix"] - r["reused"]) for r in warm)
    return {
        "requests": len(rows),
        "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in lifecycle.OUTCOMES},
        "created": sum(r["created"] for r in rows),
        "erased_invalidated": sum(r["erased_invalidated"] for r in rows),
        "shared_prefix": logs.distribution(shared),
        "prompt_tokens": logs.distribution([r["prompt_tokens"] for r in rows]),
        "prompt_sum": sum(r["prompt_tokens"] for r in rows),
        "reusable_tokens": sum(shared),
        "reused_tokens": sum(r["reused"] for r in rows),
        "processed_tokens": processed,
        "avoidable_tokens": avoid,
        "avoidable_prefill_s": round(avoid / rate, 3) if rate else None,
        "failures": {k: sum(r[k] for r in rows) for k in ("placement", "retention", "baseline_loss")},
        "share_under_512": logs._ratio(sum(v < 512 for v in shared), len(shared)),
        "share_4096_or_more": logs._ratio(sum(v >= 4096 for v in shared), len(shared)),
    }


def write_pieces(lines: list[str], base: Path, pieces: int) -> list[Path]:
    """Rotate: the oldest lines in the highest-numbered piece; pieces 2+ gzip (logrotate's
    delaycompress)."""
    per = -(-len(lines) // pieces)
    chunks = [lines[i: i + per] for i in range(0, len(lines), per)]
    paths = []
    for age, chunk in enumerate(reversed(chunks)):  # age 0 = newest
        data = ("\n".join(chunk) + "\n").encode()
        if age == 0:
            path = base
        elif age == 1:
            path = base.with_name(f"{base.name}.1")
        else:
            path = base.with_name(f"{base.name}.{age}.gz")
            data = gzip.compress(data, mtime=0)
        path.write_bytes(data)
        paths.append(path)
    return paths


def generate(out: Path, fmt: str = "b11434", seed: int = 0, requests: int = 400, servers: int = 1,
             slots: int = 2, conversations: int = 6, pieces: int = 3, days: float = 3.0,
             chatter: bool = True) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    result: dict[str, Any] = {"format": fmt, "seed": seed, "servers": []}
    all_rows = []
    for s in range(servers):
        t0 = 1_795_900_000.0 if fmt == "ik" else 0.5
        server = Server(fmt, slots, rng, t0, days * 86400, requests, chatter)
        for i, (kind, prompt) in enumerate(traffic(rng, requests, conversations)):
            server.serve(i, kind, prompt)
        paths = write_pieces(server.lines, out / f"server{s}.log", pieces)
        all_rows += server.truth
        result["servers"].append({"files": [str(p) for p in paths], "lines": len(server.lines),
                                  "requests": server.truth, "figures": truth_figures(server.truth)})
    result["figures"] = truth_figures(all_rows)
    (out / "truth.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--format", choices=["b11434", "ik"], default="b11434")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--pieces", type=int, default=3)
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--dense", action="store_true",
                    help="only the lifecycle lines (no sampler, progress, timing chatter): the reader's worst case")
    a = ap.parse_args()
    r = generate(a.out, a.format, a.seed, a.requests, a.servers, a.slots, a.conversations, a.pieces, a.days,
                 chatter=not a.dense)
    print(json.dumps(r["figures"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
