"""The engine's own tokenizer, asked over HTTP, in the recorder process (never on the request path).

A chat request's prompt is what llama-server's `/apply-template` renders from the request body
(the same `oaicompat_chat_params_parse` its chat endpoint runs), then `/tokenize` with
`add_special` and `parse_special` (the same `tokenize_mixed` call its completion path makes). A
`/completion` prompt (text, token ids, or both mixed) goes to `/tokenize` as it came. So the
tokens are the server's by construction, for any template and vocabulary the server supports;
a vocabulary-only Python tokenizer would have to re-implement llama.cpp's pre-tokenizers and
its Jinja engine to be as exact. The tokenizer URL may name a second llama-server started with
the same GGUF (`--tokenizer`), keeping even this load off the production server.

User-message starts: llama.cpp places a chat request's checkpoints where the template's user
marker occurs in the prompt tokens (common_chat_msg_delimiters::split). The marker is found
once from the template by rendering two probe conversations (text before the first user
message, and between an assistant message and the next user message: their common suffix,
trailing whitespace dropped; ChatML gives `<|im_start|>user`), or named by the operator.

Everything the server answers is untrusted: token lists are checked (integers, at most
MAX_PROMPT_TOKENS), answers are bounded in size and time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from shadowlab.traffic import MAX_PROMPT_TOKENS

MAX_ANSWER_BYTES = 256 * 1024 * 1024
_PROBES = ("\u2063sl-probe-one\u2063", "\u2063sl-probe-two\u2063", "\u2063sl-probe-three\u2063")


class TokenizerError(Exception):
    """The tokenizer server did not give a usable answer (the exchange is skipped, counted)."""


class EngineTokenizer:
    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=timeout_s)
        self._marker: tuple[int, ...] | None = None
        self._marker_known = False

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise TokenizerError(f"{path}: {type(exc).__name__}") from None
        if response.status_code != 200 or len(response.content) > MAX_ANSWER_BYTES:
            raise TokenizerError(f"{path}: HTTP {response.status_code}")
        try:
            doc = response.json()
        except ValueError:
            raise TokenizerError(f"{path}: not JSON") from None
        if not isinstance(doc, dict):
            raise TokenizerError(f"{path}: not a JSON object")
        return doc

    def tokens(self, content: Any, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        doc = self._post("/tokenize", {"content": content, "add_special": add_special,
                                       "parse_special": parse_special})
        tokens = doc.get("tokens")
        if (not isinstance(tokens, list) or len(tokens) > MAX_PROMPT_TOKENS
                or not all(type(t) is int and 0 <= t < 1 << 31 for t in tokens)):
            raise TokenizerError("/tokenize: no list of token ids")
        return tokens

    def render(self, body: dict[str, Any]) -> str:
        prompt = self._post("/apply-template", body).get("prompt")
        if not isinstance(prompt, str):
            raise TokenizerError("/apply-template: no prompt text")
        return prompt

    def chat_prompt(self, body: dict[str, Any]) -> list[int]:
        return self.tokens(self.render(body))

    def user_marker(self, named: str | None) -> tuple[int, ...]:
        """The user marker's tokens (empty: none found); `named` is the operator's, else detected."""
        if not self._marker_known:
            text = named if named is not None else self._detect_marker()
            self._marker = tuple(self.tokens(text, add_special=False)) if text else ()
            self._marker_known = True
        return self._marker or ()

    def _detect_marker(self) -> str:
        one, two, three = _PROBES
        a = self.render({"messages": [{"role": "user", "content": one}], "add_generation_prompt": False})
        b = self.render({"messages": [{"role": "user", "content": one}, {"role": "assistant", "content": two},
                                      {"role": "user", "content": three}], "add_generation_prompt": False})
        if one not in a or two not in b or three not in b:
            return ""
        before = a[:a.index(one)]
        between = b[b.index(two) + len(two):b.index(three)]
        n = 0
        while n < min(len(before), len(between)) and before[-1 - n] == between[-1 - n]:
            n += 1
        return before[len(before) - n:].rstrip()


def occurrences(tokens: Sequence[int], marker: Sequence[int]) -> list[int]:
    """Positions where `marker` starts in `tokens` (llama.cpp's split: every position, overlaps too)."""
    if not marker:
        return []
    first, m, out = marker[0], len(marker), []
    for i, t in enumerate(tokens):
        if t == first and list(tokens[i:i + m]) == list(marker):
            out.append(i)
    return out
