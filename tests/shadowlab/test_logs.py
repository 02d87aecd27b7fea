"""shadowlab logs through the real CLI: figures against the generator's truth and real captures,
hostile input counted and reported, never a traceback."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_lifecycle import FIX, make_prodlogs

REAL = sorted(p for p in FIX.rglob("*.log") if p.parent.name != "transcribed")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shadowlab", "logs", *args], capture_output=True, text=True, timeout=120)


def doc_of(*args: str) -> dict:
    p = cli(*args, "--json")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("fmt", ["b11434", "ik"])
def test_every_figure_matches_the_truth_across_rotated_gz_pieces_servers_and_slots(tmp_path, fmt):
    truth = make_prodlogs.generate(tmp_path, fmt, seed=1, requests=250, servers=2, slots=3, pieces=3)
    files = sorted(str(p) for p in tmp_path.glob("server*.log*"))
    assert any(f.endswith(".gz") for f in files)
    doc = doc_of(*files, "--trace", str(tmp_path / "t.jsonl"))
    assert doc["version"] == 1 and doc["lines_not_understood"] == 0 and len(doc["servers"]) == 2
    t, f = truth["figures"], doc["overall"]
    assert f["requests"] == t["requests"] and f["outcomes"] == t["outcomes"]
    assert f["events"]["created"] == t["created"] and f["events"]["erased_invalidated"] == t["erased_invalidated"]
    assert {k: f["shared_prefix"][k] for k in t["shared_prefix"]} == t["shared_prefix"]
    assert {k: f["prompt_tokens"][k] for k in t["prompt_tokens"]} == t["prompt_tokens"]
    assert f["prompt_tokens"]["sum"] == t["prompt_sum"]
    for k in ("reusable_tokens", "reused_tokens", "processed_tokens", "avoidable_tokens", "failures"):
        assert f[k] == t[k], k
    assert f["shared_prefix"]["share_under_512"] == t["share_under_512"]
    assert f["shared_prefix"]["share_4096_or_more"] == t["share_4096_or_more"]
    assert f["avoidable_prefill_s"] == pytest.approx(t["avoidable_prefill_s"], abs=0.002)
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["version"] == 2 and len(lines) == 1 + t["requests"]
    for s, ts in zip(doc["servers"], truth["servers"]):  # per server, in time order across pieces
        assert s["figures"]["outcomes"] == ts["figures"]["outcomes"]


def test_real_captures_are_read_without_a_line_not_understood():
    doc = doc_of(*map(str, REAL))
    bad = [(f["path"], f["samples"]) for f in doc["files"] if f["not_understood"]]
    assert not bad, bad
    assert doc["overall"]["requests"] > 50


def test_real_capture_a_c_b_c_figures():
    f = doc_of(str(FIX / "llama-server" / "cram0-A-C-B-C.log"))["overall"]
    assert f["outcomes"] == {"cold": 1, "extended": 0, "restored": 0, "forced": 1, "silent_reset": 2}
    assert f["shared_prefix"]["max"] == 2531 and f["failures"]["placement"] == 1


def test_slot_and_since_filters(tmp_path):
    make_prodlogs.generate(tmp_path, "b11434", seed=2, requests=120, slots=2, pieces=1, days=1)
    rows = json.loads((tmp_path / "truth.json").read_text())["servers"][0]["requests"]
    f = doc_of(str(tmp_path / "server0.log"), "--slot", "1")["overall"]
    assert f["requests"] == sum(r["slot"] == 1 for r in rows)
    first = rows[0]["time"]
    f = doc_of(str(tmp_path / "server0.log"), "--since", "12h")["overall"]
    assert f["requests"] == sum(r["time"] - first >= 43200 for r in rows)


def test_html_is_self_contained_and_escaped(tmp_path):
    log = tmp_path / "evil<script>.log"
    log.write_bytes((FIX / "llama.cpp-b11434" / "A-C.cram0.log").read_bytes() + b"\x1b[31m<script>alert(1)</script> checkpoint\n")
    assert cli(str(log), "--out", str(tmp_path / "o")).returncode == 0
    html = (tmp_path / "o" / "logs.html").read_text()
    assert "<script>" not in html and "<svg" in html and "http://" not in html.replace("http-equiv", "")


def test_survives_hostile_input(tmp_path):
    cut = tmp_path / "cut.log"
    cut.write_bytes((FIX / "llama.cpp-b11434" / "A-C.cram0.log").read_bytes()[:-1].rsplit(b"\n", 1)[0] + b"\n0.09.5 I slot   operator(): id  0 | task 15 | cached n_tokens = 40")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 4000)
    long = tmp_path / "long.log"
    long.write_bytes(b"x" * (1 << 20) + b" checkpoint\n" + b"y" * (3 << 20) + b"\n")
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    unreadable = tmp_path / "secret.log"
    unreadable.write_bytes(b"x\n")
    unreadable.chmod(0)
    good = gzip.compress((FIX / "llama.cpp-b11434" / "A-C.cram0.log").read_bytes() * 50)
    broken = tmp_path / "broken.log.gz"
    broken.write_bytes(good[: len(good) // 2] + b"\x00" * 64 + good[len(good) // 2 + 64:])
    p = cli(*map(str, (cut, garbage, long, empty, broken)), "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    doc = json.loads(p.stdout)
    files = {Path(f["path"]).name: f for f in doc["files"]}
    assert files["cut.log"]["cut_last_line"] and files["cut.log"]["not_understood"] >= 1
    assert all(r["reused"] != 40 for r in doc["requests"])  # the cut number never becomes a value
    assert files["broken.log.gz"]["damage"]
    # a file that cannot be opened (missing, no permission) is an error: named, no summary
    for bad in [tmp_path / "missing.log"] + ([unreadable] if os.geteuid() != 0 else []):
        only_bad = cli(str(cut), str(bad))
        assert only_bad.returncode == 2 and f"cannot read {bad}" in only_bad.stderr, only_bad.stderr
        assert only_bad.stdout == "" and "Traceback" not in only_bad.stderr
    assert cli("--since", "yesterday-ish", str(cut)).returncode == 2


def test_real_a_b_a_the_prompt_cache_load_makes_the_sim_line_stale():
    """b11434 printed `checking sim = 0.000 (0/4560)` for the slot's old content (B), then loaded
    A's prompt-cache entry and restored at 4556: A shared 4559 (its `against 4559`), not 0."""
    doc = doc_of(str(FIX / "llama.cpp-b11434" / "A-B-A.cram8192.log"))
    a2 = doc["requests"][2]
    assert (a2["outcome"], a2["shared_prefix"], a2["shared_source"], a2["reused"]) == ("restored", 4559, "n_past", 4556)
    assert "baseline_loss" not in a2["failures"]


