"""Faults survived by the runner: processes, files and locks (issue 9).

Items covered:
   2. an engine writing a line without end: shadowlab's memory stays bounded (chunked span
      reads; a failed cell's log tail read while the engine still writes), and engine.log
      stops at its cap (isolation.max_log_mib), the cell failing as infrastructure with the
      reason, a marker line ending the log;
   3. a --resume with other --fault / --request-timeout than the run started with is refused
      (exit 2, naming both);
   4. a second shadowlab in a run directory in use is refused at once (exit 2, naming the
      holder's pid);
   6. an engine that opens a listener beyond loopback after its first answer fails its cell;
  10. the machine failing the run: every port busy, a full disk (the cell running beside it
      recorded with the true reason, no traceback file after a successful resume), a
      read-only --out, a file as --out: exit 3 with one clear line, never "internal error";
  12. an engine that exits 134 right after its answer fails its cell, every time (the
      reference engine's crash-after-requests=1: no cell whose engine exited 134 is ok).

Every test runs real engine processes (tests/shadowlab/hostile_engine.py, or the reference
engine) through the command line, in-process (cli.main) or as `python -m shadowlab`.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from shadowlab import cli
from shadowlab.run import isolation
from shadowlab.results import records, rundir
from shadowlab.results.records import CellStatus

HOSTILE = Path(__file__).resolve().parents[1] / "shadowlab" / "hostile_engine.py"

MATRIX = """\
version: 1
name: hostile-runner
engines:
  bad:
    kind: openai
    binary: {python}
    command: ['{{binary}}', {script}, --port, '{{port}}'{modes}]
    log_family: llama.cpp
    ready_timeout_s: 20
    threads: 1
configurations:
{configurations}
prompts:
  A: {{kind: random, tokens: 24, seed: 1}}
  B: {{kind: random, tokens: 24, seed: 2}}
