"""Engine log → typed checkpoint lifecycle events, streamed.

    parse(source, family, extra_patterns=()) -> ParsedLog          all events, counters, samples
    iter_events(source, family, extra_patterns=(), stats=None)     the same, one event at a time

``source`` is a path (``str`` or PathLike; a ``str`` is always a path), read in 8 MiB blocks into
one reused buffer (``iter_events``' memory stays O(1) in the file size), a binary file object, or
an iterable of lines (``str`` or ``bytes``, each a whole line). A file or stream starting with the
gzip magic bytes is gunzipped as it streams, whatever its name (``LogText``); corrupt or truncated
gzip data (or a read error) ends the text there, every whole line decompressed before it is read
(as zcat gives them) and ``source_error`` says why, where, and how many lines were read. What is
not a log (bytes, log text, a missing path, a FIFO, device or directory, a text-mode file)
raises ``LogSourceError`` before anything is read: ``open_log`` is the one place a log's path is
opened, here and in ``shadowlab logs``. Bytes are decoded with ``errors="replace"``;
NUL and ``\\r`` are dropped.

Cut lines are never read: the last line without its newline (the writer may have been stopped
mid-value: ``task.n_tokens = 4`` of 4560) and the first ``MAX_LINE`` bytes of a longer line; one
holding a trigger word is counted unknown and in ``cut_lines``. Every line costs time linear in
its length: no pattern here backtracks over a run (see ``_FIELD``).

How a line is read: the tolerant rules, in ``shadowlab.logs.tolerant``'s docstring.

Speed: three layers, each giving the same events as the one below it (tests check this on every
fixture line and on mutated lines):

1. the C accelerator (``shadowlab/logs/_logscan.c``, built by ``pip install`` when a compiler exists;
   loaded by ``reading.py``, whose ``accelerated()`` says whether it is used): a vector search
   finds each line's first trigger word, small hand parsers read the common b11434 /
   reference-engine shapes, the records are built in C; every line it is not sure of comes back
   to the layers below. Not used with matrix ``log_patterns``. ~0.32 µs per event on a realistic log, a third of grep's speed;
2. the Python fast path: one C-speed regex search per scan word (``checkpoint``, ``prompt``
   where a trigger holds it, ``memory_seq_rm``, ``kv cache rm``, ``selected slot by``, ``model
   loaded``); a line is matched whole, undecoded, by one anchored regex chosen by its first scan
   word (the start-up line ``model loaded``, once per start, goes to the tolerant rules);
3. the tolerant rules (``shadowlab.logs.tolerant``), on the decoded line.

Events are tuple-based records built with ``tuple.__new__`` (a frozen dataclass cost ~3 µs
each). Figures: benchmarks/bench_logparse.py and benchmarks/README.md.

Other forks: ``extra_patterns`` (a matrix's ``log_patterns``): see ``shadowlab.logs.events``.

Unknown lines: a line with a trigger word (``checkpoint``, ``memory_seq_rm``, ...) that no pattern explains,
cut short, with a value broken by other text (read only when ``,`` ``)`` whitespace or the end follows
it) or a number no engine prints (``events.believable``: 10**18 or more) is counted in ``unknown_count``
with a few samples, never fatal. Lines without a trigger word are not events and not unknown.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, repeat as _repeat
from operator import lshift as _shift, or_ as _or
from typing import Any, BinaryIO, Union

from shadowlab.errors import LogSourceError
from shadowlab.logs import accel, reading
from shadowlab.logs.reading import (
    FAMILIES, LLAMA_CPP_FAMILIES, MAX_SAMPLES, SAMPLE_CHARS, LineState, ParseStats, accelerated, folder,
)
from shadowlab.logs.events import (
    EXTRA_PATTERN_CHARS, _new, Event, CheckpointEvent, CheckpointCreated,
    CheckpointRestored, CheckpointErased, CheckpointErasedOld, CheckpointErasedTooClose, CheckpointSuperseded,
    ForcedReprocessing, NewPrompt, CacheTrim, PromptEval, SlotSelected, PromptCacheSaved, PromptCacheLoaded,
    PromptCleared, ServerStart, EVENT_TYPES, EVENT_KINDS, ExtraPattern, ParsedLog, believable,
)
from shadowlab.logs.source import GZIP_MAGIC, GZIP_OUT, GZIP_STEP, LogText, _check_source, open_log
from shadowlab.logs.tolerant import (
    LOOK_BACK, _MessageReader, _TRIGGERS, _BENIGN, _ANSI, _segments, _extra_event,
)
from shadowlab.logs.fastpath import (
    _IGNORED, _fast_line, _SCAN_WORDS, _W_CK, _W_PROMPT, _W_TRIM, _FAST_BY_WORD, _CK_SLOT, _CK_TASK, _CK_WHAT,
    _CK_INDEX, _CK_CAPACITY, _CK_POS_MIN, _CK_POS_MAX, _CK_N_TOKENS, _CK_N_PAST, _CK_N_SWA, _CK_POS_NEXT,
    _CK_SIZE, _CK_TOOK, _CK_K_CK, _CK_K_BENIGN, _CK_S_SLOT, _CK_S_TASK, _CK_SUP_N, _CK_K_SUPERSEDED,
    _CK_TC_MIN, _CK_TC_MAX, _CK_TC_N, _CK_TC_SIZE, _CK_TC_TOOK, _CK_K_SRV_BENIGN, _PR_SLOT, _PR_TASK,
    _PR_NP_CTX, _PR_NP_KEEP, _PR_NP_N, _PR_K_NEW_PROMPT, _PR_EV_MS, _PR_EV_N, _PR_K_EVAL, _PR_HL_MS, _PR_HL_N,
    _PR_K_HEADLESS_EVAL, _PR_S_SLOT, _PR_S_TASK, _PR_K_SRV_BENIGN, _PR_CLR_N, _PR_K_CLEARED, _PR_SAVE_N,
    _PR_SAVE_SIZE, _PR_K_SAVED, _SEL_SLOT, _SEL_TASK, _SEL_LCP, _SEL_SIM, _SEL_KEEP, _match_start,
    _scan_regexes,
)

# The C accelerator is reading._logscan (None when not built, or built for another ABI): read
# there at each use, so that one switch (tests set it to None) turns it off for every reader.
BLOCK_SIZE = reading.BLOCK_SIZE
MAX_LINE = accel.MAX_LINE


# What the C accelerator builds: the classes in the order of its `enum kind`, and the field
# layouts it writes positionally (tests/shadowlab/test_logscan.py holds it to them).
_ACCEL_CLASSES = (
    CheckpointCreated, CheckpointRestored, CheckpointErased, CheckpointErasedOld, CheckpointErasedTooClose,
    CheckpointSuperseded, ForcedReprocessing, NewPrompt, CacheTrim, PromptEval, SlotSelected,
    PromptCacheSaved, PromptCacheLoaded, PromptCleared, ServerStart,
)
_ACCEL_KINDS = ACCEL_KINDS = tuple(cls.kind for cls in _ACCEL_CLASSES)  # public: logs' fold numbers them
_ACCEL_METHODS = accel.METHODS
assert _ACCEL_KINDS == accel.KIND_NAMES  # the C code's `enum kind` is generated from accel.KINDS


def line_reader(stats: ParseStats, state: LineState | None = None) -> "_Scanner":
    """What reads the lines the C fold hands back, with their look-backs (``handed_back``,
    ``block_read``): the parser's own readers, so a line reads the same on either path.
    ``state``: where the fold's reading stands (the lines and bytes read, the look-back text)."""
    return _Scanner(stats, [], state)


