"""``shadowlab logs``: production llama-server logs → the numbers that decide what to qualify.

    shadowlab logs FILE... [--out DIR] [--json] [--trace TRACE.jsonl]
                   [--since T --until T] [--slot N] [--family F]

Files
-----
Plain or gzip (recognised by its magic bytes, not its name), streamed in line-aligned 8 MiB
chunks through ``logparse.iter_events`` and ``lifecycle.Replay``: memory stays flat in the log
size (per-request figures are kept as arrays of numbers; ``--trace`` is written as it goes).
Logs with b11434 elapsed times, read without filters or ``--trace``, go through the C fold
instead (``_server_fold``: the same figures, ~8x less CPU; docs/DESIGN.md §7 says when it hands
a server back to ``Replay``).
Files are grouped into servers by name: ``foo.log``, ``foo.log.1``, ``foo.log.2.gz`` are the
rotated pieces of one server, read oldest first (highest number first, the bare name last) as
one stream; every other name is a server of its own. Every piece is opened by
``logparse.open_log`` (a FIFO, a device or a directory is refused before a byte is read: it
could block or never end) and read by ``logparse.LogText``; a file that cannot be opened is
reported with the reason, and a server none of whose pieces could be read gets no figures. A
gzip that is corrupt or truncated keeps every whole line decompressed before the damage (as
zcat gives them) and is reported damaged, with the compressed byte and the lines read. A last line without its newline (a file cut mid-write) is never parsed: it is
counted as not understood, so a cut number can never give a wrong value.

Family: ``--family``, else from the first 64 KiB of the server's first piece: b11434-style
timestamps (``M.SS.mmm.uuu L ...``) → ``llama.cpp`` (``reference`` when the reference engine's
banner is there); ``INFO [ ... ] ... timestamp=`` lines → ``ik_llama.cpp``; otherwise
``llama.cpp`` (older upstream prints the same words).

Times: b11434 prints the time elapsed since the server started (seconds here); at a restart
(lifecycle.py: the start-up line or a task id going down) or a backwards jump of more than a
second, the count goes on from the last time seen. ik_llama.cpp prints none on its slot lines,
so a request takes the Unix time of the nearest ``INFO [...] timestamp=`` line before it; a Unix
time that goes backwards (a clock stepped back, pieces out of time order) is kept as printed: it
is no restart, and the over-time figure spans the earliest to the latest request.
``--since`` / ``--until`` take a duration (``90``, ``15m``, ``36h``, ``2d``, ``1:30:00``),
compared with the time since the first request of each server, or an ISO date
(``2026-10-15T12:00``, UTC) compared with Unix times, which only ik_llama.cpp logs have: a server
without them is then not filtered, and the output says so. A filter that can select nothing
(``--slot`` below 0, ``--since`` after ``--until`` of the same kind) is a usage error.

Figures (per server, per slot, overall): see README "Reading production logs" and lifecycle.py
for the definitions of outcomes and failure conditions. Distributions use nearest-rank
percentiles (p-th: the ceil(p·n/100)-th smallest value).
"""

from __future__ import annotations

import bisect
import datetime as _dt
import heapq
import io
import json
import math
import os
import re
from array import array
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, attrgetter, lshift, sub, truediv
from types import SimpleNamespace
from typing import Any, TextIO

from shadowlab.logs import accel, lifecycle, parse as logparse
from shadowlab.errors import LogSourceError
from shadowlab.escape import visible as terminal_safe  # records' terminal_safe, without importing records

VERSION = 1
TRACE_VERSION = 2  # 2: shared_with, shared_exact (docs/trace.md)
CHUNK = logparse.BLOCK_SIZE
SNIFF = 1 << 16
EVENT_COUNT_KINDS = accel.EVENT_COUNT_KINDS
PERCENTILES = (("min", 0), ("p10", 10), ("p25", 25), ("median", 50), ("p75", 75), ("p90", 90), ("max", 100))
LARGE_SHARED = 4096
TIME_BINS = 48
MAX_ROWS = 200  # per-request rows in JSON / HTML (every row is in --trace)

_ROTATED = re.compile(r"^(?P<base>.+?)\.(?P<n>\d+)(?:\.gz)?$|^(?P<gzbase>.+?)\.gz$")
_B11434_TIME = re.compile(rb"(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) ")
_B11434_HEAD = re.compile(rb"^\d+\.\d\d\.\d{3}\.\d{3} [A-Z] ", re.M)
_IK_INFO = re.compile(rb"^(?:INFO|WARN|VERB) \[[^\]]*\].*\btimestamp=\d+", re.M)
_UNIX = re.compile(rb"timestamp=(\d{1,12})")
_SIM_WORD = b"checking sim = "
_SIM = re.compile(rb"id +(\d+) \| task -?\d+ \| +- checking sim = [\d.]+ \((\d+)/(\d+)\)")
_CHECK_WORD = b"hecking checkpoint with ["
_offset = attrgetter("offset")
_CHECK = re.compile(rb"id +(\d+) \| task (\d+) \| +[Cc]hecking checkpoint with \[-?\d+, -?\d+\] against (\d+)\.\.\.")


class UsageError(Exception):
    """Bad arguments or no readable input: exit 2."""


# --------------------------------------------------------------------------- files


@dataclass
class FileReport:
    path: str
    server: str
    compressed: bool = False
    lines: int = 0
    bytes: int = 0
    unknown: int = 0
    unknown_samples: list[tuple[int, str]] = field(default_factory=list)
    overlong: int = 0
    cut_last_line: bool = False
    error: str | None = None  # could not be read at all
    damage: str | None = None  # read up to a point


