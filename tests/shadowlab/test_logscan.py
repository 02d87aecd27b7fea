"""The C accelerator of the log parser (shadowlab/logs/_logscan.c) against the pure-Python parser.

The C code may only ever be stricter than Python (it hands every line it cannot read back to
Python), never different: every test here parses the same input both ways and compares the
events and every counter. Inputs: every fixture log (all engine families), the same logs cut
into tiny blocks, and their lines mutated in the ways real logs break (cut short, interleaved,
digits too long for int64, NUL, CR, foreign bytes, other level letters and spacing)."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import repo_scripts

from shadowlab.logs import accel, parse as lp, reading

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
ALL_LOGS = sorted(LOGS.glob("*/*.log"))

needs_c = pytest.mark.skipif(
    not lp.accelerated(), reason="the C accelerator is not built here (a C compiler is needed; CI requires it)"
)


def _family(path: Path) -> str:
    name = path.parent.name
    return "reference" if name == "reference" else "ik_llama.cpp" if "ik_" in name else "llama.cpp"


def _both(source, family="llama.cpp", monkeypatch=None, **kw):
    """(C result, pure-Python result) as comparable tuples: events with their classes and every
    counter of the parse."""
    def run():
        stats = lp.ParseStats()
        events = list(lp.iter_events(source, family, stats=stats, **kw))
        return (
            [(type(e).__name__, tuple(e)) for e in events],
            stats.lines, stats.bytes, stats.candidate_lines, stats.unknown_count, stats.unknown_samples,
            stats.ignored_count, stats.overlong_lines, stats.cut_lines, stats.source_error, dict(stats.kinds),
        )

    accelerated = run()
    monkeypatch.setattr(reading, "_logscan", None)
    try:
        pure = run()
    finally:
        monkeypatch.undo()
    return accelerated, pure


def test_accelerator_is_built_where_ci_runs():
    """CI installs with a compiler, so CI must measure and test the C path, never fall back."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("outside CI the pure-Python fallback is allowed")
    assert lp.accelerated(), "shadowlab._logscan was not built: `pip install -e .` needs a C compiler"


@needs_c
def test_the_records_the_c_code_writes_have_the_fields_it_writes_them_in():
    """_logscan.c fills the records positionally; a field added or moved in logparse.py must
    fail here before it mislabels a number."""
    checkpoint = ("line", "offset", "slot", "task", "pos_min", "pos_max", "n_tokens", "n_tokens_derived",
                  "size_mib", "took_ms")
    head = ("line", "offset", "slot", "task")
    expected = {
        "created": checkpoint + ("index", "capacity"),
        "restored": checkpoint + ("n_past",),
        "erased_invalidated": checkpoint + ("n_swa", "pos_next"),
        "erased_old": checkpoint,
        "erased_too_close": checkpoint,
        "erased_superseded": head + ("n_tokens",),
        "forced": head,
        "new_prompt": head + ("n_ctx_slot", "n_keep", "n_tokens"),
        "cache_trim": head + ("n_past", "p0"),
        "prompt_eval": head + ("ms", "n_tokens"),
        "slot_selected": head + ("method", "similarity", "f_keep"),
        "cache_saved": head + ("n_tokens", "n_checkpoints", "size_mib"),
        "cache_loaded": head + ("n_tokens", "n_checkpoints", "f_keep", "similarity"),
        "prompt_cleared": head + ("n_tokens",),
        "server_start": head,
    }
    assert {cls.kind: cls._fields for cls in lp._ACCEL_CLASSES} == expected
    assert lp._ACCEL_KINDS == tuple(expected)


@needs_c
@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_parses_the_same_with_and_without_c(path, monkeypatch):
    accelerated, pure = _both(path, _family(path), monkeypatch)
    assert accelerated == pure
    assert accelerated[0], "no events: the comparison proves nothing"


@needs_c
@pytest.mark.parametrize("block", [97, 4096, 65536])
def test_block_boundaries_anywhere_in_a_line(block, monkeypatch):
    """Small read blocks cut lines (and `found better prompt`'s look-back) at every place."""
    monkeypatch.setattr(lp, "BLOCK_SIZE", block)
    for path in ALL_LOGS:
        accelerated, pure = _both(path, _family(path), monkeypatch)
        monkeypatch.setattr(lp, "BLOCK_SIZE", block)  # _both undid it for the pure run
        assert accelerated == pure, path


@needs_c
def test_the_c_code_reads_the_b11434_request_lines_itself(monkeypatch):
    """Speed needs the C code to take the frequent lines: on the real b11434 captures no request
    line may fall back to Python (start-up messages may)."""
    fell_back = []
    original = lp._Scanner._fast_event

    def spy(self, body, start, stop, *args):
        fell_back.append(bytes(body[start:stop]))
        return original(self, body, start, stop, *args)

    monkeypatch.setattr(lp._Scanner, "_fast_event", spy)
    events = 0
    for path in sorted((LOGS / "llama.cpp-b11434").glob("*.log")):
        events += len(lp.parse(path, "llama.cpp").events)
    start_up = (b"load_model", b"init:", b"model loaded")  # once per start: Python reads them
    requests = [raw for raw in fell_back if not any(w in raw for w in start_up)]
    assert events > 100 and requests == []


def _mutations(line: bytes, rng: random.Random) -> list[bytes]:
    """Ways a real log line breaks, each applied alone."""
    out = []
    for _ in range(3):
        cut = rng.randrange(1, max(2, len(line)))
        out.append(line[:cut])  # cut short (a crash, a full disk)
        other = line[rng.randrange(len(line)) :]
        out.append(line[:cut] + other)  # two writers interleaved
    digits = [i for i, c in enumerate(line) if 48 <= c <= 57]
    if digits:
        i = rng.choice(digits)
        out.append(line[:i] + b"9" * 19 + line[i:])  # past int64
        out.append(line[:i] + b"1" * 17 + line[i:])  # still within int64
        out.append(line[:i] + b"9" * 5000 + line[i:])  # past int()'s limit
        out.append(line[:i] + b"-" + line[i:])  # a sign where none is expected
        out.append(line[:i] + b"." + line[i:])
        out.append(line[: i + 1] + b"<junk>" + line[i + 1 :])  # text broken inside a value
        out.append(line[: i + 1] + b"\xff" + line[i + 1 :])
    for junk in (b"\x00", b"\r", b"\t", b" ", b"|", b"\xff\xfe", b"\x1b[31m", "é".encode()):
        i = rng.randrange(len(line) + 1)
        out.append(line[:i] + junk + line[i:])
    out.append(line + b"   \r")  # trailing whitespace the regexes allow
    out.append(line + b" x")
    out.append(line.replace(b" I ", b" X ", 1))  # another level letter
    out.append(line.replace(b" I ", b" T ", 1))
    out.append(line.replace(b"id  ", b"id ", 1))
    out.append(line.replace(b"| task ", b"| task -", 1))
    out.append(line.replace(b"srv  ", b"srv ", 1))
    out.append(b"prefix " + line)
    out.append(b"xid" + line[line.find(b"id") + 2 :] if b"id" in line else line)
    out.append(b"0" * 200 + line)  # a head longer than the tolerant rules accept
    return out


def _candidate_lines() -> list[bytes]:
    lines = set()
    for path in ALL_LOGS:
        for line in path.read_bytes().splitlines():
            if any(t in line for t in lp._TRIGGERS):
                lines.add(line)
    return sorted(lines)


@needs_c
def test_mutated_lines_parse_the_same_with_and_without_c(monkeypatch):
    rng = random.Random(20261129)
    lines = _candidate_lines()
    assert len(lines) > 200
    mutated = [m for line in lines for m in _mutations(line, rng)]
    # in runs of 50 so a `found better prompt` sees its candidate lines before it
    for i in range(0, len(mutated), 50):
        accelerated, pure = _both(mutated[i : i + 50], "llama.cpp", monkeypatch)
        assert accelerated == pure, mutated[i : i + 50]


