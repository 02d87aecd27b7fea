"""The traffic model shared by `shadowlab simulate` and the traffic replay (issue 12, 13).

A request is a prompt made of *segments*: `Segment(block, start, length)` stands for tokens
`start .. start+length` of content block `block`. Equal (block, offset) means equal tokens, so
shared leading segments are a shared prefix, and the longest common prefix of two prompts is a
walk over their segments: no token list is ever built (66M prompt tokens are a few hundred
thousand segments). Two different continuations of one prefix are assumed to differ at their first token;
`Materialiser` makes that true (distinct blocks are unlimited; one prefix may have at most
`len(vocabulary)` different continuations) and `check_materialised` proves it for a given traffic.

Sources (docs/DESIGN.md §8):
- `generate(TrafficShape)`: conversations that grow turn by turn, each turn's prompt = system
  block + history blocks + a re-rendered (volatile) block + the new user message, interleaved
  with interlopers of three kinds (zero overlap, a conversation's system prefix, a near-duplicate
  of a conversation's last prompt); deterministic from the seed.
- `read_mooncake(path)`: Mooncake / AIPerf JSON lines (`hash_ids` of 512-token blocks).
- `read_trace(path)`: `shadowlab logs --trace` (docs/trace.md). A log states only the prefix a
  request shared with its slot's previous request, not content: each request is built to share
  exactly that prefix with its slot predecessor and nothing more with anything else.

Bad input is a `TrafficError` naming file and line; readers stream (bounded memory per line).

One module per job, this package's names re-exported here (its public surface): `model` (Segment,
Request, the bounds, Loaded / Stream), `ideals` (the perfect-cache and consecutive-turn ideals),
`shape` (TrafficShape, Dist, presets, shape files), `generate` (the seeded generator), `tally`
(the realised shape), `materialise` (token ids for segments), `lines` (bounded line reading),
`mooncake` and `trace` (the two file formats), `infer` (conversations from shared prefixes);
here: `sniff`, `load` and `stream`, any source by its content.
"""

from __future__ import annotations

from pathlib import Path

from shadowlab.errors import TrafficError
from shadowlab.results import records
from shadowlab.traffic.generate import generate, iter_generate
from shadowlab.traffic.ideals import Ideals, PrefixTrie, ideals
from shadowlab.traffic.lines import MAX_LINE_BYTES, _lines, _parse_line
from shadowlab.traffic.materialise import Materialiser, check_materialised
from shadowlab.traffic.model import (DELIMITER_BLOCK, DELIMITER_TOKENS, MAX_ID, MAX_KEY_CHARS, MAX_PROMPT_TOKENS,
                                     MAX_REQUESTS, MAX_TIME_S, Loaded, Request, Segment, Stream, common_prefix,
                                     output_block, truncate, with_output)
from shadowlab.traffic.mooncake import (ANSWER_WINDOW, CAPTURE_KEYS, MOONCAKE_BLOCK, MOONCAKE_KEYS, read_mooncake,
                                        stream_mooncake, write_mooncake)
from shadowlab.traffic.shape import CASE_STUDY, PRESETS, SHAPE_KEYS, Dist, TrafficShape, read_shape, shape_from_dict
from shadowlab.traffic.tally import NEAR_ZERO, ShapeTally, realised_shape
from shadowlab.traffic.trace import CACHE_LOAD_LOOKBACK, TRACE_KEYS, TRACE_VERSIONS, read_trace, stream_trace

__all__ = [
    "ANSWER_WINDOW", "CACHE_LOAD_LOOKBACK", "CAPTURE_KEYS", "CASE_STUDY", "DELIMITER_BLOCK", "DELIMITER_TOKENS",
    "Dist", "Ideals", "Loaded", "MAX_ID", "MAX_KEY_CHARS", "MAX_LINE_BYTES", "MAX_PROMPT_TOKENS", "MAX_REQUESTS",
    "MAX_TIME_S", "MOONCAKE_BLOCK", "MOONCAKE_KEYS", "Materialiser", "NEAR_ZERO", "PRESETS", "PrefixTrie",
    "Request", "SHAPE_KEYS", "Segment", "ShapeTally", "Stream", "TRACE_KEYS", "TRACE_VERSIONS", "TrafficError",
    "TrafficShape", "check_materialised", "common_prefix", "generate", "ideals", "iter_generate", "load",
    "output_block", "read_mooncake", "read_shape", "read_trace", "realised_shape", "shape_from_dict", "sniff",
    "stream", "stream_mooncake", "stream_trace", "truncate", "with_output", "write_mooncake",
]


def sniff(path: Path) -> str:
    """`trace`, `mooncake` or `shape` from the first non-blank line of a file."""
    for number, line, _ in _lines(path):
        text = line.strip()
        if not text:
            continue
        try:
            doc = _parse_line(text, path, number)
        except records.JSONRefused:
            return "shape"  # YAML
        if isinstance(doc, dict) and doc.get("format") == "shadowlab-trace":
            return "trace"
        if isinstance(doc, dict) and set(doc) & MOONCAKE_KEYS:
            return "mooncake"
        return "shape"
    raise TrafficError("empty file", file=str(path))


def load(path: Path | str) -> Loaded:
    """Any traffic source by its content: a logs trace, a Mooncake file, or a shape file."""
    return stream(path).loaded()


def stream(path: Path | str) -> Stream:
    """`load`, one request at a time (the file is read as the requests are consumed)."""
    if str(path).startswith("shape:") and not Path(path).exists():
        return _preset(str(path))
    path = Path(path)
    kind = sniff(path)
    if kind == "trace":
        return stream_trace(path)
    if kind == "mooncake":
        return stream_mooncake(path)
    return Stream(iter_generate(read_shape(path), str(path)), str(path), "shape")


def _preset(source: str) -> Stream:
    """`shape:NAME[:seed]`: a named shape (`PRESETS`) generated from a seed (default 0)."""
    name, _, seed = source[len("shape:"):].partition(":")
    if name not in PRESETS:
        raise TrafficError(f"{source}: no such shape preset", hint=f"known: {', '.join(f'shape:{n}' for n in PRESETS)}")
    if seed and not seed.isdigit():
        raise TrafficError(f"{source}: the seed after the preset's name is a whole number, got {seed!r}")
    return Stream(iter_generate(PRESETS[name](seed=int(seed or 0))), source, "shape")
