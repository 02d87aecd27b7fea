"""Byte identity: a warm turn's greedy output against a cold run of the same prompt.

    compare(text, tokens, reference_text, reference_tokens, reused_tokens, ...) -> IdentityCheck

Text is compared as UTF-8 bytes and token ids are compared as lists; both must be equal.
An identical output counts as evidence of safe reuse only when the warm turn reused cache
(``reused_tokens > 0``); a turn that re-prefilled everything is ``IDENTICAL_NO_REUSE`` and proves
nothing. A mismatch records the first differing token index and byte offset and both outputs.

The cold-vs-cold control (a `control` cell: the cold prompt again in another fresh process) uses
the same comparison; a control mismatch means the engine is not deterministic run to run, and
``mark_inconclusive`` flags every warm mismatch of that engine and configuration accordingly.

``triage(warm, cold, split_control, control)`` says why a warm turn differs from cold
(issue 16): ``corrupted_state`` (warm differs from a fresh run of its own batch schedule),
``split_sensitivity`` (warm equals that run; only the schedule differs from cold),
``nondeterminism`` (cold differs from cold), or ``undetermined`` with the missing control
named; each with the first differing token and the top logprobs there where present.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from shadowlab.results.verdict_schema import IdentityCheck, IdentityStatus  # the verdict schema's

__all__ = ["Difference", "IdentityCheck", "IdentityStatus", "Output", "Triage", "TriageClass", "compare", "compare_control", "describe", "difference", "first_difference", "mark_inconclusive", "missing_reference", "failed", "triage"]


def first_difference(a: Sequence[object] | bytes, b: Sequence[object] | bytes) -> int | None:
    """Index of the first element where a and b differ (the shorter length if one is a prefix
    of the other); None when equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def compare(
    text: str,
    tokens: Sequence[int] | None,
    reference_text: str,
    reference_tokens: Sequence[int] | None,
    *,
    reused_tokens: int | None,
    reference_cell: str | None = None,
    reference_turn: int | None = 0,
) -> IdentityCheck:
    byte_diff = first_difference(text.encode("utf-8", "surrogatepass"), reference_text.encode("utf-8", "surrogatepass"))
    token_diff = None
    # An empty id list next to non-empty text means the engine did not return ids (e.g. a chat
    # answer without `tokens`), not that it generated nothing: compare the text alone then.
    if tokens is not None and not tokens and text:
        tokens = None
    if reference_tokens is not None and not reference_tokens and reference_text:
        reference_tokens = None
    if tokens is not None and reference_tokens is not None:
        token_diff = first_difference(list(tokens), list(reference_tokens))
    common = dict(
        reference_cell=reference_cell,
        reference_turn=reference_turn,
        reused_tokens=reused_tokens,
        text=text,
        reference_text=reference_text,
        tokens=tuple(tokens) if tokens is not None else None,
        reference_tokens=tuple(reference_tokens) if reference_tokens is not None else None,
    )
    if byte_diff is None and token_diff is None:
        tokens_note = "" if tokens is not None and reference_tokens is not None else " (text only: no token ids)"
        if reused_tokens is not None and reused_tokens > 0:
            return IdentityCheck(
                IdentityStatus.IDENTICAL,
                detail=f"identical to {reference_cell}{tokens_note} after reusing {reused_tokens} cached tokens",
                **common,
            )
        why = "reused no cached tokens" if reused_tokens == 0 else "reuse unknown"
        return IdentityCheck(
            IdentityStatus.IDENTICAL_NO_REUSE,
            detail=f"identical to {reference_cell}{tokens_note}, but the turn {why}: proves nothing about reuse",
            **common,
        )
    parts = []
    if token_diff is not None:
        parts.append(f"first differing token #{token_diff}")
    if byte_diff is not None:
        parts.append(f"first differing byte at offset {byte_diff}")
    return IdentityCheck(
        IdentityStatus.MISMATCH,
        first_diff_token=token_diff,
        first_diff_byte=byte_diff,
        detail=f"differs from {reference_cell}: " + ", ".join(parts),
        **common,
    )


def compare_control(
    text: str,
    tokens: Sequence[int] | None,
    reference_text: str,
    reference_tokens: Sequence[int] | None,
    *,
    reference_cell: str | None,
) -> IdentityCheck:
    """Cold vs cold: IDENTICAL means the engine is deterministic run to run (no reuse involved)."""
    check = compare(text, tokens, reference_text, reference_tokens, reused_tokens=None, reference_cell=reference_cell)
    if check.status is IdentityStatus.IDENTICAL_NO_REUSE:
        return dataclasses.replace(
            check,
            status=IdentityStatus.IDENTICAL,
            detail=f"cold vs cold: identical to {reference_cell}"
            + ("" if check.tokens is not None and check.reference_tokens is not None else " (text only: no token ids)")
            + " (the engine is deterministic run to run)",
        )
    if check.status is IdentityStatus.MISMATCH:
        return dataclasses.replace(check, detail="cold vs cold: " + check.detail + " (engine nondeterminism)")
    return check


def missing_reference(reused_tokens: int | None, why: str) -> IdentityCheck:
    return IdentityCheck(IdentityStatus.NO_REFERENCE, reused_tokens=reused_tokens, detail=why)


def failed(reused_tokens: int | None, reference_cell: str | None, why: str) -> IdentityCheck:
    return IdentityCheck(IdentityStatus.ERROR, reference_cell=reference_cell, reused_tokens=reused_tokens, detail=why)