def group_servers(paths: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(server name, its pieces oldest first), servers in the order first named."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for p in paths:
        name = os.path.basename(p)
        m = _ROTATED.match(name)
        if m and m.group("base"):
            base, n = m.group("base"), int(m.group("n"))
        elif m and m.group("gzbase"):
            base, n = m.group("gzbase"), 0
        else:
            base, n = name, 0
        key = os.path.join(os.path.dirname(p), base)
        groups.setdefault(key, []).append((n, p))
    return [(k, [p for _, p in sorted(v, key=lambda t: (-t[0], t[1].endswith(".gz") is False, t[1]))])
            for k, v in groups.items()]


class _Stream(io.RawIOBase):
    """One server's pieces, oldest first, as one binary stream for ``logparse.iter_events``,
    which reads it with ``readinto`` into one reused buffer: each block is filled here and cut at
    its last newline (the partial line is carried to the next block), so a piece's cut last line
    is never handed on and never joins the next piece's first line. Offsets and line numbers run
    on across pieces, so a line that looks back (ik_llama.cpp's timing line) finds its header in
    the previous piece. While the parser reads a block the block stays in the buffer: the clock
    reads a request's time there, and the side notes the parser does not make events of (b11434's
    ``checking sim`` and ``checking checkpoint ... against N`` lines) are taken from it."""

    def __init__(self, pieces: Sequence[str], server: str, side: deque, reports: list[FileReport],
                 stdin: Stdin | None = None):
        super().__init__()
        self.pieces, self.server, self.side, self.reports = list(pieces), server, side, reports
        self.stdin = stdin  # the piece named "-"
        self.stats: logparse.ParseStats | None = None  # set before reading: per-piece counts
        self.src: Any = None
        self.raw: Any = None
        self.rep: FileReport | None = None
        self.carry = b""
        self.open_line = False  # the last bytes handed on were an overlong line's, without newline
        self.pos = 0  # stream bytes handed on
        self.buf: Any = b""  # the block being parsed: stream bytes [start, start + size)
        self.start = self.size = 0
        self.prev = b""  # the last SNIFF bytes before it
        self.starts: list[tuple[int, int, str]] = []  # (stream offset, stream line, path) per piece
        self.pending: FileReport | None = None  # the piece whose counts settle() gives next
        self.piece_pos = 0
        self._base = (0, 0, 0, 0)
        # the Python replay reads it: find the side notes, keep the look-back for the clock (the C
        # fold finds its own notes and reads no ik_llama.cpp clock)
        self.for_replay = True
        self.last_check = b""  # the head of the last check note taken: a task's run may cross blocks

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while True:
            if self.src is None:
                if not self._open_next():
                    return 0
                continue  # a piece that cannot be opened has no src: the next one
            n = self._fill(b)
            if n:
                return n

    def piece_of(self, offset: int, line: int) -> tuple[str, int]:
        """(path, line within it) of a stream line."""
        i = bisect.bisect_right(self.starts, (offset, 1 << 62, "")) - 1
        if i < 0:
            return (self.pieces[0] if self.pieces else "", line)
        return self.starts[i][2], line - self.starts[i][1]

    def _open_next(self) -> bool:
        if not self.pieces:
            return False
        self.settle()
        path = self.pieces.pop(0)
        rep = FileReport(path=path, server=self.server)
        self.reports.append(rep)
        self.pending, self.piece_pos = rep, self.pos
        st = self.stats
        self._base = (st.lines, st.unknown_count, len(st.unknown_samples), st.overlong_lines) if st else (0, 0, 0, 0)
        self.starts.append((self.pos, self._base[0], path))
        try:  # open_log refuses a FIFO, a device, a directory
            self.raw = self.stdin.open() if path == STDIN and self.stdin is not None else logparse.open_log(path)
        except LogSourceError as exc:
            rep.error = exc.message
            return True  # src stays None: the next piece
        self.rep, self.src = rep, logparse.LogText(self.raw)
        return True

    def _fill(self, b: Any) -> int:
        """Fill b with the current piece (after the carried partial line); the bytes up to its
        last newline, or 0 when the piece is done (then closed)."""
        if self.size and self.for_replay:  # b still holds the block before: keep its end for look-backs
            self.prev = bytes(b[max(0, self.size - SNIFF): self.size])
        k = len(self.carry)
        b[:k] = self.carry
        view = memoryview(b)
        n, eof = k, False
        while n < len(b):
            got = self.src.readinto(view[n:])  # damage ends the text: said in settle()
            if not got:
                eof = True
                break
            n += got
        view.release()
        end = b.rfind(b"\n", 0, n) + 1
        if eof:
            if end < n:  # a line cut mid-write: never parsed (a cut number would read as another)
                self._cut_line(bytes(b[end:n]))
            if not end:
                return self._close_piece(b)
        elif not end:  # a buffer without a newline: an overlong line, the parser cuts it
            end = n
        self.carry = bytes(b[end:n])
        self.open_line = b[end - 1] != 10
        self.buf, self.start, self.size = b, self.pos, end
        self.pos += end
        if self.for_replay:
            self._side_notes(b, end)
        if eof:
            self.carry = b""
            self._close_piece(None)
        return end

    def _close_piece(self, b: Any) -> int:
        """The piece is done; 1 when a newline is still owed (an overlong line ended the piece)."""
        self.rep.compressed, self.rep.damage = bool(self.src.compressed), self.src.damage
        self.src.close()
        self.raw.close()
        self.src = self.raw = None
        if b is not None and self.open_line:  # ends the overlong line the parser is skipping
            b[:1] = b"\n"
            self.open_line = False
            self.buf, self.start, self.size = b, self.pos, 1
            self.pos += 1
            return 1
        return 0

    def _cut_line(self, tail: bytes) -> None:
        rep = self.rep
        rep.cut_last_line = True
        rep.unknown += 1
        if len(rep.unknown_samples) < logparse.MAX_SAMPLES:
            rep.unknown_samples.append((-1, tail[: logparse.SAMPLE_CHARS].decode("utf-8", "replace")))

    def settle(self) -> None:
        """Give the piece read last its counts from the parser's: called when the parser asks
        for the next piece's first block (it has read every block before) and at the end."""
        rep, self.pending = self.pending, None
        st = self.stats
        if rep is None or st is None:
            return
        lines, unknown, samples, overlong = self._base
        rep.lines, rep.bytes = st.lines - lines, self.pos - self.piece_pos
        rep.unknown += st.unknown_count - unknown
        got = [(ln - lines, text) for ln, text in st.unknown_samples[samples:]]
        rep.unknown_samples = (got + rep.unknown_samples)[: logparse.MAX_SAMPLES]
        rep.overlong = st.overlong_lines - overlong
        if rep.damage is not None:  # where it stopped, as logparse says it
            rep.damage += f": the {rep.lines:,} whole lines before it were read"

    def _side_notes(self, b: Any, end: int) -> None:
        base = self.start
        sims, checks = [], []
        i = b.find(_SIM_WORD, 0, end)
        while i >= 0:  # b11434's slot-selection lines state the shared prefix
            line_start = b.rfind(b"\n", 0, i) + 1
            m = _SIM.search(b, line_start, i + 40)
            if m:
                sims.append(lifecycle.SharedPrefix(int(m[1]), int(m[2]), int(m[3]), base + line_start))
            i = b.find(_SIM_WORD, i + 1, end)
        i = b.find(_CHECK_WORD, 0, end)
        last = self.last_check
        while i >= 0:  # b11434: the engine's n_past (one note per task: its lines all say the same)
            line_start = b.rfind(b"\n", 0, i) + 1
            head = b[b.rfind(b"| task ", line_start, i): i]
            if head != last:  # the first line of a task's run of them
                m = _CHECK.search(b, line_start, i + 80)
                if m:
                    last = head
                    checks.append(lifecycle.CheckpointCheck(int(m[1]), int(m[2]), int(m[3]), base + line_start))
            i = b.find(_CHECK_WORD, i + 1, end)
        self.last_check = bytes(last)
        # Replay.run drains the notes in offset order: appended as two runs (all sims, then all
        # checks) a check stayed behind the block's last sim line, and its task closed without it
        self.side.extend(heapq.merge(sims, checks, key=_offset))

    def line_at(self, offset: int) -> tuple[Any, int] | None:
        i = offset - self.start
        return (self.buf, i) if 0 <= i < self.size else None


STDIN = "-"  # the file name that means standard input


class Stdin:
    """``-``: standard input (a pipe: read once). Its first SNIFF bytes are read ahead and kept,
    for the family's sniff, then handed on first when the piece is read."""

    def __init__(self, fh: Any):
        self.fh = fh
        self.head = fh.read(SNIFF) or b""

    def open(self) -> Any:
        return _Prefixed(self.head, self.fh)


class _Prefixed(io.RawIOBase):
    """``head`` then the rest of ``fh`` (not closed with it: standard input is not ours)."""

    def __init__(self, head: bytes, fh: Any):
        super().__init__()
        self.head, self.fh = memoryview(head), fh

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.fh.read(len(b))
        b[: len(data)] = data
        return len(data)


def sniff_family(path: str, stdin: Stdin | None = None) -> str:
    try:
        if path == STDIN and stdin is not None:
            head = logparse.LogText(io.BytesIO(stdin.head)).read(SNIFF)
        else:
            with logparse.open_log(path) as fh:
                head = logparse.LogText(fh).read(SNIFF)
    except LogSourceError:  # the piece's reader says why
        return "llama.cpp"
    if _B11434_HEAD.search(head):
        return "reference" if b"shadowlab-engine" in head else "llama.cpp"
    if _IK_INFO.search(head):
        return "ik_llama.cpp"
    return "llama.cpp"


# --------------------------------------------------------------------------- figures


def _pct(sorted_values: Sequence[int], p: int) -> int | None:
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[max(0, math.ceil(p * n / 100) - 1)] if p else sorted_values[0]


def distribution(values: Sequence[int]) -> dict[str, Any]:
    return _ranked(sorted(values))


def _ranked(v: Sequence[int]) -> dict[str, Any]:
    """distribution() of values already sorted."""
    out: dict[str, Any] = {name: _pct(v, p) for name, p in PERCENTILES}
    out["n"] = len(v)
    return out


class Figures:
    """What one scope (a slot; a server and the whole are folded from their slots) adds up: sums
    and arrays of numbers, one ``add`` per request."""

    _SUMS = ("requests", "shared_stated", "prompt_tokens", "reusable", "reused", "processed", "avoidable",
             "prefill_ms", "timed_tokens", "placement", "retention", "baseline", "create_n", "create_mib_n",
             "create_ms_n", "create_mib", "create_ms", "restore_n", "restore_mib_n", "restore_ms_n",
             "restore_mib", "restore_ms")

    def __init__(self) -> None:
        self.requests = 0
        self.outcomes: dict[str, int] = dict.fromkeys(lifecycle.OUTCOMES, 0)
        self.events: dict[str, int] = dict.fromkeys(EVENT_COUNT_KINDS, 0)
        self.shared = array("q")  # over warm requests with a known shared prefix
        self.shared_stated = 0
        self.prompts = array("q")
        self.prompt_tokens = self.reusable = self.reused = self.processed = self.avoidable = 0
        self.prefill_ms = 0.0
        self.timed_tokens = 0
        self.placement = self.retention = self.baseline = 0
        self.create_n = self.create_mib_n = self.create_ms_n = 0
        self.create_mib = self.create_ms = 0.0
        self.restore_n = self.restore_mib_n = self.restore_ms_n = 0
        self.restore_mib = self.restore_ms = 0.0
        self.t0: float | None = None
        self.t1: float | None = None

    def add(self, r: Any) -> None:
        """One request (a ``lifecycle.Served`` or ``Request``)."""
        self.requests += 1
        self.outcomes[r.outcome] += 1
        ev = self.events
        if r.created:
            ev["created"] += len(r.created)
            self.create_n += len(r.created)
            for c in r.created:
                if c.size_mib is not None:
                    self.create_mib += c.size_mib
                    self.create_mib_n += 1
                if c.took_ms is not None:
                    self.create_ms += c.took_ms
                    self.create_ms_n += 1
        if r.erase_counts:
            for k, n in r.erase_counts.items():
                ev[k] += n
        c = r.restored
        if c is not None:
            ev["restored"] += 1
            self.restore_n += 1
            if c.size_mib is not None:
                self.restore_mib += c.size_mib
                self.restore_mib_n += 1
            if c.took_ms is not None:
                self.restore_ms += c.took_ms
                self.restore_ms_n += 1
        if r.forced:
            ev["forced"] += 1
        if r.cache_saved or r.cache_loaded:
            ev["cache_saved"] += r.cache_saved
            ev["cache_loaded"] += r.cache_loaded
        prompt = r.prompt_tokens
        if prompt is not None:
            self.prompts.append(prompt)
            self.prompt_tokens += prompt
        reused = r.reused or 0
        shared = r.shared_prefix
        if shared is not None and r.outcome != "cold":
            self.shared.append(shared)
            if r.shared_source != "re_entry":
                self.shared_stated += 1
            self.reusable += shared
            if shared > reused:
                self.avoidable += shared - reused
        self.reused += reused
        if r.processed is not None:
            self.processed += r.processed
            if r.prefill_ms is not None:
                self.prefill_ms += r.prefill_ms
                self.timed_tokens += r.processed
        if r.placement:
            self.placement += 1
        if r.retention:
            self.retention += 1
        if r.baseline_loss:
            self.baseline += 1
        t = r.time
        if t is not None:
            if self.t0 is None or t < self.t0:
                self.t0 = t
            if self.t1 is None or t > self.t1:
                self.t1 = t

    def merge(self, other: Figures) -> Figures:
        """Add another scope's figures into this one (a server's from its slots)."""
        for name in self._SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.outcomes, other.outcomes), (self.events, other.events)):
            for k, v in theirs.items():
                mine[k] += v
        self.shared.extend(other.shared)
        self.prompts.extend(other.prompts)
        for t in (other.t0, other.t1):
            if t is not None:
                self.t0 = t if self.t0 is None else min(self.t0, t)
                self.t1 = t if self.t1 is None else max(self.t1, t)
        return self

    def to_dict(self) -> dict[str, Any]:
        # sorted once: the percentiles and both shares read it (the fold's arrays come sorted per
        # slot, and timsort merges those runs in linear time)
        ordered = sorted(self.shared)
        shared = _ranked(ordered)
        n = len(ordered)
        rate = self.timed_tokens / (self.prefill_ms / 1000) if self.prefill_ms > 0 else None
        return {
            "requests": self.requests,
            "outcomes": {o: self.outcomes.get(o, 0) for o in lifecycle.OUTCOMES},
            "events": {k: self.events.get(k, 0) for k in EVENT_COUNT_KINDS},
            "forced_vs_restored": [self.outcomes.get("forced", 0), self.outcomes.get("restored", 0)],
            "shared_prefix": shared | {
                "stated_by_log": self.shared_stated,
                "share_under_512": _ratio(bisect.bisect_left(ordered, lifecycle.BASELINE_TOKENS), n),
                "share_4096_or_more": _ratio(n - bisect.bisect_left(ordered, LARGE_SHARED), n),
            },
            "prompt_tokens": distribution(self.prompts) | {"sum": self.prompt_tokens},
            "reusable_tokens": self.reusable,
            "reusable_share": _ratio(self.reusable, self.prompt_tokens),
            "reused_tokens": self.reused,
            "processed_tokens": self.processed,
            "prefill_ms": round(self.prefill_ms, 3),
            "prefill_tokens_per_s": round(rate, 3) if rate else None,
            "avoidable_tokens": self.avoidable,
            "avoidable_prefill_s": round(self.avoidable / rate, 3) if rate else None,
            "failures": {"placement": self.placement, "retention": self.retention, "baseline_loss": self.baseline},
            "checkpoint_cost": {
                "created": self.create_n,
                "created_mib_each": _mean(self.create_mib, self.create_mib_n),
                "created_ms_each": _mean(self.create_ms, self.create_ms_n),
                "restored": self.restore_n,
                "restored_mib_each": _mean(self.restore_mib, self.restore_mib_n),
                "restored_ms_each": _mean(self.restore_ms, self.restore_ms_n),
                "creations_per_request": _ratio(self.create_n, self.requests),
            },
            "time_span_s": [self.t0, self.t1],
        }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 6) if b else None


