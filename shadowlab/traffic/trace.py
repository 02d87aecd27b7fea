"""`shadowlab logs --trace` files (docs/trace.md) as traffic: `read_trace`, `stream_trace`. A log
states only the prefix a request shared with its slot's previous request, not content: each
request is built to share exactly that prefix with its slot predecessor and nothing more with
anything else."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from shadowlab.errors import TrafficError
from shadowlab.traffic.lines import _count, _int, _json_lines, _key, _shown
from shadowlab.traffic.model import MAX_PROMPT_TOKENS, MAX_TIME_S, Loaded, Request, Segment, Stream, _Blocks, truncate


TRACE_KEYS = {"time", "server", "slot", "task", "line", "prompt_tokens", "shared_prefix", "shared_source",
              "reused", "processed", "outcome", "prefill_ms", "checkpoints", "failures",
              "shared_with", "shared_exact"}  # the last two: version 2
TRACE_VERSIONS = (1, 2)


def read_trace(path: Path | str) -> Loaded:
    """`stream_trace`, all in memory."""
    return stream_trace(path).loaded()


# Of each server, the latest prompts a prompt-cache load may have brought back (see stream_trace).
CACHE_LOAD_LOOKBACK = 256


def stream_trace(path: Path | str) -> Stream:
    """`shadowlab logs --trace` (docs/trace.md, versions 1 and 2). Version 2's `shared_with`
    names the task whose prompt the slot's cache held (the slot's previous request, or the saved
    request a prompt-cache load brought back): the request is built on that task's prompt when it
    is among the server's last CACHE_LOAD_LOOKBACK. Otherwise, as for version 1: each request is built to share exactly
    its `shared_prefix` (where `shared_source` is `lcp` or `n_past`; else `reused`, a lower bound)
    with the previous request of the same server and slot, and nothing else: the log says nothing
    about content, so a prefix shared with an older request is invisible (the ideal is then the
    consecutive one) and no request has a conversation. A request that loaded a prompt-cache
    entry (`checkpoints.cache_loaded`, llama-server's `-cram`) shared that prefix with the entry,
    not with the slot's previous request: it is built on the server's latest earlier prompt
    (among the last CACHE_LOAD_LOOKBACK) that is at least that long, the entry's content as far
    as the log can tell. `reused` (what the engine reused) is kept as the request's
    `reported_reuse`: its ideal is never below it. A request without `prompt_tokens` is skipped
    and counted."""
    out = Stream(iter(()), str(Path(path)), "trace")
    out.requests = _trace_requests(Path(path), out.skipped)
    return out


def _trace_requests(path: Path, skipped: list[str]) -> Iterator[Request]:
    docs = _json_lines(path, skipped)
    first = next(docs, None)
    if first is None:
        raise TrafficError("empty trace (no header line)", file=str(path), line=1)
    _trace_header(first[1], path, first[0])
    fresh = _Blocks()
    previous: dict[tuple[Any, Any], tuple[Segment, ...]] = {}
    recent: dict[Any, deque[tuple[Segment, ...]]] = {}  # per server, its latest prompts
    by_task: dict[Any, OrderedDict[int, tuple[Segment, ...]]] = {}  # per server, its latest prompts by task (v2)
    last_time: dict[Any, float] = {}
    count = 0
    for line, doc in docs:
        unknown = set(doc) - TRACE_KEYS
        if unknown:
            raise TrafficError(f"unknown field(s) {sorted(unknown)}", file=str(path), line=line, hint="docs/trace.md")
        n = _int(doc, "prompt_tokens", path, line, required=False, minimum=1, maximum=MAX_PROMPT_TOKENS)
        if n is None:
            skipped.append(f"line {line}: no prompt_tokens")
            continue
        _count(count, path, line)
        count += 1
        server = _key(doc, "server", path, line)
        key = (server, _key(doc, "slot", path, line, text=False))
        t = _trace_time(doc, path, line, last_time)
        source = doc.get("shared_source")
        shared = _int(doc, "shared_prefix" if source in ("lcp", "n_past") else "reused", path, line,
                      required=False, maximum=MAX_PROMPT_TOKENS) or 0
        reused = _int(doc, "reused", path, line, required=False, maximum=MAX_PROMPT_TOKENS)
        earlier = recent.setdefault(server, deque(maxlen=CACHE_LOAD_LOOKBACK))
        tasks = by_task.setdefault(server, OrderedDict())
        prev = previous.get(key, ())
        with_task = doc.get("shared_with")
        if isinstance(with_task, int) and not isinstance(with_task, bool) and with_task in tasks:
            prev = tasks[with_task]  # v2: the log says whose prompt the slot's cache held
        elif _loaded_entry(doc):
            prev = next((p for p in reversed(earlier) if _length(p) >= min(shared, n)), prev)
        keep = truncate(prev, min(shared, n, _length(prev)))
        rest = n - _length(keep)
        segments = keep + ((fresh.new(rest),) if rest > 0 else ())
        previous[key] = segments
        earlier.append(segments)
        task = doc.get("task")
        if isinstance(task, int) and not isinstance(task, bool):
            tasks[task] = segments
            tasks.move_to_end(task)
            if len(tasks) > CACHE_LOAD_LOOKBACK:
                tasks.popitem(last=False)
        yield Request(t, None, segments, 1, (), "trace", reused, None if server is None else str(server))


def _loaded_entry(doc: dict) -> bool:
    """The line says a prompt-cache entry was loaded for the request (docs/trace.md)."""
    ckpts = doc.get("checkpoints")
    loaded = ckpts.get("cache_loaded") if isinstance(ckpts, dict) else None
    return isinstance(loaded, int) and not isinstance(loaded, bool) and loaded > 0


def _length(segments: Sequence[Segment]) -> int:
    return sum(s.length for s in segments)


def _trace_header(doc: dict, path: Path, line: int) -> None:
    if doc.get("format") != "shadowlab-trace":
        raise TrafficError("not a shadowlab trace: line 1 must be its header", file=str(path), line=line,
                           hint="write one with `shadowlab logs --trace FILE`")
    if doc.get("version") not in TRACE_VERSIONS:
        raise TrafficError(f"trace version {doc.get('version')!r} is not known (this shadowlab reads 1 and 2)",
                           file=str(path), line=line)


def _trace_time(doc: dict, path: Path, line: int, last: dict[Any, float]) -> float:
    t = doc.get("time")
    if t is None:
        return last.get(doc.get("server"), 0.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME_S:  # NaN fails too
        raise TrafficError(f"'time' must be a number of seconds from 0 to {MAX_TIME_S:g}, got {_shown(t)}",
                           file=str(path), line=line)
    server = doc.get("server")
    if server in last and t < last[server]:
        raise TrafficError(f"time {t} is before the previous request's {last[server]} on server {server!r}",
                           file=str(path), line=line)
    last[server] = float(t)
    return float(t)
