"""Figures no engine can truthfully report: the rules, in one place.

    turn_problems(turn, timings) -> tuple[str, ...]     one readable sentence per impossible figure
    cell_problems(cell) -> tuple[str, ...]              a cell's, each naming its turn
    described(cell_id, problems) -> str                 one line for a refused cell

Every command that reads a run judges these the same way: the gate fails the cell (exit 3),
compare and `simulate RUN/cells/CELL` refuse it (exit 3), the report's budgets and decision
record leave it unjudged; none shows its figures as results (DESIGN §5).

A *disagreement* (the API and the log differ, a restore re-enters past its checkpoint) can be
an honest engine reporting its own bug; the identity and cascade checks judge those. The
figures below cannot be true of any engine: a 300-token prompt does not reuse 900 tokens, a
prefill does not take -5 ms, a fresh process has nothing to reuse. An engine that reports one
cannot be believed about anything else, so the gate fails its cell as an infrastructure
failure (exit 3, `plausible` check in shadowlab/judge/expectations.py), never as "qualified" or
merely "a check failed".

Rules (each names the figure, its source and the bound it breaks):

- counts: the API's `timings.cache_n` / `prompt_n` must be non-negative integers; reused and
  processed (API or log) must not exceed the prompt; where the API states both, reused +
  processed must equal the prompt;
- timings: `timings.prompt_ms` must be a finite number >= 0 (NaN and Infinity reach the
  records as null); restore and creation times and checkpoint sizes must not be negative;
- the first turn of a fresh process reuses nothing: no API reuse, no restore, no re-entry > 0;
- the re-entry point lies within the prompt and, where the divergence point is exact, at or
  below it (tokens that differ from the cache cannot have been reused); a restored checkpoint
  covers no token at or past the divergence point nor beyond the prompt;
- checkpoints of this turn have non-negative positions with pos_min <= pos_max, and those it
  created lie within its prompt (checkpoints are taken while the prompt is processed).

The rules read a `TurnVerdict` (shadowlab/results/verdict_schema.py) and the turn's raw API `timings`; they
need nothing else, so a verdicts.json of an older schema is re-judged the same way on read.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shadowlab.results.verdict_schema import CellVerdict, CheckpointRef, TurnVerdict

_API_COUNTS = ("cache_n", "prompt_n")
_API_TIMINGS = ("prompt_ms",)


def turn_problems(turn: "TurnVerdict", timings: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """Every impossible figure of one turn; () when all are possible. `timings` is the engine's
    raw `timings` object as recorded (None: not known, e.g. a verdicts.json being upgraded)."""
    found = [
        *_raw_timings(timings if isinstance(timings, Mapping) else {}),
        *_counts(turn),
        *_times(turn),
        *_cold_reuse(turn),
        *_positions(turn),
        *_checkpoints(turn, timings),
    ]
    return tuple(dict.fromkeys(found))  # one rule may restate another's figure: say it once


def cell_problems(cell: "CellVerdict") -> tuple[str, ...]:
    """Every impossible figure of a cell's turns (as judged into `TurnVerdict.implausible`), each
    as `turn I (PROMPT): problem`; () when the cell can be believed."""
    return tuple(f"turn {t.index} ({t.prompt_id}): {p}" for t in cell.turns for p in t.implausible)


def described(cell_id: str, problems: Sequence[str], shown: int = 3) -> str:
    """One line for a cell the rules reject: its id and its first impossible figures."""
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"cell {cell_id}: " + "; ".join(problems[:shown]) + more


def _raw_timings(timings: Mapping[str, Any]) -> Iterator[str]:
    for key in _API_COUNTS:
        value = timings.get(key, 0)
        if not _is_count(value):
            yield f"the API's timings.{key} = {_show(value)} is not a token count"
    for key in _API_TIMINGS:
        if key not in timings:
            continue
        value = timings[key]
        if not _is_number(value) or not math.isfinite(value):
            yield f"the API's timings.{key} is {_show(value)}, not a finite number (NaN and Infinity are recorded as null)"
        elif value < 0:
            yield f"the API's timings.{key} = {value:g} ms is negative"


def _counts(turn: "TurnVerdict") -> Iterator[str]:
    prompt = turn.prompt_tokens
    for what, source, value in (("reused", "API", turn.reused_api), ("processed", "API", turn.processed_api),
                                ("reused", "log", turn.reused_log), ("processed", "log", turn.processed_log)):
        if value is None:
            continue
        if value < 0:
            yield f"the {source} says {value} tokens {what}: a negative count"
        elif prompt is not None and value > prompt:
            yield (f"the {source} says {value:,} tokens {what} of a {prompt:,}-token prompt "
                   f"({value / max(prompt, 1):.0%} of it)")
    if turn.reused_api is not None and turn.processed_api is not None and prompt is not None:
        if turn.reused_api + turn.processed_api != prompt:
            yield (f"the API says reused {turn.reused_api:,} + processed {turn.processed_api:,} = "
                   f"{turn.reused_api + turn.processed_api:,}, but the prompt has {prompt:,} tokens")


def _times(turn: "TurnVerdict") -> Iterator[str]:
    if turn.prefill_ms is not None and (not math.isfinite(turn.prefill_ms) or turn.prefill_ms < 0):
        yield f"prefill time {turn.prefill_ms:g} ms is not a possible duration"
    for what, refs in (("restore", (turn.restored,) if turn.restored else ()), ("creation", turn.created)):
        for ref in refs:
            if ref.took_ms is not None and ref.took_ms < 0:
                yield f"checkpoint {what} at pos_max {ref.pos_max} took {ref.took_ms:g} ms: a negative duration"
            if ref.size_mib is not None and ref.size_mib < 0:
                yield f"checkpoint at pos_max {ref.pos_max} has a negative size ({ref.size_mib:g} MiB)"


def _cold_reuse(turn: "TurnVerdict") -> Iterator[str]:
    """The first turn a fresh engine process serves (turn 0, or the first served of requests
    sent concurrently) has nothing it could reuse."""
    if (turn.index if turn.processing_rank is None else turn.processing_rank) != 0:
        return
    claims = []
    if turn.reused_api:
        claims.append(f"the API says {turn.reused_api:,} tokens reused")
    if turn.reused_log:
        claims.append(f"the log says {turn.reused_log:,} tokens reused")
    if turn.restored is not None:
        claims.append(f"the log restores a checkpoint at pos_max {turn.restored.pos_max}")
    if turn.re_entry_point:
        claims.append(f"prefill re-enters at {turn.re_entry_point:,}")
    if claims:
        yield f"the first turn of a fresh engine process has nothing to reuse, yet {'; '.join(claims)}"


def _positions(turn: "TurnVerdict") -> Iterator[str]:
    prompt, re_entry, divergence = turn.prompt_tokens, turn.re_entry_point, turn.divergence_point
    exact = divergence is not None and not turn.divergence_lower_bound and turn.outcome.value != "cold"
    if re_entry is not None:
        if re_entry < 0:
            yield f"re-entry point {re_entry} is negative"
        elif prompt is not None and re_entry > prompt:
            yield f"re-entry point {re_entry:,} lies beyond the {prompt:,}-token prompt"
        elif exact and re_entry > divergence:
            yield (f"re-entry point {re_entry:,} lies above the divergence point {divergence:,}: "
                   f"tokens that differ from the cache were reused")
    if turn.restored is not None:
        covered = turn.restored.n_tokens
        if prompt is not None and covered > prompt:
            yield f"the restored checkpoint covers {covered:,} tokens, beyond the {prompt:,}-token prompt"
        elif exact and covered > divergence:
            yield (f"the restored checkpoint covers {covered:,} tokens, past the divergence point "
                   f"{divergence:,}: it holds state of tokens that differ")


def _checkpoints(turn: "TurnVerdict", timings: Mapping[str, Any] | None) -> Iterator[str]:
    refs: list[tuple[str, CheckpointRef]] = [("created", c) for c in turn.created]
    refs += [("restored", turn.restored)] if turn.restored else []
    refs += [("erased", c) for c in (*turn.erased_cascade, *turn.erased_other)]
    for what, c in refs:
        if min(c.pos_min, c.pos_max, c.n_tokens) < 0 or c.pos_min > c.pos_max:
            yield (f"checkpoint {what} with pos_min {c.pos_min}, pos_max {c.pos_max}, n_tokens {c.n_tokens}: "
                   f"not a span of token positions")
    prompt = turn.prompt_tokens
    if prompt is None:
        return
    # A checkpoint may also cover what the turn generated: ik_llama.cpp checkpoints during
    # generation (its captures: pos_max 4,567 after a 4,560-token prompt and 9 new tokens).
    # Without the raw timings (an upgraded verdicts.json) the generated count is unknown.
    generated = timings.get("predicted_n") if isinstance(timings, Mapping) else None
    if timings is None:
        return
    limit = prompt + (generated if _is_count(generated) else 0)
    for c in turn.created:
        if c.n_tokens > limit or c.pos_max >= limit:
            yield (f"checkpoint created at pos_max {c.pos_max:,} (n_tokens {c.n_tokens:,}) lies beyond the "
                   f"{prompt:,}-token prompt" + (f" and its {generated:,} generated tokens" if limit > prompt else ""))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)[:40]


__all__ = ["cell_problems", "described", "turn_problems"]