def test_rotated_pieces_are_one_stream_even_when_cut_between_a_timing_header_and_its_line(tmp_path):
    """ik_llama.cpp prints `slot print_timing: id 0 | task N |` and the `prompt eval time` on the
    next line: a rotation between the two must not lose the request's processed tokens."""
    whole = (FIX / "ik_llama.cpp-0.1.5" / "A-C.cram0.log").read_bytes()
    cut = whole.index(b"\nprompt eval time", whole.index(b"task 14 | \n") - 40) + 1
    (tmp_path / "s.log.1").write_bytes(whole[:cut])
    (tmp_path / "s.log").write_bytes(whole[cut:])
    one = doc_of(str(FIX / "ik_llama.cpp-0.1.5" / "A-C.cram0.log"))["overall"]
    two = doc_of(str(tmp_path / "s.log"), str(tmp_path / "s.log.1"))
    assert two["lines_not_understood"] == 0 and len(two["servers"]) == 1
    assert two["overall"]["processed_tokens"] == one["processed_tokens"] == 4560 + 2899
    assert two["overall"]["prompt_tokens"] == one["prompt_tokens"]
    assert [f["lines"] for f in two["files"]] == [whole[:cut].count(b"\n"), whole[cut:].count(b"\n")]


def test_dense_generated_logs_match_the_truth_too(tmp_path):
    """Without the sampler / progress / timing lines a real server prints (the reader's worst case)."""
    truth = make_prodlogs.generate(tmp_path, "b11434", seed=4, requests=150, slots=2, pieces=2, chatter=False)
    doc = doc_of(*sorted(str(p) for p in tmp_path.glob("server0.log*")))
    assert doc["lines_not_understood"] == 0
    assert doc["overall"]["outcomes"] == truth["figures"]["outcomes"]
    assert doc["overall"]["failures"] == truth["figures"]["failures"]


# ------------------------------------------------------------------ standard streams, missing files, verbosity

A_B_A = FIX / "llama-server" / "cram8192-A-B-A.log"
# what b11434 prints at TRACE level only (SLT_TRC / SRV_TRC in server-context.cpp): gone without -lv 4
TRACE_ONLY = (b"new prompt, ", b"cached n_tokens", b"created context checkpoint", b"restored context checkpoint",
              b"erased invalidated", b"forcing full prompt", b"checking sim", b"checking checkpoint",
              b"saving prompt with", b"found better prompt", b"prompt with length", b"clearing prompt",
              b"superseding context checkpoint", b"too close to an earlier one")