sequences:
  {sequence}
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1{isolation}}}
identity: {{control: false}}
"""


def write_matrix(tmp_path: Path, modes: Sequence[str] = (), *, configurations: str = "  default: {}",
                 sequence: str = "A-B: [A, B]", isolation_extra: str = "") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(
        python=json.dumps(sys.executable), script=json.dumps(str(HOSTILE)),
        modes="".join(f", --mode, {m}" for m in modes), configurations=configurations,
        sequence=sequence, isolation=isolation_extra))
    return path


def shadowlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m shadowlab ...` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "shadowlab", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def assert_clear_failure(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err


def assert_no_engine_left(out: Path) -> None:
    metas = rundir.read_cell_metas(out) if (out / "cells").is_dir() else {}
    for meta in metas.values():
        if meta.pid is not None and psutil.pid_exists(meta.pid):
            assert psutil.Process(meta.pid).status() == psutil.STATUS_ZOMBIE, meta.cell_id
    for child in psutil.Process().children(recursive=True):
        assert child.status() == psutil.STATUS_ZOMBIE, f"leftover child {child.pid} {child.cmdline()}"


def infrastructure_failure(tmp_path: Path, modes: list[str], **matrix: str) -> tuple[Path, str]:
    """Run the hostile engine in `modes`; the run must fail as infrastructure (exit 3) with
    clear words. (run directory, terminal output)"""
    out = tmp_path / "run"
    proc = shadowlab("run", write_matrix(tmp_path, modes, **matrix), "--out", out, "--request-timeout", "20")
    assert_clear_failure(proc.stderr)
    assert proc.returncode == 3, proc.stderr[-2000:]
    return out, proc.stdout + proc.stderr


def only_meta(out: Path) -> records.CellMeta:
    metas = rundir.read_cell_metas(out)
    assert len(metas) == 1, sorted(metas)
    return next(iter(metas.values()))


# ---------------------------------------------------------------------------- item 2

PEAK_RSS = """\
import sys
from shadowlab import cli
code = cli.main(sys.argv[2:])
# VmHWM is this image's own high-water mark. Not getrusage's ru_maxrss: Linux carries the
# pre-exec image's peak into it, so a child forked from a big pytest reported pytest's RSS.
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
open(sys.argv[1], "w").write(str(int(hwm.split()[1]) * 1024))
sys.exit(code)
"""

LINE = 256 << 20


def test_survives_an_engine_writing_a_line_without_end_in_bounded_memory(tmp_path):
    # Each turn writes a 256 MiB line with no newline; reading a turn's span whole (as the
    # runner did) costs at least that much memory; read in chunks it costs none of it.
    matrix = write_matrix(tmp_path, [f"flood-line={LINE}"])
    out, rss_file = tmp_path / "run", tmp_path / "rss"
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(rss_file), "run", str(matrix),
                           "--out", str(out), "--request-timeout", "60"],
                          capture_output=True, text=True, timeout=300)
    assert_clear_failure(proc.stderr)
    metas = rundir.read_cell_metas(out)
    assert {m.status for m in metas.values()} == {CellStatus.OK}, proc.stderr[-2000:]
    warm = metas["bad.default.A-B"]
    assert (out / "cells" / warm.cell_id / "engine.log").stat().st_size > 2 * LINE  # both, uncut
    assert [t.log_complete for t in warm.turns] == [True, True]
    assert warm.turns[1].log_offsets[0] == warm.turns[0].log_offsets[1]  # contiguous spans
    peak = int(rss_file.read_text())
    assert peak < LINE, f"shadowlab peaked at {peak >> 20} MiB for a {LINE >> 20} MiB line"
    assert_no_engine_left(out)


def test_survives_an_engine_still_writing_while_its_log_tail_is_read(tmp_path, monkeypatch):
    # A failed cell's log tail is read while its engine may still be flooding: the engine
    # writes 32 MiB without a newline just as the tail is read (after its size was taken).
    # Read to the end of the file, the tail chased the writer and held the whole line.
    log = tmp_path / "engine.log"
    log.write_bytes(b"start\n" + b"z" * 10_000)

    class Growing:
        def __init__(self, fh):
            self.fh = fh

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def read(self, *args):
            with open(log, "ab") as writer:
                writer.write(b"z" * (32 << 20))
            return self.fh.read(*args)

    monkeypatch.setattr(isolation, "open", lambda path, mode: Growing(open(path, mode)), raising=False)
    tail = isolation.read_log_tail(log, 4000)
    assert len(tail) <= 4000, f"the tail held {len(tail) >> 20} MiB of a line still being written"
    assert tail == "z" * 4000  # the last 4000 bytes when it looked


def test_survives_an_engine_flooding_its_log_past_the_cap(tmp_path):
    out, said = infrastructure_failure(tmp_path, ["flood-line=12582912"], sequence="A: [A]",
                                       isolation_extra=", max_log_mib: 4")
    meta = only_meta(out)
    assert meta.status is CellStatus.FAILED
    assert "engine.log reached its cap of 4 MiB (isolation.max_log_mib)" in meta.reason, meta.reason
    log = (out / "cells" / meta.cell_id / "engine.log").read_bytes()
    marker = f"\n[shadowlab] {meta.reason}\n".encode()
    assert log.endswith(marker) and len(log) == (4 << 20) + len(marker)  # the kernel's cut
    assert "engine.log reached its cap" in said  # where the user looks
    assert_no_engine_left(out)


# ---------------------------------------------------------------------------- item 3


def test_survives_a_resume_with_other_faults_or_request_timeout(tmp_path):
    matrix = write_matrix(tmp_path, ["truncated"], sequence="A: [A]")  # a failed cell to resume
    out = tmp_path / "run"
    first = shadowlab("run", matrix, "--out", out, "--fault", "stale-restore", "--request-timeout", "5")
    assert first.returncode == 3, first.stderr[-2000:]
    assert json.loads((out / "options.json").read_text()) == {
        "faults": ["stale-restore"], "request_timeout_s": 5.0}
    before = (out / "cells").stat().st_mtime_ns, sorted(p.name for p in (out / "cells").iterdir())
    for args, said in ((["--request-timeout", "5"], "--fault stale-restore then, not given now"),
                       (["--fault", "stale-restore"], "--request-timeout 5 then, 300 now"),  # the default
                       (["--fault", "skip-cascade", "--request-timeout", "5"],
                        "--fault stale-restore then, skip-cascade now")):
        resumed = shadowlab("run", matrix, "--out", out, "--resume", *args)
        assert resumed.returncode == 2, resumed.stderr
        assert said in resumed.stderr and "options changed since this run started" in resumed.stderr
        assert_clear_failure(resumed.stderr)
    # Nothing was started or rewritten by the refused resumes ...
    assert ((out / "cells").stat().st_mtime_ns, sorted(p.name for p in (out / "cells").iterdir())) == before
    # ... and the same options resume.
    again = shadowlab("run", matrix, "--out", out, "--resume", "--fault", "stale-restore",
                      "--request-timeout", "5")
    assert again.returncode == 3 and "[1/1] start" in again.stderr, again.stderr[-2000:]


# ---------------------------------------------------------------------------- item 4


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_survives_two_shadowlab_in_one_run_directory(tmp_path):
    matrix = write_matrix(tmp_path, ["slow-loris"], sequence="A: [A]")
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-m", "shadowlab", "run", str(matrix), "--out", str(out),
                               "--request-timeout", "60"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        # The holder is inside its cell's turn (a trickled answer) once its engine logged it.
        wait_for(lambda: b"task.n_tokens" in _read(out / "cells" / "bad.default.A" / "engine.log"),
                 60, "the first run's turn")
        assert (out / ".shadowlab.lock").read_text().strip() == str(holder.pid)
        for args in (["--resume"], ["--resume", "--request-timeout", "60"], []):
            second = shadowlab("run", matrix, "--out", out, *args)
            assert second.returncode == 2, second.stderr
            assert f"another shadowlab (pid {holder.pid}) is running in this run directory" in second.stderr
            assert "[1/1] start" not in second.stderr
        assert holder.poll() is None  # undisturbed
    finally:
        holder.send_signal(signal.SIGTERM)
        _, err = holder.communicate(timeout=60)
    assert holder.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert only_meta(out).status is CellStatus.ABORTED
    # The lock went with its holder: the directory resumes.
    resumed = shadowlab("run", matrix, "--out", out, "--resume", "--request-timeout", "1")
    assert resumed.returncode == 2 and "--request-timeout 60 then, 1 now" in resumed.stderr, resumed.stderr
    assert_no_engine_left(out)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


# ---------------------------------------------------------------------------- item 6


def test_survives_an_engine_listening_beyond_loopback_after_its_first_answer(tmp_path):
    out, _ = infrastructure_failure(tmp_path, ["bind-all-later"])
    metas = rundir.read_cell_metas(out)
    for meta in metas.values():
        assert meta.status is CellStatus.FAILED
        assert "listens beyond loopback on 0.0.0.0:" in meta.reason and "after turn 0" in meta.reason, \
            meta.reason
    warm = metas["bad.default.A-B"]
    assert len(warm.turns) == 1 and warm.turns[0].error is None  # it answered, then was caught
    assert_no_engine_left(out)


# ---------------------------------------------------------------------------- item 10


def test_survives_every_port_being_busy(tmp_path, monkeypatch, capsys):
    # Every port shadowlab may lease is bound by another program (here: this test).
    held = []
    for _ in range(3):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        held.append(sock)
    monkeypatch.setattr(isolation, "PORT_RANGE", [s.getsockname()[1] for s in held])
    matrix = write_matrix(tmp_path)
    out = tmp_path / "run"
    try:
        code = cli.main(["run", str(matrix), "--out", str(out), "--request-timeout", "5"])
    finally:
        for sock in held:
            sock.close()
    err = capsys.readouterr().err
    assert_clear_failure(err)
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.startswith("shadowlab: no loopback port")]
    assert len(lines) == 1 and "candidates" in lines[0] and "all bound or leased" in lines[0], err
    assert not (out / cli.TRACEBACK_NAME).exists()


@pytest.fixture
def tmpfs(tmp_path):
    """A small real filesystem of its own; skipped where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_survives_a_full_disk(tmp_path, tmpfs):
    disk = tmpfs("disk", "size=2m")
    # The engine's flood fills the disk (it ignores its own failed writes and answers), so
    # shadowlab's next record cannot be written.
    matrix = write_matrix(tmp_path, [], configurations="  flood: {flags: [--mode, flood-line=4194304]}",
                          sequence="A: [A]")
    out = disk / "run"
    proc = shadowlab("run", matrix, "--out", out, "--request-timeout", "5")
    assert_clear_failure(proc.stderr)
    assert proc.returncode == 3, proc.stderr[-2000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("shadowlab: cannot write")]
    assert len(said) == 1 and "No space left on device (ENOSPC)" in said[0], proc.stderr[-2000:]
    assert not (out / cli.TRACEBACK_NAME).exists()
    assert_no_engine_left(out)
    # Once there is room, the run resumes, and an old traceback file goes with the old attempt.
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    (out / cli.TRACEBACK_NAME).write_text("Traceback (an earlier attempt)\n")
    resumed = shadowlab("run", matrix, "--out", out, "--resume", "--request-timeout", "5")
    assert resumed.returncode in (0, 1), resumed.stderr[-2000:]
    assert only_meta(out).status is CellStatus.OK
    assert not (out / cli.TRACEBACK_NAME).exists()


