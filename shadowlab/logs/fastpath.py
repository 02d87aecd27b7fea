"""The fast path of the log parser: the whole-line regexes of the common b11434 /
reference-engine lines on the undecoded bytes (`_fast_line`, `_FAST_BY_WORD`, the scan words).
Split out of `shadowlab.logs.parse`, which re-exports the names its importers use (and whose `_Scanner` reads
`_FAST_BY_WORD` and `_fast_line` there)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from shadowlab.logs import accel
from shadowlab.logs.events import (
    Event, CheckpointCreated, CheckpointRestored, CheckpointErased, CheckpointErasedOld, NewPrompt, CacheTrim,
    PromptEval,
)


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
    # An integer group takes at most MAX_DIGITS digits: a longer number goes to `_slow_line`,
    # whose readers judge it by its value (events.believable), as the C scanner hands it back.
    # So does a decimal number with more than MAX_DIGITS digits before its point.
    most = rb"{1,%d}" % accel.MAX_DIGITS
    for group in (rb">\d+)", rb">-?\d+)", rb">\d+\.\d+)", rb">\d+(?:\.\d+)?)"):
        pattern = pattern.replace(group, group.replace(rb"\d+", rb"\d" + most, 1))
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
