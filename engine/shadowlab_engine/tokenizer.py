"""Byte-level tokenizer: ids 0..255 are bytes, then four special tokens.

Text is UTF-8 encoded byte by byte, so every string round-trips. Generated ids need not form
valid UTF-8 (a model can emit a lone continuation byte); `decode` therefore replaces each
invalid byte with U+FFFD (errors="replace") while `decode_bytes` and the ids stay exact.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

BOS, EOS, IM_START, IM_END = 256, 257, 258, 259
SPECIALS: dict[str, int] = {"<|bos|>": BOS, "<|eos|>": EOS, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
SPECIAL_NAMES: dict[int, str] = {i: s for s, i in SPECIALS.items()}
N_TOKENS = 260                     # real tokens; a model's vocab may be padded above this
STOP_TOKENS = frozenset({EOS, IM_END})
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class UnknownTokenError(ValueError):
    """A token id outside the vocabulary (the server answers 400)."""


def encode(text: str, parse_special: bool = True) -> list[int]:
    if not parse_special:
        return list(text.encode("utf-8"))
    ids: list[int] = []
    for piece in _SPECIAL_RE.split(text):   # odd indices are the specials themselves
        if piece in SPECIALS:
            ids.append(SPECIALS[piece])
        elif piece:
            ids.extend(piece.encode("utf-8"))
    return ids


def decode_bytes(ids: Iterable[int], render_special: bool = True) -> bytes:
    """The bytes of `ids`; specials as their names (or nothing), padding ids as nothing."""
    out = bytearray()
    for i in ids:
        if 0 <= i < 256:
            out.append(i)
        elif render_special and i in SPECIAL_NAMES:
            out.extend(SPECIAL_NAMES[i].encode("ascii"))
    return bytes(out)


def decode(ids: Iterable[int], render_special: bool = True) -> str:
    """Text of `ids`; each byte that is not valid UTF-8 becomes U+FFFD."""
    return decode_bytes(ids, render_special).decode("utf-8", errors="replace")


def validate(ids: Sequence[object], vocab_size: int = N_TOKENS) -> list[int]:
    """The ids as ints, or UnknownTokenError naming the first bad one (not an int, or out of range)."""
    out: list[int] = []
    for n, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise UnknownTokenError(f"token {n} is {i!r}: not an id in [0, {vocab_size})")
        out.append(i)
    return out


def chatml_text(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render_chatml(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """ChatML ids; like llama.cpp, the rendered text is tokenized with specials parsed."""
    return encode(chatml_text(messages, add_generation_prompt))


def message_starts(messages: Sequence[Mapping[str, str]], role: str = "user") -> list[int]:
    """Token offsets (in render_chatml's output) where each message of `role` starts."""
    starts, n = [], 0
    for m in messages:
        if m["role"] == role:
            starts.append(n)
        n += len(render_chatml([m], add_generation_prompt=False))
    return starts
