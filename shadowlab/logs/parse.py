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

How a line is read
------------------
The message is recognised by its words, never by the 12-character function name or the level
letter (both change between builds). A line is split at every ``id N | task M |`` slot prefix
(two lines that interleaved into one yield two messages); the text before the first prefix is a
message too when it starts the line (after a timestamp) or follows a broken prefix (``... | ``).
Fields are read as ``name = value`` pairs wherever they stand, so builds that print fewer
fields (older upstream: no ``n_tokens`` before b8157, no ``n_past``/``pos_next`` before b8400;
ik_llama.cpp: no ``n_tokens``, ``took X ms`` before the parenthesis) parse with the same rules.
A checkpoint line without ``n_tokens`` gets ``pos_max + 1`` (a hybrid checkpoint at ``pos_max``
covers ``pos_max + 1`` tokens) and ``n_tokens_derived=True``.

``prompt eval time`` lines printed without a slot prefix (``print_timing`` prints its header
line, then the timings on the next lines; ik's stdout lines may come in between) take the slot
and task of the nearest preceding ``print_timing`` line. ``llama_perf_context_print`` lines
(process totals at exit) are not turn timings and are skipped.

Speed: three layers, each giving the same events as the one below it (tests check this on every
fixture line and on mutated lines):

1. the C accelerator (``shadowlab/logs/_logscan.c``, built by ``pip install`` when a compiler exists;
   ``accelerated()`` says whether it is used): a vector search finds each line's first trigger
   word, small hand parsers read the common b11434 / reference-engine shapes, the records are
   built in C; every line it is not sure of comes back to the layers below. Not used with
   matrix ``log_patterns``. ~0.32 µs per event on a realistic log, a third of grep's speed;
2. the Python fast path: one C-speed regex search per scan word (``checkpoint``, ``prompt``
   where a trigger holds it, ``memory_seq_rm``, ``kv cache rm``, ``selected slot by``, ``model
   loaded``); a line is matched whole, undecoded, by one anchored regex chosen by its first scan
   word (the start-up line ``model loaded``, once per start, goes to the tolerant rules);
3. the tolerant rules above, on the decoded line.

Events are tuple-based records built with ``tuple.__new__`` (a frozen dataclass cost ~3 µs
each). Figures: benchmarks/bench_logparse.py and benchmarks/README.md.

Other forks: ``extra_patterns`` (a matrix's ``log_patterns``) are regexes whose named groups
become event fields; the event kind is the name of one more group, e.g.
``(?P<restored>)ckpt restore pos=(?P<pos_min>\\d+)-(?P<pos_max>\\d+)``. Their longest literal run
is the prefilter word; they see the first ``EXTRA_PATTERN_CHARS`` characters of a line.

Unknown lines: a line holding a trigger word (``checkpoint``, ``memory_seq_rm``, ...) that no
pattern explains, including one cut short or with a value broken by other text (a value is read
only when its delimiter, ``,`` ``)`` whitespace or the end, follows it), is counted in ``ParsedLog.unknown_count`` with a few
samples; it is never fatal. Lines without a trigger word are not events and not unknown.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import stat
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat as _repeat
from operator import lshift as _shift, or_ as _or
from typing import Any, BinaryIO, ClassVar, Union

from shadowlab.errors import LogSourceError
from shadowlab.logs import accel

try:  # the optional C accelerator of the fast path (setup.py builds it when a compiler exists)
    from shadowlab.logs import _logscan
except ImportError:  # pragma: no cover - exercised by installs without a compiler
    _logscan = None
_ACCEL_ABI = accel.ABI  # the C code's LOGSCAN_ABI (generated from accel.py): the scan() and fold_* expected


def _usable(module: Any) -> Any:
    """The accelerator if it speaks this file's ABI, else None (a build left over from another
    version falls back to the pure-Python path instead of mislabelling fields)."""
    return module if getattr(module, "ABI", None) == _ACCEL_ABI else None


_logscan = _usable(_logscan)

# The log families this parser reads: the one list (the matrix schema and the llama-server adapter
# import it). LLAMA_CPP_FAMILIES: those a llama.cpp-built server prints.
LLAMA_CPP_FAMILIES = ("llama.cpp", "llama.cpp-legacy", "ik_llama.cpp")
FAMILIES = (*LLAMA_CPP_FAMILIES, "reference", "none")

BLOCK_SIZE = 8 << 20
GZIP_MAGIC = b"\x1f\x8b"
GZIP_STEP = 1 << 16  # compressed bytes read at a time (a corrupt stream is salvaged up to the error)
GZIP_OUT = 1 << 20  # text decompressed ahead at most: a gzip bomb costs time, not memory
MAX_LINE = accel.MAX_LINE
LOOK_BACK = accel.LOOK_BACK  # how far `found better prompt` looks back for its prompt-cache candidate
MAX_SAMPLES = 5
# What a matrix `log_patterns` regex sees of a line: its backtracking is its author's, so a
# hostile line can cost it at most this much text, not MAX_LINE (real lines are < 600 chars).
EXTRA_PATTERN_CHARS = 4096
SAMPLE_CHARS = 240

# --------------------------------------------------------------------------- events
#
# Events are immutable records built on ``tuple`` (as ``collections.namedtuple`` is): the parser
# makes one per lifecycle line, and a frozen dataclass cost ~3 µs each to construct, more than
# everything else the fast path does for a line. The public surface is a frozen dataclass's:
# keyword-only construction with the same fields and defaults, attribute access, ``kind``,
# equality only between events of the same class, hashing, no ordering, no assignment
# (``dataclasses.FrozenInstanceError``), ``repr`` and ``to_dict``. The parser itself builds
# them with ``tuple.__new__`` (``_new``), which skips argument parsing.

try:  # the C attribute getter namedtuple uses; property(itemgetter) where it is missing
    from collections import _tuplegetter  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    from operator import itemgetter

    def _tuplegetter(index: int, doc: str) -> Any:  # type: ignore[no-redef]
        return property(itemgetter(index), doc=doc)


_REQUIRED: Any = object()
_new = tuple.__new__


def _rebuild(cls: type, values: tuple) -> Any:
    return _new(cls, values)


def _record(cls: type) -> type:
    """Give a tuple-based event class its fields: every non-ClassVar annotation of the class and
    its bases (base fields first, as dataclasses order them), defaults from the class body."""
    base = next((b for b in cls.__mro__[1:] if "_field_defaults" in vars(b)), None)
    names: list[str] = list(base._fields) if base is not None else []  # type: ignore[attr-defined]
    defaults: dict[str, Any] = {n: getattr(base, "_field_defaults").get(n, _REQUIRED) for n in names}
    for name, annotation in vars(cls).get("__annotations__", {}).items():
        if "ClassVar" in str(annotation):
            continue
        if name not in names:
            names.append(name)
        defaults[name] = vars(cls).get(name, _REQUIRED)
    params = ", ".join(n if defaults[n] is _REQUIRED else f"{n}=_d[{n!r}]" for n in names)
    source = (
        f"def __new__(_cls, *, {params}):\n"
        f"    return _new(_cls, ({''.join(n + ', ' for n in names)}))\n"
    )
    namespace: dict[str, Any] = {"_new": _new, "_d": defaults}
    exec(source, namespace)  # noqa: S102 - generated from the class's own field names
    new = namespace["__new__"]
    new.__qualname__ = f"{cls.__qualname__}.__new__"
    cls.__new__ = new  # type: ignore[assignment]
    for index, name in enumerate(names):
        setattr(cls, name, _tuplegetter(index, name))
    cls._fields = tuple(names)  # type: ignore[attr-defined]
    cls._field_defaults = {n: v for n, v in defaults.items() if v is not _REQUIRED}  # type: ignore[attr-defined]
    return cls


@_record
class Event(tuple):
    """One lifecycle line. ``line`` is 1-based; ``offset`` is the byte offset of the line start."""

    __slots__ = ()
    kind: ClassVar[str] = ""
    _fields: ClassVar[tuple[str, ...]] = ()
    line: int
    offset: int
    slot: int | None = None
    task: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        data.update(zip(self._fields, self))
        return data

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self))})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):  # a plain tuple or another kind is never equal
            return False if isinstance(other, tuple) else NotImplemented
        return tuple.__eq__(self, other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> bool:
        if type(other) is not type(self):
            return True if isinstance(other, tuple) else NotImplemented
        return tuple.__ne__(self, other)  # type: ignore[arg-type]

    __hash__ = tuple.__hash__

    def __lt__(self, other: object) -> bool:  # events have no order, as frozen dataclasses
        return NotImplemented

    __le__ = __gt__ = __ge__ = __lt__

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple:
        return _rebuild, (type(self), tuple(self))

    def __copy__(self) -> "Event":
        return self

    def __deepcopy__(self, memo: dict) -> "Event":
        return self


@_record
class CheckpointEvent(Event):
    __slots__ = ()
    pos_min: int
    pos_max: int
    n_tokens: int  # tokens the checkpoint covers
    n_tokens_derived: bool = False  # True: the line had no n_tokens; pos_max + 1 was used
    size_mib: float | None = None
    took_ms: float | None = None


@_record
class CheckpointCreated(CheckpointEvent):
    __slots__ = ()
    kind: ClassVar[str] = "created"
    index: int | None = None  # "created context checkpoint <index> of <capacity>"
    capacity: int | None = None


@_record
class CheckpointRestored(CheckpointEvent):
    __slots__ = ()
    kind: ClassVar[str] = "restored"
    n_past: int | None = None  # where prefill re-enters (None: not printed by this build)


@_record
class CheckpointErased(CheckpointEvent):
    """``erased invalidated context checkpoint``: the erase cascade after a restore/reset."""

    __slots__ = ()
    kind: ClassVar[str] = "erased_invalidated"
    n_swa: int | None = None
    pos_next: int | None = None


@_record
class CheckpointErasedOld(CheckpointEvent):
    """``erasing old context checkpoint``: the ring was full."""

    __slots__ = ()
    kind: ClassVar[str] = "erased_old"


@_record
class CheckpointErasedTooClose(CheckpointEvent):
    """``erasing context checkpoint too close to an earlier one`` (``--checkpoint-min-step``)."""

    __slots__ = ()
    kind: ClassVar[str] = "erased_too_close"


@_record
class CheckpointSuperseded(Event):
    """``superseding context checkpoint at n_tokens = N``: replaced by a new one at N."""

    __slots__ = ()
    kind: ClassVar[str] = "erased_superseded"
    n_tokens: int


@_record
class ForcedReprocessing(Event):
    __slots__ = ()
    kind: ClassVar[str] = "forced"


@_record
class NewPrompt(Event):
    __slots__ = ()
    kind: ClassVar[str] = "new_prompt"
    n_ctx_slot: int | None = None
    n_keep: int | None = None
    n_tokens: int | None = None  # task.n_tokens (n_prompt_tokens in older builds)


@_record
class CacheTrim(Event):
    """``cached n_tokens = N, memory_seq_rm [p0, end)``: the slot keeps N tokens (N = n_past)."""

    __slots__ = ()
    kind: ClassVar[str] = "cache_trim"
    n_past: int
    p0: int | None = None


@_record
class PromptEval(Event):
    """``prompt eval time = X ms / N tokens``: N = tokens actually processed."""

    __slots__ = ()
    kind: ClassVar[str] = "prompt_eval"
    ms: float
    n_tokens: int


@_record
class SlotSelected(Event):
    __slots__ = ()
    kind: ClassVar[str] = "slot_selected"
    method: str  # "lcs", "lcp", "lru", "id", ...
    similarity: float | None = None
    f_keep: float | None = None


@_record
class PromptCacheSaved(Event):
    __slots__ = ()
    kind: ClassVar[str] = "cache_saved"
    n_tokens: int | None = None
    n_checkpoints: int | None = None
    size_mib: float | None = None


@_record
class PromptCacheLoaded(Event):
    __slots__ = ()
    kind: ClassVar[str] = "cache_loaded"
    n_tokens: int | None = None
    n_checkpoints: int | None = None
    f_keep: float | None = None
    similarity: float | None = None


@_record
class PromptCleared(Event):
    """b11434's ``prompt_clear``: ``id S | task -1 | clearing prompt with N tokens``. The slot now
    holds no tokens and no checkpoints (they went into the RAM cache with the ``prompt_save`` just
    before, or nowhere); no erase line is printed for them. ``--cache-idle-slots`` prints one
    per idle slot at each new task, and one per empty slot at start-up (N = 0)."""

    __slots__ = ()
    kind: ClassVar[str] = "prompt_cleared"
    n_tokens: int | None = None


@_record
class ServerStart(Event):
    """The server's start-up line ``model loaded``: a new process began, so every slot is empty
    and task ids start again. Every family prints it exactly once per start, after loading the
    model and before serving (b11434 ``srv  llama_server: model loaded``, older upstream ``main:
    model loaded``, ik_llama.cpp ``INFO [ main] model loaded | ...``, the reference engine ``main:
    model loaded: sha256 = ...``); the line names no slot or task. A mention elsewhere (other
    words after it, text before it that is no log head) is no start."""

    __slots__ = ()
    kind: ClassVar[str] = "server_start"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        CheckpointCreated,
        CheckpointRestored,
        CheckpointErased,
        CheckpointErasedOld,
        CheckpointErasedTooClose,
        CheckpointSuperseded,
        ForcedReprocessing,
        NewPrompt,
        CacheTrim,
        PromptEval,
        SlotSelected,
        PromptCacheSaved,
        PromptCacheLoaded,
        PromptCleared,
        ServerStart,
    )
}
EVENT_KINDS = tuple(EVENT_TYPES)

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