# A path (str or PathLike; a str is always a path), a binary file object, or an iterable of lines.
Source = Union[str, "os.PathLike[str]", BinaryIO, Iterable[Union[str, bytes]]]


def parse(source: Source, family: str = "llama.cpp", extra_patterns: Sequence[ExtraPattern | str] = ()) -> ParsedLog:
    """Every event of the log, with its counters. Raises LogSourceError for what is not a log
    (see `_check_source`); a log that breaks off while read (corrupt .gz) sets `source_error`."""
    _check_source(source)
    stats = ParseStats(family=family)
    events: list[Event] = []
    for batch in _batches(source, family, extra_patterns, stats):
        events += batch
    return ParsedLog(
        family=family,
        events=events,
        lines=stats.lines,
        bytes=stats.bytes,
        unknown_count=stats.unknown_count,
        unknown_samples=list(stats.unknown_samples),
        ignored_count=stats.ignored_count,
        overlong_lines=stats.overlong_lines,
        counts=dict(stats.kinds),
        cut_lines=stats.cut_lines,
        source_error=stats.source_error,
    )


def iter_events(
    source: Source,
    family: str = "llama.cpp",
    extra_patterns: Sequence[ExtraPattern | str] = (),
    stats: ParseStats | None = None,
) -> Iterator[Event]:
    _check_source(source)  # now, not at the first next()
    # chain walks each block's list in C: a generator here cost ~50 ns per event, 12% of the
    # accelerated parse of a realistic log
    return chain.from_iterable(_batches(source, family, extra_patterns, stats))