def _mean(total: float, n: int) -> float | None:
    return round(total / n, 6) if n else None


# --------------------------------------------------------------------------- time


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class TimeBound:
    seconds: float
    absolute: bool  # an ISO date (Unix seconds) rather than a duration since the first request
    text: str = ""  # as given


def parse_time(text: str) -> TimeBound:
    m = _DURATION.match(text)
    if m:
        return TimeBound(float(m[1]) * _UNITS[m[2]], False, text)
    if re.fullmatch(r"\d+(?::\d{1,2}){1,2}", text.strip()):
        parts = [int(p) for p in text.strip().split(":")]
        while len(parts) < 3:
            parts.insert(0, 0)
        return TimeBound(parts[0] * 3600 + parts[1] * 60 + parts[2], False, text)
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
        self.base = 0.0
        self.last: float | None = None

    def __call__(self, offset: int) -> float | None:
        if self.replay is not None and self.replay.restarts != self.restarts:
            self.restarts = self.replay.restarts
            if self.last is not None:  # a new process counts from 0 again: time goes on
                self.base = self.last
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
        elapsed = int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
        t = elapsed + self.base
        if self.last is not None and t < self.last - 1.0:  # the server restarted: time goes on
            self.base = self.last
            t = elapsed + self.base
        self.last = t
        return t


