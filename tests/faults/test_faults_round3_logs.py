"""Issue 21 ("Hostile world, round 3"), the production-log reader: `shadowlab logs`, logparse,
lifecycle and the C fold, on real captures.

6. A FIFO, a device or a directory given as a log is refused up front (exit 2, "not a regular
   file"): it used to hang (a FIFO's second open() waited for a writer; /dev/zero spun forever).
7. A truncated or corrupt `.gz` keeps every whole line decompressed before the damage, as zcat
   does, on every path, and says where it stopped: it used to keep 0 of 170 lines.
10. A fresh process's first request that evicts its own checkpoints (a ring of one or two) is
    `cold`, without a baseline-loss failure (it used to be a `silent_reset`)."""

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

from shadowlab import lifecycle, logparse, logs
from shadowlab.errors import LogSourceError

ROOT = Path(logparse.__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
LOGS = FIX / "logs"
IK = sorted((LOGS / "ik_llama.cpp-0.1.5").glob("*.log")) + sorted((FIX / "runs" / "ik_llama.cpp-0.1.5").glob("cells/*/engine.log"))
LFM2 = sorted((LOGS / "llama.cpp-b11434-lfm2").glob("session-*.log"))
B11434 = sorted((LOGS / "llama.cpp-b11434").glob("*.log")) + sorted((LOGS / "llama-server").glob("*.log"))
B9093 = sorted((LOGS / "llama.cpp-b9093").glob("*.log"))
REFERENCE = sorted((LOGS / "reference").glob("*.log"))


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "engine")]))
    try:
        return subprocess.run([sys.executable, "-m", "shadowlab", "logs", *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`shadowlab logs {' '.join(args)}` did not end within {timeout} s (it hangs)")


def doc_of(*args: str) -> dict:
    p = cli(*args, "--json")
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
    doc = doc_of(good, str(fifo), "/dev/zero")  # what can be read is read; the rest is named
    assert doc["readable_files"] == 1 and doc["overall"]["requests"] == 4
    assert {u["path"]: "not a regular file" in u["why"] for u in doc["unreadable_files"]} == {
        str(fifo): True, "/dev/zero": True}
    assert "FIFO" in json.dumps(doc["unreadable_files"]) and "device" in json.dumps(doc["unreadable_files"])


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
        args = () if fold else ("--slot", "0")  # --slot: the Python replay reads the server
        doc, want = doc_of(str(damaged), *args), doc_of(str(plain), *args)
        assert doc["lines_read"] == n == want["lines_read"], name
        assert _figures(doc) == _figures(want), name
        (why,) = [d["why"] for d in doc["damaged_files"]]
        assert "gzip" in why and f"{n:,} whole lines" in why, why
        if name == "corrupt-late":  # zlib sees it only at the member's checksum: said so
            assert zcat == before and "damaged somewhere" in why, why
        text_out = cli(str(damaged), *args).stdout
        assert f"damaged: {damaged}: " in text_out and f"{n:,} whole lines" in text_out, text_out
        parsed = logparse.parse(damaged)  # the library reads the same lines
        assert parsed.events == logparse.parse(plain).events and parsed.lines == n + (len(before) > len(kept)), name
        assert parsed.source_error and f"{n:,} whole lines" in parsed.source_error, name


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
