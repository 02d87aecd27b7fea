"""What an answer reports about itself: status, tokens generated, tokens the server reused.

llama-server's `timings` (`cache_n` reused, `prompt_n` processed, `predicted_n` generated) in a
JSON answer or in the last event of a streamed one that has them; OpenAI's `usage`
(`prompt_tokens_details.cached_tokens`, `completion_tokens`, `prompt_tokens`) where `timings` is
absent (vLLM, SGLang). The payload may be only the tail of a long answer (http1.Tap): events are
then read from the last complete ones. Untrusted: a figure that is not an integer in
[0, MAX_PROMPT_TOKENS] is not reported (None).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shadowlab.traffic import MAX_PROMPT_TOKENS


@dataclass(frozen=True)
class Reported:
    output_length: int | None = None
    reused: int | None = None
    prompt_tokens: int | None = None


def reported(payload: bytes, event_stream: bool) -> Reported:
    for doc in reversed(_documents(payload, event_stream)):
        figures = _figures(doc)
        if figures != Reported():
            return figures
    return Reported()


def _documents(payload: bytes, event_stream: bool) -> list[dict[str, Any]]:
    if not event_stream:
        try:
            doc = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return []
        return [doc] if isinstance(doc, dict) else []
    out = []
    for line in payload.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        try:
            doc = json.loads(line[5:])
        except (ValueError, UnicodeDecodeError):
            continue  # "[DONE]", or an event cut where the tail began
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _figures(doc: dict[str, Any]) -> Reported:
    timings = doc.get("timings") if isinstance(doc.get("timings"), dict) else {}
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    reused = _count(timings.get("cache_n"))
    if reused is None:
        reused = _count(details.get("cached_tokens"))
    output = _count(timings.get("predicted_n"))
    if output is None:
        output = _count(usage.get("completion_tokens"))
    if output is None:
        output = _count(doc.get("tokens_predicted"))
    processed = _count(timings.get("prompt_n"))
    prompt = reused + processed if reused is not None and processed is not None else _count(usage.get("prompt_tokens"))
    return Reported(output, reused, prompt)


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_PROMPT_TOKENS else None
