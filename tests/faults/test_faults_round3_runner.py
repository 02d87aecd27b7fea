"""Faults survived by the runner, round 3 (issue 21).

Items covered:
   1. a grandchild that calls setsid() and keeps the inherited listening socket, at start-up or
      forked on SIGTERM, with its marker or with its environment overwritten, is killed every
      time: no process left, the port free (SHADOWLAB_SETSID_REPEATS=30 runs each 30 times);
      what a shadowlab could not stop is named by pid and command; what a killed shadowlab left
      behind, escaped grandchildren included, is killed by the next run;
  12. (--request-timeout) a resume compares the timeout in effect, not how it was spelled: 300
      written or not is one timeout, also against an options.json of an older shadowlab (null);
      another timeout is still refused.

Every test runs real engine processes (tests/shadowlab/hostile_engine.py) through
`python -m shadowlab`, as a user runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from shadowlab.run import isolation, listeners, process_group
from shadowlab.results import rundir

from test_faults_runner import HOSTILE, assert_clear_failure, write_matrix

REPEATS = int(os.environ.get("SHADOWLAB_SETSID_REPEATS", "3"))
TAG = "SHADOWLAB_TEST_ROUND3_TAG"  # in shadowlab's environment, so in every engine's and escapee's


def shadowlab(tag: str, *args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shadowlab", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", TAG: tag})


def pidfile_pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            continue
    return left


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries this test's tag and an engine marker."""
    marked = listeners.environment_values(isolation.ENGINE_MARKER_ENV)
    return alive([pid for pid, value in listeners.environment_values(TAG).items() if value == tag and pid in marked])


@pytest.fixture
def leftovers(tmp_path):
    """(tag, pidfile); whatever a failing test leaves is killed, not left to the next test."""
    tag, pidfile = uuid.uuid4().hex, tmp_path / "grandchildren.pid"
    yield tag, pidfile
    for pid in set(alive(pidfile_pids(pidfile)) + tagged(tag)):
        psutil.Process(pid).kill()


def _matrix(tmp_path: Path, modes: list[str], pidfile: Path) -> Path:
    """The hostile engine in `modes`, one cell, its grandchildren's pids written to `pidfile`."""
    path = write_matrix(tmp_path, modes, sequence="A: [A]")
    text = path.read_text().replace("'{port}'", "'{port}', --pidfile, " + json.dumps(str(pidfile)), 1)
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------- item 1


ESCAPES = [["setsid-keeps-port"], ["setsid-on-term"], ["setsid-keeps-port", "scrub-environ"],
           ["setsid-on-term", "scrub-environ"]]


@pytest.mark.parametrize("modes", ESCAPES, ids="+".join)
def test_a_setsid_grandchild_keeping_the_port_is_killed_every_time(tmp_path, leftovers, modes):
    # Before the fix, setsid-on-term (forked after the scans that precede the signal) and
    # scrub-environ (no marker to find) survived every run: exit 3, "survivors [], port P still
    # bound", the grandchild (parent 1) listening on. Now each run: exit 0, nothing left.
    tag, pidfile = leftovers
    matrix = _matrix(tmp_path, modes, pidfile)
    for attempt in range(REPEATS):
        pidfile.unlink(missing_ok=True)
        out = tmp_path / f"run{attempt}"
        proc = shadowlab(tag, "run", matrix, "--out", out, "--request-timeout", "20")
        assert_clear_failure(proc.stderr)
        escaped = pidfile_pids(pidfile)
        assert escaped, f"run {attempt}: the hostile engine did not fork its grandchild"
        assert alive(escaped) == [] and tagged(tag) == [], (attempt, proc.stderr[-2000:])
        ports = {m.port for m in rundir.read_cell_metas(out).values()} | _tokenizer_ports(out)
        assert ports and all(isolation.port_is_free(p) for p in ports), (attempt, ports)
        assert proc.returncode == 0, (attempt, proc.stderr[-2000:])