def folder() -> Any:
    """The C accelerator when built (None otherwise): its ``fold_*`` functions replay a b11434
    log for ``shadowlab logs`` without a Python object per line (logs._server_fold)."""
    return _logscan


def line_reader(stats: ParseStats) -> "_Scanner":
    """What reads the lines the C fold hands back, with their look-backs (``handed_back``,
    ``block_read``): the parser's own readers, so a line reads the same on either path."""
    return _Scanner(stats, [])


def accelerated() -> bool:
    """True when the C accelerator (shadowlab._logscan) is built and used: `parse` gives the
    same events either way, the accelerator ~10x faster (benchmarks/README.md)."""
    return _logscan is not None


# --------------------------------------------------------------------------- extra patterns


@dataclass(frozen=True)
class ExtraPattern:
    """A matrix-declared line shape for another fork: named groups become the event's fields.

    ``contains`` is the literal a line must hold before the regex is tried (the prefilter);
    by default the longest plain run of the regex. Groups ``slot``/``task`` set the slot and
    task; other groups are converted to int or float when they look like numbers.
    """

    kind: str
    regex: str
    contains: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EVENT_TYPES:
            raise ValueError(f"extra log pattern: unknown event kind {self.kind!r} (one of {', '.join(EVENT_KINDS)})")
        re.compile(self.regex)

    @classmethod
    def from_regex(cls, regex: str) -> "ExtraPattern":
        """A matrix `log_patterns` entry: the event kind is the name of an (often empty) named
        group, e.g. ``(?P<restored>)ckpt restore pos=(?P<pos_min>\\d+)-(?P<pos_max>\\d+)``."""
        kinds = [g for g in re.compile(regex).groupindex if g in EVENT_TYPES]
        if len(kinds) != 1:
            raise ValueError(
                f"log pattern {regex!r}: name exactly one group after the event kind it reports "
                f"(one of {', '.join(EVENT_KINDS)}), e.g. (?P<restored>)"
            )
        return cls(kinds[0], regex)

    def trigger(self) -> bytes:
        """The prefilter literal: `contains`, else the longest plain run of the regex (a run's
        last character is dropped when a quantifier makes it optional)."""
        if self.contains:
            return self.contains.encode()
        best = ""
        text = re.sub(r"\(\?P<\w+>|\(\?:|\\.|\[[^\]]*\]", "\x00", self.regex)
        for m in re.finditer(r"[^\x00\\.^$|?*+()\[\]{}]+", text):
            run = m.group(0)
            if text[m.end() : m.end() + 1] in ("?", "*", "{"):
                run = run[:-1]
            if len(run.strip()) > len(best):
                best = run.strip()
        if len(best) < 3:
            raise ValueError(f"extra log pattern {self.regex!r}: give `contains`, a literal every line holds")
        return best.encode()


