"""A `{kind: traffic}` sequence of the matrix: a shape realised into requests, or a trace file read
bounded (docs/DESIGN.md §2 "Traffic sequences")."""

from __future__ import annotations

import hashlib
from typing import Any

from shadowlab import traffic
from shadowlab.bounds import Bounds
from shadowlab.errors import TrafficError
from shadowlab.matrix import sequences, traffic_kind
from shadowlab.matrix.dump import _traffic_to_dict
from shadowlab.matrix.schema import MAX_SIGMA, SHAPE_LENGTHS, schema_key
from shadowlab.matrix.specs import TrafficSequence, traffic_prompt_id
from shadowlab.matrix.traffic_kind import TraceSource
from shadowlab.matrix.values import (_At, _Context, _choice, _closest_hint, _describe, _fields, _given, _list, _num,
                                     _str, _text)
from shadowlab.matrix.yamlpos import LineList, LineMap
from shadowlab.results.records import FileRefused, read_regular_file


MAX_TRACE_BYTES = 64 << 20  # a trace file is read whole at load


def _traffic(name: str, body: LineMap, at: _At, ctx: _Context) -> TrafficSequence:
    f = _fields(body, at, "sequence.traffic")
    if "trace" in f:
        if "shape" in f:
            f["shape"][1].fail("a traffic sequence has a shape or a trace, not both",
                               "remove `shape` to replay the trace, or `trace` to generate the shape")
        source, requests = _trace_source(f, ctx)
    else:
        # `format: auto` (the default) says nothing; any other trace key needs a trace.
        stray = [k for k in ("format", "limit") if k in f and (k, f[k][0]) != ("format", "auto")]
        if stray:
            f[stray[0]][1].fail(f"{stray[0]!r} applies to a trace file only", "add `trace: path` or remove it")
        source = _shape(*f["shape"]) if "shape" in f else traffic.TrafficShape()
        shape_at = f["shape"][1] if "shape" in f else at
        planned = source.requests
        if planned > traffic_kind.MAX_TRAFFIC_REQUESTS:  # refused before generating them
            shape_at.fail(f"about {planned:,} requests; a traffic sequence may have at most "
                          f"{traffic_kind.MAX_TRAFFIC_REQUESTS}", "fewer conversations or turns")
        try:
            requests = tuple(traffic.generate(source))
        except TrafficError as exc:
            shape_at.fail(exc.headline().removeprefix("<shape>: "), exc.hint)
    if not requests:
        at.fail("the traffic has no request", line=body.line)
    if len(requests) > traffic_kind.MAX_TRAFFIC_REQUESTS:
        at.fail(f"{len(requests)} requests; a traffic sequence may have at most "
                f"{traffic_kind.MAX_TRAFFIC_REQUESTS}", "fewer conversations or turns, or a trace `limit`",
                line=body.line)
    reference = _given(f, "sequence.traffic", "reference", _choice, traffic_kind.REFERENCE_METHODS)
    ids = tuple(traffic_prompt_id(name, i) for i in range(len(requests)))
    in_flight = _num(f, "sequence.traffic", "in_flight")
    return TrafficSequence(name, ids, "traffic", source=source, requests=requests, reference=reference,
                           description=_given(f, "sequence.traffic", "description", _text),
                           in_flight=in_flight)


def _shape(value: Any, at: _At) -> traffic.TrafficShape:
    """traffic.shape_from_dict, each key's numbers held to its schema bounds and the key tried
    alone first, so an error names its own line. The request count, which several keys make, is
    _traffic's to judge, on the whole shape: with the matrix's own figures."""
    if not isinstance(value, LineMap):
        at.fail(f"expected a mapping of shape keys, got {_describe(value)}")
    known = sorted(traffic.SHAPE_KEYS)
    for key in value:
        k_at = at.key(key, value.key_lines[key])
        if key not in traffic.SHAPE_KEYS:
            k_at.fail(f"unknown key {key!r}", _closest_hint(str(key), known, "shape keys"))
        v_at = at.key(key, value.value_lines[key])
        _shape_numbers(value[key], v_at, schema_key("shape", key).bounds)
        try:
            traffic.shape_from_dict({key: _plain(value[key])}, "", count=False)
        except (TrafficError, TypeError, ValueError) as exc:
            v_at.fail(_traffic_message(exc), getattr(exc, "hint", None))
    try:
        return traffic.shape_from_dict(_plain(value), "", count=False)  # _traffic's bound is lower
    except (TrafficError, TypeError, ValueError) as exc:
        at.fail(_traffic_message(exc), getattr(exc, "hint", None), line=value.line)


def _shape_numbers(value: Any, at: _At, bounds: Bounds | None) -> None:
    """Every number a shape key holds — itself, a size's (`[low, high]`, `{a, b, low, high}`), a
    weight — within the key's bounds; a lognormal's sigma within MAX_SIGMA, a preamble's header
    lengths within SHAPE_LENGTHS. What is no number is left to traffic.shape_from_dict."""
    if bounds is None or isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        problem = bounds.problem(value)
        if problem is not None:
            at.fail(problem, bounds.hint)
    elif isinstance(value, LineList):
        for item, item_at in _list(value, at):
            _shape_numbers(item, item_at, bounds)
    elif isinstance(value, LineMap):
        sigma = Bounds(0, MAX_SIGMA) if value.get("kind") == "lognormal" else bounds
        for key, item in value.items():
            if isinstance(key, (int, float)):
                _shape_numbers(key, at.key(key, value.key_lines[key]), SHAPE_LENGTHS)
            _shape_numbers(item, at.key(key, value.value_lines[key]), sigma if key == "b" else bounds)


def _plain(value: Any) -> Any:
    """YAML with lines → plain dicts and lists (what traffic.py reads)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _traffic_message(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.removeprefix(": ").strip()


def _trace_source(f: dict[str, tuple[Any, _At]], ctx: _Context) -> tuple[TraceSource, tuple]:
    sec = "sequence.traffic"
    path_value, p_at = f["trace"]
    path = ctx.base_dir / _str(path_value, p_at)
    fmt = _given(f, sec, "format", _choice, traffic_kind.TRACE_FORMATS)
    limit = _num(f, sec, "limit")
    try:
        data = read_regular_file(path, MAX_TRACE_BYTES)
    except FileNotFoundError:
        p_at.fail(f"no such trace file: {path}", "the path is relative to the matrix file")
    except (FileRefused, OSError) as exc:
        p_at.fail(f"cannot read the trace file {path}: {exc}",
                  f"a trace is a regular file of at most {MAX_TRACE_BYTES >> 20} MiB")
    try:
        if fmt == "auto":
            fmt = "shadowlab-trace" if traffic.sniff(path) == "trace" else "mooncake"
        loaded = traffic.read_trace(path) if fmt == "shadowlab-trace" else traffic.read_mooncake(path)
    except TrafficError as exc:
        where = f"{path}:{exc.line}" if getattr(exc, "line", None) else str(path)
        p_at.fail(f"trace {where}: {exc.message}", exc.hint or f"the file must be {fmt} JSON lines")
    requests = loaded.requests[:limit] if limit else loaded.requests
    source = TraceSource(path=path.resolve(), format=fmt, limit=limit, sha256=hashlib.sha256(data).hexdigest())
    return source, tuple(requests)


def _read(given: sequences.SequenceInput) -> TrafficSequence:
    return _traffic(given.name, given.body, given.at, given.ctx)


sequences.register(sequences.SequenceKind("traffic", _read, dump=_traffic_to_dict))
