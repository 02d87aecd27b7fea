"""``shadowlab logs``' input: log files grouped into servers (rotated pieces), each server's pieces
read as one stream, standard input, and the family sniffed from a server's first piece.
Split out of `shadowlab.logs.analysis` (``shadowlab logs``), which re-exports the names its importers use."""

from __future__ import annotations

import bisect
import heapq
import io
import os
import re
from collections import deque
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from shadowlab.logs import accel, reading
from shadowlab.logs.source import LogText, open_log
from shadowlab.errors import LogSourceError

SNIFF = 1 << 16
_ROTATED = re.compile(r"^(?P<base>.+?)\.(?P<n>\d+)(?:\.gz)?$|^(?P<gzbase>.+?)\.gz$")
_B11434_HEAD = re.compile(rb"^\d+\.\d\d\.\d{3}\.\d{3} [A-Z] ", re.M)
_IK_INFO = re.compile(rb"^(?:INFO|WARN|VERB) \[[^\]]*\].*\btimestamp=\d+", re.M)
_SIM_WORD = b"checking sim = "
# _N: a number a note is believed for, below 10**MAX_DIGITS (logparse.believable's bound)
_N = rb"0*(\d{1,%d})" % accel.MAX_DIGITS
_SIM = re.compile(rb"id +%s \| task -?\d+ \| +- checking sim = [\d.]+ \(%s/%s\)" % (_N, _N, _N))
_CHECK_WORD = b"hecking checkpoint with ["
_offset = attrgetter("offset")
_CHECK = re.compile(rb"id +%s \| task %s \| +[Cc]hecking checkpoint with \[-?\d+, -?\d+\] against %s\.\.\."
                    % (_N, _N, _N))


class UsageError(Exception):
    """Bad arguments or no readable input: exit 2."""


# --------------------------------------------------------------------------- files


class FileReport:
    """What was read of one file. A plain class: the dataclasses module (with inspect) was ~10 %
    of the start of `shadowlab logs`, and the C fold's path imports it nowhere else."""

    __slots__ = ("path", "server", "compressed", "lines", "bytes", "unknown", "unknown_samples", "overlong",
                 "cut_last_line", "error", "damage")

    def __init__(self, path: str, server: str, error: str | None = None) -> None:
        self.path = path
        self.server = server
        self.compressed = False
        self.lines = 0
        self.bytes = 0
        self.unknown = 0
        self.unknown_samples: list[tuple[int, str]] = []
        self.overlong = 0
        self.cut_last_line = False
        self.error = error  # could not be read at all
        self.damage: str | None = None  # read up to a point

    def __repr__(self) -> str:
        return "FileReport(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


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
        self.stats: reading.ParseStats | None = None  # set before reading: per-piece counts
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
            self.raw = self.stdin.open() if path == STDIN and self.stdin is not None else open_log(path)
        except LogSourceError as exc:
            rep.error = exc.message
            return True  # src stays None: the next piece
        self.rep, self.src = rep, LogText(self.raw)
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
            if not end:  # what was carried is that cut line's start: the next piece never sees it
                self.carry = b""
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
        if len(rep.unknown_samples) < reading.MAX_SAMPLES:
            rep.unknown_samples.append((-1, tail[: reading.SAMPLE_CHARS].decode("utf-8", "replace")))

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
        rep.unknown_samples = (got + rep.unknown_samples)[: reading.MAX_SAMPLES]
        rep.overlong = st.overlong_lines - overlong
        if rep.damage is not None:  # where it stopped, as logparse says it
            rep.damage += f": the {rep.lines:,} whole lines before it were read"

    def _side_notes(self, b: Any, end: int) -> None:
        from shadowlab.logs.lifecycle import CheckpointCheck, SharedPrefix  # the Python replay's (not the fold's)

        base = self.start
        sims, checks = [], []
        i = b.find(_SIM_WORD, 0, end)
        while i >= 0:  # b11434's slot-selection lines state the shared prefix
            line_start = b.rfind(b"\n", 0, i) + 1
            m = _SIM.search(b, line_start, i + 40)
            if m:
                sims.append(SharedPrefix(int(m[1]), int(m[2]), int(m[3]), base + line_start))
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
                    checks.append(CheckpointCheck(int(m[1]), int(m[2]), int(m[3]), base + line_start))
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
            head = LogText(io.BytesIO(stdin.head)).read(SNIFF)
        else:
            with open_log(path) as fh:
                head = LogText(fh).read(SNIFF)
    except LogSourceError:  # the piece's reader says why
        return "llama.cpp"
    if _B11434_HEAD.search(head):
        return "reference" if b"shadowlab-engine" in head else "llama.cpp"
    if _IK_INFO.search(head):
        return "ik_llama.cpp"
    return "llama.cpp"