def mark_inconclusive(check: IdentityCheck, control_cell: str) -> IdentityCheck:
    """A warm mismatch on an engine whose cold-vs-cold control also mismatched."""
    if check.status is not IdentityStatus.MISMATCH:
        return check
    return dataclasses.replace(
        check,
        inconclusive=True,
        detail=check.detail + f"; inconclusive: the cold-vs-cold control {control_cell} also differs "
        "(the engine is not deterministic run to run)",
    )


# --- triage of a warm mismatch (issue 16) -----------------------------------------------------
#
# A warm turn that differs from cold either restored a wrong state (a cache bug) or ran on an
# engine whose numerics depend on where the prompt is split into batches, which a restore always
# changes. The split control (a fresh process computing the same prompt through the warm turn's
# batch schedule, no restore) separates the two; the cold-vs-cold control separates plain
# run-to-run nondeterminism from both.


class TriageClass(str, enum.Enum):
    CORRUPTED_STATE = "corrupted_state"  # warm != split control: the restored state is wrong
    SPLIT_SENSITIVITY = "split_sensitivity"  # warm == split control != cold: the schedule did it
    NONDETERMINISM = "nondeterminism"  # cold != cold: the engine differs run to run
    UNDETERMINED = "undetermined"  # a control is missing; the reason says which and why


@dataclass(frozen=True)
class Output:
    """One completion as triage compares it. `top_logprobs`: per generated token, the engine's
    (token id, logprob) alternatives, or None where the engine gave none."""

    text: str
    tokens: tuple[int, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None


@dataclass(frozen=True)
class Difference:
    """Where two outputs part: first token index / byte offset, and what each had there."""

    first_token: int | None
    first_byte: int | None
    tokens_at: tuple[int | None, int | None] = (None, None)  # (this, other) at first_token
    top_logprobs_at: tuple[tuple[tuple[int, float], ...] | None, ...] = (None, None)


@dataclass(frozen=True)
class Triage:
    cls: TriageClass
    warm_vs_cold: Difference
    warm_vs_split: Difference | None  # None: no split control, or warm == split control
    cold_vs_control: Difference | None  # None: no control, or cold == control
    detail: str


def _at(seq: Sequence | None, i: int | None):
    return seq[i] if seq is not None and i is not None and i < len(seq) else None


def difference(a: Output, b: Output) -> Difference | None:
    """None when a and b are the same output (bytes, ids where both have them, and top
    logprobs where both have them: a logprob that moved is a difference too)."""
    first_byte = first_difference(a.text.encode("utf-8", "surrogatepass"), b.text.encode("utf-8", "surrogatepass"))
    first_token = None
    if a.tokens is not None and b.tokens is not None:
        first_token = first_difference(list(a.tokens), list(b.tokens))
    if first_token is None and a.top_logprobs is not None and b.top_logprobs is not None:
        first_token = first_difference(list(a.top_logprobs), list(b.top_logprobs))
    if first_token is None and first_byte is None:
        return None
    return Difference(
        first_token,
        first_byte,
        (_at(a.tokens, first_token), _at(b.tokens, first_token)),
        (_at(a.top_logprobs, first_token), _at(b.top_logprobs, first_token)),
    )


def _where(d: Difference) -> str:
    if d.first_token is not None:
        this, other = d.tokens_at
        ids = f" ({this} vs {other})" if this is not None or other is not None else ""
        return f"token #{d.first_token}{ids}"
    return f"byte {d.first_byte}"


def describe(d: Difference | None) -> str | None:
    """Where two outputs part, with the top logprobs there when both engines gave them."""
    if d is None:
        return None
    top = d.top_logprobs_at
    if all(t is not None for t in top):
        shown = [", ".join(f"{i}: {p:.4f}" for i, p in t[:4]) for t in top]
        return f"{_where(d)}; top logprobs [{shown[0]}] vs [{shown[1]}]"
    return _where(d)


def triage(
    warm: Output,
    cold: Output,
    split_control: Output | None = None,
    control: Output | None = None,
    *,
    no_split_control: str = "",
    control_pair: tuple[Output, Output] | None = None,
) -> Triage | None:
    """Class a warm-vs-cold mismatch; None when warm and cold are the same output.

    `split_control`: the warm turn's prompt through the warm turn's batch schedule in a fresh
    process; when there is none, `no_split_control` says why (e.g. no request sequence
    reproduces the schedule). `control`: the cold prompt again in another fresh process; or
    `control_pair`: (cold, control) of another prompt on the same engine and configuration
    (the plan's one control cell), the same run-to-run evidence."""
    wc = difference(warm, cold)
    if wc is None:
        return None
    ws = difference(warm, split_control) if split_control is not None else None
    pair = (cold, control) if control is not None else control_pair
    cc = difference(*pair) if pair is not None else None
    if cc is not None:
        return Triage(TriageClass.NONDETERMINISM, wc, ws, cc,
                      f"cold vs cold differs at {_where(cc)}: the engine is not deterministic run to run")
    if split_control is None:
        why = no_split_control or "no split control was run"
        return Triage(TriageClass.UNDETERMINED, wc, None, cc,
                      f"warm differs from cold at {_where(wc)}; no split control: {why}")
    if ws is None:
        return Triage(TriageClass.SPLIT_SENSITIVITY, wc, None, cc,
                      f"warm differs from cold at {_where(wc)} but equals its split control: the "
                      "engine's numerics depend on the batch schedule, the restored state is right")
    if pair is None:
        return Triage(TriageClass.UNDETERMINED, wc, ws, None,
                      f"warm differs from its split control at {_where(ws)}, but no cold-vs-cold "
                      "control was run: nondeterminism is not excluded")
    return Triage(TriageClass.CORRUPTED_STATE, wc, ws, None,
                  f"warm differs from its split control at {_where(ws)} (same schedule, no restore) "
                  "and the engine is deterministic: the restored state is wrong")