def test_dash_reads_standard_input_plain_or_gzip_as_the_file_reads():
    want = doc_of(str(A_B_A))
    for data in (A_B_A.read_bytes(), gzip.compress(A_B_A.read_bytes())):
        p = subprocess.run([sys.executable, "-m", "shadowlab", "logs", "--json", "-"], input=data,
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got["overall"] == want["overall"] and got["servers"][0]["server"] == "-"
        assert got["files"][0]["gzip"] == (data[:2] == b"\x1f\x8b")


def test_trace_dash_writes_the_trace_to_standard_output_and_the_summary_to_standard_error(tmp_path):
    p = cli(str(A_B_A), "--trace", "-")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert json.loads(lines[0])["format"] == "shadowlab-trace" and len(lines) == 1 + 3
    assert all(json.loads(x)["server"] == str(A_B_A) for x in lines[1:])
    assert "requests 3" in p.stderr
    cli(str(A_B_A), "--trace", str(tmp_path / "t.jsonl"))
    assert (tmp_path / "t.jsonl").read_text().splitlines() == lines  # the same lines as a file gets
    both = cli(str(A_B_A), "--json", "--trace", "-")
    assert both.returncode == 2 and "standard output" in both.stderr and not both.stdout


def test_a_missing_file_is_an_error_without_a_summary(tmp_path):
    for args in ([str(tmp_path / "gone.log")], [str(tmp_path / "gone.log"), str(A_B_A)], [str(tmp_path)]):
        p = cli(*args)
        assert p.returncode == 2, args
        assert p.stdout == "" and f"cannot read {args[0]}" in p.stderr, p.stderr
        assert "requests" not in p.stderr and "Traceback" not in p.stderr


def test_a_log_without_lifecycle_lines_warns_with_the_verbosity_it_needs_and_exits_4(tmp_path):
    quiet = tmp_path / "default-verbosity.log"  # the same server, as its default log level prints it
    quiet.write_bytes(b"".join(line for line in A_B_A.read_bytes().splitlines(keepends=True)
                               if not any(w in line for w in TRACE_ONLY)))
    p = cli(str(quiet))
    assert p.returncode == 4, p.stderr
    assert "requests 3" in p.stdout  # the summary is written: its timing lines were read
    assert "warning" in p.stderr and "-lv 4" in p.stderr and str(quiet) in p.stderr
    doc = json.loads(cli(str(quiet), "--json").stdout)
    assert [w["server"] for w in doc["warnings"]] == [str(quiet)]
    both = cli(str(quiet), str(A_B_A), "--json")  # one server of two without them: said of that one
    assert both.returncode == 4 and [w["server"] for w in json.loads(both.stdout)["warnings"]] == [str(quiet)]
    assert cli(str(A_B_A)).returncode == 0 and "warning" not in cli(str(A_B_A)).stderr


def _trace(tmp_path: Path, log: Path) -> list[dict]:
    out = tmp_path / f"{log.stem}.jsonl"
    assert cli(str(log), "--trace", str(out)).returncode == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0] == {"format": "shadowlab-trace", "version": 2, "time_unit": "s", "source": "shadowlab logs"}
    return lines[1:]


def test_a_prompt_cache_load_enters_the_trace_as_a_prefix_shared_with_the_request_it_saved(tmp_path):
    """The real `-cram 8192` A→B→A capture: B evicted A into the RAM cache, the last A loaded it
    back and reused 4,556 tokens. The trace says what the last A shared and with whom: 4,559
    tokens (the engine's n_past) with task 0, the first A, not with B (99 tokens, nothing
    shared): an ideal read from it is never below what the engine reused."""
    for log in (A_B_A, FIX / "llama.cpp-b11434" / "A-B-A.cram8192.log"):
        a, b, last = _trace(tmp_path, log)
        assert (a["shared_with"], b["shared_with"], last["shared_with"]) == (None, a["task"], a["task"]), log
        assert last["reused"] == 4556 and last["shared_prefix"] >= last["reused"] and last["shared_exact"], last
        assert b["shared_prefix"] == 0 and b["shared_exact"]  # `checking sim = 0.000 (0/99)`: stated
        assert a["shared_exact"] is False  # a first request: its 0 is no statement (a lower bound)
    # the same server without its prompt-cache lines (a log that cannot say what was loaded):
    # the last A is then read as following B, as the log reads, and the load is not invented
    blind = tmp_path / "no-cache-lines.log"
    blind.write_bytes(b"".join(line for line in A_B_A.read_bytes().splitlines(keepends=True)
                               if b"prompt_save" not in line and b"srv          load:" not in line))
    a, b, last = _trace(tmp_path, blind)
    assert last["shared_with"] == b["task"] and last["checkpoints"]["cache_loaded"] == 0


