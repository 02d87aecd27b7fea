"""Prompts exact in tokens, on any tokenizer.

A token prompt is built from seeded text: `seeded_text(seed, n)` is a deterministic stream of
plain-ASCII pseudo-words and sentences (any byte-level or BPE tokenizer handles it). The text is
tokenized by the engine under test (`tokenize`, backed by its `/tokenize`), and the token list
is cut to the exact count. Prompts are then composed as token lists and sent as token ids, so
the divergence point is exact whatever the tokenizer does at word boundaries:

- random:    the first N tokens of seed's text.
- diverge:   P[:K] + new tokens, the first of which differs from P[K]  (LCP(C, P) == K).
- unrelated: new tokens whose first token differs from the first token of every named prompt
             (LCP == 0 with each of them, and with anything that starts like them).
- append:    all of P, then M new tokens.

`sha256` of a prompt is the SHA-256 of its token ids packed as little-endian signed 32-bit
integers (`struct.pack("<%di" % n, *tokens)`), hex-encoded: cheap to recompute in any language.

Chat prompts are not materialized ahead of time: their messages may splice the warm cell's
replies (`{from_turn: i}`), known only while the cell runs. `chat_messages` builds a turn's
messages from those replies; `render_chatml` renders them the way the reference engine does.
"""

from __future__ import annotations

import hashlib
import json
import string
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowlab import traffic
from shadowlab.errors import RunDirError, ShadowlabError
from shadowlab.results.records import common_prefix, read_json, write_bytes_atomic  # common_prefix: re-exported
from shadowlab.matrix import (
    AppendPrompt,
    ChatPrompt,
    DivergePrompt,
    PromptSpec,
    RandomPrompt,
    TrafficSequence,
    UnrelatedPrompt,
)

Tokenize = Callable[[str], Sequence[int]]

# `/completion` message delimiters for ChatML-rendered prompts (llama.cpp's `message_delimiters`).
CHATML_MESSAGE_DELIMITERS = ({"role": "user", "delimiter": "<|im_start|>user"},)


@dataclass(frozen=True)
class MaterializedPrompt:
    id: str
    kind: str
    tokens: tuple[int, ...]
    sha256: str
    text_seed: int | None  # seed of the prompt's own new text (None for chat)

    @classmethod
    def of(cls, id: str, kind: str, tokens: Sequence[int], text_seed: int | None) -> MaterializedPrompt:
        tokens = tuple(int(t) for t in tokens)
        return cls(id, kind, tokens, tokens_sha256(tokens), text_seed)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokens": list(self.tokens), "sha256": self.sha256,
                "text_seed": self.text_seed}

    @classmethod
    def from_dict(cls, id: str, data: Mapping[str, Any]) -> MaterializedPrompt:
        return cls(id, data.get("kind", ""), tuple(data["tokens"]), data["sha256"], data.get("text_seed"))


def tokens_sha256(tokens: Sequence[int]) -> str:
    """SHA-256 of token ids as little-endian int32, hex."""
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


# --------------------------------------------------------------------------------------------
# Seeded text. Its own generator (splitmix64), so the text never changes with Python's `random`.

_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "v", "w",
           "y", "z", "bl", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gl", "gr", "pl", "pr", "sc",
           "sh", "sk", "sl", "sp", "st", "sw", "th", "tr", "wh")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "au", "ea", "ee", "ie", "io", "oa", "oo", "ou")
_CODAS = ("", "", "", "b", "ck", "d", "f", "g", "l", "ll", "m", "n", "nd", "ng", "nt", "p", "r", "rd",
          "rn", "s", "ss", "st", "t", "th", "x")
_MASK64 = (1 << 64) - 1


class _SplitMix64:
    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n


def _word(rng: _SplitMix64) -> str:
    syllables = (1, 1, 2, 2, 3)[rng.below(5)]
    return "".join(_ONSETS[rng.below(len(_ONSETS))] + _NUCLEI[rng.below(len(_NUCLEI))]
                   + _CODAS[rng.below(len(_CODAS))] for _ in range(syllables))


def _sentence(rng: _SplitMix64) -> str:
    words = [_word(rng) for _ in range(4 + rng.below(12))]
    if len(words) > 6 and rng.below(3) == 0:
        words[rng.below(len(words) - 2)] += ","
    end = "?" if rng.below(8) == 0 else "."
    return " ".join(words).capitalize() + end


def seeded_text(seed: int, n_chars: int) -> str:
    """The first n_chars characters of seed's text; a longer request extends a shorter one."""
    rng = _SplitMix64(seed)
    parts: list[str] = []
    size = 0
    while size < n_chars:
        sentence = _sentence(rng)
        # A paragraph break now and then, so tokenizers see newlines too.
        sep = "\n\n" if parts and rng.below(7) == 0 else (" " if parts else "")
        parts.append(sep + sentence)
        size += len(sep) + len(sentence)
    return "".join(parts)[:n_chars]