@needs_c
def test_found_better_prompt_finds_its_candidate_line_as_python_does(monkeypatch):
    head = b"0.01.000.000 I srv          load: "
    candidate = head + b" - prompt with length 4556, lcp = 4000, f_keep = 0.878, f_sim = 0.915"
    other = head + b" - prompt with length 99, lcp = 1, f_keep = 0.100, f_sim = 0.200"
    found = head + b" - found better prompt with f_keep = 0.878, f_sim = 0.915"
    filler = [b"0.01.000.001 I srv  update_slots: all slots are idle"] * 700  # ~36 KiB
    cases = {
        "just before": [candidate, other, found],
        "far before": [candidate] + filler + [found],
        "beyond 64 KiB": [candidate] + filler * 2 + [found],
        "none": [other, found],
        "long length": [candidate.replace(b"4556", b"4" * 30), found],
        "f_sim runs on": [candidate + b"7", found],  # 0.9157 is no 0.915
        "f_sim broken": [candidate + b"<junk>", found],
        "f_sim then text": [candidate + b" (best)", found],
    }
    for name, lines in cases.items():
        accelerated, pure = _both(lines, "llama.cpp", monkeypatch)
        assert accelerated == pure, name
    (loaded,) = [e for e in lp.parse(cases["just before"], "llama.cpp").events if e.kind == "cache_loaded"]
    assert (loaded.n_tokens, loaded.f_keep, loaded.similarity) == (4556, 0.878, 0.915)
    (loaded,) = [e for e in lp.parse(cases["beyond 64 KiB"], "llama.cpp").events if e.kind == "cache_loaded"]
    assert loaded.n_tokens is None
    for name, want in (("f_sim runs on", None), ("f_sim broken", None), ("f_sim then text", 4556)):
        (loaded,) = [e for e in lp.parse(cases[name], "llama.cpp").events if e.kind == "cache_loaded"]
        assert loaded.n_tokens == want, name
    # the candidate blocks before the line: the look-back reaches into the text kept from them
    monkeypatch.setattr(lp, "BLOCK_SIZE", 4096)
    for accelerated in (True, False):
        if not accelerated:
            monkeypatch.setattr(reading, "_logscan", None)
        (loaded,) = [e for e in lp.parse(cases["far before"], "llama.cpp").events if e.kind == "cache_loaded"]
        assert loaded.n_tokens == 4556, accelerated


def _scan(data: bytes, lo: int, hi: int, variant: int = 0) -> tuple:
    return reading._logscan.scan(data, lo, hi, 0, 0, lp._ACCEL_CLASSES, lp._ACCEL_METHODS, variant)


@needs_c
def test_scan_rejects_bad_arguments():
    scan, data = reading._logscan.scan, b"abc\n"
    with pytest.raises(ValueError):
        scan(data, 2, 9, 0, 0, lp._ACCEL_CLASSES, lp._ACCEL_METHODS)
    with pytest.raises(ValueError):
        scan(data, 3, 2, 0, 0, lp._ACCEL_CLASSES, lp._ACCEL_METHODS)
    with pytest.raises(ValueError):
        scan(data, 0, 4, 0, 0, lp._ACCEL_CLASSES[:3], lp._ACCEL_METHODS)
    with pytest.raises(TypeError):
        scan(data, 0, 4, 0, 0, (int,) * len(lp._ACCEL_CLASSES), lp._ACCEL_METHODS)


def test_a_build_from_another_version_is_not_used():
    """A stale shadowlab/_logscan*.so left by an older install must fall back to Python."""
    stale = type("Stale", (), {"ABI": accel.ABI + 1, "scan": None})()
    assert reading.usable(stale) is None
    assert reading.usable(type("NoAbi", (), {})()) is None
    if lp.accelerated():
        assert reading.usable(reading._logscan) is reading._logscan


def _search_variants() -> list[int]:
    """The trigger searches this machine can run (1 scalar, 2 SSE2, 3 AVX2, 4 AVX-512BW)."""
    variants = []
    for variant in (1, 2, 3, 4):
        try:
            _scan(b"x\n", 0, 2, variant)
        except ValueError:
            continue
        variants.append(variant)
    return variants


@needs_c
def test_every_trigger_search_the_cpu_has_finds_the_same_lines():
    """The vector searches read 47 bytes ahead and skip lanes past the region's end: each must
    give what the byte-by-byte search gives, on every fixture and at every region end."""
    variants = _search_variants()
    assert 1 in variants
    rng = random.Random(7)
    data = b"".join(path.read_bytes() for path in ALL_LOGS)
    data += b"".join(m + b"\n" for line in _candidate_lines() for m in _mutations(line, rng))
    regions = [(0, len(data))] + [tuple(sorted(rng.sample(range(len(data)), 2))) for _ in range(40)]
    for lo, hi in regions:
        results = {v: _scan(data, lo, hi, v) for v in variants}
        assert all(r == results[1] for r in results.values()), (lo, hi)
    with pytest.raises(ValueError):
        _scan(b"x\n", 0, 2, 9)


@needs_c
def test_every_side_note_search_the_cpu_has_finds_the_same_words():
    """The fold finds its side notes by "hecking " (AVX-512BW, AVX2 or memmem: the widest the
    CPU runs). Each variant must find what bytes.find finds: words at every chunk position,
    overlapping near-misses, regions ending mid-word and at the buffer's end."""
    rng = random.Random(5)
    pieces = [b"hecking ", b"checking sim = ", b"hecking", b"heck", b"h", b"k", b" ", b"x" * 40, b"\n"]
    data = b"".join(rng.choice(pieces) for _ in range(20000))
    variants = [v for v in (1, 3, 4) if _hecking_available(v)]
    assert 1 in variants
    regions = [(0, len(data))] + [tuple(sorted(rng.sample(range(len(data)), 2))) for _ in range(40)]
    for lo, hi in regions:
        want, i = [], data.find(b"hecking ", lo, hi)
        while i >= 0:
            want.append(i)
            i = data.find(b"hecking ", i + 1, hi)
        for v in variants:
            assert reading._logscan.hecking_all(data, lo, hi, v) == want, (v, lo, hi)
            assert reading._logscan.hecking_all(data[:hi], lo, hi, v) == want, ("at the buffer's end", v, lo, hi)
    with pytest.raises(ValueError):
        reading._logscan.hecking_all(b"x", 0, 1, 2)


def _hecking_available(variant: int) -> bool:
    try:
        reading._logscan.hecking_all(b"x", 0, 1, variant)
    except ValueError:
        return False
    return True


@needs_c
def test_the_fused_finders_count_lines_at_every_chunk_position():
    """The AVX2 / AVX-512 finders (variants 3 and 4) search 32 / 64 positions at a time and count
    newlines from the same loads: a trigger's line starts at the chunk's last newline before it
    or earlier, ends in the chunk or later, and near the buffer's end (the loads would pass it)
    the rest goes the generic way. Lines of every length from 0 to 200 bytes put each trigger at
    every position of a chunk, lines run over two chunks and more, and regions end at the
    buffer's end (no byte readable past it) and mid-line; each variant must give the scalar
    search's records, line numbers and counts."""
    variants = _search_variants()
    rng = random.Random(11)
    trigger_lines = _candidate_lines()[:300]
    lines = []
    for _ in range(6000):
        pick = rng.random()
        if pick < 0.45:
            lines.append(rng.choice(trigger_lines))
        elif pick < 0.55:
            lines.append(b"")
        else:
            lines.append(bytes(rng.choice(b"abcdefghijklmnop |:=.0123456789") for _ in range(rng.randrange(201))))
    data = b"\n".join(lines) + b"\n"
    regions = [(0, len(data))] + [(rng.randrange(len(data)), len(data)) for _ in range(30)]
    regions += [tuple(sorted(rng.sample(range(len(data)), 2))) for _ in range(30)]
    for lo, hi in regions:
        want = _scan(data, lo, hi, 1)
        for v in variants:
            assert _scan(data, lo, hi, v) == want, (v, lo, hi)
            assert _scan(data[:hi], lo, hi, v) == want, ("at the buffer's end", v, lo, hi)
    for cut in range(1, 400):  # short buffers: every line near the end, each region its whole
        piece = data[:cut]
        want = _scan(piece, 0, cut, 1)
        assert all(_scan(piece, 0, cut, v) == want for v in variants), cut


@needs_c
def test_a_region_of_many_batches_reads_as_one(tmp_path, monkeypatch):
    """scan() reads a block in batches of 2048 lines (records, then objects): a block of many
    batches, read as a file and as a line list, gives what the pure-Python parser gives."""
    data = b"".join(p.read_bytes() for p in ALL_LOGS if _family(p) == "llama.cpp") * 3
    assert data.endswith(b"\n") and data.count(b"\n") > 3 * 2048
    path = tmp_path / "big.log"
    path.write_bytes(data)
    from_file, pure = _both(path, "llama.cpp", monkeypatch)
    assert from_file == pure
    from_lines, _ = _both(data.split(b"\n")[:-1], "llama.cpp", monkeypatch)
    assert from_lines == from_file


