"""The `traffic` sequence kind: conversations and interlopers interleaved on one server.

The traffic model is the `shadowlab/traffic/` package (segments, the seeded generator, the Mooncake and
`logs --trace` readers, the ideals, the materialiser); this module is the matrix's side of it:
the spec a traffic sequence loads into and the turn ids of its requests. A sequence either
declares a `shape` (traffic.TrafficShape's keys) or names a `trace` file; the loader realises
its requests once, so plan, run and verdicts see the same turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shadowlab import traffic

REFERENCE_METHODS = ("replay", "cold")
TRACE_FORMATS = ("auto", "mooncake", "shadowlab-trace")
MAX_TRAFFIC_REQUESTS = 4096  # turns of one warm cell: each is an HTTP request and a record
MAX_IN_FLIGHT = 64  # requests a warm traffic cell keeps in flight: one sending thread each


@dataclass(frozen=True)
class TraceSource:
    """A trace file as loaded: where it was and what it held (sha256 of its bytes)."""

    path: Path
    format: str  # "mooncake" | "shadowlab-trace"
    limit: int | None
    sha256: str


def traffic_prompt_id(sequence: str, index: int) -> str:
    """The prompt id of request `index` of a traffic sequence (also its prompts/<engine>.json key)."""
    return f"{sequence}-t{index:04d}"


def shape_fields() -> tuple[tuple[str, str], ...]:
    """(key, default as text) of every TrafficShape key, for docs/matrix.md."""
    default = traffic.TrafficShape()
    return tuple((name, repr(getattr(default, name))) for name in traffic.TrafficShape.__dataclass_fields__)