# --------------------------------------------------------------------------- analysis


@dataclass
class Options:
    family: str | None = None
    since: TimeBound | None = None
    until: TimeBound | None = None
    slot: int | None = None
    trace: TextIO | None = None
    stdin: Any = None  # the binary stream a file named "-" reads (standard input)

    def check(self) -> None:
        """Filters that can select nothing are usage errors, not an empty answer."""
        if self.slot is not None and self.slot < 0:
            raise UsageError(f"--slot {self.slot}: slot ids are 0 or more")
        since, until = self.since, self.until
        if since is not None and until is not None and since.absolute == until.absolute and since.seconds > until.seconds:
            raise UsageError(f"--since {since.text!r} lies after --until {until.text!r}: no time is in that window")


def analyse(paths: Sequence[str], options: Options) -> dict[str, Any]:
    """Read every file; the whole result as the JSON document (``version`` 1)."""
    overall = Figures()
    servers_out = []
    files_out: list[FileReport] = []
    rows: list[dict[str, Any]] = []
    times = array("d")
    codes = array("b")
    notes: list[str] = []
    readers: list[dict[str, Any]] = []
    if options.trace is not None:
        options.trace.write(json.dumps({"format": "shadowlab-trace", "version": TRACE_VERSION,
                                        "time_unit": "s", "source": "shadowlab logs"}) + "\n")
    stdin = Stdin(options.stdin) if STDIN in paths and options.stdin is not None else None
    for server, pieces in group_servers(paths):
        family = options.family or sniff_family(pieces[0], stdin)
        first = len(files_out)
        reading: dict[str, Any] = {"server": server, "reader": "c_fold", "why": None, "lines_handed_back": 0,
                                   "kinds": {}}
        doc, fig = _server(server, pieces, family, options, files_out, rows, times, codes, reading, stdin)
        if all(f.error is not None for f in files_out[first:]):
            continue  # nothing of it was read: its files are listed unreadable, with no figures
        readers.append(reading)
        servers_out.append(doc)
        overall.merge(fig)
    readable = [f for f in files_out if f.error is None]
    overall_doc = overall.to_dict()
    if len({s["time"] for s in servers_out}) > 1:  # elapsed and Unix times do not add up
        overall_doc["time_span_s"] = [None, None]
        notes.append("servers mix elapsed and Unix times: no overall time span")
    return {
        "version": VERSION,
        "tool": "shadowlab logs",
        "overall": overall_doc,
        "servers": servers_out,
        "files": [_file_dict(f) for f in files_out],
        "lines_read": sum(f.lines for f in files_out),
        "lines_not_understood": sum(f.unknown for f in files_out),
        "unreadable_files": [{"path": f.path, "why": f.error} for f in files_out if f.error],
        "damaged_files": [{"path": f.path, "why": f.damage} for f in files_out if f.damage],
        "readable_files": len(readable),
        "filters": {"since": _bound(options.since), "until": _bound(options.until), "slot": options.slot,
                    "family": options.family},
        "requests": rows,
        "requests_shown": len(rows),
        "over_time": _over_time(times, codes),
        "notes": notes,
        "warnings": [{"server": r["server"], "why": NOT_VERBOSE} for r in readers if _not_verbose(r["kinds"])],
        "reader": _reader_doc(readers),
        "_hist": log_bins(overall.shared),  # for the HTML picture only; not in the JSON
    }


