"""The declared shape of generated traffic: `Dist`, `TrafficShape` (and its presets, the case
study's lanes), read from a mapping (`shape_from_dict`) or a YAML/JSON file (`read_shape`) and
checked. `generate.py` realises a shape into requests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shadowlab.errors import TrafficError
from shadowlab.traffic.lines import MAX_LINE_BYTES, _open_regular
from shadowlab.traffic.model import MAX_REQUESTS


@dataclass(frozen=True)
class Dist:
    """A distribution of token counts: `fixed` (a), `uniform` (a..b), `lognormal` (median a,
    sigma b), clipped to [low, high]."""

    kind: str = "fixed"
    a: float = 0
    b: float = 0
    low: int = 0
    high: int = 1 << 20

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        elif self.kind == "lognormal":
            v = self.a * math.exp(rng.gauss(0.0, self.b))
        else:
            raise TrafficError(f"unknown distribution kind {self.kind!r}", hint="fixed, uniform or lognormal")
        return int(min(self.high, max(self.low, round(v))))

    @classmethod
    def parse(cls, value: Any, where: str) -> Dist:
        """`1200`, `[500, 3000]` (uniform), or `{kind, a, b, low, high}`."""
        if isinstance(value, bool):
            raise TrafficError(f"{where}: expected a number, a [low, high] pair or a mapping")
        if isinstance(value, (int, float)):
            return cls("fixed", value, value)
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
            return cls("uniform", value[0], value[1])
        if isinstance(value, dict):
            unknown = set(value) - {"kind", "a", "b", "low", "high"}
            if unknown:
                raise TrafficError(f"{where}: unknown key(s) {sorted(unknown)}", hint="kind, a, b, low, high")
            try:
                return cls(**value)
            except TypeError as exc:
                raise TrafficError(f"{where}: {exc}") from None
        raise TrafficError(f"{where}: expected a number, a [low, high] pair or a mapping, got {value!r}")


@dataclass(frozen=True)
class TrafficShape:
    """The declared shape of generated traffic; `generate` realises it from `seed`.

    Each conversation's turn t sends: its system block, the history blocks of turns < t, a
    re-rendered block (`volatile_tokens`, new content every turn: the divergence point of turn
    t+1 is the end of turn t's history, deep inside the prompt), then the new user message.
    `concurrent` conversations are live at a time (a new one starts when one ends).
    Interlopers make up `interloper_share` of all requests, of the kinds weighted by
    `interloper_kinds` (zero overlap; the system block of a live conversation, then new text;
    a near-duplicate: a live conversation's last prompt cut at `near_duplicate_cut` of it, then
    new text).
    `preamble` (length -> weight) starts every prompt with the first n tokens of ONE header block
    shared by all requests, n drawn per conversation and per interloper: the template header and
    BOS that make "unrelated" prompts share 1, 3 or 32 tokens in the case study.
    `user_delimiter` opens every user message (each history block and the new user message) with
    the delimiter segment (`DELIMITER_BLOCK`, `DELIMITER_TOKENS` long: the engine's tokens of
    `<|im_start|>user` first, put there by `Materialiser(delimiter=...)`), so a request sent with
    llama.cpp's `message_delimiters` gets checkpoints at `Request.user_starts`.
    """

    conversations: int = 4
    turns: int = 6
    concurrent: int = 2
    system_tokens: Dist = Dist("uniform", 200, 400)
    turn_tokens: Dist = Dist("uniform", 100, 300)
    volatile_tokens: Dist = Dist("fixed", 0)
    user_tokens: Dist = Dist("uniform", 20, 60)
    interloper_share: float = 0.0
    interloper_tokens: Dist = Dist("uniform", 50, 300)
    interloper_kinds: tuple[tuple[str, float], ...] = (("zero", 1.0),)
    near_duplicate_cut: Dist = Dist("uniform", 0.5, 0.95, 0, 1)
    arrival: str = "round_robin"  # "round_robin" | "random" | "bursts"
    burst: int = 3
    interloper_placement: str = "random"  # "random" | "before_turns"
    output_tokens: int = 1
    gap_s: float = 1.0
    seed: int = 0
    preamble: tuple[tuple[int, float], ...] = ()
    user_delimiter: bool = False

    KINDS = ("zero", "system", "near_duplicate")
    ARRIVALS = ("round_robin", "random", "bursts")
    PLACEMENTS = ("random", "before_turns")

    @property
    def requests(self) -> int:
        """How many requests `generate` makes: every conversation turn, and interlopers making up
        `interloper_share` of the whole (the one count the bounds and the generator use)."""
        turns = self.conversations * self.turns
        return round(turns / (1 - self.interloper_share)) if self.interloper_share else turns

    @classmethod
    def case_study(cls, seed: int = 0, scale: int = 1) -> TrafficShape:
        """The case study's production lane (seed 000; `CASE_STUDY` lists what it measured and
        tests/shadowlab/test_simulate.py holds `realised_shape` of this to it): one slot's worth
        of interleaved traffic, ~3,500 requests and ~62M prompt tokens at scale 1. Conversations
        (20 turns each, a heavy-tailed system prompt and pasted turns) re-render a block before
        the new user message, so a turn diverges from its predecessor deep in the prompt; a third
        of the requests are unrelated jobs that share only the template header (1, 3 or 32
        tokens) with anything. `scale` multiplies conversations and jobs alike."""
        return cls(
            conversations=119 * scale, turns=20, concurrent=1,
            preamble=((32, 0.55), (3, 0.4), (1, 0.05)),
            system_tokens=Dist("lognormal", 1000, 1.4, 300, 150_000),
            turn_tokens=Dist("lognormal", 55, 2.3, 5, 150_000),
            volatile_tokens=Dist("lognormal", 1700, 1.0, 600, 60_000), user_tokens=Dist("uniform", 20, 300),
            interloper_share=0.32, interloper_tokens=Dist("lognormal", 4000, 2.6, 700, 258_037),
            interloper_kinds=(("zero", 1.0),), arrival="random", gap_s=111.0, seed=seed)  # ~4.5 days

    @classmethod
    def case_study_interleaved(cls, seed: int = 0, scale: int = 1) -> TrafficShape:
        """The lane the case study's mechanism describes (seeds/000: "every low-overlap interloper
        erases the checkpoints the next conversation turn would need"): the same conversations
        and jobs at the same scale (~3,500 requests, ~64M prompt tokens), but a job sits in front
        of every turn that continues a conversation, as a memory-worker job after each turn
        would. A fifth of the jobs run on a live conversation's template and system prompt (the
        upper mode of the shared prefix), the rest share only the header. The request before a
        conversation turn is then never its own previous turn. It does NOT match the case study's
        measured shared-prefix percentiles (only ~3 % of requests share 4,096+ with the one
        before, not 24 %): no one-slot traffic can show those and leave POLICY=0 near zero
        (docs/DESIGN.md §10, "The case study's conclusion, checked")."""
        return replace(
            cls.case_study(seed, scale), conversations=88 * scale, interloper_share=0.497,
            interloper_placement="before_turns", interloper_kinds=(("zero", 0.8), ("system", 0.2)),
            volatile_tokens=Dist("lognormal", 1300, 1.0, 600, 60_000),
            interloper_tokens=Dist("lognormal", 2500, 2.6, 700, 258_037))


PRESETS = {"case-study": TrafficShape.case_study, "case-study-interleaved": TrafficShape.case_study_interleaved}


# What the case study measured on its lane (seeds/000: 3,292 partial-reuse turns of ~3,500; the
# prefix each request shared with the slot's cached prompt, i.e. the request before it).
CASE_STUDY = {
    "requests": 3500, "prompt_tokens": 66_230_000,
    "prompt_size": {"median": 6552, "max": 258_037},
    "shared_with_previous": {"min": 1, "p10": 3, "p25": 3, "median": 32, "p75": 3734, "p90": 9923, "max": 155_259},
    "share_near_zero_overlap": 0.57, "share_4096_or_more": 0.24, "reusable_share": 12.39 / 66.23,
}


SHAPE_KEYS = {f for f in TrafficShape.__dataclass_fields__}
_DIST_KEYS = {"system_tokens", "turn_tokens", "volatile_tokens", "user_tokens", "interloper_tokens",
              "near_duplicate_cut"}


def shape_from_dict(doc: Any, where: str = "<shape>", *, count: bool = True) -> TrafficShape:
    """A TrafficShape from a YAML/JSON mapping (unknown keys refused). `count=False`: the request
    count, which several keys make, is left to the caller (one key checked by itself: the other
    keys' defaults are no figures of the shape; a matrix, with its own lower bound)."""
    if not isinstance(doc, dict):
        raise TrafficError(f"{where}: a traffic shape is a mapping of {sorted(SHAPE_KEYS)}")
    unknown = set(doc) - SHAPE_KEYS
    if unknown:
        raise TrafficError(f"{where}: unknown key(s) {sorted(unknown)}", hint=f"known: {', '.join(sorted(SHAPE_KEYS))}")
    kw: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _DIST_KEYS:
            kw[key] = Dist.parse(value, f"{where}: {key}")
        elif key == "interloper_kinds":
            if not isinstance(value, dict):
                raise TrafficError(f"{where}: interloper_kinds is a mapping kind -> weight")
            kw[key] = tuple((str(k), float(v)) for k, v in value.items())
        elif key == "preamble":
            if not isinstance(value, dict):
                raise TrafficError(f"{where}: preamble is a mapping header length -> weight")
            try:
                kw[key] = tuple((int(k), float(v)) for k, v in value.items())
            except (TypeError, ValueError):
                raise TrafficError(f"{where}: preamble maps whole header lengths to weights, got {value!r}") from None
        else:
            kw[key] = value
    shape = TrafficShape(**kw)
    _check_shape(shape, where, count)
    return shape


def _check_shape(s: TrafficShape, where: str, count: bool = True) -> None:
    for key in ("conversations", "turns", "concurrent", "burst", "output_tokens", "seed"):
        v = getattr(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "seed" else 1):
            raise TrafficError(f"{where}: {key} must be an integer >= {0 if key == 'seed' else 1}, got {v!r}")
    if not isinstance(s.interloper_share, (int, float)) or not 0 <= s.interloper_share < 1:
        raise TrafficError(f"{where}: interloper_share must be in [0, 1), got {s.interloper_share!r}")
    if not isinstance(s.user_delimiter, bool):
        raise TrafficError(f"{where}: user_delimiter must be true or false, got {s.user_delimiter!r}")
    if s.arrival not in TrafficShape.ARRIVALS:
        raise TrafficError(f"{where}: arrival must be one of {TrafficShape.ARRIVALS}, got {s.arrival!r}")
    n_conv = s.conversations * s.turns
    if count and s.requests > MAX_REQUESTS:
        jobs = " and their interlopers" if s.interloper_share else ""
        raise TrafficError(f"{where}: {n_conv:,} conversation turns (conversations × turns){jobs} are more than "
                           f"{MAX_REQUESTS:,} requests")
    if s.interloper_placement not in TrafficShape.PLACEMENTS:
        raise TrafficError(f"{where}: interloper_placement must be one of {TrafficShape.PLACEMENTS}, "
                           f"got {s.interloper_placement!r}")
    bad = [k for k, _ in s.interloper_kinds if k not in TrafficShape.KINDS]
    if bad or not any(w > 0 for _, w in s.interloper_kinds):
        raise TrafficError(f"{where}: interloper_kinds: kinds are {TrafficShape.KINDS} with a positive weight")
    if s.preamble and (any(n < 1 or w < 0 for n, w in s.preamble) or not any(w > 0 for _, w in s.preamble)):
        raise TrafficError(f"{where}: preamble: header lengths >= 1 with weights >= 0, one of them positive")


def read_shape(path: Path) -> TrafficShape:
    import yaml

    with _open_regular(path) as fh:
        raw = fh.read(MAX_LINE_BYTES + 1)
    if len(raw) > MAX_LINE_BYTES:
        raise TrafficError(f"a shape file longer than {MAX_LINE_BYTES} bytes", file=str(path))
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TrafficError(f"cannot read: {exc}", file=str(path)) from None
    except RecursionError:  # YAML's composer recurses per level of nesting
        raise TrafficError("nested too deeply to be a traffic shape", file=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TrafficError(f"not YAML/JSON: {getattr(exc, 'problem', exc)}", file=str(path),
                           line=None if mark is None else mark.line + 1) from None
    return shape_from_dict(doc, str(path))
