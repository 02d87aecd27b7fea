"""Issue 9, log parser: the engine log is untrusted text, and what is given as a log may not be one.

13. A hostile line (a checkpoint line followed by a megabyte of word characters, or of spaces)
    costs time linear in its length, in the pure-Python path, the C accelerator and with matrix
    `log_patterns`: it used to cost O(n²) (12 s at 40 kB, 449 s at 200 kB).
14. A line cut mid-number (the last line of a killed server's log, without its newline) or broken
    inside a value (`n_tokens = 390<junk>6`) is counted as not understood, never read as a value.
15. `parse()` reads a gzip log (by its magic bytes) from a path or a binary file object, keeps
    the events before a corrupt or truncated part and says why it stopped; bytes, log text given
    as a path, a text-mode file and a missing path are refused with a clear LogSourceError.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shadowlab.logs import parse as lp, reading
from shadowlab.errors import LogSourceError, ShadowlabError

ROOT = Path(lp.__file__).resolve().parents[2]  # shadowlab/logs/parse.py -> the shadowlab under test, for the child process
HEAD = b"0.01.000.000 I slot create_check: id  0 | task 3 | "
NEW_PROMPT = HEAD + b"new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 4560\n"
CREATED = HEAD + (
    b"created context checkpoint 1 of 8 (pos_min = 4559, pos_max = 4559, n_tokens = 4560, size = 0.1 MiB)\n"
)


@pytest.fixture(params=["accelerated", "pure"])
def mode(request, monkeypatch):
    """Each test runs with the C accelerator (where built) and without it."""
    if request.param == "pure":
        monkeypatch.setattr(reading, "_logscan", None)
    elif not lp.accelerated():
        pytest.skip("the C accelerator is not built here")
    return request.param


# ---------------------------------------------------------------------------------------- 13

# Run in a child process with a wall limit: a linear parse of these lines takes about a second
# in all; the quadratic regexes took hours (449 s at 200 kB, growing with the square).
_HOSTILE = textwrap.dedent(
    """
    import sys
    from shadowlab.logs import parse as lp, reading
    head = b"0.01.000.000 I slot create_check: id  0 | task 3 | "
    room = lp.MAX_LINE - 200  # inside the line cap: every byte is read, not cut
    lines = [
        head + b"created context checkpoint 1 of 8 (" + b"z" * room + b")",
        b"created context checkpoint " + b"z" * room,
        b"INFO [ update_slots] kv cache rm " + b" " * room + b"z",
        b"INFO [ update_slots] kv cache rm | " + b"z" * room,
        head + b"checking checkpoint with [" + b" " * room + b"|z",
        b"prompt cache: " + b"a=" * (room // 2),
    ]
    path = sys.argv[1]
    with open(path, "wb") as fh:
        fh.write(b"\\n".join(lines) + b"\\n")
    pattern = r"(?P<created>)ckpt at (?P<pos_min>\\d+)"  # a matrix log_patterns entry
    for accelerated, extra in ((True, ()), (False, ()), (False, (pattern,))):
        if not accelerated:
            reading._logscan = None
        parsed = lp.parse(path, "llama.cpp", extra)
        assert parsed.events == [] and parsed.lines == len(lines), (accelerated, extra, parsed)
        assert parsed.unknown_count + parsed.ignored_count == len(lines), parsed
        print("ok", accelerated, extra, parsed.unknown_count, flush=True)
    """
)


def test_survives_a_megabyte_hostile_line_in_linear_time(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _HOSTILE, str(tmp_path / "hostile.log")],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"six hostile 1 MiB lines were not parsed within 60 s (quadratic time?): {exc.stdout!r}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ok ") == 3, done.stdout


# ---------------------------------------------------------------------------------------- 14


def test_survives_a_line_cut_mid_number_or_broken_inside_a_value(tmp_path, mode):
    # the last line of a killed server's log: `task.n_tokens = 4` of 4560, no newline
    path = tmp_path / "engine.log"
    path.write_bytes(NEW_PROMPT + CREATED + NEW_PROMPT[: NEW_PROMPT.index(b"4560") + 1])
    parsed = lp.parse(path, "llama.cpp")
    assert [(e.kind, e.n_tokens) for e in parsed.events] == [("new_prompt", 4560), ("created", 4560)]
    assert (parsed.unknown_count, parsed.cut_lines, parsed.lines) == (1, 1, 3)
    assert parsed.unknown_samples[0][1].endswith("task.n_tokens = 4")
    # the same cut in the middle of a gzip stream that breaks off there
    gz = tmp_path / "engine.log.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [(e.kind, e.n_tokens) for e in lp.parse(gz, "llama.cpp").events] == [("new_prompt", 4560), ("created", 4560)]

    # text broken inside a value, in every shape that carries one
    superseding = HEAD + b"superseding context checkpoint at n_tokens = 4560\n"
    saved = HEAD + b"prompt cache: saved prompt, n_tokens = 4560, checkpoints = 2, size = 10.5 MiB\n"
    trim = b"INFO [    batch_pending_prompt] kv cache rm [p0, end) | tid=\"1\" timestamp=1 id_slot=0 id_task=3 p0=4560\n"
    legacy = b"slot update_slots: id  0 | task 3 | created context checkpoint 1 of 8 (pos_min = 0, pos_max = 4559, size = 0.1 MiB)\n"
    good = [NEW_PROMPT, CREATED, superseding, saved, trim, legacy]
    assert len(lp.parse(good, "llama.cpp").events) == len(good)  # the intact lines are events
    broken = [line.replace(b"4560", b"456<junk>0").replace(b"4559", b"45\xff59") for line in good]
    broken += [CREATED.replace(b"1 of 8", b"1 of 8x"), CREATED.replace(b"0.1 MiB", b"0.1.5 MiB")]
    parsed = lp.parse(broken, "llama.cpp")
    assert parsed.events == [], parsed.events
    assert parsed.unknown_count == len(broken)


# ---------------------------------------------------------------------------------------- 15


def test_survives_a_gzip_log_by_path_or_file_object(tmp_path, mode):
    text = (NEW_PROMPT + CREATED) * 3000
    plain = tmp_path / "engine.log"
    plain.write_bytes(text)
    expected = lp.parse(plain, "llama.cpp")
    assert len(expected.events) == 6000
    gz = tmp_path / "engine.log.gz"
    gz.write_bytes(gzip.compress(text))
    unnamed = tmp_path / "rotated.1"  # a gzip file is known by its magic bytes, not its name
    unnamed.write_bytes(gzip.compress(text[:100_000]) + gzip.compress(text[100_000:]))  # two members
    for source in (gz, str(gz), unnamed, gz.open("rb"), io.BytesIO(gz.read_bytes()), io.BytesIO(text)):
        parsed = lp.parse(source, "llama.cpp")
        assert (parsed.events, parsed.bytes, parsed.source_error) == (expected.events, len(text), None), source


def test_survives_a_gzip_log_corrupt_or_truncated_half_way(tmp_path, mode):
    text = b"".join(
        NEW_PROMPT.replace(b"task 3", b"task %d" % i) + CREATED.replace(b"task 3", b"task %d" % i) for i in range(20000)
    )
    data = gzip.compress(text)
    corrupt = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 64):
        corrupt[i] ^= 0x5A
    truncated = data[: len(data) // 2]
    for name, blob in (("corrupt", bytes(corrupt)), ("truncated", truncated)):
        path = tmp_path / f"{name}.log.gz"
        path.write_bytes(blob)
        parsed = lp.parse(path, "llama.cpp")
        assert parsed.source_error is not None and "gzip" in parsed.source_error, name
        # the events before the damage are kept, the first ones exactly
        tasks = [e.task for e in parsed.events]
        assert len(tasks) > 10000 and tasks[:10000] == [i for i in range(5000) for _ in (0, 1)], name
        assert all(e.n_tokens == 4560 for e in parsed.events[:10000])
    intact = tmp_path / "intact.log.gz"
    intact.write_bytes(data)
    assert lp.parse(intact, "llama.cpp").source_error is None


def test_survives_bytes_text_and_missing_paths_given_as_a_log(tmp_path):
    text = NEW_PROMPT + CREATED
    text_file = tmp_path / "engine.log"
    text_file.write_bytes(text)
    refused = {
        "bytes": text,
        "bytearray": bytearray(text),
        "log text as a str": text.decode(),
        "a missing path": str(tmp_path / "missing.log"),
        "a directory": tmp_path,
        "a FIFO-like device": "/dev/zero",
        "a text-mode file": text_file.open("r"),
        "an int": 5,
    }
    for name, source in refused.items():
        for call in (lambda: lp.parse(source, "llama.cpp"), lambda: lp.iter_events(source, "llama.cpp")):
            with pytest.raises(LogSourceError) as caught:
                call()
            assert isinstance(caught.value, ShadowlabError) and caught.value.hint, name
    assert "pass the log's path" in str(pytest.raises(LogSourceError, lp.parse, text).value)
    assert "a str is a path" in str(pytest.raises(LogSourceError, lp.parse, text.decode()).value)
    assert len(lp.parse(text_file.open("rb"), "llama.cpp").events) == 2  # a binary file object is read