@needs_c
def test_garbage_with_trigger_words_parses_the_same_with_and_without_c(monkeypatch):
    """A hostile engine prints anything: random bytes around trigger words and pieces of real
    lines, cut anywhere. The C code must read none of it differently (and must not crash)."""
    rng = random.Random(4242)
    pieces = [t for t in lp._TRIGGERS] + [b"| task ", b"id  0 ", b" | ", b"0.01.234.567 I ", b"slot ",
                                          b"srv  ", b"(pos_min = ", b", size = 0.3 MiB)", b"f_keep = 0.5",
                                          b"prompt with length 12, lcp = 1, f_keep = 0.5, f_sim = 0.5"]
    pieces += _candidate_lines()[:200]
    lines = []
    for _ in range(3000):
        parts = []
        for _ in range(rng.randrange(1, 6)):
            if rng.random() < 0.5:
                parts.append(rng.choice(pieces))
            else:
                parts.append(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))))
        line = b"".join(parts).replace(b"\n", b" ")
        lines.append(line[: rng.randrange(1, len(line) + 2)] if line else line)
    accelerated, pure = _both(lines, "llama.cpp", monkeypatch)
    assert accelerated == pure


# --------------------------------------------------------------------------- the fold (shadowlab logs)
#
# `shadowlab logs` reads b11434-style logs through _logscan.c's fold_* (scan, side notes, replay,
# figures in C); lifecycle.Replay and logs.Figures are its specification. Each test reads the
# same files three ways and compares the whole JSON document: the fold, the Python replay over
# the C scan, and the pure-Python path; and checks the fold did read them (a fallback to the
# Python replay would compare Python with itself).


def _three_ways(paths, monkeypatch, options_of=None):
    """The whole JSON document and the --trace text, three ways; `options_of()`: the filters
    (logs.Options fields), made afresh for each way."""
    from shadowlab.logs import analysis as logs

    folded: list[str] = []
    fold = logs._server_fold

    def spy(*args):
        out = fold(*args)
        folded.append(args[1])
        return out

    traces = []

    def analyse():
        options = logs.Options(**(options_of() if options_of else {}))
        options.trace = io.StringIO()
        doc = logs.analyse([str(p) for p in paths], options)
        traces.append(options.trace.getvalue())
        readers.append(doc.pop("reader"))  # which reader read it: the one thing that differs
        return doc

    readers: list[dict] = []
    with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:  # a file: the fold writes to its descriptor,
        piece, logs._TRACE_WRITE = logs._TRACE_WRITE, 1000  # here in pieces of 1000 bytes or more
        try:
            logs.analyse([str(p) for p in paths], logs.Options(**(options_of() if options_of else {}), trace=fh))
        finally:
            logs._TRACE_WRITE = piece
        fh.seek(0)
        to_file = fh.read()
    monkeypatch.setattr(logs, "_server_fold", spy)
    docs = [analyse()]
    assert to_file == traces[0]
    monkeypatch.setattr(logs, "_FOLD_BLOCK", 1 << 20)
    monkeypatch.setattr(logs, "FOLD", False)
    docs.append(analyse())
    monkeypatch.setattr(reading, "_logscan", None)
    docs.append(analyse())
    monkeypatch.undo()
    assert traces[0] == traces[1] == traces[2]  # --trace: the same lines, byte for byte
    assert readers[0]["c_fold"] == len(folded) and readers[1]["c_fold"] == readers[2]["c_fold"] == 0
    return docs, folded


def _make_prodlogs():
    return repo_scripts.load("make_prodlogs")


@needs_c
def test_a_slot_lines_first_bar_is_found_at_any_distance_from_its_start(tmp_path, monkeypatch):
    """The C head reader (any_head) reads a slot line's prefix back from its first '|'
    (first_bar: 16 bytes a step, then byte by byte): with the prefix at every distance from the
    line's start across three steps, and lines shorter than a step, the fold reads every line
    itself (a bar missed or misplaced would hand the line to Python: not read alike, only
    slower) and three ways alike."""
    msgs = ("cached n_tokens = 8192, memory_seq_rm [8192, end)",
            "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 9",
            "created context checkpoint 1 of 8 (pos_min = 5, pos_max = 5, n_tokens = 6, size = 1.500 MiB)")
    lines = [f"{'.' * pad}id  1 | task {pad} | {msg}" for pad in range(48) for msg in msgs]
    lines += ["id 1 | task 99 | new prompt, n_ctx_slot = 1, n_keep = 0, task.n_tokens = 1",
              "id  2 | task 100 | cached n_tokens = 0, memory_seq_rm [0, end)"]
    log = tmp_path / "bars.log"
    log.write_text("\n".join(lines) + "\n")
    docs, folded = _three_ways([log], monkeypatch)
    assert docs[0] == docs[1] == docs[2] and folded
    from shadowlab.logs import analysis

    doc = analysis.analyse([str(log)], analysis.Options())
    assert doc["overall"]["requests"] == 50 and doc["lines_not_understood"] == 0  # 48 padded, 2 short
    assert doc["reader"] == {"c_fold": 1, "python_replay": [], "lines_handed_back": 0}


@needs_c
@pytest.mark.parametrize("block", [None, 4099], ids=["1MiB", "4099"])
@pytest.mark.parametrize("chatter", [True, False], ids=["realistic", "dense"])
def test_fold_reads_generated_logs_as_the_python_replay_does(tmp_path, monkeypatch, chatter, block):
    """Rotated .gz pieces, two servers, three slots, and a server restarted (the log twice);
    small blocks put block ends next to every kind of line and side note."""
    from shadowlab.logs import analysis as logs

    _make_prodlogs().generate(tmp_path, "b11434", seed=7, requests=300, servers=2, slots=3, pieces=3,
                              chatter=chatter)
    if block:
        monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
    pieces = sorted(tmp_path.glob("server*.log*"))
    assert any(p.suffix == ".gz" for p in pieces)
    twice = tmp_path / "restarted.log"
    one = (tmp_path / "server0.log").read_bytes()
    twice.write_bytes(one + one)
    (fold, replay, pure), folded = _three_ways([*pieces, twice], monkeypatch)
    assert len(folded) == 3 == len(fold["servers"])
    assert fold == replay == pure
    assert fold["overall"]["requests"] > 300 and fold["servers"][2]["restarts"] == 1
    assert len(fold["requests"]) == 200 and fold["requests"][0]["checkpoints"]["created"]


@needs_c
def test_fold_reads_the_real_captures_as_the_python_replay_does(monkeypatch):
    """Every capture of a family the fold reads, one server each, and all of them as one log
    (a restart between each): the fold reads every one itself, those with prompt-cache saves,
    loads (`-cram 8192`) and idle-slot clears (`--cache-idle-slots`) too."""
    paths = _fold_logs()
    cache_lines = 0
    for path in paths:
        (fold, replay, pure), folded = _three_ways([path], monkeypatch)
        assert folded == [str(path)], path
        assert fold == replay == pure, path
        events = fold["overall"]["events"]
        cache_lines += events["cache_saved"] + events["cache_loaded"]
    assert cache_lines >= 20  # the prompt cache's lines were there, and read
    assert any("np4-pinned" in str(p) for p in paths) and any("A-B-A" in str(p) for p in paths)