def _batches(
    source: Source,
    family: str,
    extra_patterns: Sequence[ExtraPattern | str],
    stats: ParseStats | None,
) -> Iterator[list[Event]]:
    """The events of each block read, as one list per block."""
    if family not in FAMILIES:
        raise ValueError(f"unknown log family {family!r} (one of {', '.join(FAMILIES)})")
    stats = stats if stats is not None else ParseStats(family=family)
    stats.family = family
    if family == "none":
        return
    patterns = [ExtraPattern.from_regex(p) if isinstance(p, str) else p for p in extra_patterns]
    scanner = _Scanner(stats, [(p.trigger(), p, re.compile(p.regex)) for p in patterns])
    splitter = _Splitter()
    for block in _blocks(source, stats):
        yield scanner.process(splitter.split(block))
    cut = bool(splitter.pending)  # the text ends inside a line (a damaged gzip usually does)
    if cut:
        yield scanner.process(splitter.split(b"", final=True))
    if stats.source_error is not None:  # said with where it stopped, counted as the reader does
        stats.source_error += f": the {stats.lines - cut:,} whole lines before it were read"


# What _Splitter cuts a stream into: (_LINES, body, lo, hi): complete lines body[lo:hi];
# (_SKIP, n): n bytes of an overlong line already counted; (_OVERLONG, head, n): a line of n
# bytes longer than MAX_LINE, cut at MAX_LINE; (_CUT, line): the stream's last line, without
# its newline. Both of the last are cut lines: see _Scanner._cut.
_LINES, _SKIP, _OVERLONG, _CUT = "lines", "skip", "overlong", "cut"


class _Splitter:
    """Cuts chunks into pieces of complete lines, carrying a partial last line to the next."""

    def __init__(self) -> None:
        self.pending = bytearray()  # partial last line of the previous chunk (appended in place: a
        # line that arrives in many small reads costs time linear in its length)
        self.skipping = False  # inside an overlong line whose head was already judged

    def split(self, chunk: bytes | bytearray, final: bool = False) -> list[tuple]:
        """The pieces `chunk` completes. They refer to `chunk` (no copy); what is kept for the
        next chunk is copied."""
        pieces: list[tuple] = []
        pos, size = 0, len(chunk)
        if self.skipping:  # the rest of an overlong line, already judged on its head
            nl = chunk.find(b"\n")
            if nl == -1:
                return [(_SKIP, size)]
            pieces.append((_SKIP, nl + 1))
            pos, self.skipping = nl + 1, False
        if self.pending:  # the line the previous chunk left open: completed on its own
            nl = chunk.find(b"\n", pos)
            if nl == -1:
                self.pending += chunk[pos:]
                pos = size
            else:
                line, self.pending, pos = bytes(self.pending + chunk[pos : nl + 1]), bytearray(), nl + 1
                pieces.append((_LINES, line, 0, len(line)))
        end = chunk.rfind(b"\n", pos) + 1
        if end > pos:
            pieces.append((_LINES, chunk, pos, end))
            pos = end
        if pos < size:
            self.pending += chunk[pos:]
        if len(self.pending) > MAX_LINE:
            # an overlong line: cut at MAX_LINE, the rest skipped
            pieces.append((_OVERLONG, bytes(self.pending[:MAX_LINE]), len(self.pending)))
            self.pending, self.skipping = bytearray(), True
        if final and self.pending:  # the last line has no newline: the writer may have been stopped mid-line
            pieces.append((_CUT, bytes(self.pending)))
            self.pending = bytearray()
        return pieces


