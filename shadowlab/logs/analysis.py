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

import json
from array import array
from collections import Counter, deque
from collections.abc import Sequence
from itertools import repeat
from operator import add, lshift, sub, truediv
from types import SimpleNamespace
from typing import Any, TextIO

from shadowlab.logs import accel
from shadowlab.logs.reading import BLOCK_SIZE, LineState, ParseStats, folder
from shadowlab.logs.figures import EVENT_COUNT_KINDS, LARGE_SHARED, PERCENTILES, Figures, _ratio, distribution
from shadowlab.logs.logfiles import SNIFF, STDIN, FileReport, Stdin, UsageError, _Stream, group_servers, sniff_family
from shadowlab.logs.outputs import LazyBins, log_bins, render_html, summary
from shadowlab.logs.times import TimeBound, _Clock, parse_time

# The C fold's path imports neither the Python parser (parse.py and its events, fast path and
# tolerant rules) nor the replay (lifecycle.py) nor dataclasses: ~40 % of a start of `shadowlab
# logs`, ~5 % of a 1 GB run (benchmarks/README.md). The replay's functions import them where
# they run; tests/shadowlab/test_logs.py holds the fold's start to it.

VERSION = 1
TRACE_VERSION = 2  # 2: shared_with, shared_exact (docs/trace.md)
CHUNK = BLOCK_SIZE
TIME_BINS = 48
MAX_ROWS = 200  # per-request rows in JSON / HTML (every row is in --trace)


# --------------------------------------------------------------------------- analysis


class Options:
    """What to read and where the trace goes (keywords only)."""

    def __init__(self, *, family: str | None = None, since: TimeBound | None = None, until: TimeBound | None = None,
                 slot: int | None = None, trace: TextIO | None = None, stdin: Any = None) -> None:
        self.family = family
        self.since = since
        self.until = until
        self.slot = slot
        self.trace = trace
        self.stdin = stdin  # the binary stream a file named "-" reads (standard input)

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
        # for the HTML picture only, not in the JSON: counted when a picture is drawn (a count
        # over every request, ~10 ms per 200k requests, that --json never uses)
        "_hist": LazyBins(overall.shared),
    }


# The C fold (shadowlab/logs/_logscan.c fold_*) reads these families: b11434-style elapsed times.
_FOLD_FAMILIES = ("llama.cpp", "llama.cpp-legacy", "reference")
FOLD = True  # tests switch it off to compare the two paths
# The fold reads 1 MiB blocks: copied in and scanned while in the CPU's cache, ~15% less CPU
# than 8 MiB ones. A line longer than a block (logparse.MAX_LINE is 1 MiB) falls back to Python.
_FOLD_BLOCK = 1 << 20
_TRACE_WRITE = 4 << 20  # the fold's trace is written in pieces of this many bytes (the last one less)
_FOLD_SEARCH = 0  # the fold's trigger search (0: the widest the CPU runs); tests fold with each
_FOLD_KIND = {kind: i for i, kind in enumerate(accel.KIND_NAMES)}  # the C code's `enum kind`


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
    fold = folder()
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