# The C fold (shadowlab/logs/_logscan.c fold_*) reads these families: b11434-style elapsed times.
_FOLD_FAMILIES = ("llama.cpp", "llama.cpp-legacy", "reference")
FOLD = True  # tests switch it off to compare the two paths
# The fold reads 1 MiB blocks: copied in and scanned while in the CPU's cache, ~15% less CPU
# than 8 MiB ones. A line longer than a block (logparse.MAX_LINE is 1 MiB) falls back to Python.
_FOLD_BLOCK = 1 << 20
_FOLD_KIND = {kind: i for i, kind in enumerate(logparse.ACCEL_KINDS)}  # the C code's `enum kind`


class _Unfoldable(Exception):
    """The C fold met what only the Python replay reads exactly (the reason is the message);
    ``written``: the trace lines it had written."""

    def __init__(self, why: str, written: int = 0):
        super().__init__(why)
        self.written = written


def _server(server: str, pieces: list[str], family: str, options: Options, files_out: list[FileReport],
            rows: list[dict[str, Any]], times: array, codes: array,
            reading: dict[str, Any], stdin: Stdin | None = None) -> tuple[dict[str, Any], Figures]:
    """One server's pieces as one stream: its JSON part and its figures. The C fold reads it
    when it can (the same figures, ~8x less CPU); whatever it cannot read exactly, it says, and
    the Python replay reads the whole server again. ``reading`` says which read it and why."""
    fold = logparse.folder()
    if FOLD and fold is not None and family in _FOLD_FAMILIES:
        kept = len(files_out), len(rows), len(times)
        try:
            return _server_fold(fold, server, pieces, family, options, files_out, rows, times, codes, reading, stdin)
        except (_Unfoldable, MemoryError) as exc:  # the replay reports running out of memory where it does
            del files_out[kept[0]:], rows[kept[1]:], times[kept[2]:], codes[kept[2]:]
            skip = exc.written if isinstance(exc, _Unfoldable) else 0
            reading.update(reader="python_replay", why=str(exc) if isinstance(exc, _Unfoldable) else "out of memory")
            return _server_replay(server, pieces, family, options, files_out, rows, times, codes, skip, stdin,
                                  reading)
    reading.update(reader="python_replay", why="the C accelerator is not built" if fold is None else
                   "the C fold is switched off" if not FOLD else f"family {family}: the C fold reads elapsed times only")
    return _server_replay(server, pieces, family, options, files_out, rows, times, codes, 0, stdin, reading)


NOT_VERBOSE = ("requests, but no checkpoint lifecycle lines (new prompt, cached n_tokens, created / restored / "
               "erased checkpoint, forcing): llama-server b9838 and later print them at TRACE level only; start "
               "it with -lv 4 (--verbosity 4). Every figure of this server that needs them reads 0")
# What b11434 prints at TRACE level only (SLT_TRC / SRV_TRC in server-context.cpp): a log holding
# none of them (but other events: timing lines, slot selections) was written without -lv 4.
LIFECYCLE_KINDS = ("new_prompt", "cache_trim", "created", "restored", "erased_invalidated", "erased_too_close",
                   "erased_superseded", "forced", "cache_saved", "cache_loaded", "prompt_cleared")


def _not_verbose(kinds: dict[str, int]) -> bool:
    """A server whose lines hold events, none of them lifecycle lines (logparse's kind counts)."""
    return any(n for k, n in kinds.items() if k != "server_start") and not any(kinds.get(k) for k in LIFECYCLE_KINDS)


