"""``shadowlab logs``' time: ``--since`` / ``--until`` bounds (``parse_time``) and the clock that
turns a log's printed times into seconds across restarts. Split out of `shadowlab.logs.analysis` (``shadowlab logs``), which re-exports the names its importers use."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from shadowlab.logs.logfiles import SNIFF, UsageError, _Stream

if TYPE_CHECKING:
    from shadowlab.logs import lifecycle

_B11434_TIME = re.compile(rb"(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) ")
_UNIX = re.compile(rb"timestamp=(\d{1,12})")


# --------------------------------------------------------------------------- time


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class TimeBound:
    """A --since / --until bound. A plain class (no dataclass or NamedTuple: their class
    creation was ~3 % of the start of `shadowlab logs`)."""

    __slots__ = ("seconds", "absolute", "text")

    def __init__(self, seconds: float, absolute: bool, text: str = "") -> None:
        self.seconds = seconds
        self.absolute = absolute  # an ISO date (Unix seconds) rather than a duration since the first request
        self.text = text  # as given

    def __repr__(self) -> str:
        return f"TimeBound({self.seconds!r}, {self.absolute!r}, {self.text!r})"


def parse_time(text: str) -> TimeBound:
    m = _DURATION.match(text)
    if m:
        return TimeBound(float(m[1]) * _UNITS[m[2]], False, text)
    if re.fullmatch(r"\d+(?::\d{1,2}){1,2}", text.strip()):
        parts = [int(p) for p in text.strip().split(":")]
        while len(parts) < 3:
            parts.insert(0, 0)
        return TimeBound(parts[0] * 3600 + parts[1] * 60 + parts[2], False, text)
    import datetime as _dt  # for dates only (~2 % of a start)

    try:
        when = _dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since/--until {text!r}: give a duration (90, 15m, 36h, 2d, 1:30:00) or an ISO date") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return TimeBound(when.timestamp(), True, text)


class _Clock:
    """The time of a request's first line, from the lines themselves (see the module docstring)."""

    def __init__(self, family: str):
        self.unix = family == "ik_llama.cpp"
        self.reader: _Stream | None = None
        self.replay: lifecycle.Replay | None = None  # its restarts restart the elapsed count
        self.restarts = 0
        self.base_us = 0  # b11434: whole microseconds, so a sum carries no float error
        self.last_us: int | None = None
        self.last: float | None = None

    def __call__(self, offset: int) -> float | None:
        if self.replay is not None and self.replay.restarts != self.restarts:
            self.restarts = self.replay.restarts
            if self.last_us is not None:  # a new process counts from 0 again: time goes on
                self.base_us = self.last_us
        found = self.reader.line_at(offset) if self.reader is not None else None
        if found is None:
            return self.last
        chunk, i = found
        if self.unix:
            j = chunk.rfind(b"timestamp=", max(0, i - SNIFF), i)
            if j >= 0:
                m = _UNIX.match(chunk, j)
            else:  # the INFO line before may end the block before
                prev = self.reader.prev if i < SNIFF else b""
                j = prev.rfind(b"timestamp=")
                m = _UNIX.match(prev, j) if j >= 0 else None
            if m:
                self.last = float(m[1])
            return self.last
        m = _B11434_TIME.match(chunk, i)
        if not m:
            return self.last
        elapsed = ((int(m[1]) * 60 + int(m[2])) * 1000 + int(m[3])) * 1000 + int(m[4])
        t = elapsed + self.base_us
        if self.last_us is not None and t < self.last_us - 1_000_000:  # the server restarted: time goes on
            self.base_us = self.last_us
            t = elapsed + self.base_us
        self.last_us = t
        self.last = t / 1e6
        return self.last
