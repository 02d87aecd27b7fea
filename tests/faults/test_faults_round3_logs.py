"""Issue 21 ("Hostile world, round 3"), the production-log reader: `shadowlab logs`, logparse,
lifecycle and the C fold, on real captures.

6. A FIFO, a device or a directory given as a log is refused up front (exit 2, "not a regular
   file"): it used to hang (a FIFO's second open() waited for a writer; /dev/zero spun forever).
7. A truncated or corrupt `.gz` keeps every whole line decompressed before the damage, as zcat
   does, on every path, and says where it stopped: it used to keep 0 of 170 lines.
8. A server restart is found from the server's own start-up line (`model loaded`), not only
   from a task id going down: concatenated and rotated real sessions give the sums of the
   sessions read one by one (they used to merge: 8 requests of 11 on ik_llama.cpp).
9. Unix times that go backwards (ik_llama.cpp pieces out of time order) are data: exit 0 and
   every request in the over-time figure (it used to end in an IndexError, exit 3).
10. A fresh process's first request that evicts its own checkpoints (a ring of one or two) is
    `cold`, without a baseline-loss failure (it used to be a `silent_reset`).
12. `--slot -1` and `--since` after `--until` are usage errors (exit 2, saying why); a missing
    file prints its error and no all-zero summary.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from shadowlab.logs import analysis as logs, lifecycle, parse as logparse
from shadowlab.errors import LogSourceError

ROOT = Path(logparse.__file__).resolve().parents[2]  # shadowlab/logs/parse.py -> the checkout
FIX = ROOT / "tests" / "fixtures"
LOGS = FIX / "logs"
IK = sorted((LOGS / "ik_llama.cpp-0.1.5").glob("*.log")) + sorted((FIX / "runs" / "ik_llama.cpp-0.1.5").glob("cells/*/engine.log"))
LFM2 = sorted((LOGS / "llama.cpp-b11434-lfm2").glob("session-*.log"))
B11434 = sorted((LOGS / "llama.cpp-b11434").glob("*.log")) + sorted((LOGS / "llama-server").glob("*.log"))
B9093 = sorted((LOGS / "llama.cpp-b9093").glob("*.log"))
REFERENCE = sorted((LOGS / "reference").glob("*.log"))


# `shadowlab logs` with the C fold switched off: the Python replay reads every server
_REPLAY_ONLY = ("import sys; from shadowlab.logs import analysis; analysis.FOLD = False; "
                "from shadowlab.cli import main; sys.exit(main(['logs', *sys.argv[1:]]))")


def cli(*args: str, timeout: float = 60, fold: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "engine")]))
    command = ["-m", "shadowlab", "logs"] if fold else ["-c", _REPLAY_ONLY]
    try:
        return subprocess.run([sys.executable, *command, *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`shadowlab logs {' '.join(args)}` did not end within {timeout} s (it hangs)")


def doc_of(*args: str, fold: bool = True) -> dict:
    p = cli(*args, "--json", fold=fold)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    return json.loads(p.stdout)


# ---------------------------------------------------------------------------------------- 6


def test_a_fifo_a_device_or_a_directory_is_refused_up_front(tmp_path):
    fifo = tmp_path / "engine.log"
    os.mkfifo(fifo)  # nobody writes to it: an open() that waits for a writer waits forever
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        p = cli(path)
        assert p.returncode == 2, (path, p.stderr)
        assert "not a regular file" in p.stderr and "Traceback" not in p.stderr, p.stderr
        with pytest.raises(LogSourceError, match="not a regular file"):
            logparse.parse(path)
    good = str(LOGS / "llama-server" / "cram0-A-C-B-C.log")
    p = cli(good, str(fifo), "/dev/zero", "--json")  # each named, and no summary of the rest
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert f"cannot read {fifo}: not a regular file (a FIFO)" in p.stderr, p.stderr
    assert "cannot read /dev/zero: not a regular file (a character device)" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------- 7


def _text_before_the_damage(blob: bytes) -> bytes:
    """What zlib decompresses of a damaged gzip before it can tell the damage, fed a byte at a
    time (it gives nothing of a call that fails): the text a reader can trust."""
    d, out = zlib.decompressobj(16 + zlib.MAX_WBITS), []
    for i in range(len(blob)):
        try:
            out.append(d.decompress(blob[i : i + 1]))
        except zlib.error:
            break
    return b"".join(out)


def _figures(doc: dict) -> dict:
    return {k: v for k, v in doc["overall"].items() if k != "time_span_s"}


@pytest.mark.skipif(shutil.which("gzip") is None, reason="zcat is the witness here")
@pytest.mark.parametrize("fold", [True, False], ids=["fold", "replay"])
def test_a_truncated_or_corrupt_gz_keeps_every_whole_line_before_the_damage(tmp_path, fold):
    text = (LOGS / "llama.cpp-b11434" / "A-C.cram0.log").read_bytes()
    small = gzip.compress(text)
    large = gzip.compress(text * 100)  # 25,100 lines
    cases = {"truncated-small": small[: len(small) * 2 // 3], "truncated-large": large[: len(large) * 9 // 10],
             "truncated-in-the-trailer": small[:-4]}
    for name, at in (("corrupt-early", len(large) // 4), ("corrupt-late", len(large) * 3 // 4)):
        corrupt = bytearray(large)
        for i in range(at, at + 40):
            corrupt[i] ^= 0x5A
        cases[name] = bytes(corrupt)
    for name, blob in cases.items():
        damaged = tmp_path / f"{name}.log.gz"
        damaged.write_bytes(blob)
        before = _text_before_the_damage(blob)
        zcat = subprocess.run([shutil.which("gzip"), "-dc", str(damaged)], capture_output=True).stdout
        # zcat gives the same text up to the damage; past a corrupt byte it prints what it
        # decodes from the damaged data (no line of it can be trusted), so the text before is
        # a prefix of it, and all of it when the file is only cut short
        assert zcat.startswith(before) and (zcat == before or name.startswith("corrupt")), name
        kept = before[: before.rfind(b"\n") + 1]
        n = kept.count(b"\n")
        assert n > 150, name
        plain = tmp_path / f"{name}.plain.log"
        plain.write_bytes(kept)
        doc, want = doc_of(str(damaged), fold=fold), doc_of(str(plain), fold=fold)
        assert doc["reader"]["c_fold"] == (1 if fold else 0), doc["reader"]
        assert doc["lines_read"] == n == want["lines_read"], name
        assert _figures(doc) == _figures(want), name
        (why,) = [d["why"] for d in doc["damaged_files"]]
        assert "gzip" in why and f"{n:,} whole lines" in why, why
        if name == "corrupt-late":  # zlib sees it only at the member's checksum: said so
            assert zcat == before and "damaged somewhere" in why, why
        text_out = cli(str(damaged), fold=fold).stdout
        assert f"damaged: {damaged}: " in text_out and f"{n:,} whole lines" in text_out, text_out
        parsed = logparse.parse(damaged)  # the library reads the same lines
        assert parsed.events == logparse.parse(plain).events and parsed.lines == n + (len(before) > len(kept)), name
        assert parsed.source_error and f"{n:,} whole lines" in parsed.source_error, name


# ---------------------------------------------------------------------------------------- 8


def _analysed(paths: list[Path], monkeypatch, fold: bool) -> dict:
    monkeypatch.setattr(logs, "FOLD", fold)
    return logs.analyse([str(p) for p in paths], logs.Options())


def _sums(docs: list[dict]) -> dict:
    keys = ("requests", "processed_tokens", "reused_tokens")
    out = {k: sum(d["overall"][k] for d in docs) for k in keys}
    out["outcomes"] = {o: sum(d["overall"]["outcomes"][o] for d in docs) for o in lifecycle.OUTCOMES}
    out["prompt_sum"] = sum(d["overall"]["prompt_tokens"]["sum"] for d in docs)
    return out


def _of(doc: dict) -> dict:
    f = doc["overall"]
    return {"requests": f["requests"], "processed_tokens": f["processed_tokens"], "reused_tokens": f["reused_tokens"],
            "outcomes": f["outcomes"], "prompt_sum": f["prompt_tokens"]["sum"]}


@pytest.mark.parametrize("fold", [True, False], ids=["fold", "replay"])
@pytest.mark.parametrize("family", ["ik_llama.cpp", "lfm2", "b11434", "b9093", "reference"])
def test_concatenated_real_sessions_give_the_sums_of_the_sessions(tmp_path, monkeypatch, family, fold):
    sessions = {"ik_llama.cpp": IK, "lfm2": LFM2, "b11434": B11434, "b9093": B9093, "reference": REFERENCE}[family]
    assert len(sessions) >= 6, family
    one_by_one = [_analysed([p], monkeypatch, fold) for p in sessions]
    assert all(d["servers"][0]["restarts"] == 0 for d in one_by_one)
    concatenated = tmp_path / "server.log"
    concatenated.write_bytes(b"".join(p.read_bytes() for p in sessions))
    doc = _analysed([concatenated], monkeypatch, fold)
    assert doc["servers"][0]["restarts"] == len(sessions) - 1
    assert _of(doc) == _sums(one_by_one)
    assert doc["overall"]["outcomes"]["cold"] >= len(sessions)  # each session's first request


@pytest.mark.parametrize("fold", [True, False], ids=["fold", "replay"])
def test_rotated_pieces_of_cold_sessions_are_separate_sessions(tmp_path, monkeypatch, fold):
    ik = [LOGS / "ik_llama.cpp-0.1.5" / f"{n}.cram0.log" for n in ("cold-B", "cold-C", "control-C")]
    lfm2 = [p for p in LFM2 if len(json.loads(p.with_suffix(".json").read_text())) == 1][:3]  # one request each
    for name, three in (("ik", ik), ("lfm2", lfm2)):
        (tmp_path / name).mkdir()
        pieces = [tmp_path / name / "s.log.2.gz", tmp_path / name / "s.log.1", tmp_path / name / "s.log"]
        pieces[0].write_bytes(gzip.compress(three[0].read_bytes()))
        pieces[1].write_bytes(three[1].read_bytes())
        pieces[2].write_bytes(three[2].read_bytes())
        doc = _analysed(pieces, monkeypatch, fold)
        assert len(doc["servers"]) == 1 and doc["servers"][0]["restarts"] == 2, name
        assert doc["overall"]["requests"] == 3 and doc["overall"]["outcomes"]["cold"] == 3, name


def test_the_start_up_line_is_an_event_of_every_family_once_per_start():
    families = {"ik_llama.cpp": IK[:7], "llama.cpp": B11434 + B9093 + LFM2, "reference": REFERENCE}
    for family, paths in families.items():
        for path in paths:
            starts = logparse.parse(path, family).of("server_start")
            assert len(starts) == 1 and (starts[0].slot, starts[0].task) == (None, None), path
            assert b"model loaded" in path.read_bytes().splitlines()[starts[0].line - 1]


# ---------------------------------------------------------------------------------------- 9


def test_unix_times_that_go_backwards_are_data_not_a_crash(tmp_path):
    later, earlier = LOGS / "ik_llama.cpp-0.1.5" / "control-C.cram0.log", LOGS / "ik_llama.cpp-0.1.5" / "A-C.cram0.log"
    (tmp_path / "s.log.1").write_bytes(later.read_bytes())  # the older piece holds the later times
    (tmp_path / "s.log").write_bytes(earlier.read_bytes())
    for args in ((), ("--slot", "0")):
        p = cli(str(tmp_path / "s.log"), str(tmp_path / "s.log.1"), "--json", *args)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        doc = json.loads(p.stdout)
        assert doc["overall"]["requests"] == 3 and doc["servers"][0]["restarts"] == 1  # the start line, not the clock
        bins = doc["over_time"]["bins"]
        assert sum(map(sum, bins)) == 3 and len(bins) == logs.TIME_BINS
    # within one session (a clock stepped back): no restart
    text = earlier.read_bytes()
    cut = text.index(b"task 14")
    stepped = text[:cut] + text[cut:].replace(b"timestamp=17959522", b"timestamp=17959510")
    (tmp_path / "stepped.log").write_bytes(stepped)
    doc = doc_of(str(tmp_path / "stepped.log"))
    assert doc["servers"][0]["restarts"] == 0 and doc["overall"]["requests"] == 2
    assert sum(map(sum, doc["over_time"]["bins"])) == 2


# ---------------------------------------------------------------------------------------- 10


def _ik_cold_with_a_ring_of_two() -> bytes:
    """ik_llama.cpp's cold C with `--ctx-checkpoints 2`: from its third checkpoint on, each
    creation first erases the oldest (`erasing old context checkpoint`, ik's wording)."""
    lines = (LOGS / "ik_llama.cpp-0.1.5" / "cold-C.cram0.log").read_bytes().splitlines(keepends=True)
    out, made = [], []
    for line in lines:
        if b"created context checkpoint" in line:
            head, fields = line.split(b"created context checkpoint", 1)
            if len(made) >= 2:
                old = made.pop(0)
                out.append(head + b"erasing old context checkpoint " + old)
            made.append(fields[fields.index(b"(pos_min"):].split(b", took")[0] + b")\n")
        out.append(line)
    return b"".join(out)


def test_a_fresh_process_that_evicts_its_own_checkpoints_is_cold(tmp_path):
    ik = tmp_path / "ik-ring2.log"
    ik.write_bytes(_ik_cold_with_a_ring_of_two())
    assert ik.read_bytes().count(b"erasing old context checkpoint") == 3
    real = LOGS / "llama-server" / "ckpt1-A-C.log"  # b11434, --ctx-checkpoints 1: a real capture
    for path, family, want in ((ik, "ik_llama.cpp", ["cold"]), (real, "llama.cpp", ["cold", "forced"])):
        reqs = lifecycle.replay(logparse.parse(path, family).events)
        assert [r.outcome for r in reqs] == want, path
        assert not reqs[0].baseline_loss and reqs[0].erase_counts.get("erased_old"), path
        for args in ((), ("--slot", "0")):  # the C fold (b11434) and the Python replay
            doc = doc_of(str(path), *args)
            assert [r["outcome"] for r in doc["requests"]] == want and doc["requests"][0]["failures"] == [], path
            assert doc["overall"]["failures"]["baseline_loss"] == 0


# ---------------------------------------------------------------------------------------- 12


def test_impossible_filters_are_usage_errors():
    log = str(LOGS / "llama-server" / "cram0-A-C-B-C.log")
    for args, why in ((("--slot", "-1"), "--slot"), (("--since", "10", "--until", "5"), "--since")):
        p = cli(log, *args)
        assert p.returncode == 2 and why in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert p.stdout == ""
    empty = cli(log, "--since", "5", "--until", "5")  # an empty window is a question
    assert empty.returncode == 0 and "warning" not in empty.stderr, empty.stderr


def test_a_missing_file_prints_its_error_and_no_summary(tmp_path):
    missing = str(tmp_path / "missing.log")
    p = cli(missing)
    assert p.returncode == 2 and "cannot open" in p.stderr and missing in p.stderr, p.stderr
    assert "requests 0" not in p.stderr + p.stdout and "server " not in p.stderr + p.stdout
    good = str(LOGS / "llama-server" / "cram0-A-C-B-C.log")
    p = cli(good, missing)  # with a file that can be read: still an error, and no summary of the rest
    assert p.returncode == 2 and p.stdout == "" and f"cannot read {missing}: cannot open" in p.stderr, p.stderr