def _blocks(source: Source, stats: ParseStats) -> Iterator[bytes | bytearray]:
    """Blocks of the source (checked by `_check_source`). A file or binary stream is gunzipped
    when it starts with the gzip magic, whatever its name."""
    if isinstance(source, (str, os.PathLike)):
        with open_log(source) as fh:  # checked again: the path may have changed since
            yield from _stream(fh, stats)
    elif callable(getattr(source, "read", None)):
        yield from _stream(source, stats)  # type: ignore[arg-type]
    else:
        yield from _line_blocks(source)  # type: ignore[arg-type]


def _stream(fh: BinaryIO, stats: ParseStats) -> Iterator[bytes | bytearray]:
    """The log text of a binary stream, plain or gzip, in blocks read into one reused buffer
    (a fresh 8 MiB object per block cost more than the C scan of it): each is valid until the
    next. Damage (a read error, corrupt or truncated gzip data) ends it early and is kept in
    `stats.source_error`."""
    text = LogText(fh)
    buffer = bytearray(BLOCK_SIZE)
    view = memoryview(buffer)
    while n := text.readinto(buffer):
        yield buffer if n == BLOCK_SIZE else view[:n].tobytes()
    stats.source_error = text.damage


def _line_blocks(lines: Iterable[str | bytes]) -> Iterator[bytes]:
    """An iterable of lines joined into blocks; each item is a whole line (a newline is added
    where it has none), so no item is a cut line."""
    batch: list[bytes] = []
    size = 0
    for line in lines:
        if isinstance(line, str):
            data = line.encode("utf-8", "surrogateescape")
        elif isinstance(line, (bytes, bytearray, memoryview)):
            data = bytes(line)
        else:
            raise LogSourceError(
                f"a line is {type(line).__name__}, not str or bytes", source="parse()",
                hint="pass the log's path, a binary file object or an iterable of str / bytes lines",
            )
        if not data.endswith(b"\n"):
            data += b"\n"
        batch.append(data)
        size += len(data)
        if size >= BLOCK_SIZE:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)