def _reader_doc(readers: list[dict[str, Any]]) -> dict[str, Any]:
    """Which reader read each server (the C fold, or the Python replay and why): the same
    figures either way, only the cost differs."""
    return {
        "c_fold": sum(r["reader"] == "c_fold" for r in readers),
        "python_replay": [{"server": r["server"], "why": r["why"]} for r in readers if r["reader"] != "c_fold"],
        "lines_handed_back": sum(r["lines_handed_back"] for r in readers),
    }


# logs._row's fields of a request, in the order fold_finish gives its rows
_FOLD_ROW = accel.FOLD_ROW


@dataclass(frozen=True)
class _Ck:
    pos_min: int
    pos_max: int
    n_tokens: int


def _fold_row(values: tuple) -> Any:
    """A row of fold_finish as the request _row reads (attributes, checkpoints with positions)."""
    if len(values) != len(_FOLD_ROW):  # accel.FOLD_ROW and the C code's row disagree: a stale build
        raise RuntimeError(f"the C fold's rows have {len(values)} fields, accel.FOLD_ROW {len(_FOLD_ROW)}")
    r = dict(zip(_FOLD_ROW, values))
    r["alive_before"] = [_Ck(*c) for c in r["alive_before"]]
    r["created"] = [_Ck(*c) for c in r["created"]]
    r["restored"] = None if r["restored"] is None else _Ck(*r["restored"])
    return SimpleNamespace(**r)


def _fold_figures(d: dict[str, Any]) -> Figures:
    fig = Figures()
    for name in Figures._SUMS + ("t0", "t1"):
        setattr(fig, name, d[name])
    fig.outcomes = dict(zip(lifecycle.OUTCOMES, d["outcomes"]))
    fig.events = dict(zip(EVENT_COUNT_KINDS, d["events"]))
    fig.shared.frombytes(d["shared"])
    fig.prompts.frombytes(d["prompts"])
    return fig


def _server_fold(fold: Any, server: str, pieces: list[str], family: str, options: Options,
                 files_out: list[FileReport], rows: list[dict[str, Any]], times: array,
                 codes: array, reading: dict[str, Any], stdin: Stdin | None = None) -> tuple[dict[str, Any], Figures]:
    """_server_replay by the C fold, filters and --trace included: blocks of whole lines go to
    fold_block; a block that is not one (an overlong line) or a reason from it: _Unfoldable,
    which says how many trace lines were written (the Python replay writes the same ones first:
    it skips them)."""
    stream = _Stream(pieces, server, deque(), files_out, stdin)
    stream.for_replay = False
    stats = logparse.ParseStats(family=family)
    stream.stats = stats
    reader = logparse.line_reader(stats)
    server_notes = []
    if any(b is not None and b.absolute for b in (options.since, options.until)):  # elapsed times only
        server_notes.append("--since/--until dates not applied: this log has elapsed times only (no wall clock)")
    since, until = (None if b is None or b.absolute else b.seconds for b in (options.since, options.until))
    trace = options.trace
    state = fold.fold_new(MAX_ROWS - len(rows), None if trace is None else json.dumps(server).encode(),
                          options.slot, since, until)
    written = 0  # trace lines
    buf = bytearray(_FOLD_BLOCK)
    while True:
        n = stream.readinto(buf)
        if not n:
            break
        if buf[n - 1] != 10:
            raise _Unfoldable("a line longer than a block", written)
        lo, line, piece_line = 0, stats.lines, stream.starts[-1][1]
        while True:  # the lines the C reader hands back are read here, in their place
            got = fold.fold_block(state, buf, lo, n, line, stream.start, piece_line)
            if isinstance(got, int):
                line += got
                break
            if isinstance(got, str):
                raise _Unfoldable(got, written)
            start, stop, line_no, word = got
            reading["lines_handed_back"] += 1
            events = reader.handed_back(buf, start, stop, line_no, word, stream.start + start)
            why = fold.fold_events(state, buf, n, stream.start, [(_FOLD_KIND[e.kind], e) for e in events])
            if why is not None:
                raise _Unfoldable(why, written)
            lo, line = stop + 1, line_no
        reader.block_read(buf, 0, n, line - stats.lines)
        if trace is not None:
            written += _write_trace(trace, fold.fold_trace(state))
    stream.settle()
    done = fold.fold_finish(state)
    if isinstance(done, str):
        raise _Unfoldable(done, written)
    if trace is not None:
        _write_trace(trace, fold.fold_trace(state))
    reading["kinds"] = dict(zip(logparse.ACCEL_KINDS, done["kinds"]))
    rows += [_row(server, _fold_row(t), stream) for t in done["rows"]]
    times.frombytes(bytes(done["times"]))
    codes.frombytes(bytes(done["codes"]))
    slots = {d["slot"]: _fold_figures(d) for d in done["slots"]}
    fig = Figures()
    for f in slots.values():
        fig.merge(f)
    return _server_doc(server, pieces, family, False, done["restarts"], fig, slots,
                       server_notes + done["notes"][:5] + done["ring_notes"][:5]), fig


def _write_trace(trace: TextIO, text: bytes) -> int:
    """The fold's trace lines (ASCII JSON): the number of lines written. To a file's binary layer
    when it has one (no decoding and encoding again), after what its text layer holds."""
    if not text:
        return 0
    raw = getattr(trace, "buffer", None)
    if raw is not None:
        trace.flush()
        raw.write(text)
    else:
        trace.write(text.decode("ascii"))
    return text.count(b"\n")


def _server_doc(server: str, pieces: list[str], family: str, unix: bool, restarts: int, fig: Figures,
                slots: dict[Any, Figures], notes: list[str]) -> dict[str, Any]:
    return {
        "server": server, "family": family, "files": pieces,
        "time": "unix" if unix else "elapsed", "restarts": restarts,
        "figures": fig.to_dict(),
        "slots": {str(k): v.to_dict() for k, v in sorted(slots.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))},
        "notes": notes,
    }