def test_survives_a_full_disk_beside_a_running_cell(tmp_path, monkeypatch, capsys):
    # Two cells at once: `slow` waits for a trickled answer while `full` cannot write its
    # answer (ENOSPC, injected for that one file). The run stops; the slow cell is recorded
    # aborted with the true reason, not as "interrupted".
    real_write = records.write_bytes_atomic

    def full_disk(path: Path, data: bytes) -> None:
        if "bad.full.A" in str(path) and path.name.startswith("turn-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, data)

    monkeypatch.setattr(records, "write_bytes_atomic", full_disk)
    matrix = write_matrix(tmp_path, [], configurations="  full: {}\n  slow: {flags: [--mode, slow-loris]}",
                          sequence="A: [A]", isolation_extra=", jobs: 2")
    out = tmp_path / "run"
    code = cli.main(["run", str(matrix), "--out", str(out), "--request-timeout", "60"])
    err = capsys.readouterr().err
    assert_clear_failure(err)
    assert code == 3, err
    assert f"shadowlab: cannot write {out}/cells/bad.full.A/responses/turn-0.json: No space left on " \
           "device (ENOSPC)" in err, err
    metas = rundir.read_cell_metas(out)
    for meta in metas.values():
        assert meta.status is CellStatus.ABORTED, (meta.cell_id, meta.status, meta.reason)
        assert meta.reason.startswith("the run stopped: cannot write") and "ENOSPC" in meta.reason, meta.reason
        assert "interrupted" not in meta.reason
    assert "bad.slow.A" in metas
    assert_no_engine_left(out)


def test_survives_a_read_only_out(tmp_path, tmpfs):
    read_only = tmpfs("ro", "ro,size=1m")
    proc = shadowlab("run", write_matrix(tmp_path), "--out", read_only / "run")
    assert_clear_failure(proc.stderr)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"shadowlab: cannot write {read_only / 'run'}: Read-only file system (EROFS)"), proc.stderr