def test_idle_slot_saves_and_loads_across_four_slots_name_the_request_they_came_from(tmp_path):
    """`--cache-idle-slots` with four pinned slots (real capture): each idle slot is saved and
    cleared when a task starts; a request whose slot was cleared finds nothing (shared_with
    null) unless a prompt-cache entry was loaded into it, which names the saved request."""
    rows = _trace(tmp_path, FIX / "llama.cpp-b11434-idle-slots" / "np4-pinned-cram8192.head422.log")
    tasks = {r["task"] for r in rows}
    assert rows and all(r["shared_with"] is None or r["shared_with"] in tasks for r in rows)
    loaded = [r for r in rows if r["checkpoints"]["cache_loaded"]]
    assert all(r["shared_with"] is not None for r in loaded if r["shared_exact"]), loaded
    for r in rows:  # never a shared prefix below what the engine reused
        assert r["shared_prefix"] is None or r["reused"] is None or r["shared_prefix"] >= r["reused"], r


def test_json_output_is_the_indented_document_with_a_request_a_line(tmp_path):
    """--json writes the document as json.dumps(indent=1) does, but each request of `requests`
    on one line (the indented dump runs json's pure-Python encoder: a fifth of a 0.3 GB log's
    time); the text reads back to the same document, hostile strings included, and --out's
    logs.json is the same text."""
    from shadowlab.logs.outputs import json_text

    hostile = {"a\nb": "line\nbreak \"quoted\" \u00e9\u2028 </script>", "n": [1, 2.5, None, True], "e": {}, "l": []}
    doc = {"version": 1, "servers": [hostile], "requests": [dict(hostile, i=i) for i in range(3)], "notes": []}
    text = json_text(doc)
    assert json.loads(text) == doc and text.isascii()
    lines = text.split("\n")
    first = lines.index(' "requests": [')
    rows = lines[first + 1 : lines.index(" ],", first)]
    assert len(rows) == 3 and [json.loads(r.rstrip(",")) for r in rows] == doc["requests"]
    without = dict(doc, requests=[])
    assert json_text(without) == json.dumps(without, indent=1, ensure_ascii=True)
    out = tmp_path / "out"
    p = cli(str(FIX / "llama.cpp-b11434" / "A-B-C.cram8192.log"), "--json", "--out", str(out))
    got = p.stdout
    assert json.loads(got)["requests"] and got == (out / "logs.json").read_text()
    assert sum(ln.startswith("  {\"time\"") for ln in got.split("\n")) == len(json.loads(got)["requests"])


_MODULES_AFTER = """
import sys
from shadowlab.cli import main
rc = main(sys.argv[1:])
print("MODULES", " ".join(sorted(m for m in sys.modules if m.startswith("shadowlab") or m == "dataclasses")))
"""
_PYTHON_READER = ("shadowlab.logs.parse", "shadowlab.logs.events", "shadowlab.logs.tolerant",
                  "shadowlab.logs.fastpath", "shadowlab.logs.lifecycle", "shadowlab.logs.rings", "dataclasses")


def _modules_of_a_run(tmp_path, log: Path) -> tuple[dict, set[str]]:
    """(the --json document's reader block, the modules loaded when the command returned)"""
    p = subprocess.run([sys.executable, "-c", _MODULES_AFTER, "logs", str(log), "--json", "--trace",
                        str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    doc, modules = p.stdout.rsplit("MODULES", 1)
    return json.loads(doc)["reader"], set(modules.split())


def test_the_fold_reads_a_b11434_log_without_importing_the_python_reader(tmp_path):
    """The start of `shadowlab logs` is a third of its CPU on a small log: the C fold's path imports
    none of the Python reader (reading.py's docstring); a line it hands back brings it in."""
    from shadowlab.logs import reading
    if not reading.accelerated():
        pytest.skip("the C accelerator is not built")
    reader, folded = _modules_of_a_run(tmp_path, FIX / "llama.cpp-b11434" / "A-B-C.cram8192.log")
    assert reader["c_fold"] == 1 and reader["lines_handed_back"] == 0, reader
    assert "shadowlab.logs.analysis" in folded and "shadowlab.logs.reading" in folded
    loaded = sorted(folded & set(_PYTHON_READER))
    assert not loaded, loaded
    reader, handed_back = _modules_of_a_run(tmp_path, FIX / "reference" / "cram8192-A-B-A.log")
    assert reader["c_fold"] == 1 and reader["lines_handed_back"] > 0, reader
    assert "shadowlab.logs.parse" in handed_back
