"""The parser's records: the typed lifecycle events, the matrix's extra log patterns, and what
`parse` returns (`ParsedLog`; its counters, `ParseStats`, are reading.py's). Split out of
`shadowlab.logs.parse`, which re-exports the names its importers use; import them from there.

Other forks: ``extra_patterns`` (a matrix's ``log_patterns``) are regexes whose named groups
become event fields; the event kind is the name of one more group, e.g.
``(?P<restored>)ckpt restore pos=(?P<pos_min>\\d+)-(?P<pos_max>\\d+)``. Their longest literal run
is the prefilter word; they see the first ``EXTRA_PATTERN_CHARS`` characters of a line.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from shadowlab.logs import accel


# An event with a number of 10**MAX_DIGITS or more was read from a number no engine prints
# (accel.MAX_DIGITS): `believable` says no, and its line is counted not understood.
_INT_LIMIT = 10 ** accel.MAX_DIGITS
# What a matrix `log_patterns` regex sees of a line: its backtracking is its author's, so a
# hostile line can cost it at most this much text, not MAX_LINE (real lines are < 600 chars).
EXTRA_PATTERN_CHARS = 4096


def believable(ev: tuple) -> bool:
    """No number of the event is 10**MAX_DIGITS or more in size (a token count, position, slot
    or task id, MiB or milliseconds past anything an engine holds), and no float is inf or NaN
    (`9` * 400 reads as inf); text is not judged."""
    for v in ev:
        if (v.__class__ is int or v.__class__ is float) and not -_INT_LIMIT < v < _INT_LIMIT:
            return False
    return True


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