def fresh_tokens(seed: int, count: int, tokenize: Tokenize, avoid_first: frozenset[int] = frozenset()) -> list[int]:
    """`count` tokens of seed's text, starting at its first token not in `avoid_first`."""
    n_chars = 2 * count + 64
    limit = 64 * count + 65536
    while True:
        tokens = list(tokenize(seeded_text(seed, n_chars)))
        start = 0
        while start < len(tokens) and tokens[start] in avoid_first:
            start += 1
        if len(tokens) - start >= count:
            return tokens[start:start + count]
        if n_chars >= limit:
            raise ShadowlabError(
                f"the tokenizer gave only {len(tokens) - start} usable tokens for {n_chars} characters "
                f"of text (seed {seed}); {count} were needed",
                hint="the engine's /tokenize answers look wrong; try it by hand on a sentence")
        n_chars *= 2


# --------------------------------------------------------------------------------------------
# Materialization.


def materialize(prompts: Mapping[str, PromptSpec], tokenize: Tokenize) -> dict[str, MaterializedPrompt]:
    """Every token prompt of a matrix, exact in tokens, in matrix order. Chat prompts are skipped."""
    done: dict[str, MaterializedPrompt] = {}

    def build(pid: str) -> MaterializedPrompt:
        if pid not in done:
            spec = prompts[pid]
            for dep in spec.depends_on():  # the matrix loader has already rejected cycles
                build(dep)
            done[pid] = _checked(spec, _materialize_one(spec, done, tokenize), done)
        return done[pid]

    for pid, spec in prompts.items():
        if not isinstance(spec, ChatPrompt):
            build(pid)
    return {pid: done[pid] for pid in prompts if pid in done}


def _materialize_one(spec: PromptSpec, done: Mapping[str, MaterializedPrompt], tokenize: Tokenize) -> MaterializedPrompt:
    if isinstance(spec, RandomPrompt):
        tokens = fresh_tokens(spec.seed, spec.tokens, tokenize)
    elif isinstance(spec, DivergePrompt):
        source = done[spec.source].tokens
        new = fresh_tokens(spec.seed, spec.tokens - spec.shared, tokenize,
                           avoid_first=frozenset({source[spec.shared]}))
        tokens = list(source[: spec.shared]) + new
    elif isinstance(spec, AppendPrompt):
        tokens = list(done[spec.source].tokens) + fresh_tokens(spec.seed, spec.extra, tokenize)
    elif isinstance(spec, UnrelatedPrompt):
        firsts = frozenset(done[other].tokens[0] for other in spec.unrelated_to)
        tokens = fresh_tokens(spec.seed, spec.tokens, tokenize, avoid_first=firsts)
    else:
        raise TypeError(f"prompt {spec.id!r} of kind {spec.kind!r} is not a token prompt")
    return MaterializedPrompt.of(spec.id, spec.kind, tokens, getattr(spec, "seed", None))


def _checked(spec: PromptSpec, prompt: MaterializedPrompt, done: Mapping[str, MaterializedPrompt]) -> MaterializedPrompt:
    """The promises a matrix makes about a prompt, verified on the actual tokens."""
    problems = []
    if len(prompt.tokens) != spec.length:
        problems.append(f"has {len(prompt.tokens)} tokens, not {spec.length}")
    if isinstance(spec, DivergePrompt):
        lcp = common_prefix(prompt.tokens, done[spec.source].tokens)
        if lcp != spec.shared:
            problems.append(f"shares {lcp} tokens with {spec.source!r}, not {spec.shared}")
    if isinstance(spec, AppendPrompt) and prompt.tokens[: spec.source_length] != done[spec.source].tokens:
        problems.append(f"does not start with all of {spec.source!r}")
    if isinstance(spec, UnrelatedPrompt):
        for other in spec.unrelated_to:
            if common_prefix(prompt.tokens, done[other].tokens):
                problems.append(f"shares a prefix with {other!r}")
    if problems:
        raise ShadowlabError(f"prompt {spec.id!r} " + "; ".join(problems),
                             hint="this is a shadowlab bug; please report it with the matrix")
    return prompt


# --------------------------------------------------------------------------------------------
# prompts/<engine>.json


def save(prompts: Mapping[str, MaterializedPrompt], path: str | Path) -> None:
    """Write {prompt_id: {kind, tokens, sha256, text_seed}} atomically (temp file + rename)."""
    data = {pid: p.to_dict() for pid, p in prompts.items()}
    write_bytes_atomic(Path(path), (json.dumps(data, separators=(",", ":")) + "\n").encode("utf-8"))


