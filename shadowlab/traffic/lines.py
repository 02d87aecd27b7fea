"""Reading a traffic file bounded: regular files only, lines of at most MAX_LINE_BYTES, JSON
through the one bounded reader, and the checked fields (integers, ids) every reader shares.
Bad input is a `TrafficError` naming file and line."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shadowlab.errors import TrafficError
from shadowlab.results import records
from shadowlab.traffic.model import MAX_ID, MAX_KEY_CHARS, MAX_REQUESTS

MAX_LINE_BYTES = 16 * 1024 * 1024  # a JSON line longer than this is refused, never read whole


def _open_regular(path: Path) -> Any:
    """A binary file object of `path` if it is a regular file; TrafficError otherwise (a FIFO
    would wait for a writer, /dev/zero never end: refused unread)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise TrafficError(f"cannot read: {exc.strerror}", file=str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TrafficError("not a regular file (a FIFO, a device or a directory): nothing was read", file=str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, ends with newline), each line read bounded."""
    with _open_regular(path) as fh:
        number = 0
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise TrafficError(f"line longer than {MAX_LINE_BYTES} bytes", file=str(path), line=number)
            yield number, line, line.endswith(b"\n")


def _json_lines(path: Path, skipped: list[str]) -> Iterator[tuple[int, Any]]:
    """Decoded JSON objects; a cut last line (no newline, not JSON) is skipped and counted."""
    for number, line, whole in _lines(path):
        if not line.strip():
            continue
        try:
            doc = _parse_line(line, path, number)
        except records.JSONRefused as exc:
            if not whole:
                skipped.append(f"line {number}: cut last line skipped")
                return
            raise TrafficError(f"not a JSON line: {exc}", file=str(path), line=number) from None
        if not isinstance(doc, dict):
            raise TrafficError("a line must be a JSON object", file=str(path), line=number)
        yield number, doc


def _parse_line(line: bytes, path: Path, number: int) -> Any:
    """One line through records.parse_json (the one bounded JSON reader): JSON nested too deeply
    is refused whether or not the line is whole; other JSONRefused pass to the caller."""
    try:  # without its newline: json's "line 2 column 1" would name a line the file does not have
        return records.parse_json(line.rstrip(b"\r\n"))
    except records.JSONTooDeep as exc:
        raise TrafficError(str(exc), file=str(path), line=number) from None


def _int(doc: dict, key: str, path: Path, line: int, *, required: bool = True, minimum: int = 0,
         maximum: int | None = None) -> int | None:
    if key not in doc or doc[key] is None:
        if required:
            raise TrafficError(f"missing {key!r}", file=str(path), line=line)
        return None
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise TrafficError(f"{key!r} must be an integer, got {v!r}", file=str(path), line=line)
    if v < minimum:
        raise TrafficError(f"{key!r} must be >= {minimum}, got {v}", file=str(path), line=line)
    if maximum is not None and v > maximum:
        raise TrafficError(f"{key!r} is {int(v):,}, beyond the {maximum:,} it may be", file=str(path), line=line)
    return int(v)


def _key(doc: dict, key: str, path: Path, line: int, *, text: bool = True) -> str | int | None:
    """An id that names something (a session, a server, a slot): an integer in [0, MAX_ID], or
    (`text`) a string of at most MAX_KEY_CHARS; None when absent."""
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_ID:
        return v
    if text and isinstance(v, str) and len(v) <= MAX_KEY_CHARS:
        return v
    kinds = f"a string of at most {MAX_KEY_CHARS} characters or " if text else ""
    raise TrafficError(f"{key!r} must be {kinds}an integer from 0 to {MAX_ID:,}, got {_shown(v)}",
                       file=str(path), line=line)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def _count(count: int, path: Path, line: int) -> None:
    if count >= MAX_REQUESTS:
        raise TrafficError(f"more than {MAX_REQUESTS:,} requests", file=str(path), line=line,
                           hint="split the trace by time (--since/--until when it comes from shadowlab logs)")