def _shuffled(lines: list[bytes], rng: random.Random) -> list[bytes]:
    """Lines a log loses, repeats and reorders (a lost buffer, two writers, a cut and a restart):
    every line stays one the C reader takes, so the fold must read the result itself."""
    out = list(lines)
    for _ in range(len(out) // 15):
        i = rng.randrange(len(out))
        what = rng.randrange(5)
        if what == 0:
            del out[i]
        elif what == 1:
            out.insert(rng.randrange(len(out)), out[i])
        elif what == 2:
            j = min(len(out) - 1, i + rng.randrange(1, 30))
            out[i], out[j] = out[j], out[i]
        elif what == 3:  # another task id: a restart, or a task that jumps slots
            out[i] = out[i].replace(b"| task ", b"| task 1", 1)
        else:
            out[i] = out[i].replace(b"id  0 |", b"id  1 |", 1).replace(b"id  1 |", b"id  0 |", 1)
    return out


@needs_c
def test_fold_reads_a_log_that_lost_repeated_and_reordered_lines_as_python_does(tmp_path, monkeypatch):
    _make_prodlogs().generate(tmp_path, "b11434", seed=3, requests=200, slots=2, pieces=1, days=1)
    lines = (tmp_path / "server0.log").read_bytes().splitlines(keepends=True)
    from shadowlab.logs import analysis as logs

    rng = random.Random(20261201)
    notes = []
    for round_ in range(8):
        path = tmp_path / f"shuffled{round_}.log"
        path.write_bytes(b"".join(_shuffled(lines[: 400 * (round_ + 1)], rng)))
        # small blocks: a task's run of `checking checkpoint` lines (one note) across a block end
        monkeypatch.setattr(logs, "_FOLD_BLOCK", 4099 if round_ % 2 else 1 << 20)
        (fold, replay, pure), folded = _three_ways([path], monkeypatch)
        assert folded == [str(path)], round_
        assert fold == replay == pure, round_
        notes += fold["servers"][0]["notes"]
    assert any("never seen created" in n for n in notes) and any("restarted" in n for n in notes), notes


@needs_c
def test_fold_reads_handed_back_lines_in_place_and_leaves_what_it_cannot_hold_to_python(tmp_path, monkeypatch):
    """A line the C reader hands back is read by logparse's Python readers and folded in its
    place; one with an integer of more than accel.MAX_DIGITS digits is not believed (counted not
    understood, on every path); such a number in a side note makes the Python replay read the
    server. Prompt-cache lines and slot clears are the fold's own, wherever they stand (here:
    between a request's lines)."""
    _make_prodlogs().generate(tmp_path, "b11434", seed=5, requests=60, slots=2, pieces=1, days=1)
    lines = (tmp_path / "server0.log").read_bytes().splitlines(keepends=True)
    created = [k for k, line in enumerate(lines) if b"created context checkpoint" in line]
    sims = [k for k, line in enumerate(lines) if b"checking sim = " in line]

    def edited(at: list[int], old: bytes, new: bytes) -> bytes:
        return b"".join(line.replace(old, new, 1) if k in at else line for k, line in enumerate(lines))

    cases = {  # name: (text, read by the fold itself)
        "handed back": (edited(created[:5], b"size = ", b"size = " + b"9" * 30), True),  # a float Python reads
        "int past int64": (edited(created[3:4], b"n_tokens = ", b"n_tokens = " + b"9" * 20), True),
        "int of 19 digits": (edited(created[3:4], b"n_tokens = ", b"n_tokens = 1" + b"0" * 18), True),
        "float of 400 digits": (edited(created[3:4], b"size = ", b"size = " + b"9" * 400), True),  # inf
        # an ik_llama.cpp line that names a task but no slot (Python: slot None, its own request)
        "no slot": (edited(created[4:5], b"", b'INFO [    batch_pending_prompt] kv cache rm [p0, end) | tid="1" '
                                              b'timestamp=1 id_task=1 p0=4555\n'), True),
        "sim past int64": (edited(sims[2:3], b"id  ", b"id  " + b"3" * 20), False),
        "prompt cache": (edited(created[4:5], b"", b"0.00.000.000 I srv   prompt_save:  - saving prompt with length 9, "
                                                     b"total state size = 1.000 MiB\n"), True),
        "slot clear": (edited(created[4:5], b"", b"0.00.000.000 I slot prompt_clear: id  0 | task -1 | "
                                                   b"clearing prompt with 9 tokens\n"), True),
    }
    for name, (text, foldable) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.log"
        path.write_bytes(text)
        (fold, replay, pure), folded = _three_ways([path], monkeypatch)
        assert folded == ([str(path)] if foldable else []), name
        assert fold == replay == pure, name
        if name.startswith("int"):  # the line is reported, its number never believed
            (doc,) = fold["files"]
            assert doc["not_understood"] == 1 and "n_tokens = 1000000000000000000" in doc["samples"][0]["text"] \
                or "n_tokens = " + "9" * 20 in doc["samples"][0]["text"], (name, doc)
            assert "9" * 20 not in repr(fold["requests"]) and "1" + "0" * 18 not in repr(fold["requests"]), name
        if name == "no slot":  # written as null, as Python writes None: not as the C code's NO_INT
            assert "None" in fold["servers"][0]["slots"] and str(-2 ** 63) not in json.dumps(fold, default=repr)
        if name.startswith("float"):
            assert fold["files"][0]["not_understood"] == 1 and "Infinity" not in json.dumps(fold, default=repr), name


@needs_c
def test_fold_finds_side_notes_that_share_a_line_with_a_trigger_or_each_other(tmp_path, monkeypatch):
    """Side notes where a search for them next to the trigger search would miss them: a note
    written after a trigger word on the trigger's line (two writers on one line), a check note
    before a sim note on one line. Such a line goes back to Python for its events, its notes
    stay the fold's; the fold gives the same figures as the Python replay and the pure Python
    reader, with 1 MiB blocks and small ones."""
    from shadowlab.logs import analysis as logs

    _make_prodlogs().generate(tmp_path, "b11434", seed=11, requests=80, slots=2, pieces=1, days=1)
    lines = (tmp_path / "server0.log").read_bytes().splitlines(keepends=True)

    def holding(text: bytes) -> list[int]:
        found = [k for k, line in enumerate(lines) if text in line]
        assert found, text
        return found

    sims, checks = holding(b"checking sim = "), holding(b"hecking checkpoint with [")
    created, news = holding(b"created context checkpoint"), holding(b"new prompt, n_ctx_slot")

    def joined(firsts: list[int], seconds: list[int], pad: bool = False) -> bytes:
        """Each first line with the first of `seconds` after it written on it (that line's own
        place gone); `pad`: after 0 to 130 spaces, one more each line, so the note's word
        stands at every place of the finder's chunk and of its newline search after it."""
        pairs = {k: next((j for j in seconds if j > k), seconds[-1]) for k in firsts}
        gone = set(pairs.values()) - set(pairs)
        out = []
        for k, line in enumerate(lines):
            if k in gone:
                continue
            if k in pairs:
                line = line.rstrip(b"\n") + b" " * (1 + (len(out) % 131 if pad else 0)) + lines[pairs[k]]
            out.append(line)
        return b"".join(out)

    cases = {
        "sim after new prompt": joined(news[::3], sims),
        "check after created": joined(created[::4], checks),
        "sim after check": joined(checks[::2], sims),
        "sim far after new prompt": joined(news, sims, pad=True),
        "check far after created": joined(created, checks, pad=True),
    }
    for name, text in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.log"
        path.write_bytes(text)
        # every search the CPU has: the fused finders find these words in their chunks and in
        # the newline search over a trigger line's tail, the generic way by a search of its own
        for variant, block in [(v, b) for v in _search_variants() for b in (1 << 20, 4099)]:
            monkeypatch.setattr(logs, "_FOLD_SEARCH", variant)
            monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
            (fold, replay, pure), folded = _three_ways([path], monkeypatch)
            assert folded == [str(path)], name
            assert fold == replay == pure, (name, variant, block)
            assert fold["overall"]["requests"] > 0, name
        monkeypatch.setattr(logs, "_FOLD_SEARCH", 0)
        reader = logs.analyse([str(path)], logs.Options())["reader"]
        assert reader["c_fold"] == 1 and reader["lines_handed_back"] > 0, (name, reader)


@needs_c
def test_fold_reads_side_notes_whose_heads_hold_decoys_as_python_does(tmp_path, monkeypatch):
    """A side note's slot prefix is read back from the line's first '|' (search_id's quick way)
    and only believed when the whole note matches there; else every "id" from the left is tried,
    as re.search does. Notes with a bar before their prefix, an earlier "id N |" that is not a
    prefix, an "id" inside a word, and a prefix of another slot before theirs read as the
    Python replay and the pure Python reader read them."""
    _make_prodlogs().generate(tmp_path, "b11434", seed=12, requests=80, slots=2, pieces=1, days=1)
    lines = (tmp_path / "server0.log").read_bytes().splitlines(keepends=True)
    decoys = (
        lambda head: head.replace(b": id", b"|: id", 1),  # a bar before the prefix
        lambda head: head.replace(b": id", b" id 7 x: id", 1),  # an "id N" that is no prefix
        lambda head: head.replace(b": id", b": id 5 | get id", 1),  # a prefix without "task" first
        lambda head: head.replace(b": id", b": xid", 1),  # "id" inside a word still matches
        lambda head: head,
    )
    out, n = [], 0
    for line in lines:
        if b"checking sim = " in line or b"hecking checkpoint with [" in line:
            head, sep, rest = line.partition(b" | task ")
            line = decoys[n % len(decoys)](head) + sep + rest
            n += 1
        out.append(line)
    assert n > 100
    path = tmp_path / "decoys.log"
    path.write_bytes(b"".join(out))
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded == [str(path)] and fold == replay == pure
    assert fold["overall"]["requests"] > 0


@needs_c
def test_a_headless_prompt_eval_finds_its_header_as_far_back_wherever_a_block_ends(tmp_path, monkeypatch):
    """b9093 prints `prompt eval time` on the line after its `print_timing: id N | task M |`
    header; the line goes back to Python, which looks TIMING_LOOK_BACK bytes back for the header,
    into the text before the block (the fold's 4099-byte blocks end between them). Within that
    span the request keeps its prefill figures, beyond it it has none; the same on every path."""
    from shadowlab.logs import analysis as logs
    from shadowlab.logs.tolerant import TIMING_LOOK_BACK

    text = (LOGS / "llama.cpp-b9093" / "A-C.cram0.log").read_bytes()
    header = b"| task 15 | \n"
    at = text.index(header) + len(header)
    filler = b"srv  log_server_r: request: GET /health 127.0.0.1 200\n"
    plain = logs.analyse([str(LOGS / "llama.cpp-b9093" / "A-C.cram0.log")], logs.Options())["overall"]
    for span, found in ((TIMING_LOOK_BACK - 200, True), (TIMING_LOOK_BACK + 200, False)):
        path = tmp_path / f"apart-{span}.log"
        path.write_bytes(text[:at] + filler * (span // len(filler)) + text[at:])
        for block in (4099, 1 << 20):
            monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
            (fold, replay, pure), folded = _three_ways([path], monkeypatch)
            assert folded == [str(path)] and fold == replay == pure, (span, block)
            figures = fold["overall"]
            assert (figures["processed_tokens"] == plain["processed_tokens"]) is found, (span, block, figures)
            assert (figures["prefill_ms"] == plain["prefill_ms"]) is found, (span, block)


@needs_c
def test_a_line_handed_back_looks_back_into_the_block_before_as_it_was_read(tmp_path, monkeypatch):
    """Blocks of LOOK_BACK bytes or more: the fold keeps the block before whole (in the other of
    its two buffers) instead of copying its end, and a headless `prompt eval time` line at the
    start of a block finds its header at the end of the block before, on every path alike."""
    from shadowlab.logs import analysis as logs

    text = (LOGS / "llama.cpp-b9093" / "A-C.cram0.log").read_bytes()
    header = b"| task 15 | \n"
    at = text.index(header) + len(header)
    filler = b"srv  log_server_r: request: GET /health 127.0.0.1 200\n"
    block = 2 * lp.LOOK_BACK
    plain = logs.analyse([str(LOGS / "llama.cpp-b9093" / "A-C.cram0.log")], logs.Options())["overall"]
    # the header ~1000 bytes before the first block's end, its line ~1000 bytes after it
    before = filler * ((block - 1000 - at) // len(filler))
    path = tmp_path / "across.log"
    path.write_bytes(before + text[:at] + filler * (2000 // len(filler)) + text[at:] + filler * (block // len(filler)))
    monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded == [str(path)] and fold == replay == pure
    assert (fold["overall"]["prefill_ms"], fold["overall"]["processed_tokens"]) == (
        plain["prefill_ms"], plain["processed_tokens"])


@needs_c
def test_a_piece_whose_cut_last_line_spans_a_block_end_leaves_the_next_piece_whole(tmp_path, monkeypatch):
    """A rotated piece ends in a line cut mid-write that began before the last block end: its
    start was carried to the next read, which found no newline. That start was once carried on
    into the next piece's first line (its bytes counted there, its line misread)."""
    from shadowlab.logs import analysis as logs

    text = (LOGS / "llama.cpp-b11434" / "A-B-C.cram0.log").read_bytes()
    block = 4099
    last = text.rindex(b"\n", 0, block) + 1  # the cut line starts in the first block, ends in the second
    older, newer = tmp_path / "server.log.1", tmp_path / "server.log"
    older.write_bytes(text[:last] + text[last:last + 60].replace(b"\n", b" "))
    newer.write_bytes(text)
    monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
    (fold, replay, pure), folded = _three_ways([older, newer], monkeypatch)
    assert fold == replay == pure and folded == [str(newer)]
    files = {f["path"]: f for f in fold["files"]}
    assert files[str(older)]["bytes"] == last and files[str(newer)]["bytes"] == len(text)
    alone = logs.analyse([str(newer)], logs.Options())
    assert files[str(newer)]["not_understood"] == alone["files"][0]["not_understood"]


@needs_c
def test_mutated_captures_read_alike_three_ways(tmp_path):
    """Seeded rounds of scripts/fuzz_logs.py (mutated fixture logs, a random block size and
    filter): the fold, the replay over the C scan and pure Python give the same document and
    trace, and none raises. 104092 and 104883 hold a line with a task and no slot, which the
    fold wrote as slot -2**63; 303979 rotated pieces, one ending in a cut line across a block
    end, whose start was carried into the next piece."""
    fuzz = repo_scripts.load("fuzz_logs")
    texts = fuzz.sources()
    pool = [line for text in texts for line in text]
    for n in [*range(120), 104092, 104883, 303979]:
        found = fuzz.one_round(n, texts, pool, 60, tmp_path / f"round{n}.log")
        assert not found, (n, found)


@needs_c
def test_fold_rejects_bad_arguments():
    f = reading._logscan
    state = f.fold_new(10)
    with pytest.raises(ValueError):
        f.fold_block(state, b"abc\n", 0, 9, 0, 0)
    with pytest.raises(ValueError):
        f.fold_block(state, b"abc\n", 3, 2, 0, 0)
    with pytest.raises(ValueError):
        f.fold_block(b"not a state", b"abc\n", 0, 4, 0, 0)
    with pytest.raises(ValueError):
        f.fold_events(state, b"abc\n", 4, 0, [(99, ())])
    assert f.fold_block(state, b"abc\n", 0, 4, 0, 0) == 1
    assert f.fold_finish(state)["slots"] == []


@needs_c
def test_fold_takes_one_check_note_per_run_of_lines_even_across_a_block_end(tmp_path, monkeypatch):
    """`checking checkpoint` notes are taken once per run of lines with the same `| task N |`
    head (its lines all say the same); the run goes on across a block end, on both paths."""
    from shadowlab.logs import analysis as logs

    def line(slot: int, task: int, text: str) -> str:
        return f"0.00.000.000 I slot update_slots: id  {slot} | task {task} | {text}\n"

    first = [line(0, 5, "new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 200"),
             line(0, 5, "checking checkpoint with [10, 10] against 100..."),
             line(0, 5, "erased invalidated context checkpoint (pos_min = 10, pos_max = 10, n_tokens = 11, "
                        "n_swa = 0, pos_next = 0, size = 0.111 MiB)"),
             line(0, 5, "cached n_tokens = 0, memory_seq_rm [0, end)")]
    idle = "0.00.000.000 I srv  update_slots: all slots are idle\n"
    pad = idle * ((4099 - len("".join(first))) // len(idle) + 1)
    second = [line(1, 5, "checking checkpoint with [1, 1] against 3..."),  # the same head: the same run
              line(1, 5, "new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 50"),
              line(1, 5, "cached n_tokens = 0, memory_seq_rm [0, end)")]
    path = tmp_path / "runs.log"
    path.write_text("".join(first) + pad + "".join(second))
    assert len("".join(first) + pad) > 4099  # the second slot's lines lie in the second block
    monkeypatch.setattr(logs, "_FOLD_BLOCK", 4099)
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded and fold == replay == pure
    assert [(r["slot"], r["shared_prefix"], r["shared_source"]) for r in fold["requests"]] == [
        (0, 100, "n_past"), (1, 0, "re_entry")]


def test_fold_holds_pending_check_notes_as_replay_does_as_they_come_and_go_and_past_the_cap(tmp_path, monkeypatch):
    """`checking checkpoint` notes pending: a few at a time over many requests (the C table
    rebuilt again and again without its taken notes), then more than lifecycle's PENDING_CHECKS
    of tasks that never come (all dropped at the cap, the later ones kept); each request takes
    its own task's note, on every path alike."""
    from shadowlab.logs import accel

    def line(slot: int, task: int, text: str) -> str:
        return f"0.00.000.000 I slot update_slots: id  {slot} | task {task} | {text}\n"

    def request(slot: int, task: int) -> str:
        return (line(slot, task, "new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 500") +
                line(slot, task, "erased invalidated context checkpoint (pos_min = 10, pos_max = 10, n_tokens = 11, "
                                 "n_swa = 0, pos_next = 0, size = 0.111 MiB)") +
                line(slot, task, "cached n_tokens = 0, memory_seq_rm [0, end)"))

    def note(slot: int, task: int) -> str:  # `against` says which task's note a request took
        return line(slot, task, f"checking checkpoint with [1, 1] against {task % 400 + 20}...")

    ahead = 40  # each request's note this many tasks ahead: as many pending, the table rebuilt often
    text = [note(t % 2, t) for t in range(ahead)]
    for t in range(300):
        text.append(note(t % 2, t + ahead))
        text.append(request(t % 2, t))
    late = 300 + accel.PENDING_CHECKS + 50  # tasks 300 + ahead.. never come: the cap drops them all once
    text += [note(0, t) for t in range(300 + ahead, late)]
    text += [request(1, 301), request(0, late - 1)]  # 301: dropped at the cap; the last: kept
    path = tmp_path / "pending.log"
    path.write_text("".join(text))
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded and fold == replay == pure
    with (tmp_path / "trace.jsonl").open("w") as trace:
        from shadowlab.logs import analysis as logs
        logs.analyse([str(path)], logs.Options(trace=trace))
    rows = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()[1:]]
    shared = {r["task"]: (r["shared_source"], r["shared_prefix"]) for r in rows}
    # a request closes when its slot's next one starts: 298 and 299 after the cap dropped their notes
    assert [t for t in range(300) if shared[t] != ("n_past", t % 400 + 20)] == [298, 299]
    assert shared[301] == ("re_entry", 0) and shared[late - 1] == ("n_past", (late - 1) % 400 + 20)


@needs_c
def test_fold_closes_requests_that_started_on_one_line_in_the_order_they_started(tmp_path, monkeypatch):
    """Two writers' lines run into one: both requests start at the same offset, and the end of
    the log closes them in the order they started (Replay._finish's stable sort)."""
    def msg(slot: int, task: int, text: str) -> str:
        return f"slot update_slots: id  {slot} | task {task} | {text}"

    head = "0.00.000.000 I "
    text = "".join(head + msg(s, t, "cached n_tokens = 0, memory_seq_rm [0, end)") + "\n" for s, t in ((1, 1), (0, 2)))
    text += head + msg(0, 7, "cached n_tokens = 5, memory_seq_rm [5, end)") + " " + msg(1, 8, "cached n_tokens = 3, "
                                                                                         "memory_seq_rm [3, end)") + "\n"
    path = tmp_path / "interleaved.log"
    path.write_text(text)
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded and fold == replay == pure
    assert [r["task"] for r in fold["requests"]] == [2, 1, 7, 8]  # 2 closes first: slot 0 went on first


@needs_c
@pytest.mark.parametrize("block", [None, 4099], ids=["1MiB", "4099"])
def test_fold_reads_restarts_from_start_lines_as_the_python_replay_does(tmp_path, monkeypatch, block):
    """Real b11434 sessions one after another (most serve one request: their task ids never go
    down, only the `model loaded` start-up line tells them apart), as one file, as rotated
    pieces, and with a session cut mid-request (a crash) before the next start; small blocks
    put block ends next to the start lines. The fold reads the start line (handed back to
    Python, folded in place) and must agree with the replay."""
    from shadowlab.logs import analysis as logs

    if block:
        monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
    sessions = sorted((LOGS / "llama.cpp-b11434-lfm2").glob("session-*.log")) + sorted(
        (LOGS / "llama-server").glob("*-C*.log"))  # without the prompt cache (its lines: Python's)
    texts = [p.read_bytes() for p in sessions]
    whole = tmp_path / "whole.log"
    whole.write_bytes(b"".join(texts))
    crashed = texts[4][: texts[4].index(b"task 7 | erased invalidated")]  # mid-request, mid-line
    crash = tmp_path / "crash.log"
    crash.write_bytes(texts[0] + crashed + b"\n" + texts[5] + texts[1])
    rotated = [tmp_path / "rot.log.3", tmp_path / "rot.log.2.gz", tmp_path / "rot.log.1", tmp_path / "rot.log"]
    for path, text in zip(rotated, texts):
        path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    for paths, restarts in (([whole], len(texts) - 1), ([crash], 3), (rotated, 3)):
        (fold, replay, pure), folded = _three_ways(paths, monkeypatch)
        assert folded == [str(paths[0]).removesuffix(".3")], folded  # the fold read it itself
        assert fold == replay == pure, paths
        assert fold["servers"][0]["restarts"] == restarts, paths
        assert any("the server started again" in n for n in fold["servers"][0]["notes"])


# ------------------------------------------------------------------ the prompt cache, filters, --trace

CRAM_CAPTURES = [LOGS / "llama-server" / "cram8192-A-B-A.log", LOGS / "llama.cpp-b11434" / "A-B-A.cram8192.log",
                 LOGS / "llama.cpp-b11434" / "A-B-C.cram8192.log",
                 LOGS / "llama.cpp-b11434" / "msgs-A-B-C.cram8192_step256.log",
                 LOGS / "llama.cpp-b11434-idle-slots" / "np4-pinned-cram8192.head422.log",
                 LOGS / "reference" / "cram8192-A-B-A.log"]
FILTERS = {  # name: logs.Options fields (durations: the fold's families have elapsed times)
    "slot 0": lambda: {"slot": 0}, "slot 2": lambda: {"slot": 2},
    "since": lambda: {"since": _logs().parse_time("2")}, "until": lambda: {"until": _logs().parse_time("3")},
    "window": lambda: {"since": _logs().parse_time("1"), "until": _logs().parse_time("8")},
    "date": lambda: {"since": _logs().parse_time("2026-01-01T00:00")},  # not applied: said in the notes
}


def _logs():
    from shadowlab.logs import analysis

    return analysis


def _fold_logs() -> list[Path]:
    """Every capture of a family the fold reads (as `shadowlab logs` recognises it)."""
    logs = _logs()
    return [p for p in ALL_LOGS if logs.sniff_family(str(p)) in logs._FOLD_FAMILIES]


@needs_c
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_fold_reads_filters_and_trace_as_the_python_replay_does(monkeypatch, name):
    """--slot, --since/--until and --trace go through the fold too: every capture it reads, one
    server each, and the real captures concatenated into one log (a restart between each)."""
    paths = _fold_logs()
    for path in paths:
        (fold, replay, pure), folded = _three_ways([path], monkeypatch, FILTERS[name])
        assert folded == [str(path)] and fold == replay == pure, (name, path)
    (fold, replay, pure), folded = _three_ways(paths, monkeypatch, FILTERS[name])
    assert fold == replay == pure and len(folded) == len(paths)
    if name == "date":
        assert all("dates not applied" in s["notes"][0] for s in fold["servers"])
    elif name != "slot 2":
        assert 0 < fold["overall"]["requests"] < _three_ways(paths, monkeypatch)[0][0]["overall"]["requests"]


@needs_c
def test_fold_reads_the_same_with_every_search_the_cpu_has(tmp_path, monkeypatch):
    """The fold runs the widest trigger and side-note search the CPU has, so on an AVX-512
    machine its AVX2 and generic ways would go untested: each variant folds the real captures
    and a generated log in small blocks (many batches, block ends mid-way through dense lines)
    as the Python replay reads them."""
    from shadowlab.logs import analysis as logs

    _make_prodlogs().generate(tmp_path, "b11434", seed=13, requests=300, slots=3, pieces=1, days=1)
    generated = tmp_path / "server0.log"
    for variant in _search_variants():
        for paths, block in ((_fold_logs(), 1 << 20), ([generated], 4099)):
            monkeypatch.setattr(logs, "_FOLD_SEARCH", variant)
            monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
            (fold, replay, pure), folded = _three_ways(paths, monkeypatch)
            assert fold == replay == pure and len(folded) == len(paths), (variant, block)
    with pytest.raises(ValueError):
        reading._logscan.fold_new(1, None, None, None, None, 9)


@needs_c
def test_fold_trace_writes_numbers_of_every_length_as_json_does(tmp_path, monkeypatch):
    """The fold writes the trace's integers itself (two digits a step, the length counted
    first): task ids of every length from 1 to 18 digits, at each power of ten and one below
    it, written as the Python replay's json.dumps writes them."""
    _make_prodlogs().generate(tmp_path, "b11434", seed=11, requests=60, slots=2, pieces=1, days=1)
    text = (tmp_path / "server0.log").read_bytes()
    tasks = sorted({int(t) for t in re.findall(rb"\| task (\d+) \|", text)})
    big = sorted({0} | {10**k for k in range(1, 18)} | {10**k - 1 for k in range(1, 19)})
    assert len(tasks) >= len(big)
    renamed = dict(zip(tasks, big + [10**17 + i for i in range(len(tasks) - len(big))]))  # in order: no restart
    text = re.sub(rb"\| task (\d+) \|", lambda m: b"| task %d |" % renamed[int(m[1])], text)
    path = tmp_path / "big-tasks.log"
    path.write_bytes(text)
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded == [str(path)] and fold == replay == pure
    shown = {r["task"] for r in fold["requests"]}
    assert {9, 10, 10**17, 10**18 - 1} <= shown, sorted(shown)[:5]


def test_fold_trace_writes_milliseconds_of_every_shape_as_json_does(tmp_path, monkeypatch):
    """The fold writes short decimals itself (float.__repr__'s text, from the digits): prefill
    milliseconds with no places to six, trailing zeros, at and past both ends of the range it
    writes (1e-4, 1e9: repr's own conversion there), written as json.dumps writes them."""
    _make_prodlogs().generate(tmp_path, "b11434", seed=12, requests=60, slots=2, pieces=1, days=1)
    text = (tmp_path / "server0.log").read_bytes()
    shapes = [b"5", b"0.1", b"0.0001", b"0.00009", b"0.000123", b"10.50", b"100.000", b"100.000001",
              b"1234.5678", b"123456789.123456", b"999999999.999999", b"1000000000", b"1000000000.5",
              b"0.30000000000000004", b"42.000010", b"7.25", b"3"]
    found = iter(range(1 << 30))
    text = re.sub(rb"prompt eval time = +\d+(?:\.\d+)? ms",
                  lambda m: b"prompt eval time = %s ms" % shapes[next(found) % len(shapes)], text)
    assert next(found) > len(shapes)
    path = tmp_path / "ms.log"
    path.write_bytes(text)
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded == [str(path)] and fold == replay == pure


@needs_c
def test_fold_reads_prompt_cache_lines_in_any_order_as_the_python_replay_does(tmp_path, monkeypatch):
    """The real `-cram 8192` captures (prompt-cache saves, `found better prompt` loads, idle-slot
    saves and clears of four slots) with lines lost, repeated, reordered and moved to other
    slots or tasks: every save, load and clear lands where Replay puts it (a held save a clear
    names, a load of an entry another slot saved, an entry saved before the log began)."""
    lines = b"".join(p.read_bytes() for p in CRAM_CAPTURES).splitlines(keepends=True)
    rng = random.Random(20261202)
    notes = []
    for round_ in range(10):
        path = tmp_path / f"cram{round_}.log"
        path.write_bytes(b"".join(_shuffled(lines, rng)))
        (fold, replay, pure), folded = _three_ways([path], monkeypatch)
        assert folded == [str(path)] and fold == replay == pure, round_
        notes += fold["servers"][0]["notes"]
        assert fold["overall"]["events"]["cache_loaded"] > 0, round_
    assert any("saved before the log began" in n for n in notes), notes


@needs_c
def test_fold_keeps_at_most_max_saved_prompt_cache_entries_per_slot_as_replay_does(tmp_path, monkeypatch):
    """A slot saved more entries than lifecycle.MAX_SAVED without loading them: the oldest went,
    on both paths (a load of it then finds nothing and is noted)."""
    from shadowlab.logs import lifecycle

    head = "0.00.000.000 I "

    def request(task: int, n: int) -> str:
        slot = f"slot update_slots: id  0 | task {task} | "
        return (f"{head}srv   prompt_save:  - saving prompt with length {n}, total state size = 1.000 MiB\n"
                f"{head}{slot}new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = {n + 1}\n"
                f"{head}{slot}created context checkpoint 1 of 64 (pos_min = 4, pos_max = 4, n_tokens = 5, "
                f"size = 0.111 MiB)\n")  # one length: the ring holds one checkpoint (replaced)

    n = lifecycle.MAX_SAVED + 3  # the C code's MAX_SAVED is generated from lifecycle's
    load = (f"{head}srv          load:    - prompt with length {{n}}, lcp = 1, f_keep = 0.500, f_sim = 0.500\n"
            f"{head}srv          load:  - found better prompt with f_keep = 0.500, f_sim = 0.500\n")
    text = "".join(request(t, 10 + t) for t in range(n))
    text += load.format(n=10) + request(n, 5) + load.format(n=20) + request(n + 1, 6)
    path = tmp_path / "many-entries.log"
    path.write_text(text)
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded and fold == replay == pure
    notes = fold["servers"][0]["notes"]
    assert sum("saved before the log began" in x for x in notes) == 1, notes  # entry 10 went; 20 was kept


@needs_c
def test_a_line_the_fold_cannot_hold_late_in_a_log_hands_over_without_writing_a_trace_line_twice(
        tmp_path, monkeypatch):
    """A side note's number past int64 near the end (its slot id): the Python replay reads the
    server (said in --json's `reader`), and the trace lines the fold had written are not
    written again."""
    text = b"".join(p.read_bytes() for p in CRAM_CAPTURES) * 30
    line = text.rindex(b"checking sim = ", 0, len(text) - 2000)
    at = text.rindex(b"id  ", 0, line) + len(b"id  ")
    path = tmp_path / "late.log"
    path.write_bytes(text[:at] + b"9" * 25 + text[at:])
    (fold, replay, pure), folded = _three_ways([path], monkeypatch)
    assert folded == [] and fold == replay == pure
    logs = _logs()
    options = logs.Options()
    options.trace = io.StringIO()
    doc = logs.analyse([str(path)], options)
    assert doc["reader"]["c_fold"] == 0 and "int64" in doc["reader"]["python_replay"][0]["why"], doc["reader"]
    assert options.trace.getvalue().count("\n") == 1 + doc["overall"]["requests"]


@needs_c
def test_the_fold_reads_the_b11434_start_up_and_idle_slot_lines_itself(monkeypatch):
    """Every line of the real b11434 captures the fold reads is read in C: none is handed back
    to Python (a restart, an idle slot's save, a slot chosen by id cost no Python call)."""
    logs = _logs()
    paths = [p for p in ALL_LOGS if "b11434" in p.parent.name or p.parent.name == "llama-server"]
    assert len(paths) >= 20
    # the argument parser's warning about a repeated flag included (read as benign in C too)
    assert any(b"W DEPRECATED: argument '--ctx-checkpoints'" in p.read_bytes() for p in paths)
    doc = logs.analyse([str(p) for p in paths], logs.Options())
    assert doc["reader"] == {"c_fold": len(paths), "python_replay": [], "lines_handed_back": 0}, doc["reader"]


@needs_c
def test_trace_times_are_the_printed_microseconds_also_after_a_restart(tmp_path, monkeypatch):
    """b11434 prints each line's elapsed time as M.SS.mmm.uuu. A request's trace time is that
    decimal in seconds, plus the time the server had reached before it restarted. The clock sums
    whole microseconds, so the times carry no float error (summed as floats, 9 of 10 printed as
    246.90334199999998), the same in the C fold and in Python; after the restart every time is
    the first run's plus the last time the clock read before it (the last request's), exactly."""
    import re
    from decimal import Decimal

    from shadowlab.logs import analysis as logs

    _make_prodlogs().generate(tmp_path, "b11434", seed=3, requests=120, slots=2, pieces=1, chatter=True)
    one = (tmp_path / "server0.log").read_bytes()
    twice = tmp_path / "restarted.log"
    twice.write_bytes(one + one)

    def trace_times() -> list[str]:
        options = logs.Options()
        options.trace = io.StringIO()
        logs.analyse([str(twice)], options)
        lines = options.trace.getvalue().splitlines()[1:]
        assert all(json.loads(line)["time"] is not None for line in lines)
        return [re.search(r'"time":([^,]*),', line).group(1) for line in lines]

    folded = trace_times()
    monkeypatch.setattr(reading, "_logscan", None)
    assert trace_times() == folded
    assert all(re.fullmatch(r"\d+\.\d{1,6}", t) for t in folded), [t for t in folded if len(t) > 14][:3]
    n = len(folded) // 2
    assert n > 50 and len(folded) == 2 * n
    base = Decimal(folded[n - 1])
    assert [Decimal(t) for t in folded[n:]] == [Decimal(t) + base for t in folded[:n]]


@needs_c
def test_the_figures_over_every_request_read_the_same_in_c_and_python(monkeypatch):
    """The over-time bins (analysis._over_time) and the ranked arrays (figures._ordered) are
    computed in C when it is built: the same JSON as the Python (signed zeros, equal times, one
    request, int64's ends, times in one bin or at the end of the last); outcome codes outside
    the outcomes are refused, not counted."""
    from array import array

    from shadowlab.logs import analysis, figures, lifecycle

    rng = random.Random(11)
    n_out = len(lifecycle.OUTCOMES)
    for _ in range(300):
        n = rng.choice((1, 2, 3, 17, 500))
        pick = rng.choice((
            lambda: rng.uniform(-1e7, 1e7), lambda: rng.choice((0.0, -0.0, 3.5)), lambda: float(rng.randint(-3, 3)),
            lambda: rng.uniform(0, 1) * 10 ** rng.randint(-6, 12),
        ))
        times = array("d", (pick() for _ in range(n)))
        codes = array("b", (rng.randrange(n_out) for _ in range(n)))
        values = array("q", (rng.choice((rng.randint(-2**63, 2**63 - 1), rng.randint(0, 70000), 0, 512))
                             for _ in range(n)))
        cut = rng.randint(0, n)  # two ascending runs (one may be empty) merged: Figures.merge's
        a, b = (array("q", sorted(part)) for part in (values[:cut], values[cut:]))
        if rng.random() < 0.2:
            a, b = array("q", sorted(values[:cut])), array("q", sorted(values[:cut]))  # equal runs
        in_c = (json.dumps(analysis._over_time(times, codes)), list(figures._ordered(values)),
                list(figures._merged(a, b)))
        with monkeypatch.context() as m:
            m.setattr(reading, "_logscan", None)
            in_python = (json.dumps(analysis._over_time(times, codes)), list(figures._ordered(values)),
                         list(figures._merged(a, b)))
        assert in_c == in_python
        assert in_c[2] == sorted([*a, *b])  # and both are the sorted whole (a and b untouched)
    with pytest.raises(ValueError, match="outcome code 7"):
        analysis._over_time(array("d", [1.0, 2.0]), array("b", [0, 7]))
    with pytest.raises(TypeError, match="array"):
        lp.folder().sort_q(array("d", [1.0]))
    with pytest.raises(TypeError, match="array"):
        lp.folder().merge_q(array("i", [1, 2]), 1)
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="0 <= n <= len"):
            lp.folder().merge_q(array("q", [1, 2]), bad)
    with pytest.raises(ValueError, match="as many codes"):
        lp.folder().bin_outcomes(array("d", [1.0, 2.0]), array("b", [0]), 10, n_out)


@pytest.mark.parametrize("accel", [True, False], ids=["c", "python"])
def test_figures_merged_in_order_read_as_figures_merged_unordered(monkeypatch, accel):
    """Figures.merge keeps two scopes' arrays ascending (the fold's slots come so: merged, not
    sorted again) and appends otherwise; either way a server's and the whole's figures are the
    same. add() makes a scope unordered: its requests arrive in their own order."""
    from shadowlab.logs.figures import Figures

    if accel:
        if lp.folder() is None:
            pytest.skip("the accelerator is not built")
    else:
        monkeypatch.setattr(reading, "_logscan", None)
    rng = random.Random(5)

    def scope(shared, prompts, ordered):
        f = Figures()
        f.requests, f.prompt_tokens = len(prompts), sum(prompts)
        f.shared.extend(sorted(shared) if ordered else shared)
        f.prompts.extend(sorted(prompts) if ordered else prompts)
        f.ordered = ordered
        return f

    for _ in range(40):
        parts = [([rng.choice((0, 3, 511, 512, 4096, rng.randint(0, 70000))) for _ in range(rng.randint(0, 60))],
                  [rng.randint(1, 90000) for _ in range(rng.randint(0, 60))]) for _ in range(rng.randint(1, 4))]
        kinds = [rng.random() < 0.7 for _ in parts]
        mixed, plain = Figures(), Figures()
        for (shared, prompts), ordered in zip(parts, kinds):
            mixed.merge(scope(shared, prompts, ordered))
            plain.merge(scope(shared, prompts, False))
        assert mixed.ordered == all(kinds) and not plain.ordered
        if mixed.ordered:
            assert list(mixed.shared) == sorted(mixed.shared) and list(mixed.prompts) == sorted(mixed.prompts)
        assert mixed.to_dict() == plain.to_dict()
        assert sorted(mixed.shared) == sorted(plain.shared) and sorted(mixed.prompts) == sorted(plain.prompts)
    grown = scope([5, 1], [7, 2], True)
    assert grown.ordered
    grown.add(SimpleNamespace(outcome="cold", created=(), erase_counts=None, restored=None, forced=False,
                              cache_saved=0, cache_loaded=0, prompt_tokens=1, reused=0, shared_prefix=None,
                              shared_source=None, processed=None, prefill_ms=None, placement=False,
                              retention=False, baseline_loss=False, time=None))
    assert not grown.ordered and grown.to_dict()["prompt_tokens"]["min"] == 1


@needs_c
def test_a_line_handed_back_first_after_many_blocks_looks_back_into_the_block_before(tmp_path, monkeypatch):
    """The fold keeps only where its reading stands (reading.LineState) and makes the parser's
    reader of it at the first line the C code hands back: that reader must see the text before
    the line as one made at the start would. A multi-line print_timing (b9093: the timing line
    names no slot; its header, up to 16 KiB back, does) is the first line handed back, after
    filler that ends a block just before, at or after the header; every request's prefill time
    is read, three ways alike (a reader without the block before loses the header's task)."""
    from shadowlab.logs import analysis as logs

    def request(task: int) -> str:
        return (f"slot update_slots: id  0 | task {task} | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 99\n"
                f"slot create_check: id  0 | task {task} | created context checkpoint 1 of 64 (pos_min = 94, "
                f"pos_max = 94, n_tokens = 95, size = 0.111 MiB)\n"
                f"slot print_timing: id  0 | task {task} | \n"
                "prompt eval time =      13.25 ms /    99 tokens (    0.13 ms per token,  7471.13 tokens per second)\n"
                "       eval time =       5.58 ms /    16 tokens (    0.35 ms per token,  2867.90 tokens per second)\n"
                f"slot      release: id  0 | task {task} | stop processing: n_tokens = 114, truncated = 0\n")

    block = 4099
    filler = "srv  log_server_r: done request: POST /completion 127.0.0.1 200\n"  # no trigger word
    first = request(0)
    header_end = first.index("prompt eval time")  # the header's line ends there
    for shift in (-60, -37, -1, 0, 1, 36, 37, 60):  # 0: the block ends with the header's newline
        before = block + shift - header_end  # bytes of filler: whole filler lines, one shorter line
        text = filler * (before // len(filler)) + "x" * (before % len(filler) - 1) + "\n" + first + request(1)
        assert text.index("prompt eval time") == block + shift
        log = tmp_path / f"shift{shift}.log"
        log.write_text(text)
        monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
        (fold, replay, pure), folded = _three_ways([log], monkeypatch)
        assert folded == [str(log)] and fold == replay == pure, shift
        assert [r["prefill_ms"] for r in fold["requests"]] == [13.25, 13.25], shift
        monkeypatch.setattr(logs, "_FOLD_BLOCK", block)
        assert logs.analyse([str(log)], logs.Options())["reader"]["lines_handed_back"] == 2, shift