def test_survives_a_file_as_out(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("not a directory\n")
    for out in (target, target / "run"):
        proc = shadowlab("run", write_matrix(tmp_path), "--out", out)
        assert_clear_failure(proc.stderr)
        assert proc.returncode == 3, proc.stderr
        first = proc.stderr.splitlines()[0]
        assert first in (f"shadowlab: {target}: the run directory is not a directory",
                         f"shadowlab: cannot write {out}: Not a directory (ENOTDIR)"), proc.stderr
    assert target.read_text() == "not a directory\n"


# ---------------------------------------------------------------------------- item 12


def test_survives_an_engine_that_exits_right_after_its_answer(tmp_path):
    # The engine exits 134 once its answer is out, before its log line for the turn: the
    # runner, waiting for that line, sees the exit, every time.
    out, _ = infrastructure_failure(tmp_path, ["exit-after-answer"], sequence="A: [A]")
    meta = only_meta(out)
    assert meta.status is CellStatus.FAILED
    assert meta.reason == "engine exited on its own with code 134 after answering turn 0", meta.reason
    assert meta.turns[0].error is None and meta.stop.signal == "none" and meta.stop.returncode == 134
    assert_no_engine_left(out)


REFERENCE_MATRIX = """\
version: 1
name: crash
engines:
  reference:
    kind: reference
    model: {preset: tiny, seed: 0}
    flags: [-c, 1024, -b, 64, -ub, 32, --ctx-checkpoints, 8, -cram, 0, -np, 1]
    threads: 1
prompts:
  A: {kind: random, tokens: 60, seed: 1}
  C: {kind: diverge, from: A, shared: 30, tokens: 70, seed: 2}
sequences:
  A-C: [A, C]
generation: {n_predict: 2, temperature: 0}
isolation: {cores_per_cell: 1, jobs: 2}
identity: {control: false}
"""


def test_survives_the_reference_engine_crashing_after_one_request(tmp_path, repo_root):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(REFERENCE_MATRIX)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "run", str(matrix), "--out", str(out),
                           "--fault", "crash-after-requests=1", "--request-timeout", "60"],
                          capture_output=True, text=True, timeout=600, cwd=repo_root)
    assert_clear_failure(proc.stderr)
    assert proc.returncode == 3, proc.stderr[-2000:]
    metas = rundir.read_cell_metas(out)
    assert sorted(metas) == ["reference.default.A-C", "reference.default.cold.C"]
    for meta in metas.values():
        assert meta.stop is not None, meta.cell_id
        crashed = meta.stop.returncode == 134 or any(
            "code 134" in (t.error or "") for t in meta.turns) or "code 134" in (meta.reason or "")
        if crashed:
            assert meta.status is CellStatus.FAILED and "134" in meta.reason, (meta.cell_id, meta.reason)
        else:  # stopped by shadowlab before it could crash: its exit is the stop signal's
            assert meta.stop.returncode in (-signal.SIGTERM, 0), (meta.cell_id, meta.stop)
    warm = metas["reference.default.A-C"]
    assert warm.status is CellStatus.FAILED  # its second request met a dead engine
    assert_no_engine_left(out)

