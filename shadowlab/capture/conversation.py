"""The conversation key, from what clients already send, hashed with the capture's salt.

In order of precedence: the header the operator named (`--conversation-header`), the body's
`prompt_cache_key` (OpenAI's cache-routing key, the reference engine's affinity field), OpenAI's
`user`, llama-server's `id_slot` (a pinned slot: a conversation key only where each
conversation pins its own). The trace holds `session_id` = a keyed BLAKE2b of the key's source
and value (the same salt as the block ids: equal keys give equal ids within one capture, and
nothing outside it can recompute them) and `session_source` = which field it came from.
"""

from __future__ import annotations

import hashlib
from typing import Any

MAX_KEY_CHARS = 4096  # a longer value is not a key a client routes by: ignored


def key(body: dict[str, Any], header_value: str | None) -> tuple[str, str] | None:
    """(source, value) of the first key present, or None."""
    if isinstance(header_value, str) and 0 < len(header_value) <= MAX_KEY_CHARS:
        return "header", header_value
    for field in ("prompt_cache_key", "user"):
        value = body.get(field)
        if isinstance(value, str) and 0 < len(value) <= MAX_KEY_CHARS:
            return field, value
    slot = body.get("id_slot")
    if type(slot) is int and slot >= 0:
        return "id_slot", str(slot)
    return None


def session_id(salt: bytes, source: str, value: str) -> str:
    data = f"{source}\0{value}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=8, key=salt, person=b"shadowlab-conv").hexdigest()