def _server_replay(server: str, pieces: list[str], family: str, options: Options, files_out: list[FileReport],
                   rows: list[dict[str, Any]], times: array, codes: array,
                   skip_trace: int = 0, stdin: Stdin | None = None,
                   reading: dict[str, Any] | None = None) -> tuple[dict[str, Any], Figures]:
    """One server's pieces as one stream through lifecycle.Replay: its JSON part and its figures
    (folded from its slots' at the end: each request is added once, to its slot). The first
    ``skip_trace`` trace lines are not written (the C fold wrote them before it handed over)."""
    side: deque = deque()
    stream = _Stream(pieces, server, side, files_out, stdin)
    clock = _Clock(family)
    clock.reader = stream
    replay = lifecycle.Replay(clock)
    clock.replay = replay
    slots: dict[Any, Figures] = {}
    first_time: list[float | None] = [None]
    server_notes: list[str] = []
    absolute_filter = any(b is not None and b.absolute for b in (options.since, options.until))
    if absolute_filter and not clock.unix:
        server_notes.append("--since/--until dates not applied: this log has elapsed times only (no wall clock)")
    filtered = options.slot is not None or options.since is not None or options.until is not None
    trace = options.trace
    skip = [skip_trace]
    outcome_code = {o: i for i, o in enumerate(lifecycle.OUTCOMES)}

    def take(r: lifecycle.Served) -> None:
        t = r.time
        if first_time[0] is None and t is not None:
            first_time[0] = t
        if filtered and (options.slot is not None and r.slot != options.slot
                         or not _in_window(t, first_time[0], options, clock.unix)):
            return
        fig = slots.get(r.slot)
        if fig is None:
            fig = slots[r.slot] = Figures()
        fig.add(r)
        if t is not None:
            times.append(t - (first_time[0] or 0.0))
            codes.append(outcome_code[r.outcome])
        if trace is not None or len(rows) < MAX_ROWS:  # a row only where one is shown
            row = _row(server, r, stream)
            if len(rows) < MAX_ROWS:
                rows.append(row)
            if trace is not None:
                if skip[0]:
                    skip[0] -= 1
                else:
                    trace.write(json.dumps(row, separators=(",", ":")) + "\n")

    stats = logparse.ParseStats(family=family)
    stream.stats = stats
    try:
        replay.run(logparse.iter_events(stream, family, stats=stats), take, side)
    except MemoryError:  # pragma: no cover - a hostile file must not take the host down
        if stream.rep is not None:
            stream.rep.damage = "out of memory while reading"
    stream.settle()
    if reading is not None:
        reading["kinds"] = dict(stats.kinds)
    for path in stream.pieces:  # not reached (out of memory): said, not silently dropped
        files_out.append(FileReport(path=path, server=server, error="not read: reading stopped before it"))
    for r in replay.finish(side):
        take(r)
    fig = Figures()
    for f in slots.values():
        fig.merge(f)
    server_notes += replay.notes[:5] + [n for ring in replay.rings.values() for n in ring.notes][:5]
    return _server_doc(server, pieces, family, clock.unix, replay.restarts, fig, slots, server_notes), fig


def _in_window(t: float | None, first: float | None, options: Options, unix: bool) -> bool:
    for bound, after in ((options.since, True), (options.until, False)):
        if bound is None:
            continue
        if bound.absolute:
            if not unix or t is None:
                continue  # said in the server's notes
            value = t
        else:
            if t is None or first is None:
                continue
            value = t - first
        if (after and value < bound.seconds) or (not after and value > bound.seconds):
            return False
    return True


def _bound(b: TimeBound | None) -> Any:
    return None if b is None else {"seconds": b.seconds, "absolute": b.absolute}


def _file_dict(f: FileReport) -> dict[str, Any]:
    return {"path": f.path, "server": f.server, "gzip": f.compressed, "lines": f.lines, "bytes": f.bytes,
            "not_understood": f.unknown, "samples": [{"line": ln, "text": t} for ln, t in f.unknown_samples],
            "overlong_lines": f.overlong, "cut_last_line": f.cut_last_line, "error": f.error, "damage": f.damage}


def _ck(c: Any) -> list[Any]:
    return [c.pos_min, c.pos_max, c.n_tokens]


def _row(server: str, r: Any, stream: _Stream | None = None) -> dict[str, Any]:
    """One request (``Served`` or ``Request``) as a trace line (docs/trace.md)."""
    line = stream.piece_of(r.offset, r.line)[1] if stream is not None else r.line
    return {
        "time": r.time, "server": server, "slot": r.slot, "task": r.task, "line": line,
        "prompt_tokens": r.prompt_tokens, "shared_prefix": r.shared_prefix, "shared_source": r.shared_source,
        "shared_with": r.shared_with if r.shared_prefix is not None else None,
        "shared_exact": None if r.shared_prefix is None else r.shared_source != "re_entry",
        "reused": r.reused, "processed": r.processed, "outcome": r.outcome, "prefill_ms": r.prefill_ms,
        "checkpoints": {
            "alive_before": [_ck(c) for c in r.alive_before],
            "created": [_ck(c) for c in r.created],
            "restored": _ck(r.restored) if r.restored is not None else None,
            "erased": dict(r.erase_counts),
            "forced": r.forced, "cache_saved": r.cache_saved, "cache_loaded": r.cache_loaded,
        },
        "failures": [n for n, f in (("placement", r.placement), ("retention", r.retention),
                                    ("baseline_loss", r.baseline_loss)) if f],
    }


def _over_time(times: array, codes: array) -> dict[str, Any]:
    """Outcomes per time bin, from the earliest request to the latest. Times are since each
    server's first request and may be negative: a clock stepped back, or rotated pieces whose
    Unix times go backwards, are data (the order of the lines is kept; no restart is made of it)."""
    if not times:
        return {"bins": [], "bin_s": None, "start_s": None}
    start = min(times)
    width = ((max(times) - start) or 1.0) / TIME_BINS
    bins = [[0] * len(lifecycle.OUTCOMES) for _ in range(TIME_BINS)]
    # counted by bin * 8 + outcome in C-speed loops (one Python step per request was ~0.1 s
    # per GB); every bin is >= 0, from the earliest time
    offsets = map(sub, times, repeat(start))
    keys = map(add, map(lshift, map(int, map(truediv, offsets, repeat(width))), repeat(3)), codes)
    for key, n in Counter(keys).items():
        bins[min(TIME_BINS - 1, key >> 3)][key & 7] += n
    return {"bin_s": width, "start_s": start, "outcomes": list(lifecycle.OUTCOMES), "bins": bins}


