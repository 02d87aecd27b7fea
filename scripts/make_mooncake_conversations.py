"""A GENERATED trace shaped like Mooncake's public FAST'25 conversation trace (docs/BRIEF §6),
for checking conversation inference where the real file cannot be downloaded. It is not that
file: only its published shape is imitated.

    python scripts/make_mooncake_conversations.py --out trace.jsonl [--truth truth.jsonl] [--seed 0] [--requests N]

The shape: 12,031 requests, ~145M prompt tokens (mean ~12k), Mooncake JSON lines (`timestamp`
ms, `input_length`, `output_length`, `hash_ids` of 512-token blocks, no `session_id`). Requests
belong to conversations that interleave widely (about 560 live at a time, so a conversation's
next turn comes a few hundred requests after its previous one: the trace's reuse "reaches far
back"); a turn's prompt is its previous prompt whole, then the previous answer and a new user
message (the previous prompt's partial last block is a new block then, as in any hash-id trace).
Most conversations start from one of a few shared system templates (whole blocks), the rest from
their own. Sizes are lognormal, tuned so that about a third of the prompt tokens is reusable
from some earlier request and a few percent from the request just before (what the brief states
of the real trace; `shadowlab simulate` prints both for this file).

`--truth` writes the same lines with `session_id` (the true conversation), for precision and
recall of the inference (tests/shadowlab/test_traffic_infer.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 512


@dataclass
class _Conversation:
    name: str
    ids: list[int] = field(default_factory=list)  # the last prompt's block ids
    length: int = 0  # the last prompt's tokens
    answer: int = 0  # the last answer's tokens
    turns_left: int = 0
    turns: int = 0  # sent so far


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return int(min(high, max(low, round(median * math.exp(rng.gauss(0.0, sigma))))))


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def new(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def generate(seed: int, requests: int = 12_031, live: int = 560) -> list[dict]:
    rng = random.Random(f"mooncake-conversations:{seed}")
    ids = _Ids()
    templates = [ids.new(rng.randint(2, 8)) for _ in range(4)]
    open_: list[_Conversation] = []
    out: list[dict] = []
    t_ms, count = 0, 0
    while len(out) < requests:
        if len(open_) < live or rng.random() < 0.04:
            open_.append(_start(rng, ids, templates, count))
            count += 1
        conv = rng.choice(open_)
        _turn(rng, ids, conv)
        t_ms += int(rng.expovariate(1 / 300.0))
        out.append({"timestamp": t_ms, "input_length": conv.length, "output_length": conv.answer,
                    "hash_ids": list(conv.ids), "session_id": conv.name})
        conv.turns_left -= 1
        if conv.turns_left == 0:
            open_.remove(conv)
    return out


def _start(rng: random.Random, ids: _Ids, templates: list[list[int]], count: int) -> _Conversation:
    system = list(rng.choice(templates)) if rng.random() < 0.5 else ids.new(rng.randint(1, 4))
    conv = _Conversation(f"s{count}", system, len(system) * BLOCK)
    conv.turns_left = 1 + min(30, int(rng.expovariate(1 / 0.9)))
    return conv


def _turn(rng: random.Random, ids: _Ids, conv: _Conversation) -> None:
    """The next prompt: the last one whole (its full blocks kept), the last answer, a new message."""
    new = (_lognormal(rng, 5600, 0.9, 100, 120_000) if conv.turns == 0 else _lognormal(rng, 450, 1.0, 20, 20_000))
    new += conv.answer
    conv.turns += 1
    keep = conv.length // BLOCK  # the partial last block becomes a new block
    rest = conv.length - keep * BLOCK + new
    conv.ids = conv.ids[:keep] + ids.new(-(-rest // BLOCK))
    conv.length = keep * BLOCK + rest
    conv.answer = _lognormal(rng, 300, 0.8, 1, 4000)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--truth", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, default=12_031,
                   help="how many lines (default: the public trace's 12,031; benchmarks/bench_simulate.py asks for 1M)")
    args = p.parse_args()
    lines = generate(args.seed, args.requests)
    with open(args.out, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps({k: v for k, v in line.items() if k != "session_id"}) + "\n")
    if args.truth is not None:
        with open(args.truth, "w", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(line) + "\n" for line in lines))
    print(f"{len(lines):,} requests, {sum(x['input_length'] for x in lines):,} prompt tokens -> {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