class _Scanner(_MessageReader):
    """Reads `_Splitter` pieces in order, carrying line numbers, offsets, the counters and the
    text a line may look back into from one piece to the next."""

    def __init__(self, stats: ParseStats, extra: list[tuple[bytes, ExtraPattern, re.Pattern[str]]],
                 state: LineState | None = None):
        super().__init__(stats, state)
        self.extra = extra
        self.triggers = _TRIGGERS + tuple(t for t, _, _ in extra)
        # One literal search per scan word finds every line that holds a trigger word.
        self.scan_words = _scan_regexes(_SCAN_WORDS, self.triggers)
        # With matrix patterns, the lines the tolerant path used to read go to it again: the
        # patterns are tried before the built-in rules there.
        self.fast = [pair[1] if extra else pair[0] for pair in _FAST_BY_WORD]
        # The C accelerator reads the built-in shapes only; matrix patterns need Python's rules.
        self.accel = reading._logscan is not None and not extra
        self.newlines = 0  # newlines counted by the last _scan_body

    def process(self, pieces: list[tuple]) -> list[Event]:
        """The events of `_Splitter` pieces, in order."""
        out: list[Event] = []
        for piece in pieces:
            if piece[0] is _LINES:
                out += self._body(piece[1], piece[2], piece[3])
            elif piece[0] is _SKIP:
                self._advance(piece[1], 0)
            elif piece[0] is _OVERLONG:
                self.stats.overlong_lines += 1
                self._cut(piece[1], self.line_no + 1)
                self._advance(piece[2], 1)
                self.lo, self.tail = 0, b""  # what stood before the skipped rest was not kept
            else:  # _CUT
                self._cut(piece[1], self.line_no + 1)
                self._advance(len(piece[1]), 1)
        return out

    def _cut(self, head: bytes, line_no: int) -> None:
        """A cut line: the last line of the stream without its newline, or the first MAX_LINE
        bytes of an overlong line. It may end inside a value (`task.n_tokens = 4` of 4560), so
        it is never read: with a trigger word it is counted unknown (and in `cut_lines`)."""
        if any(t in head for t in self.triggers):
            self.stats.candidate_lines += 1
            self.stats.cut_lines += 1
            self.stats.unknown(line_no, head[: SAMPLE_CHARS * 4].decode("utf-8", "replace"))

    def _body(self, body: bytes | bytearray, lo: int, hi: int) -> list[Event]:
        """The events of the complete lines in body[lo:hi]; counts them and moves on."""
        self.lo = lo
        events = self._scan_body(body, lo, hi, self.offset, self.line_no)
        # _scan_body counted the newlines on its way (one pass over the block, not two)
        self.block_read(body, lo, hi, self.newlines + (0 if body[hi - 1] == 10 else 1))
        return events

    def handed_back(self, body: bytes | bytearray, start: int, stop: int, line_no: int, word: int,
                    offset: int) -> list[Event]:
        """The events of a candidate line the C code handed back (body[start:stop], its first
        trigger of scan word `word`), read by the fast regex or the tolerant path, counted."""
        stats = self.stats
        ev = self._fast_event(body, start, stop, word, line_no, offset)
        if ev is None:
            return list(self._slow_line(body, start, stop, line_no, offset))
        stats.candidate_lines += 1
        if ev is _IGNORED:
            stats.ignored_count += 1
            return []
        stats.kinds[ev.kind] += 1
        return [ev]

    def _scan_body(self, body: bytes | bytearray, lo: int, hi: int, base_offset: int, base_line: int) -> list[Event]:
        """Events of the complete lines in body[lo:hi] (its byte lo is at file offset
        `base_offset`); sets `self.newlines` to its newline count.

        Candidate lines are found by one C-speed search per scan word; a line is matched whole
        by the regex of its first word (`_FAST_BY_WORD`, undecoded) and its event built with
        `tuple.__new__`, or else read by `_slow_line`."""
        if self.accel:
            return self._scan_body_c(body, lo, hi, base_offset, base_line)
        stats = self.stats
        kinds = stats.kinds
        find, rfind, count = body.find, body.rfind, body.count
        out: list[Event] = []
        hits: list[int] = []
        for word, rx in self.scan_words:  # (position << 3) | word: sorted by position
            hits += map(_or, map(_shift, map(_match_start, rx.finditer(body, lo, hi)), _repeat(3)), _repeat(word))
        if len(self.scan_words) > 1:
            hits.sort()
        counted_to, line_no, next_line, candidates, ignored = lo, base_line, 0, 0, 0
        base = base_offset - lo
        for key in hits:
            i = key >> 3
            if i < next_line:
                continue  # another word on a line already read
            start = rfind(b"\n", lo, i) + 1 or lo
            stop = find(b"\n", i, hi)
            if stop == -1:
                stop = hi
            next_line = stop + 1
            line_no += count(b"\n", counted_to, start)
            counted_to = start
            ev = self._fast_event(body, start, stop, key & 7, line_no + 1, base + start)
            if ev is None:
                out += self._slow_line(body, start, stop, line_no + 1, base + start)
            elif ev is _IGNORED:
                candidates += 1
                ignored += 1
            else:
                candidates += 1
                kinds[ev.kind] += 1
                out.append(ev)
        stats.candidate_lines += candidates
        stats.ignored_count += ignored
        self.newlines = line_no - base_line + count(b"\n", counted_to, hi)
        return out

    def _scan_body_c(self, body: bytes | bytearray, lo: int, hi: int, base_offset: int, base_line: int) -> list[Event]:
        """`_scan_body` by the C accelerator (shadowlab/logs/_logscan.c): the lines it cannot read
        come back in `slow` and are read here, in their place among its events."""
        events, slow, self.newlines, candidates, ignored, counts = reading._logscan.scan(
            body, lo, hi, base_line, base_offset, _ACCEL_CLASSES, _ACCEL_METHODS
        )
        stats = self.stats
        stats.candidate_lines += candidates
        stats.ignored_count += ignored
        kinds = stats.kinds
        for kind, n in zip(_ACCEL_KINDS, counts):
            if n:
                kinds[kind] += n
        if not slow:
            return events
        out: list[Event] = []
        done, base = 0, base_offset - lo
        for index, start, stop, line_no, word in slow:
            out += events[done:index]
            done = index
            out += self.handed_back(body, start, stop, line_no, word, base + start)
        out += events[done:]
        return out

    def _fast_event(self, body: bytes, start: int, stop: int, word: int, ln: int, off: int) -> Any:
        """The event of a candidate line whose first trigger is scan word `word`, by that word's
        whole-line regex (undecoded); `_IGNORED` for a known benign line; None: not matched (a
        number of more than MAX_DIGITS digits neither), the line is for `_slow_line`."""
        match = self.fast[word] if word < len(self.fast) else None
        m = match(body, start, stop) if match is not None and stop - start <= MAX_LINE else None
        if m is None:
            return None
        k = m.lastindex
        g = m.groups()
        try:
            if word == _W_TRIM:
                return _new(CacheTrim, (ln, off, *map(int, g)))
            if word == _W_CK:
                if k == _CK_K_CK:
                    what, took = g[_CK_WHAT], g[_CK_TOOK]
                    head = (ln, off, int(g[_CK_SLOT]), int(g[_CK_TASK]), int(g[_CK_POS_MIN]),
                            int(g[_CK_POS_MAX]), int(g[_CK_N_TOKENS]), False, float(g[_CK_SIZE]),
                            None if took is None else float(took))
                    if what == b"created":
                        index, capacity = g[_CK_INDEX], g[_CK_CAPACITY]
                        return _new(CheckpointCreated, head + (None if index is None else int(index),
                                                               None if capacity is None else int(capacity)))
                    if what == b"erased invalidated":
                        n_swa, pos_next = g[_CK_N_SWA], g[_CK_POS_NEXT]
                        return _new(CheckpointErased, head + (None if n_swa is None else int(n_swa),
                                                              None if pos_next is None else int(pos_next)))
                    if what == b"restored":
                        n_past = g[_CK_N_PAST]
                        return _new(CheckpointRestored, head + (None if n_past is None else int(n_past),))
                    return _new(CheckpointErasedOld, head)
                if k == _CK_K_BENIGN or k == _CK_K_SRV_BENIGN:
                    return _IGNORED
                task = int(g[_CK_S_TASK])
                common = (ln, off, int(g[_CK_S_SLOT]), task if task >= 0 else None)
                if k == _CK_K_SUPERSEDED:
                    return _new(CheckpointSuperseded, common + (int(g[_CK_SUP_N]),))
                took = g[_CK_TC_TOOK]
                return _new(CheckpointErasedTooClose, common + (
                    int(g[_CK_TC_MIN]), int(g[_CK_TC_MAX]), int(g[_CK_TC_N]), False,
                    float(g[_CK_TC_SIZE]), None if took is None else float(took)))
            if word == _W_PROMPT:
                if k == _PR_K_NEW_PROMPT:
                    return _new(NewPrompt, (ln, off, int(g[_PR_SLOT]), int(g[_PR_TASK]),
                                            int(g[_PR_NP_CTX]), int(g[_PR_NP_KEEP]), int(g[_PR_NP_N])))
                if k == _PR_K_EVAL:
                    return _new(PromptEval, (ln, off, int(g[_PR_SLOT]), int(g[_PR_TASK]),
                                             float(g[_PR_EV_MS]), int(g[_PR_EV_N])))
                if k == _PR_K_HEADLESS_EVAL:  # multi-line print_timing: the header names the task
                    slot, task = self.timing_owner(body, start)
                    return _new(PromptEval, (ln, off, slot, task, float(g[_PR_HL_MS]), int(g[_PR_HL_N])))
                if k == _PR_K_SRV_BENIGN:
                    return _IGNORED
                if k == _PR_K_CLEARED:  # task -1: the server clears an idle slot between tasks
                    return _new(PromptCleared, (ln, off, int(g[_PR_S_SLOT]), None, int(g[_PR_CLR_N])))
                if k == _PR_K_SAVED:  # no slot prefix: the line names neither slot nor task
                    return _new(PromptCacheSaved, (ln, off, None, None,
                                                   int(g[_PR_SAVE_N]), None, float(g[_PR_SAVE_SIZE])))
                task = int(g[_PR_S_TASK])
                return _new(ForcedReprocessing, (ln, off, int(g[_PR_S_SLOT]), task if task >= 0 else None))
            # _W_SELECTED
            task = int(g[_SEL_TASK])
            common = (ln, off, int(g[_SEL_SLOT]), task if task >= 0 else None)
            if g[_SEL_LCP] is None:
                return _new(SlotSelected, common + ("lru", None, None))
            return _new(SlotSelected, common + ("lcp", float(g[_SEL_SIM]), float(g[_SEL_KEEP])))
        except ValueError:  # a number too long for int(): the tolerant path reports the line
            return None

    def _slow_line(self, body: bytes, start: int, stop: int, line_no: int, offset: int) -> Iterator[Event]:
        """A line the whole-line regexes did not take: `_fast_line`, then the tolerant path."""
        if stop - start > MAX_LINE:
            self.stats.overlong_lines += 1
            self._cut(bytes(body[start : start + MAX_LINE]), line_no)
            return
        raw = body[start:stop]
        self.stats.candidate_lines += 1
        try:
            ev = _fast_line(raw, line_no, offset)
        except ValueError:
            ev = None
        if ev is not None and (ev is _IGNORED or believable(ev)):
            if ev is _IGNORED:
                self.stats.ignored_count += 1
                return
            if ev.task is None and ev.kind == "prompt_eval":
                slot, task = self.timing_owner(body, start)
                ev = PromptEval(line=ev.line, offset=ev.offset, slot=slot, task=task, ms=ev.ms, n_tokens=ev.n_tokens)
            self.stats.kinds[ev.kind] += 1
            yield ev
            return
        yield from self._line(raw, line_no, offset, body, start)

    # ----------------------------------------------------------------- one line

    def _line(self, raw: bytes, line_no: int, offset: int, body: bytes, start: int) -> Iterator[Event]:
        text = raw.decode("utf-8", "replace")
        if "\x00" in text or "\r" in text:
            text = text.replace("\x00", "").replace("\r", " ")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        for extra_trigger, pattern, rx in self.extra:
            if extra_trigger in raw:
                m = rx.search(text, 0, EXTRA_PATTERN_CHARS)
                if m:
                    ev = _extra_event(pattern, m, line_no, offset)
                    if ev is not None and believable(ev):
                        self._count(ev)
                        yield ev
                        return
        understood = False
        try:
            segments = list(_segments(text))
        except ValueError:  # a slot or task id too long for int(): not a line from an engine
            self.stats.unknown(line_no, text)
            return
        for slot, task, message, headless in segments:
            ev, known = self._message(message, slot, task, headless, line_no, offset, body, start)
            if ev is not None:
                self._count(ev)
                understood = True
                yield ev
            elif known:
                understood = True
        if not understood:
            low = text.lower()
            if "llama_perf" in low or "perf_context_print" in low or any(b in low for b in _BENIGN):
                self.stats.ignored_count += 1
            elif any(w.decode() in text for w in self.triggers):
                self.stats.unknown(line_no, text)
            else:
                self.stats.ignored_count += 1  # trigger word was split by NUL/CR removal

    def _count(self, ev: Event) -> None:
        self.stats.kinds[ev.kind] += 1


__all__ = [
    "ACCEL_KINDS", "BLOCK_SIZE", "CacheTrim", "CheckpointCreated", "CheckpointErased", "CheckpointErasedOld",
    "CheckpointErasedTooClose", "CheckpointEvent", "CheckpointRestored", "CheckpointSuperseded", "EVENT_KINDS",
    "EVENT_TYPES", "EXTRA_PATTERN_CHARS", "Event", "ExtraPattern", "FAMILIES", "ForcedReprocessing", "GZIP_MAGIC",
    "GZIP_OUT", "GZIP_STEP", "LLAMA_CPP_FAMILIES", "LOOK_BACK", "LogText", "MAX_LINE", "MAX_SAMPLES", "NewPrompt",
    "ParseStats", "ParsedLog", "PromptCacheLoaded", "PromptCacheSaved", "PromptCleared", "PromptEval", "SAMPLE_CHARS",
    "ServerStart", "SlotSelected", "Source", "accelerated", "folder", "iter_events", "line_reader", "open_log",
    "parse",
]