class _Ck:
    """A checkpoint of a fold row, as _row reads it."""

    __slots__ = ("pos_min", "pos_max", "n_tokens")

    def __init__(self, pos_min: int, pos_max: int, n_tokens: int) -> None:
        self.pos_min, self.pos_max, self.n_tokens = pos_min, pos_max, n_tokens


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
    fig.outcomes = dict(zip(accel.OUTCOMES, d["outcomes"]))
    fig.events = dict(zip(EVENT_COUNT_KINDS, d["events"]))
    fig.shared.frombytes(d["shared"])  # ascending (fold_finish sorts them)
    fig.prompts.frombytes(d["prompts"])
    fig.ordered = True
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
    stats = ParseStats(family=family)
    stream.stats = stats
    # where the reading stands; the parser's reader is made of it at the first line handed back
    # (the parser is imported then, if ever: the C code reads every line of most logs)
    reader: Any = LineState(stats)
    server_notes = []
    if any(b is not None and b.absolute for b in (options.since, options.until)):  # elapsed times only
        server_notes.append("--since/--until dates not applied: this log has elapsed times only (no wall clock)")
    since, until = (None if b is None or b.absolute else b.seconds for b in (options.since, options.until))
    trace = options.trace
    state = fold.fold_new(MAX_ROWS - len(rows), None if trace is None else json.dumps(server).encode(),
                          options.slot, since, until, _FOLD_SEARCH)
    written = 0  # trace lines
    fd = -1 if trace is None else _trace_fd(trace)
    # two buffers in turn: the block before stays whole while the next one is read, so a line
    # handed back looks back into it there (reader.block_read's `kept`: no copy of its end)
    buffers = [bytearray(_FOLD_BLOCK), bytearray(_FOLD_BLOCK)]
    while True:
        buffers.reverse()
        buf = buffers[0]
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
            if reader.__class__ is LineState:
                from shadowlab.logs import parse as logparse

                reader = logparse.line_reader(stats, reader)
            events = reader.handed_back(buf, start, stop, line_no, word, stream.start + start)
            why = fold.fold_events(state, buf, n, stream.start, [(_FOLD_KIND[e.kind], e) for e in events])
            if why is not None:
                raise _Unfoldable(why, written)
            lo, line = stop + 1, line_no
        reader.block_read(buf, 0, n, line - stats.lines, kept=True)
        if trace is not None:
            written += _write_trace(trace, fd, fold, state, _TRACE_WRITE)
    stream.settle()
    done = fold.fold_finish(state)
    if isinstance(done, str):
        raise _Unfoldable(done, written)
    if trace is not None:
        _write_trace(trace, fd, fold, state)
    reading["kinds"] = dict(zip(accel.KIND_NAMES, done["kinds"]))
    rows += [_row(server, _fold_row(t), stream) for t in done["rows"]]
    times.frombytes(bytes(done["times"]))
    codes.frombytes(bytes(done["codes"]))
    slots = {d["slot"]: _fold_figures(d) for d in done["slots"]}
    fig = Figures()
    for f in slots.values():
        fig.merge(f)
    return _server_doc(server, pieces, family, False, done["restarts"], fig, slots,
                       server_notes + done["notes"][:5] + done["ring_notes"][:5]), fig


def _trace_fd(trace: TextIO) -> int:
    """The trace file's descriptor, after what its own layers hold is written (the fold writes
    to it directly: no bytes object of ~100 KB per block in between); -1 for a file without one
    (io.StringIO), which gets text."""
    try:
        fd = trace.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return -1
    trace.flush()
    return fd


def _write_trace(trace: TextIO, fd: int, fold: Any, state: Any, least: int = 0) -> int:
    """The fold's trace lines so far (ASCII JSON), to `fd` (_trace_fd) once `least` bytes wait
    (4 MiB writes cost the kernel ~25% less than a block's ~100 KB ones), else as text: the
    number written (the fold counts them: no pass over the text)."""
    if fd >= 0:
        return fold.fold_trace(state, fd, least)[1]
    text, lines = fold.fold_trace(state)
    if text:
        trace.write(text.decode("ascii"))
    return lines


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
    from shadowlab.logs import lifecycle, parse as logparse  # the Python replay's own (the fold needs neither)

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

    stats = ParseStats(family=family)
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
    outcomes = list(accel.OUTCOMES)
    c = folder()
    if c is not None:  # the same counts in C (_logscan_figures.c): ~0.1 s less per 200k requests
        start, width, bins = c.bin_outcomes(times, codes, TIME_BINS, len(outcomes))
        return {"bin_s": width, "start_s": start, "outcomes": outcomes, "bins": bins}
    start = min(times)
    width = ((max(times) - start) or 1.0) / TIME_BINS
    bins = [[0] * len(accel.OUTCOMES) for _ in range(TIME_BINS)]
    # counted by bin * 8 + outcome in C-speed loops (one Python step per request was ~0.1 s
    # per GB); every bin is >= 0, from the earliest time
    offsets = map(sub, times, repeat(start))
    keys = map(add, map(lshift, map(int, map(truediv, offsets, repeat(width))), repeat(3)), codes)
    for key, n in Counter(keys).items():
        bins[min(TIME_BINS - 1, key >> 3)][key & 7] += n
    return {"bin_s": width, "start_s": start, "outcomes": outcomes, "bins": bins}


# --------------------------------------------------------------------------- command


# the command's public names; those of its parts (logfiles, figures, times, outputs) re-exported
__all__ = [
    "CHUNK", "EVENT_COUNT_KINDS", "FOLD", "Figures", "FileReport", "LARGE_SHARED", "LIFECYCLE_KINDS",
    "MAX_ROWS", "NOT_VERBOSE", "Options", "PERCENTILES", "SNIFF", "STDIN", "Stdin", "TIME_BINS",
    "TRACE_VERSION", "TimeBound", "UsageError", "VERSION", "analyse", "distribution", "group_servers",
    "log_bins", "parse_time", "render_html", "sniff_family", "summary",
    "_ratio",  # scripts/make_prodlogs.py reads it here
]