# --------------------------------------------------------------------------- results


@dataclass
class ParseStats:
    """Counters filled while events stream out (read them after the iterator is exhausted)."""

    family: str = "llama.cpp"
    lines: int = 0
    bytes: int = 0
    candidate_lines: int = 0  # lines holding a trigger word
    unknown_count: int = 0
    unknown_samples: list[tuple[int, str]] = field(default_factory=list)  # (line, text)
    ignored_count: int = 0  # known lines that are not events (e.g. `checking checkpoint with`)
    overlong_lines: int = 0
    cut_lines: int = 0  # lines with a trigger word that ended without their newline (see _Scanner._cut)
    source_error: str | None = None  # why reading stopped early (a corrupt .gz, a read error), else None
    kinds: Counter = field(default_factory=Counter)

    def unknown(self, line_no: int, text: str) -> None:
        self.unknown_count += 1
        if len(self.unknown_samples) < MAX_SAMPLES:
            self.unknown_samples.append((line_no, text[:SAMPLE_CHARS]))


@dataclass
class ParsedLog:
    family: str
    events: list[Event]
    lines: int
    bytes: int
    unknown_count: int
    unknown_samples: list[tuple[int, str]]
    ignored_count: int
    overlong_lines: int
    counts: dict[str, int]
    cut_lines: int = 0
    source_error: str | None = None  # set when reading stopped early: the events before are kept

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def between(self, start: int, end: int) -> list[Event]:
        """Events whose line starts in the byte span [start, end)."""
        return [e for e in self.events if start <= e.offset < end]


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


# --------------------------------------------------------------------------- reading