# --------------------------------------------------------------------------- outputs


def summary(doc: dict[str, Any]) -> str:
    """The terminal summary. Everything that came from a log goes through terminal_safe."""
    out: list[str] = []
    add = out.append
    add(f"shadowlab logs: {doc['readable_files']} file(s) read, {doc['lines_read']:,} lines, "
        f"{doc['lines_not_understood']:,} not understood")
    for s in doc["servers"]:
        add("")
        add(f"server {s['server']} ({s['family']}, {len(s['files'])} piece(s), times {s['time']})")
        _figures_lines(s["figures"], add, "  ")
        if len(s["slots"]) > 1:
            for slot, f in s["slots"].items():
                oc = f["outcomes"]
                add(f"  slot {slot}: {f['requests']} requests, " + ", ".join(f"{k} {v}" for k, v in oc.items()))
        for n in s["notes"]:
            add(f"  note: {n}")
    if len(doc["servers"]) > 1:
        add("")
        add("overall")
        _figures_lines(doc["overall"], add, "  ")
    for f in doc["files"]:
        if f["not_understood"]:
            add(f"not understood in {f['path']}: {f['not_understood']}")
            for smp in f["samples"][:3]:
                where = "last line (cut short)" if smp["line"] == -1 else f"line {smp['line']}"
                add(f"  {where}: {smp['text'][:160]}")
    for u in doc["unreadable_files"]:
        add(f"unreadable: {u['path']}: {u['why']}")
    for d in doc["damaged_files"]:
        add(f"damaged: {d['path']}: {d['why']}")
    return terminal_safe("\n".join(out)) + "\n"


def _fmt(v: Any, spec: str = ",") -> str:
    if v is None:
        return "-"
    return format(v, spec)


def _figures_lines(f: dict[str, Any], add: Any, ind: str) -> None:
    oc, ev, sp, pt = f["outcomes"], f["events"], f["shared_prefix"], f["prompt_tokens"]
    add(f"{ind}requests {f['requests']:,}: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in oc.items()))
    add(f"{ind}events: " + ", ".join(f"{k} {v:,}" for k, v in ev.items()))
    add(f"{ind}forced vs restored: {oc['forced']:,} vs {oc['restored']:,}")
    label = "shared prefix" if sp["stated_by_log"] == sp["n"] else (
        "re-entry point (shared prefix not stated)" if not sp["stated_by_log"] else
        f"shared prefix ({sp['stated_by_log']:,} of {sp['n']:,} stated, the rest re-entry points)")
    add(f"{ind}{label} over {sp['n']:,} warm requests: " + ", ".join(f"{k} {_fmt(sp[k])}" for k, _ in PERCENTILES)
        + f"; under 512: {_pc(sp['share_under_512'])}, 4,096+: {_pc(sp['share_4096_or_more'])}")
    add(f"{ind}prompt tokens: " + ", ".join(f"{k} {_fmt(pt[k])}" for k, _ in PERCENTILES) + f"; sum {pt['sum']:,}")
    add(f"{ind}reusable prefix {f['reusable_tokens']:,} of {pt['sum']:,} prompt tokens ({_pc(f['reusable_share'])}); "
        f"reused {f['reused_tokens']:,}, processed {f['processed_tokens']:,}")
    add(f"{ind}prefill rate {_fmt(f['prefill_tokens_per_s'], ',.0f')} tok/s (measured); avoidable "
        f"{f['avoidable_tokens']:,} tokens = {_fmt(f['avoidable_prefill_s'], ',.1f')} s")
    fl = f["failures"]
    add(f"{ind}failures: placement {fl['placement']:,}, retention {fl['retention']:,} (upper bound), "
        f"baseline loss {fl['baseline_loss']:,}")
    c = f["checkpoint_cost"]
    add(f"{ind}checkpoint cost: {c['created']:,} created ({_fmt(c['created_mib_each'], '.3f')} MiB, "
        f"{_fmt(c['created_ms_each'], '.2f')} ms each), {c['restored']:,} restored ({_fmt(c['restored_mib_each'], '.3f')} MiB, "
        f"{_fmt(c['restored_ms_each'], '.2f')} ms each), {_fmt(c['creations_per_request'], '.2f')} creations per request")
    t0, t1 = f["time_span_s"]
    add(f"{ind}time span: {_fmt(t0, '.3f')} .. {_fmt(t1, '.3f')} s ({_fmt(None if t0 is None else t1 - t0, ',.1f')} s)")


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def render_html(doc: dict[str, Any]) -> str:
    from shadowlab import present  # the HTML environment: autoescape, |visible, StrictUndefined

    env = present.environment()
    return env.get_template("logs.html.j2").render(doc=doc, pictures=_pictures(doc), percentiles=PERCENTILES)


def _pictures(doc: dict[str, Any]) -> dict[str, Any]:
    """Numbers the template draws as SVG: log-scale shared-prefix bins and outcomes over time."""
    return {"shared_bins": _log_bins_of(doc), "over_time": doc["over_time"]}


def _log_bins_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc.get("_hist") or []


def log_bins(values: Sequence[int]) -> list[dict[str, Any]]:
    """Counts in bins [0], [1,2), [2,4), ... [2^k, 2^(k+1)): equal width on a log scale."""
    if values and min(values) >= 0:  # 0 .bit_length() is 0: one C-speed count
        counts = Counter(map(int.bit_length, values))
    else:
        counts = Counter(0 if v <= 0 else v.bit_length() for v in values)
    if not counts:
        return []
    top = max(counts)
    return [{"lo": 0 if k == 0 else 1 << (k - 1), "hi": 1 if k == 0 else 1 << k, "n": counts.get(k, 0)}
            for k in range(top + 1)]


# --------------------------------------------------------------------------- command