def load(path: str | Path) -> dict[str, MaterializedPrompt]:
    """Read a prompts file back; every prompt's sha256 must match its tokens."""
    path = Path(path)
    try:
        data = read_json(path)
    except RunDirError as exc:
        raise RunDirError(f"cannot read prompts: {exc.message}", path=str(path)) from None
    if not isinstance(data, dict):
        raise RunDirError("not a JSON object of prompt id → prompt", path=str(path))
    out = {}
    for pid, entry in data.items():
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if not (isinstance(tokens, list) and all(_is_token(t) for t in tokens)
                and isinstance(entry.get("sha256"), str)):
            raise RunDirError(f"{pid}: expected {{tokens: [token ids], sha256: str}}", path=str(path),
                              hint="the file was edited or damaged; rerun the cells that use it")
        prompt = MaterializedPrompt.from_dict(pid, entry)
        if tokens_sha256(prompt.tokens) != prompt.sha256:
            raise RunDirError(f"prompt {pid!r}: sha256 does not match its tokens", path=str(path),
                              hint="the file was edited or damaged; rerun the cells that use it")
        out[pid] = prompt
    return out


def _is_token(value: Any) -> bool:
    """A token id as tokens_sha256 packs it (signed 32-bit)."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 31) <= value < 1 << 31


# --------------------------------------------------------------------------------------------
# Chat turns.


def chat_messages(prompt: ChatPrompt, replies: Mapping[int, str]) -> list[dict[str, str]]:
    """The turn's messages, `{from_turn: i}` replaced by `replies[i]` (the warm cell's reply text)."""
    messages = []
    for m in prompt.messages:
        if m.from_turn is None:
            content = m.content or ""
        elif m.from_turn in replies:
            content = replies[m.from_turn]
        else:
            raise ShadowlabError(
                f"chat prompt {prompt.id!r} needs the reply to turn {m.from_turn}, which is not available",
                hint="that turn failed or has not run; its cold cell depends on the warm cell")
        messages.append({"role": m.role, "content": content})
    return messages


def render_chatml(messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
    """ChatML, as the reference engine renders a chat request (docs/DESIGN.md §1 Tokenizer)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def materialize_chat(prompt: ChatPrompt, replies: Mapping[int, str], tokenize: Tokenize) -> MaterializedPrompt:
    """A chat prompt as ChatML tokens, for sending to `/completion` (tokenize must parse specials)."""
    text = render_chatml(chat_messages(prompt, replies))
    return MaterializedPrompt.of(prompt.id, prompt.kind, tokenize(text), None)


# --------------------------------------------------------------------------------------------
# Traffic turns.


_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "


def materialize_traffic(sequence: TrafficSequence, tokenize: Tokenize) -> dict[str, MaterializedPrompt]:
    """Every request of a traffic sequence as exact token ids (traffic.Materialiser over a
    vocabulary of the engine's own tokens of seeded text), checked: each pair of prompts shares
    exactly the prefix their segments say (traffic.check_materialised)."""
    # Printable ASCII besides the seeded text: a byte tokenizer then gives ~95 tokens, so as many
    # requests may part ways at one point (traffic.Materialiser's one limit).
    vocabulary = sorted(set(tokenize(seeded_text(0, 4096) + _PRINTABLE)))
    shape = sequence.source
    delimited = isinstance(shape, traffic.TrafficShape) and shape.user_delimiter
    delimiter = tuple(tokenize(CHATML_MESSAGE_DELIMITERS[0]["delimiter"])) if delimited else ()
    try:
        materialiser = traffic.Materialiser(vocabulary, seed=0, delimiter=delimiter)
        built = [materialiser.prompt(r) for r in sequence.requests]
        traffic.check_materialised(sequence.requests, built)
        for index, (request, tokens) in enumerate(zip(sequence.requests, built)):
            if delimiter:
                check_delimited(index, request, tokens, delimiter)
    except ShadowlabError as exc:
        raise ShadowlabError(f"traffic {sequence.name!r}: {exc.message}",
                             hint=f"the engine's tokenizer gave {len(vocabulary)} distinct tokens to start "
                                  "the continuations of one prefix with") from None
    return {pid: MaterializedPrompt.of(pid, "traffic", tokens, None)
            for pid, tokens in zip(sequence.prompts, built)}


def check_delimited(index: int, request: traffic.Request, tokens: Sequence[int], delimiter: Sequence[int]) -> None:
    """The delimiter occurs in a traffic prompt exactly at its user starts: llama.cpp puts a
    user-message checkpoint wherever it finds it, so one inside another block would be a
    checkpoint the traffic (and the simulator) does not know of."""
    n = len(delimiter)
    found = tuple(i for i in range(len(tokens) - n + 1)
                  if tokens[i] == delimiter[0] and tuple(tokens[i:i + n]) == tuple(delimiter))
    if found != tuple(request.user_starts):
        raise ShadowlabError(f"materialised request {index}: the user-message delimiter is at {list(found)[:8]}, "
                             f"its user messages start at {list(request.user_starts)[:8]}")
