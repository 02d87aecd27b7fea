"""The tolerant path of the log parser: the trigger words, the field regexes, and the builder
of an event from a decoded message of any llama.cpp-family build (`_build`, `_extra_event`).
Split out of `shadowlab.logs.parse`, which re-exports the names its importers use.

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
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from shadowlab.logs import accel
from shadowlab.logs.reading import LineState
from shadowlab.logs.events import (
    Event, CheckpointEvent, CheckpointCreated, CheckpointRestored, CheckpointErased, CheckpointErasedOld,
    CheckpointErasedTooClose, CheckpointSuperseded, ForcedReprocessing, NewPrompt, CacheTrim, PromptEval,
    SlotSelected, PromptCacheSaved, PromptCacheLoaded, PromptCleared, ServerStart, EVENT_TYPES, ExtraPattern,
    believable,
)

LOOK_BACK = accel.LOOK_BACK  # how far `found better prompt` looks back for its prompt-cache candidate
TIMING_LOOK_BACK = 16384  # how far a headless `prompt eval time` line looks back for its print_timing header


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


def _build(msg: str, common: dict[str, Any], scanner: _MessageReader, body: bytes, start: int) -> Event | None:
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


class _MessageReader(LineState):
    """What the tolerant path asks of the line reader (`shadowlab.logs.parse._Scanner`, its one
    subclass): a decoded message's event, and the look-backs `_build` reads (`cache_entry_length`,
    `timing_owner`) in the reader's body and `tail` (LineState's)."""

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
            ev = _build(msg, common, self, body, start)
            return (ev, False) if ev is None or believable(ev) else (None, False)  # a number no engine prints
        except _Benign:
            return None, True
        except (ValueError, KeyError, OverflowError):  # OverflowError: int(float("9" * 400))
            return None, False

    def cache_entry_length(self, body: bytes, start: int, f_keep: str | None, f_sim: str | None) -> int | None:
        """llama.cpp names the loaded prompt-cache entry only in the candidate lines before
        `found better prompt` (`- prompt with length N, lcp = L, f_keep = F, f_sim = S`)."""
        if f_keep is None or f_sim is None:
            return None
        # the last matching candidate within LOOK_BACK bytes before the line, searched from the end
        window, low, end = self._before(body, start, LOOK_BACK)
        i, want = end, (f_keep.encode(), f_sim.encode())
        while (i := window.rfind(b"prompt with length", low, i)) != -1:
            m = _CACHE_CANDIDATE.match(window, i, end)
            if m is not None and (m.group(2), m.group(3)) == want:
                return int(m.group(1))
        return None

    def timing_owner(self, body: bytes, start: int) -> tuple[int | None, int | None]:
        """Slot and task of the nearest `print_timing` line starting within TIMING_LOOK_BACK
        bytes before `start` (the header of a multi-line print_timing)."""
        window, low, end = self._before(body, start, TIMING_LOOK_BACK)
        i = window.rfind(b"print_timing", low, end)
        if i == -1:
            return None, None
        nl = window.find(b"\n", i, end)
        m = _TIMING_HEADER.search(window, i, end if nl == -1 else nl)
        return (int(m.group(1)), int(m.group(2))) if m else (None, None)

    def _before(self, body: bytes, start: int, span: int) -> tuple[bytes, int, int]:
        """The `span` bytes of text before `start` as (window, low, end): window[low:end], the
        text before the body (`tail`) included near its start, so that a look-back finds the
        same line wherever a block ends."""
        if start - self.lo >= span:
            return body, start - span, start
        window = self.tail[max(0, len(self.tail) - (span - (start - self.lo))):] + body[self.lo:start]
        return window, 0, len(window)