def open_log(path: str | os.PathLike[str]) -> BinaryIO:
    """The one place a log's path is opened (``parse``, ``iter_events`` and ``shadowlab logs``):
    an unbuffered binary file, or LogSourceError before a byte is read when the path is missing,
    unreadable or not a regular file. The path is opened without waiting (O_NONBLOCK: a FIFO's
    open() would wait for a writer) and judged by what was opened (fstat), so a FIFO, a device
    (/dev/zero reads forever) or a directory is refused whatever the path was when checked
    before. A stream (stdin, a pipe) is a file object: `LogText` reads either."""
    shown = os.fspath(path)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        text = "\n" in os.fspath(path)
        raise LogSourceError(
            f"cannot open: {getattr(exc, 'strerror', None) or exc}", source=repr(shown),
            hint="a str is a path; to parse log text pass text.splitlines()" if text else "check the path",
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LogSourceError(
                f"not a regular file ({_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')})", source=repr(shown),
                hint="pass a log file; a stream can be given as a binary file object",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}


def _check_source(source: Any) -> None:
    """Refuse what is not a log before anything is read: bytes (log text is not a path; pass a
    path, a binary file or its lines), a path `open_log` refuses, a text-mode file, anything not
    iterable."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        raise LogSourceError(
            f"got {type(source).__name__} ({len(source)} bytes), not a log source", source="parse()",
            hint="pass the log's path, a file opened with open(path, 'rb'), or its lines (data.splitlines())",
        )
    if isinstance(source, (str, os.PathLike)):
        open_log(source).close()
        return
    if isinstance(source, io.TextIOBase):
        raise LogSourceError(
            "a file opened in text mode", source=repr(getattr(source, "name", "<file>")),
            hint="open the log with open(path, 'rb') (or pass its path): offsets are byte offsets",
        )
    if not (callable(getattr(source, "read", None)) or isinstance(source, Iterable)):
        raise LogSourceError(
            f"got {type(source).__name__}, not a log source", source="parse()",
            hint="pass the log's path, a binary file object or an iterable of lines",
        )


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


class LogText(io.RawIOBase):
    """The text of one log file or binary stream, for every reader of logs (logparse's own and
    ``shadowlab logs``' pieces): gunzipped as it is read when it starts with the gzip magic bytes
    (one member or several, whatever the name), else as it is. A read error, or corrupt or
    truncated gzip data, ends the text there as zcat ends it: every byte decompressed before the
    damage is given (zlib gives nothing of a call that fails, so the failing input is fed again
    a byte at a time), and ``damage`` says what and where (None otherwise). ``readinto`` fills
    the buffer it is given, up to its end or the end of the text (plain text is read straight
    into it: the caller's own buffer object); a gzip bomb costs time, not memory (at most
    GZIP_OUT bytes are decompressed ahead). ``compressed`` is known after the first read."""

    def __init__(self, fh: BinaryIO) -> None:
        super().__init__()
        self.fh = fh
        self.damage: str | None = None
        self.raw_read = 0  # bytes read from fh (compressed bytes for a gzip)
        self.compressed: bool | None = None
        self._chunks: Iterator[bytes] | None = None
        self._out = memoryview(b"")  # decompressed, not handed on yet

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.compressed is None:  # the first read tells: the gzip magic, or text
            n = self._raw_into(b)
            while 0 < n < 2 and (more := self._raw_into(memoryview(b)[n:])):
                n += more
            self.compressed = bytes(b[:2]) == GZIP_MAGIC
            if not self.compressed:
                return n
            self._chunks = self._gunzip(bytes(b[:n]))
        elif self._chunks is None:
            return self._raw_into(b)
        view = memoryview(b).cast("B")
        n = 0
        while n < len(view):
            if not self._out:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._out = memoryview(chunk)
            take = min(len(self._out), len(view) - n)
            view[n : n + take] = self._out[:take]
            self._out = self._out[take:]
            n += take
        return n

    def _raw(self, size: int) -> bytes:
        """Up to `size` bytes of fh; b"" at its end or after a read error (then `damage`)."""
        if self.damage is not None:
            return b""
        try:
            data = self.fh.read(size)
        except (OSError, ValueError) as exc:  # EIO, a closed file, ...
            self.damage = f"reading stopped after byte {self.raw_read:,}: {exc}"
            return b""
        if data is None:  # a non-blocking stream with nothing yet: read as its end
            return b""
        if not isinstance(data, (bytes, bytearray)):
            raise LogSourceError(
                f"the file object gave {type(data).__name__}, not bytes", source=repr(getattr(self.fh, "name", "<file>")),
                hint="open the log with open(path, 'rb')",
            )
        self.raw_read += len(data)
        return bytes(data)

    def _raw_into(self, b: Any) -> int:
        readinto = getattr(self.fh, "readinto", None)
        if readinto is None:
            data = self._raw(len(b))
            memoryview(b)[: len(data)] = data
            return len(data)
        if self.damage is not None:
            return 0
        try:
            got = readinto(b) or 0
        except (OSError, ValueError) as exc:
            self.damage = f"reading stopped after byte {self.raw_read:,}: {exc}"
            return 0
        self.raw_read += got
        return got

    def _inputs(self, first: bytes) -> Iterator[bytes]:
        """The compressed bytes in pieces of at most GZIP_STEP: what the first read brought,
        then fh's (a failing piece is salvaged byte by byte, so a piece bounds that work)."""
        for i in range(0, len(first), GZIP_STEP):
            yield first[i : i + GZIP_STEP]
        while data := self._raw(GZIP_STEP):
            yield data

    def _gunzip(self, first: bytes) -> Iterator[bytes]:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        inputs = self._inputs(first)
        data, at = b"", 0  # at: compressed bytes consumed before `data`
        while True:
            if not data and not (data := next(inputs, b"")):
                break
            if d.eof:  # a member ended and more follows (`cat a.gz b.gz`)
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            saved = d.copy()
            try:
                out = d.decompress(data, GZIP_OUT)
            except zlib.error as exc:
                good = yield from _salvage(saved, data)
                self.damage = f"corrupt gzip data at compressed byte {at + good:,} ({exc})"
                if "check" in str(exc):  # the member's CRC or length: damaged where zlib could not see
                    self.damage += "; the text of that gzip member is damaged somewhere before it (where is unknown)"
                return
            if out:
                yield out
            rest = d.unconsumed_tail or (d.unused_data if d.eof else b"")
            at += len(data) - len(rest)
            data = rest
        if not d.eof and self.damage is None:
            self.damage = f"the gzip data ends early, after {at:,} compressed bytes (truncated)"


def _salvage(d: Any, data: bytes) -> Iterator[bytes]:
    """What `data` decompresses to before the byte zlib rejects (fed 256 bytes at a time, the
    failing piece again a byte at a time); returns how many bytes of `data` were good."""
    for i in range(0, len(data), 256):
        saved = d.copy()
        try:
            out = d.decompress(data[i : i + 256])
        except zlib.error:
            for j in range(i, min(i + 256, len(data))):
                try:
                    out = saved.decompress(data[j : j + 1])
                except zlib.error:
                    return j
                if out:
                    yield out
            return min(i + 256, len(data))
        if out:
            yield out
        if d.eof:
            return i + 256
    return len(data)


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


# Words that make a line worth decoding. Every event's text holds one of them.
_TRIGGERS = (
    b"checkpoint",
    b"forcing full prompt",
    b"new prompt,",
    b"memory_seq_rm",
    b"kv cache rm",
    b"prompt eval time",
    b"selected slot by",
    b"prompt cache",
    b"saving prompt with length",
    b"found better prompt",
    b"clearing prompt with",
    b"model loaded",
)

# Known lines with a trigger word that carry no event.
_BENIGN = (
    "checking checkpoint with",
    "tokens since last checkpoint",
    "context checkpoints enabled",
    "context checkpoints disabled",
    "speculative checkpoint",
    "speculative decoding will use checkpoints",
    "restore checkpoint)",
    "prompt cache is enabled",
    "prompt cache is disabled",
    "updating prompt cache",
    "prompt cache update took",
    "to disable the prompt cache",
    "to enable it",
    "saving idle slot to prompt cache",
    "idle slots will be saved",
    "failed to load prompt from cache",
    "do_checkpoint",
    "n_ctx_checkpoints",
    "ctx_checkpoints",
    "ctx-checkpoints",
    "checkpoint_min_step",
    "checkpoint-min-step",
    "cache_ram",
    "tokens, checkpoints:",  # prompt cache state listing: `- prompt 0x...: N tokens, checkpoints: K, X MiB`
)

_PREFIX = re.compile(r"\bid\s+(-?\d+)\s*\|\s*task\s+(-?\d+)\s*\|")
_TIMING_HEADER = re.compile(rb"\bid\s+(-?\d+)\s*\|\s*task\s+(-?\d+)\s*\|")
# Every pattern of the tolerant path costs time linear in the line (a hostile engine prints what
# it likes, up to MAX_LINE bytes): a name is tried only where a run of name characters starts
# (the lookbehind), and runs are taken whole (possessive), so no position is read twice per try.
# `name = value`: the value is the token up to its delimiter (`,` `)` whitespace or the end);
# a token that is not a whole number (`390<junk>6`) is _BROKEN, which int() and float() refuse:
# the line is then not understood instead of read as 390.
_FIELD = re.compile(r"(?<![\w.])(?:(?![A-Za-z_])[\w.])*+([A-Za-z_][\w.]*+)\s*+=\s*+(-?\d[^\s,)]*+)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BROKEN = "<broken value>"
_DELIMITED = r"(?=[\s,)]|\Z)"  # what must follow a number read at the end of a pattern
# `took X ms`; the second branch: `took` and a number that is not `X ms` (broken)
_TOOK = re.compile(r"took\s++(?:(-?\d+(?:\.\d+)?)\s*ms|(?=-?\d))")
# `created context checkpoint I of N`, or without the numbers (older builds); no match: broken
_CREATED_NUM = re.compile(r"created context checkpoint(?:\s+(\d+)\s+of\s+(\d+)" + _DELIMITED + r"|(?!\s*+\d))")
_TRIM = re.compile(r"(?:cached n_tokens|n_tokens|n_past)\s*=\s*(\d+)\s*,\s*memory_seq_rm\s*\[\s*(\d+)\s*,\s*end\)")
_TRIM_P0 = re.compile(r"(?:memory_seq_rm|kv cache rm)\s*\[\s*(?:p0\s*=\s*)?(\d+)\s*,\s*end\)")
_EVAL = re.compile(r"prompt eval time\s*=\s*(\d+(?:\.\d+)?)\s*ms\s*/\s*(\d+)\s*tokens")
_SELECTED = re.compile(r"selected slot by\s+([A-Za-z]+)")
_CLEARED = re.compile(r"clearing prompt with\s+(\d+)\s+tokens" + _DELIMITED)
_LOADED = re.compile(r"model loaded(?::|\s*+\Z)")  # ServerStart: the whole message, or details after ':'
_SAVE_LEN = re.compile(r"saving prompt with length(?:\s+(\d+)" + _DELIMITED + r"|(?!\s*+\d))")
_TRIM_KEY = re.compile(r"(?:n_tokens|n_past)\s*+=")  # a trim line naming its count, which _TRIM must read
# What may stand before a message on a line without a slot prefix: timestamps, a level word,
# and one `name:` tag (`srv  prompt_save:`, `llama_perf...:` is excluded elsewhere).
_TIMESTAMP_HEAD = re.compile(
    r"(?:[\s\d\-:.,/+|\[\]TZ]|\b[IWEDN]\b|\b(?:INFO|WARN|ERROR|DEBUG|TRACE)\b)*"
    r"(?:(?:srv|slot|main|server)?\s*[A-Za-z_][\w ()]{0,30}:)?[\s\-]*"
)
# `INFO [ func] message | k=v k=v`: the head; the message ends at the first ` | ` (_INFO_BAR)
_INFO_LINE = re.compile(r"\s*+(?:INFO|VERB|WARN|ERR|ERROR|DEBUG)\s*+\[[^\]]*+\]\s*+")
_INFO_BAR = re.compile(r"\s\|\s")
_INFO_KV = re.compile(r"(?<!\w)(\w++)=(-?\d\S*+)")  # the value: the token up to whitespace
_CACHE_CANDIDATE = re.compile(
    rb"prompt with length\s+(\d+), lcp =\s*\d+, f_keep = ([\d.]+), f_sim = ([\d.]+)(?=[\s,)]|\Z)"
)
_ANSI = re.compile(r"\x1b\[[\d;]*m")


class _Scanner:
    """Reads `_Splitter` pieces in order, carrying line numbers, offsets, the counters and the
    text a line may look back into from one piece to the next."""

    def __init__(self, stats: ParseStats, extra: list[tuple[bytes, ExtraPattern, re.Pattern[str]]]):
        self.stats = stats
        self.extra = extra
        self.triggers = _TRIGGERS + tuple(t for t, _, _ in extra)
        # One literal search per scan word finds every line that holds a trigger word.
        self.scan_words = _scan_regexes(_SCAN_WORDS, self.triggers)
        # With matrix patterns, the lines the tolerant path used to read go to it again: the
        # patterns are tried before the built-in rules there.
        self.fast = [pair[1] if extra else pair[0] for pair in _FAST_BY_WORD]
        # The C accelerator reads the built-in shapes only; matrix patterns need Python's rules.
        self.accel = _logscan is not None and not extra
        self.newlines = 0  # newlines counted by the last _scan_body
        self.offset = 0  # byte offset of the next piece
        self.line_no = 0  # lines completed so far
        self.lo = 0  # where the lines of the body being read start
        self.tail = b""  # the text before it (at most LOOK_BACK bytes): what lines look back into

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

    def _advance(self, nbytes: int, lines: int) -> None:
        self.offset += nbytes
        self.stats.bytes += nbytes
        self.line_no += lines
        self.stats.lines += lines

    def _body(self, body: bytes | bytearray, lo: int, hi: int) -> list[Event]:
        """The events of the complete lines in body[lo:hi]; counts them and moves on."""
        self.lo = lo
        events = self._scan_body(body, lo, hi, self.offset, self.line_no)
        # _scan_body counted the newlines on its way (one pass over the block, not two)
        self.block_read(body, lo, hi, self.newlines + (0 if body[hi - 1] == 10 else 1))
        return events

    def block_read(self, body: bytes | bytearray, lo: int, hi: int, lines: int) -> None:
        """body[lo:hi] (`lines` lines) has been read: count it, keep its end for look-backs."""
        self._advance(hi - lo, lines)
        if hi - lo >= LOOK_BACK:
            self.tail = bytes(body[hi - LOOK_BACK : hi])
        else:
            self.tail = (self.tail + body[lo:hi])[-LOOK_BACK:]

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
        events, slow, self.newlines, candidates, ignored, counts = _logscan.scan(
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
        whole-line regex (undecoded); `_IGNORED` for a known benign line; None: not matched,
        the line is for `_slow_line`."""
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
        if ev is not None:
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
                    if ev is not None:
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

    def _message(
        self,
        message: str,
        slot: int | None,
        task: int | None,
        headless: bool,
        line_no: int,
        offset: int,
        body: bytes,
        start: int,
    ) -> tuple[Event | None, bool]:
        """(event, known): known=True for a benign line that is understood but not an event."""
        msg = message.lstrip(" -")
        if headless:
            pos = _first_phrase(msg)
            if pos is None:
                return None, False
            head = msg[:pos]
            if "perf" in head:
                return None, True  # llama_perf_context_print / common_perf_print: process totals
            if head and (len(head) > 160 or not (_TIMESTAMP_HEAD.fullmatch(head) or head.rstrip().endswith("|"))):
                return None, False  # the phrase stands inside other text (a prompt dump)
            msg = msg[pos:]
        common = {"line": line_no, "offset": offset, "slot": slot, "task": task}
        try:
            return _build(msg, common, self, body, start), False
        except _Benign:
            return None, True
        except (ValueError, KeyError, OverflowError):  # OverflowError: int(float("9" * 400))
            return None, False

    def cache_entry_length(self, body: bytes, start: int, f_keep: str | None, f_sim: str | None) -> int | None:
        """llama.cpp names the loaded prompt-cache entry only in the candidate lines before
        `found better prompt` (`- prompt with length N, lcp = L, f_keep = F, f_sim = S`)."""
        if f_keep is None or f_sim is None:
            return None
        # the last matching candidate within LOOK_BACK bytes before the line, searched from the
        # end; near the start of the body the window takes in the text before it
        if start - self.lo >= LOOK_BACK:
            window, low, end = body, start - LOOK_BACK, start
        else:
            window = self.tail[max(0, len(self.tail) - (LOOK_BACK - (start - self.lo))) :] + body[self.lo : start]
            low, end = 0, len(window)
        i, want = end, (f_keep.encode(), f_sim.encode())
        while (i := window.rfind(b"prompt with length", low, i)) != -1:
            m = _CACHE_CANDIDATE.match(window, i, end)
            if m is not None and (m.group(2), m.group(3)) == want:
                return int(m.group(1))
        return None

    def timing_owner(self, body: bytes, start: int) -> tuple[int | None, int | None]:
        """Slot and task of the nearest `print_timing` line before `start`."""
        i = body.rfind(b"print_timing", max(0, start - 16384), start)
        if i != -1:
            hay = body[i : body.find(b"\n", i) if body.find(b"\n", i) != -1 else len(body)]
        else:
            context = self.tail[-4096:]
            j = context.rfind(b"print_timing")
            if j == -1:
                return None, None
            hay = context[j:]
        m = _TIMING_HEADER.search(hay)
        return (int(m.group(1)), int(m.group(2))) if m else (None, None)


# The fast path: the common b11434 / reference-engine lines, whole, each in one anchored match
# on the undecoded bytes. Anything else (older builds, forks, damaged or interleaved lines) goes
# through the tolerant path, which gives the same events for these lines, only slower.
_FAST_PREFIX = re.compile(rb"\bid +(\d+) \| task (-?\d+) \| ")
_FAST_CHECKPOINT = re.compile(
    rb"(created|restored|erased invalidated|erasing old) context checkpoint "
    rb"(?:(\d+) of (\d+) )?\(pos_min = (\d+), pos_max = (\d+), n_tokens = (\d+)"
    rb"(?:, n_past = (\d+))?(?:, n_swa = (\d+), pos_next = (\d+))?, size = (\d+\.\d+) MiB"
    rb"(?:, took (\d+\.\d+) ms)?\)[ \t\r]*\Z"
)
_FAST_MISC = re.compile(
    rb"(?:new prompt, n_ctx_slot = (\d+), n_keep = (-?\d+), task\.n_tokens = (\d+)"
    rb"|cached n_tokens = (\d+), memory_seq_rm \[(\d+), end\)"
    rb"|prompt eval time = +(\d+(?:\.\d+)?) ms / +(\d+) tokens \([^)\n]*\))[ \t\r]*\Z"
)
# Benign trace lines frequent enough to deserve a reject before decoding.
_FAST_BENIGN = (b"checking checkpoint with [", b"Checking checkpoint with [")
_IGNORED: Any = object()


def _fast_line(raw: bytes, line_no: int, offset: int) -> Event | None:
    p = _FAST_PREFIX.search(raw)
    if p is None:
        if raw.startswith(b"prompt eval time"):  # the multi-line print_timing form
            m = _FAST_MISC.match(raw)
            if m is not None and m.group(7) is not None:
                return PromptEval(line=line_no, offset=offset, ms=float(m.group(6)), n_tokens=int(m.group(7)))
        return None
    pos = p.end()
    if raw.find(b"| task ", pos) != -1:
        return None  # two messages on one line: the tolerant path splits them
    slot, task = int(p.group(1)), int(p.group(2))
    if task < 0:
        return None
    m = _FAST_CHECKPOINT.match(raw, pos)
    if m is not None:
        return _fast_checkpoint(m, slot, task, line_no, offset)
    m = _FAST_MISC.match(raw, pos)
    if m is not None:
        g = m.groups()
        if g[2] is not None:
            return NewPrompt(line=line_no, offset=offset, slot=slot, task=task, n_ctx_slot=int(g[0]), n_keep=int(g[1]), n_tokens=int(g[2]))
        if g[3] is not None:
            return CacheTrim(line=line_no, offset=offset, slot=slot, task=task, n_past=int(g[3]), p0=int(g[4]))
        return PromptEval(line=line_no, offset=offset, slot=slot, task=task, ms=float(g[5]), n_tokens=int(g[6]))
    if raw.startswith(_FAST_BENIGN, pos):
        return _IGNORED
    return None


def _fast_checkpoint(m: re.Match[bytes], slot: int, task: int, line_no: int, offset: int) -> Event:
    what, index, capacity, pos_min, pos_max, n_tokens, n_past, n_swa, pos_next, size, took = m.groups()
    took_ms = float(took) if took is not None else None
    if what == b"created":
        return CheckpointCreated(
            line=line_no, offset=offset, slot=slot, task=task, pos_min=int(pos_min),
            pos_max=int(pos_max), n_tokens=int(n_tokens), size_mib=float(size), took_ms=took_ms,
            index=int(index) if index is not None else None,
            capacity=int(capacity) if capacity is not None else None,
        )
    if what == b"restored":
        return CheckpointRestored(
            line=line_no, offset=offset, slot=slot, task=task, pos_min=int(pos_min),
            pos_max=int(pos_max), n_tokens=int(n_tokens), size_mib=float(size), took_ms=took_ms,
            n_past=int(n_past) if n_past is not None else None,
        )
    if what == b"erased invalidated":
        return CheckpointErased(
            line=line_no, offset=offset, slot=slot, task=task, pos_min=int(pos_min),
            pos_max=int(pos_max), n_tokens=int(n_tokens), size_mib=float(size), took_ms=took_ms,
            n_swa=int(n_swa) if n_swa is not None else None,
            pos_next=int(pos_next) if pos_next is not None else None,
        )
    return CheckpointErasedOld(
        line=line_no, offset=offset, slot=slot, task=task, pos_min=int(pos_min),
        pos_max=int(pos_max), n_tokens=int(n_tokens), size_mib=float(size), took_ms=took_ms,
    )


# The whole-line fast path (`_Scanner._scan_body`). A candidate line is found by its first
# scan word, and matched whole, undecoded, by that word's regex. Each regex has two kinds of
# branches:
#  * after `_ANY_HEAD` (any text without `|`, then the slot prefix): exactly the lines and
#    fields `_fast_line` takes; the head has no `|`, so the prefix is the line's first, and the
#    rest cannot hold another prefix;
#  * after `_STRICT_HEAD` / `_SRV_HEAD` (a b11434 timestamp, level and function name, nothing
#    else): b11434 lines `_fast_line` leaves to the tolerant path (slot selection, forcing,
#    superseding, too close, the prompt cache's own lines), with the fields the tolerant rules
#    read. Such a head holds no event phrase, so the tolerant path reads one message only.
#    These branches are left out when matrix patterns are given (the tolerant path tries the
#    patterns first).
# Anything else goes to `_slow_line`. tests/shadowlab/test_logparse.py checks that both paths
# give the same events for every line of the fixtures.
_ANY_HEAD = rb"[^|\n]*\bid +(?P<slot>\d+) \| task (?P<task>\d+) \| "
_STRICT_HEAD = rb"\d+\.\d+\.\d+\.\d+ [A-Z] (?:slot|srv ) +[\w()]+: id +(?P<s_slot>\d+) \| task (?P<s_task>-?\d+) \| "
_SRV_HEAD = rb"\d+\.\d+\.\d+\.\d+ [A-Z] srv +"
_END = rb")[ \t\r]*\Z"
_CK_ANY = (
    _ANY_HEAD + rb"(?:"
    rb"(?P<what>created|restored|erased invalidated|erasing old) context checkpoint "
    rb"(?:(?P<index>\d+) of (?P<capacity>\d+) )?\(pos_min = (?P<pos_min>\d+), pos_max = (?P<pos_max>\d+), "
    rb"n_tokens = (?P<n_tokens>\d+)(?:, n_past = (?P<n_past>\d+))?(?:, n_swa = (?P<n_swa>\d+), "
    rb"pos_next = (?P<pos_next>\d+))?, size = (?P<size>\d+\.\d+) MiB(?:, took (?P<took>\d+\.\d+) ms)?\)(?P<K_CK>)"
    rb"|[Cc]hecking checkpoint with \[[^|\n]*+(?P<K_BENIGN>))"
)
_CK_STRICT = (
    rb"|" + _STRICT_HEAD + rb"(?:superseding context checkpoint at n_tokens = (?P<sup_n>\d+)(?P<K_SUPERSEDED>)"
    rb"|erasing context checkpoint too close to an earlier one \(pos_min = (?P<tc_min>\d+), "
    rb"pos_max = (?P<tc_max>\d+), n_tokens = (?P<tc_n>\d+), size = (?P<tc_size>\d+\.\d+) MiB"
    rb"(?:, took (?P<tc_took>\d+\.\d+) ms)?\)(?P<K_TOO_CLOSE>))"
    rb"|" + _SRV_HEAD + rb"update: +- prompt 0x[0-9a-f]+: +\d+ tokens, checkpoints: +\d+, +\d+\.\d+ MiB(?P<K_SRV_BENIGN>)"
)
_PROMPT_ANY = (
    _ANY_HEAD + rb"(?:new prompt, n_ctx_slot = (?P<np_ctx>\d+), n_keep = (?P<np_keep>-?\d+), "
    rb"task\.n_tokens = (?P<np_n>\d+)(?P<K_NEW_PROMPT>)"
    rb"|prompt eval time = +(?P<ev_ms>\d+(?:\.\d+)?) ms / +(?P<ev_n>\d+) tokens \([^)|\n]*\)(?P<K_EVAL>))"
    rb"|prompt eval time = +(?P<hl_ms>\d+(?:\.\d+)?) ms / +(?P<hl_n>\d+) tokens \([^)|\n]*\)(?P<K_HEADLESS_EVAL>)"
)
_PROMPT_STRICT = (
    rb"|" + _STRICT_HEAD + rb"(?:forcing full prompt re-processing[^|\n]*+(?P<K_FORCED>)"
    rb"|clearing prompt with (?P<clr_n>\d+) tokens(?P<K_CLEARED>))"
    rb"|" + _SRV_HEAD + rb"get_availabl: (?:updating prompt cache|prompt cache update took \d+\.\d+ ms)(?P<K_SRV_BENIGN>)"
    rb"|" + _SRV_HEAD + rb"prompt_save: +- saving prompt with length (?P<save_n>\d+), "
    rb"total state size = (?P<save_size>\d+\.\d+) MiB(?: \(draft: \d+\.\d+ MiB\))?(?P<K_SAVED>)"
)
_TRIM_ANY = _ANY_HEAD + rb"cached n_tokens = (?P<trim_n>\d+), memory_seq_rm \[(?P<trim_p0>\d+), end\)"
_SELECTED_STRICT = (
    _STRICT_HEAD + rb"selected slot by (?:(?P<lcp>LCP) similarity, (?:f_)?sim_best = (?P<sim>\d+\.\d+) "
    rb"\(> \d+\.\d+ thold\), f_keep = (?P<keep>\d+\.\d+)|LRU, t_last = -?\d+)"
)


def _fast(pattern: bytes) -> Any:
    return re.compile(rb"(?:" + pattern + _END).match


# Per scan word: (regex with the strict branches, regex without them); None: none.
_SCAN_WORDS = tuple(word for word, _ in accel.SCAN_WORDS)  # the C code's `enum word`
_W_CK, _W_PROMPT, _W_TRIM, _W_KV, _W_SELECTED, _W_STARTED = range(6)
_FAST_BY_WORD = (
    (_fast(_CK_ANY + _CK_STRICT), _fast(_CK_ANY)),
    (_fast(_PROMPT_ANY + _PROMPT_STRICT), _fast(_PROMPT_ANY)),
    (_fast(_TRIM_ANY), _fast(_TRIM_ANY)),
    (None, None),
    (_fast(_SELECTED_STRICT), None),
    (None, None),  # `model loaded`: once per start, read by the tolerant rules
)


def _indices(match: Any, *names: str) -> tuple[int, ...]:
    """Group names -> `Match.groups()` indices; a `K_` marker -> its `Match.lastindex`."""
    index = match.__self__.groupindex
    return tuple(index[n] if n.startswith("K_") else index[n] - 1 for n in names)


(_CK_SLOT, _CK_TASK, _CK_WHAT, _CK_INDEX, _CK_CAPACITY, _CK_POS_MIN, _CK_POS_MAX, _CK_N_TOKENS, _CK_N_PAST,
 _CK_N_SWA, _CK_POS_NEXT, _CK_SIZE, _CK_TOOK, _CK_K_CK, _CK_K_BENIGN, _CK_S_SLOT, _CK_S_TASK, _CK_SUP_N,
 _CK_K_SUPERSEDED, _CK_TC_MIN, _CK_TC_MAX, _CK_TC_N, _CK_TC_SIZE, _CK_TC_TOOK, _CK_K_TOO_CLOSE,
 _CK_K_SRV_BENIGN) = _indices(
    _FAST_BY_WORD[_W_CK][0], "slot", "task", "what", "index", "capacity", "pos_min", "pos_max", "n_tokens",
    "n_past", "n_swa", "pos_next", "size", "took", "K_CK", "K_BENIGN", "s_slot", "s_task", "sup_n",
    "K_SUPERSEDED", "tc_min", "tc_max", "tc_n", "tc_size", "tc_took", "K_TOO_CLOSE", "K_SRV_BENIGN")
(_PR_SLOT, _PR_TASK, _PR_NP_CTX, _PR_NP_KEEP, _PR_NP_N, _PR_K_NEW_PROMPT, _PR_EV_MS, _PR_EV_N, _PR_K_EVAL,
 _PR_HL_MS, _PR_HL_N, _PR_K_HEADLESS_EVAL, _PR_S_SLOT, _PR_S_TASK, _PR_K_FORCED, _PR_K_SRV_BENIGN,
 _PR_CLR_N, _PR_K_CLEARED, _PR_SAVE_N, _PR_SAVE_SIZE, _PR_K_SAVED) = _indices(
    _FAST_BY_WORD[_W_PROMPT][0], "slot", "task", "np_ctx", "np_keep", "np_n", "K_NEW_PROMPT", "ev_ms", "ev_n",
    "K_EVAL", "hl_ms", "hl_n", "K_HEADLESS_EVAL", "s_slot", "s_task", "K_FORCED", "K_SRV_BENIGN", "clr_n",
    "K_CLEARED", "save_n", "save_size", "K_SAVED")
assert _FAST_BY_WORD[_W_TRIM][0].__self__.groups == 4  # slot, task, n_past, p0: built with map(int, ...)
_SEL_SLOT, _SEL_TASK, _SEL_LCP, _SEL_SIM, _SEL_KEEP = _indices(
    _FAST_BY_WORD[_W_SELECTED][0], "s_slot", "s_task", "lcp", "sim", "keep")
# the variants without strict branches number their shared groups alike
assert all(
    plain is None or all(strict.__self__.groupindex[n] == i for n, i in plain.__self__.groupindex.items())
    for strict, plain in _FAST_BY_WORD if strict is not None
)
_match_start = re.Match.start


def _scan_regexes(words: Sequence[bytes], triggers: Sequence[bytes]) -> list[tuple[int, re.Pattern[bytes]]]:
    """(word index, regex) per word, the regex matching exactly where one of the triggers that
    hold the word stands (a lookbehind checks the part before the word): a search runs at the
    speed of a literal search and finds trigger words only (`prompt processing` is no hit).
    A trigger without a word (a matrix pattern's) gets a regex of its own, index len(words)."""
    groups: dict[bytes, list[bytes]] = {}
    for trigger in dict.fromkeys(triggers):
        word = next((w for w in words if w in trigger), trigger)
        groups.setdefault(word, []).append(trigger)
    out = []
    for word, members in groups.items():
        index = words.index(word) if word in words else len(words)
        if word in members:
            out.append((index, re.compile(re.escape(word))))
            continue
        alternatives = []
        for t in members:
            i = t.index(word)
            behind = rb"(?<=" + re.escape(t[: i + len(word)]) + rb")" if i else b""
            alternatives.append(behind + re.escape(t[i + len(word) :]))
        out.append((index, re.compile(re.escape(word) + rb"(?:" + rb"|".join(alternatives) + rb")")))
    return out


class _Benign(Exception):
    """A line with a trigger word that is known and carries no event."""


_PHRASES = (
    "created context checkpoint",
    "restored context checkpoint",
    "erased invalidated context checkpoint",
    "erasing old context checkpoint",
    "erasing context checkpoint too close",
    "superseding context checkpoint",
    "forcing full prompt re-processing",
    "new prompt,",
    "cached n_tokens",
    "n_tokens = ",
    "n_past = ",
    "kv cache rm",
    "prompt eval time",
    "selected slot by",
    "prompt cache:",
    "saving prompt with length",
    "found better prompt",
    "clearing prompt with",
    "model loaded",
)


def _first_phrase(msg: str) -> int | None:
    best = None
    for phrase in _PHRASES:
        i = msg.find(phrase)
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _segments(text: str) -> Iterator[tuple[int | None, int | None, str, bool]]:
    """(slot, task, message, headless) for each message of a physical line."""
    prefixes = list(_PREFIX.finditer(text))
    if not prefixes:
        m = _INFO_LINE.match(text)
        if m is not None:  # ik / older upstream stdout: `INFO [ func] message | k=v k=v`
            rest = text[m.end() :]
            bar = _INFO_BAR.search(rest)
            message, pairs = (rest[: bar.start()], rest[bar.end() :]) if bar else (rest.rstrip(), "")
            kv = {k: _checked(v) for k, v in _INFO_KV.findall(pairs)}
            if "p0" in kv:
                message = message.replace("[p0, end)", f"[{kv['p0']}, end)")
            slot = int(kv["id_slot"]) if "id_slot" in kv else None
            task = int(kv["id_task"]) if "id_task" in kv else None
            yield slot, (task if task is None or task >= 0 else None), message, False
            return
        yield None, None, text, True
        return
    head = text[: prefixes[0].start()]
    if any(p in head for p in _PHRASES):
        yield None, None, head, True
    for k, m in enumerate(prefixes):
        stop = prefixes[k + 1].start() if k + 1 < len(prefixes) else len(text)
        task = int(m.group(2))
        yield int(m.group(1)), (task if task >= 0 else None), text[m.end() : stop], False


def _fields(msg: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in _FIELD.findall(msg):
        out.setdefault(key, _checked(value))
    return out


def _checked(token: str) -> str:
    """The token if it is a whole number, else _BROKEN (which int() and float() refuse)."""
    return token if _NUMBER.fullmatch(token) else _BROKEN


def _checkpoint_fields(msg: str, require_end: bool = True) -> dict[str, Any]:
    if require_end and ")" not in msg:
        raise ValueError("truncated checkpoint line")
    f = _fields(msg)
    pos_min, pos_max = int(f["pos_min"]), int(f["pos_max"])
    took = _TOOK.search(msg)
    if took is not None and took.group(1) is None:
        raise ValueError("broken took value")
    out: dict[str, Any] = {
        "pos_min": pos_min,
        "pos_max": pos_max,
        "size_mib": float(f["size"]) if "size" in f else None,
        "took_ms": float(took.group(1)) if took else None,
    }
    if "n_tokens" in f:
        out["n_tokens"] = int(f["n_tokens"])
    else:
        out["n_tokens"], out["n_tokens_derived"] = pos_max + 1, True
    out["_f"] = f
    return out


def _opt_int(f: dict[str, str], *keys: str) -> int | None:
    for k in keys:
        if k in f:
            return int(float(f[k]))
    return None


def _opt_float(f: dict[str, str], *keys: str) -> float | None:
    for k in keys:
        if k in f:
            return float(f[k])
    return None


def _build(msg: str, common: dict[str, Any], scanner: _Scanner, body: bytes, start: int) -> Event | None:
    if msg.startswith("created context checkpoint"):
        c = _checkpoint_fields(msg)
        c.pop("_f")
        m = _CREATED_NUM.match(msg)
        if m is None:
            raise ValueError("broken checkpoint index")
        index, capacity = m.groups()
        return CheckpointCreated(
            **common, **c, index=None if index is None else int(index), capacity=None if capacity is None else int(capacity)
        )
    if msg.startswith("restored context checkpoint"):
        c = _checkpoint_fields(msg)
        f = c.pop("_f")
        return CheckpointRestored(**common, **c, n_past=_opt_int(f, "n_past"))
    if msg.startswith("erased invalidated context checkpoint"):
        c = _checkpoint_fields(msg)
        f = c.pop("_f")
        return CheckpointErased(**common, **c, n_swa=_opt_int(f, "n_swa"), pos_next=_opt_int(f, "pos_next"))
    if msg.startswith("erasing old context checkpoint"):
        c = _checkpoint_fields(msg)
        c.pop("_f")
        return CheckpointErasedOld(**common, **c)
    if msg.startswith("erasing context checkpoint too close"):
        c = _checkpoint_fields(msg)
        c.pop("_f")
        return CheckpointErasedTooClose(**common, **c)
    if msg.startswith("superseding context checkpoint"):
        return CheckpointSuperseded(**common, n_tokens=int(_fields(msg)["n_tokens"]))
    if msg.startswith("forcing full prompt re-processing"):
        return ForcedReprocessing(**common)
    if msg.startswith("new prompt,"):
        f = _fields(msg)
        n = _opt_int(f, "task.n_tokens", "n_prompt_tokens", "n_tokens")
        if n is None:
            raise ValueError("new prompt without its token count")
        return NewPrompt(**common, n_ctx_slot=_opt_int(f, "n_ctx_slot"), n_keep=_opt_int(f, "n_keep"), n_tokens=n)
    if "memory_seq_rm" in msg or "kv cache rm" in msg:
        m = _TRIM.search(msg)
        if m:
            return CacheTrim(**common, n_past=int(m.group(1)), p0=int(m.group(2)))
        if _TRIM_KEY.search(msg):
            raise ValueError("cache trim with a broken count")
        m = _TRIM_P0.search(msg)
        if m:
            return CacheTrim(**common, n_past=int(m.group(1)), p0=int(m.group(1)))
        raise ValueError("cache trim without positions")
    if msg.startswith("prompt eval time"):
        m = _EVAL.match(msg)
        if not m:
            raise ValueError("truncated prompt eval line")
        if common["task"] is None:
            common["slot"], common["task"] = scanner.timing_owner(body, start)
        return PromptEval(**common, ms=float(m.group(1)), n_tokens=int(m.group(2)))
    if msg.startswith("selected slot by"):
        m = _SELECTED.match(msg)
        f = _fields(msg)
        return SlotSelected(
            **common,
            method=m.group(1).lower() if m else "?",
            similarity=_opt_float(f, "similarity", "f_sim_best", "sim_best", "f_sim"),
            f_keep=_opt_float(f, "f_keep"),
        )
    if msg.startswith("prompt cache:"):
        f = _fields(msg)
        rest = msg[len("prompt cache:") :].lstrip()
        if rest.startswith("saved"):
            return PromptCacheSaved(
                **common,
                n_tokens=_opt_int(f, "n_tokens"),
                n_checkpoints=_opt_int(f, "checkpoints"),
                size_mib=_opt_float(f, "size"),
            )
        if rest.startswith("loaded"):
            return PromptCacheLoaded(
                **common,
                n_tokens=_opt_int(f, "n_tokens"),
                n_checkpoints=_opt_int(f, "checkpoints"),
                f_keep=_opt_float(f, "f_keep"),
                similarity=_opt_float(f, "sim", "f_sim"),
            )
        raise ValueError("unknown prompt cache line")
    if msg.startswith("saving prompt with length"):
        m = _SAVE_LEN.match(msg)
        if m is None:
            raise ValueError("broken prompt length")
        f = _fields(msg)
        length = m.group(1)
        return PromptCacheSaved(**common, n_tokens=None if length is None else int(length), size_mib=_opt_float(f, "size"))
    if msg.startswith("clearing prompt with"):
        m = _CLEARED.match(msg)
        if m is None:
            raise ValueError("broken clearing count")
        return PromptCleared(**common, n_tokens=int(m.group(1)))
    if msg.startswith("model loaded"):
        if _LOADED.match(msg) is None:
            raise ValueError("`model loaded` followed by other words: not the start-up line")
        return ServerStart(line=common["line"], offset=common["offset"])
    if msg.startswith("found better prompt"):
        f = _fields(msg)
        f_keep, f_sim = _opt_float(f, "f_keep"), _opt_float(f, "f_sim", "sim")
        return PromptCacheLoaded(
            **common, n_tokens=scanner.cache_entry_length(body, start, f.get("f_keep"), f.get("f_sim")),
            f_keep=f_keep, similarity=f_sim,
        )
    low = msg.lower()
    if any(b in low for b in _BENIGN):
        raise _Benign()
    raise ValueError("not an event")


def _extra_event(pattern: ExtraPattern, m: re.Match[str], line_no: int, offset: int) -> Event | None:
    cls = EVENT_TYPES[pattern.kind]
    groups = {k: _number(v) for k, v in m.groupdict().items() if v is not None and k not in EVENT_TYPES}
    kwargs: dict[str, Any] = {
        "line": line_no,
        "offset": offset,
        "slot": groups.pop("slot", None),
        "task": groups.pop("task", None),
    }
    names = set(cls._fields)
    kwargs.update({k: v for k, v in groups.items() if k in names})
    if issubclass(cls, CheckpointEvent) and "n_tokens" not in kwargs and "pos_max" in kwargs:
        kwargs["n_tokens"], kwargs["n_tokens_derived"] = kwargs["pos_max"] + 1, True
    if issubclass(cls, SlotSelected):
        kwargs.setdefault("method", "pattern")
    try:
        return cls(**kwargs)
    except TypeError:
        return None


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
