"""Byte identity: a warm turn's greedy output against a cold run of the same prompt.

    compare(text, tokens, reference_text, reference_tokens, reused_tokens, ...) -> IdentityCheck

Text is compared as UTF-8 bytes and token ids are compared as lists; both must be equal.
An identical output counts as evidence of safe reuse only when the warm turn reused cache
(``reused_tokens > 0``); a turn that re-prefilled everything is ``IDENTICAL_NO_REUSE`` and proves
nothing. A mismatch records the first differing token index and byte offset and both outputs.

The cold-vs-cold control (a `control` cell: the cold prompt again in another fresh process) uses
the same comparison; a control mismatch means the engine is not deterministic run to run, and
``mark_inconclusive`` flags every warm mismatch of that engine and configuration accordingly.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["IdentityCheck", "IdentityStatus", "compare", "compare_control", "first_difference", "mark_inconclusive", "missing_reference", "failed"]


class IdentityStatus(str, enum.Enum):
    """A warm turn's output compared with the cold run of the same prompt."""

    IDENTICAL = "identical"  # same bytes and token ids, and the turn reused cache: evidence
    IDENTICAL_NO_REUSE = "identical_no_reuse"  # same, but the turn re-prefilled: proves nothing
    MISMATCH = "mismatch"  # outputs differ (first differing token and byte recorded)
    NO_REFERENCE = "no_reference"  # no cold cell for this engine/configuration/prompt
    ERROR = "error"  # the warm turn or its reference failed


@dataclass(frozen=True)
class IdentityCheck:
    """Warm-vs-cold (or control-vs-cold) comparison of one output."""

    status: IdentityStatus
    reference_cell: str | None = None  # the cold cell compared against
    reference_turn: int | None = None
    reused_tokens: int | None = None  # what the compared turn reused (evidence only when > 0)
    first_diff_token: int | None = None  # index of the first differing completion token
    first_diff_byte: int | None = None  # byte offset of the first differing UTF-8 byte of text
    text: str | None = None  # this output
    reference_text: str | None = None  # the cold output
    tokens: tuple[int, ...] | None = None
    reference_tokens: tuple[int, ...] | None = None
    inconclusive: bool = False  # a cold-vs-cold control of the same engine mismatched
    detail: str = ""  # one readable sentence


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