def _tokenizer_ports(out: Path) -> set[int]:
    """The port of the engine that tokenized the prompts (its log's start-up line names it)."""
    ports = set()
    for log in (out / "prompts").glob("*.engine.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("hostile engine listening on 127.0.0.1:"):
                ports.add(int(line.split(":")[1].split()[0]))
    return ports


def test_a_process_that_took_the_port_is_named_with_its_command(tmp_path, leftovers):
    # rebind-on-term: at SIGTERM the engine hands its port to a new process of its own session
    # with an empty environment (a new socket): nothing shows it is the engine's, so it is not
    # killed; the run names it (before: "survivors [], port P still bound", no pid).
    tag, pidfile = leftovers
    out = tmp_path / "run"
    proc = shadowlab(tag, "run", _matrix(tmp_path, ["rebind-on-term"], pidfile), "--out", out,
                     "--request-timeout", "20")
    assert_clear_failure(proc.stderr)
    [holder] = pidfile_pids(pidfile)
    assert alive([holder]) == [holder]
    assert f"its port is still bound, held by pid {holder} ({sys.executable} -c" in proc.stderr, proc.stderr
    assert "\\n" in proc.stderr.split(f"pid {holder} (")[1].split("\n")[0], "the command shown on one line"
    assert proc.returncode == 3


def test_what_a_killed_shadowlab_left_behind_is_killed_by_the_next_run(tmp_path, leftovers):
    # A shadowlab killed by SIGKILL stops nothing. Its claim names the engine, whose group the
    # next run kills; the grandchild that left the group (setsid-keeps-port) was not in it and
    # lived on before the fix. Now the next run kills every process whose marker names a
    # shadowlab that is gone.
    tag, pidfile = leftovers
    slow = _matrix(tmp_path, ["setsid-keeps-port", "slow-loris"], pidfile)
    first = subprocess.Popen([sys.executable, "-m", "shadowlab", "run", str(slow), "--out",
                              str(tmp_path / "killed"), "--request-timeout", "60"],
                             env={**os.environ, TAG: tag}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        escaped = _wait_for_pids(pidfile, first)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=30)
    assert alive(escaped) == escaped, "the grandchild should outlive the killed shadowlab"
    quick = tmp_path / "quick"
    quick.mkdir()
    proc = shadowlab(tag, "run", _matrix(quick, [], quick / "none.pid"), "--out", quick / "run",
                     "--request-timeout", "20")
    assert "left behind by a killed shadowlab" in proc.stderr, proc.stderr
    assert alive(escaped) == [] and tagged(tag) == [], proc.stderr[-2000:]


def _wait_for_pids(pidfile: Path, proc: subprocess.Popen) -> list[int]:
    """The live grandchildren once the cell's engine has forked one (the engine that tokenized
    the prompts forked one too, killed at its stop), and the cell's slow-loris turn is in flight."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        pids = pidfile_pids(pidfile)
        if len(pids) >= 2 and alive(pids):
            time.sleep(0.5)  # the turn's answer trickles: shadowlab waits on it
            return alive(pids)
        time.sleep(0.05)
    raise AssertionError(f"no grandchild of a cell's engine within a minute (shadowlab exit {proc.poll()})")


def test_a_process_shadowlab_may_not_signal_is_named_with_its_command(tmp_path, leftovers, monkeypatch):
    # The grandchild refuses every signal shadowlab sends it (as another user's process would:
    # EPERM). Before the fix a stop that left it said "survivors [...]" with bare pids; now it
    # names the pid and command line of what is left, and who holds the port.
    _, pidfile = leftovers
    port = isolation.lease_port()
    proc = process_group.EngineProcess(
        [sys.executable, str(HOSTILE), "--port", str(port.port), "--pidfile", str(pidfile),
         "--mode", "setsid-keeps-port"],
        env=dict(os.environ), cwd=tmp_path / "scratch", log_path=tmp_path / "engine.log",
        cores=[isolation.usable_cores()[0]], port=port.port)
    try:
        deadline = time.monotonic() + 20
        while not (pidfile_pids(pidfile) and proc.listens_on_port()) and time.monotonic() < deadline:
            time.sleep(0.02)
        [grandchild] = pidfile_pids(pidfile)
        refuse = psutil.Process.send_signal

        def send_signal(self: psutil.Process, sig: int) -> None:
            if self.pid == grandchild:
                raise psutil.AccessDenied(self.pid)
            refuse(self, sig)

        monkeypatch.setattr(psutil.Process, "send_signal", send_signal)
        with pytest.raises(process_group.ProcessSurvived) as caught:
            proc.stop(grace_s=1.0, port_wait_s=0.5)
    finally:
        port.release()
    command = f"{sys.executable} {HOSTILE} --port {port.port}"
    assert f"could not stop pid {grandchild} ({command}" in str(caught.value), caught.value
    assert f"its port is still bound, held by pid {grandchild} ({command}" in str(caught.value)
    assert proc.stop_report is not None and proc.stop_report.survivors == [grandchild]


# ---------------------------------------------------------------------------- item 12


def test_a_resume_compares_the_request_timeout_in_effect(tmp_path, leftovers):
    # Before: `--request-timeout 300` (the default) on resume was "changed" when the run started
    # without it, and the other way round (options.json held null for "not given").
    tag, _ = leftovers
    matrix = write_matrix(tmp_path, ["truncated"], sequence="A: [A]")  # a failed cell: resume reruns it
    for first, then in ((), ("--request-timeout", "300")), (("--request-timeout", "300"), ()):
        out = tmp_path / f"run{len(first)}"
        started = shadowlab(tag, "run", matrix, "--out", out, *first)
        assert started.returncode == 3, started.stderr[-2000:]
        assert json.loads((out / "options.json").read_text()) == {"faults": [], "request_timeout_s": 300.0}
        resumed = shadowlab(tag, "run", matrix, "--out", out, "--resume", *then)
        assert resumed.returncode == 3 and "[1/1] start" in resumed.stderr, resumed.stderr[-2000:]
    # An options.json written before it held the timeout in effect says null: the default.
    options = out / "options.json"
    options.write_text(json.dumps({"faults": [], "request_timeout_s": None}))
    resumed = shadowlab(tag, "run", matrix, "--out", out, "--resume", "--request-timeout", "300")
    assert resumed.returncode == 3 and "[1/1] start" in resumed.stderr, resumed.stderr[-2000:]
    # Another timeout is another experiment: still refused, naming both.
    for old, new in ((None, "120"), (300.0, "299.5")):
        options.write_text(json.dumps({"faults": [], "request_timeout_s": old}))
        refused = shadowlab(tag, "run", matrix, "--out", out, "--resume", "--request-timeout", new)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"--request-timeout 300 then, {new} now" in refused.stderr, refused.stderr
