"""What every reader of a log shares, and all that ``shadowlab logs``' C fold needs of the parser:
the C accelerator as built (the one switch: tests set ``reading._logscan`` to None to read
without it), the families, the read counters (``ParseStats``) and the line reader's position and
look-back text (``LineState``).

The rest of the parser (the event records, the fast-path regexes, the tolerant rules: parse.py,
events.py, fastpath.py, tolerant.py) is imported only when a line is read in Python: the fold
reads a b11434 log without it, and importing it (and the dataclasses module its records use)
was ~40 % of the start of ``shadowlab logs`` (benchmarks/README.md). Nothing here imports it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from shadowlab.logs import accel

try:  # the optional C accelerator (setup.py builds it when a compiler exists)
    from shadowlab.logs import _logscan
except ImportError:  # pragma: no cover - exercised by installs without a compiler
    _logscan = None


def usable(module: Any) -> Any:
    """The accelerator if it speaks this tree's ABI (accel.ABI), else None: a build left over
    from another version falls back to the pure-Python path instead of mislabelling fields."""
    return module if getattr(module, "ABI", None) == accel.ABI else None


_logscan = usable(_logscan)


def folder() -> Any:
    """The C accelerator when built (None otherwise): its ``fold_*`` functions replay a b11434
    log for ``shadowlab logs`` without a Python object per line (analysis._server_fold)."""
    return _logscan


def accelerated() -> bool:
    """True when the C accelerator (shadowlab.logs._logscan) is built and used: the parser gives
    the same events either way, the accelerator ~10x faster (benchmarks/README.md)."""
    return _logscan is not None


# The log families the parser reads: the one list (the matrix schema, the llama-server adapter
# and `shadowlab logs --family` take it from here). LLAMA_CPP_FAMILIES: a llama.cpp build's.
LLAMA_CPP_FAMILIES = ("llama.cpp", "llama.cpp-legacy", "ik_llama.cpp")
FAMILIES = (*LLAMA_CPP_FAMILIES, "reference", "none")

BLOCK_SIZE = 8 << 20  # what the parser reads at a time (parse.BLOCK_SIZE)
LOOK_BACK = accel.LOOK_BACK
MAX_SAMPLES = 5  # not-understood lines kept as samples, per file
SAMPLE_CHARS = 240  # of each


class ParseStats:
    """Counters filled while a log is read (read them after its events are exhausted)."""

    __slots__ = ("family", "lines", "bytes", "candidate_lines", "unknown_count", "unknown_samples",
                 "ignored_count", "overlong_lines", "cut_lines", "source_error", "kinds")

    def __init__(self, family: str = "llama.cpp") -> None:
        self.family = family
        self.lines = 0
        self.bytes = 0
        self.candidate_lines = 0  # lines holding a trigger word
        self.unknown_count = 0
        self.unknown_samples: list[tuple[int, str]] = []  # (line, text)
        self.ignored_count = 0  # known lines that are not events (e.g. `checking checkpoint with`)
        self.overlong_lines = 0
        self.cut_lines = 0  # lines with a trigger word that ended without their newline (parse._Scanner._cut)
        self.source_error: str | None = None  # why reading stopped early (a corrupt .gz, a read error)
        self.kinds: Counter = Counter()  # events read, by kind

    def unknown(self, line_no: int, text: str) -> None:
        self.unknown_count += 1
        if len(self.unknown_samples) < MAX_SAMPLES:
            self.unknown_samples.append((line_no, text[:SAMPLE_CHARS]))

    def __repr__(self) -> str:
        return "ParseStats(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


class LineState:
    """Where a line reader stands: the byte offset and line count of what it has read, and the
    text before the block being read that a line may look back into (``tail``: at most
    LOOK_BACK bytes). parse._Scanner is one; ``shadowlab logs``' fold keeps one of these while
    the C code reads every line, and makes a _Scanner of it (``parse.line_reader(stats,
    state)``) at the first line the C code hands back."""

    def __init__(self, stats: ParseStats, state: LineState | None = None) -> None:
        self.stats = stats
        if state is None:
            self.offset = 0  # byte offset of the next block
            self.line_no = 0  # lines completed so far
            self.lo = 0  # where the lines of the body being read start
            self._tail: bytes = b""
            self._kept: tuple[Any, int] | None = None  # (body, hi): the tail, still in the caller's block
        else:
            self.offset, self.line_no, self.lo = state.offset, state.line_no, state.lo
            self._tail, self._kept = state._tail, state._kept

    def _advance(self, nbytes: int, lines: int) -> None:
        self.offset += nbytes
        self.stats.bytes += nbytes
        self.line_no += lines
        self.stats.lines += lines

    def block_read(self, body: bytes | bytearray, lo: int, hi: int, lines: int, kept: bool = False) -> None:
        """body[lo:hi] (`lines` lines) has been read: count it, keep its end for look-backs
        (``kept``: left in place, keep_tail)."""
        self._advance(hi - lo, lines)
        self.keep_tail(body, lo, hi, kept)

    @property
    def tail(self) -> bytes:
        """The text before the body being read (at most LOOK_BACK bytes): what lines look back
        into. Taken from the block it was kept in (`keep_tail`) the first time a line asks."""
        if self._kept is not None:
            body, hi = self._kept
            self._tail, self._kept = bytes(body[hi - LOOK_BACK : hi]), None
        return self._tail

    @tail.setter
    def tail(self, value: bytes) -> None:
        self._tail, self._kept = value, None

    def keep_tail(self, body: bytes | bytearray, lo: int, hi: int, kept: bool) -> None:
        """body[lo:hi] has been read: its end is the tail now. ``kept``: the caller leaves body
        as it is until the next block is read (into another buffer), so the end is copied only
        if a line looks back into it (a copy of 64 KiB per block otherwise, ~3% of the C fold)."""
        if hi - lo < LOOK_BACK:
            self.tail = (self.tail + body[lo:hi])[-LOOK_BACK:]
        elif kept:
            self._kept = (body, hi)
        else:
            self.tail = bytes(body[hi - LOOK_BACK : hi])
