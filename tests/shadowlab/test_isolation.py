"""Isolation: core and port leases, GPU hiding, process-group spawn and stop.

Process tests use the stand-in engine (tests/shadowlab/standin_engine.py): they are
about processes and sockets, not answers. The runner's tests (test_run.py) repeat
the important checks with the real reference engine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from shadowlab.run import isolation
from shadowlab.run.isolation import LeaseUnavailable
from shadowlab.run.process_group import EngineProcess


def wait_healthy(port: int, proc: EngineProcess, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.log_tail()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError("stand-in never became healthy:\n" + proc.log_tail())


def start_standin(standin_argv, tmp_path: Path, cores, *extra: str) -> tuple[EngineProcess, isolation.PortLease]:
    port = isolation.lease_port()
    proc = EngineProcess(
        [*standin_argv, "--port", str(port.port), *extra],
        env=dict(os.environ) | isolation.gpu_env(None),
        cwd=tmp_path / "scratch",
        log_path=tmp_path / "engine.log",
        cores=cores,
        port=port.port,
    )
    return proc, port


def test_core_leases_are_disjoint_and_released():
    cores = isolation.usable_cores()
    first = isolation.lease_cores(1)
    try:
        leases = [first]
        for _ in range(len(cores) - 1):
            leases.append(isolation.lease_cores(1))
        taken = [c for lease in leases for c in lease.cores]
        assert sorted(taken) == cores  # every core once, none twice
        with pytest.raises(LeaseUnavailable):
            isolation.lease_cores(1)
    finally:
        for lease in leases:
            lease.release()
    again = isolation.lease_cores(len(cores))
    assert sorted(again.cores) == cores
    again.release()


def test_core_lease_asking_for_more_than_the_machine_has_is_an_error():
    with pytest.raises(ValueError, match="cannot pin"):
        isolation.lease_cores(len(isolation.usable_cores()) + 1)


HOLD_CORE = """
import sys, time
from shadowlab.run import isolation
lease = isolation.lease_cores(1)
print(lease.cores[0], flush=True)
sys.stdin.readline()
"""


def test_core_lease_held_by_another_process_is_not_handed_out():
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CORE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        held = int(holder.stdout.readline())
        mine = [isolation.lease_cores(1) for _ in range(len(isolation.usable_cores()) - 1)]
        assert held not in {c for lease in mine for c in lease.cores}
        with pytest.raises(LeaseUnavailable):
            isolation.lease_cores(1)
        for lease in mine:
            lease.release()
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the dead holder's flock: its core is free again.
    lease = isolation.lease_cores(len(isolation.usable_cores()))
    lease.release()


def test_port_leases_differ_and_skip_bound_ports():
    leases = [isolation.lease_port() for _ in range(20)]
    ports = [lease.port for lease in leases]
    assert len(set(ports)) == len(ports)
    for lease in leases:
        lease.release()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        bound = sock.getsockname()[1]
        assert not isolation.port_is_free(bound)


def test_gpu_env_hides_every_runtime_or_names_one_device():
    assert isolation.gpu_env(None) == {
        "CUDA_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "",
        "ROCR_VISIBLE_DEVICES": "",
    }
    assert set(isolation.gpu_env(1).values()) == {"1"}


def test_engine_is_pinned_before_exec_and_stopped_as_a_group(standin_argv, tmp_path):
    cores = isolation.lease_cores(1)
    proc, port = start_standin(standin_argv, tmp_path, cores.cores, "--children", "2")
    try:
        wait_healthy(port.port, proc)
        assert proc.observed_affinity() == list(cores.cores)
        # The engine saw the affinity from its first instruction, not after a later fix-up.
        props = httpx.get(f"http://127.0.0.1:{port.port}/props").json()
        assert props["affinity"] == list(cores.cores)
        assert props["env"]["CUDA_VISIBLE_DEVICES"] == ""
        proc.remember_members()
        members = proc.group_members()
        assert len(members) == 3  # the engine and its two children
        for pid in members:
            assert sorted(psutil.Process(pid).cpu_affinity()) == list(cores.cores)
        # shadowlab's own affinity is untouched.
        assert sorted(os.sched_getaffinity(0)) == isolation.usable_cores()
        report = proc.stop(grace_s=5.0)
    finally:
        proc.stop()
        cores.release()
        port.release()
    assert report.signal_used == "TERM"
    assert report.survivors == [] and report.port_free
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in members)


def test_engine_ignoring_term_is_killed(standin_argv, tmp_path):
    proc, port = start_standin(standin_argv, tmp_path, [isolation.usable_cores()[0]],
                               "--ignore-term", "--children", "1")
    try:
        wait_healthy(port.port, proc)
        report = proc.stop(grace_s=0.5)
    finally:
        port.release()
    assert report.signal_used == "KILL"
    assert report.survivors == [] and report.port_free


def test_engine_that_exits_at_once_reports_its_log(tmp_path):
    proc = EngineProcess(
        [sys.executable, "-c", "import sys; print('bad flag --nope'); sys.exit(2)"],
        env=dict(os.environ), cwd=tmp_path / "s", log_path=tmp_path / "engine.log",
        cores=[isolation.usable_cores()[0]], port=isolation.lease_port().port,
    )
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    report = proc.stop()
    assert report.returncode == 2 and report.signal_used == "none"
    assert "bad flag --nope" in proc.log_tail()


def test_address_in_use_is_recognised_in_logs():
    assert isolation.log_says_address_in_use("OSError: [Errno 98] Address already in use")
    assert isolation.log_says_address_in_use("srv    init: couldn't bind HTTP server socket")
    assert not isolation.log_says_address_in_use("prompt eval time = 1 ms")


def test_stale_claim_with_a_recycled_pid_kills_nothing():
    import json

    claim = isolation.lock_dir() / f"core-{isolation.usable_cores()[0]}.claim"
    # Our own pid, but another creation time: what a recycled pid looks like.
    claim.write_text(json.dumps({"pid": os.getpid(), "create_time": 1.0, "shadowlab_pid": 1}))
    assert isolation.reap_orphans() == []
    assert not claim.exists()


def test_claims_are_written_while_leased_and_removed_on_release():
    lease = isolation.lease_cores(1)
    lease.claim(os.getpid())
    claim = isolation.lock_dir() / f"core-{lease.cores[0]}.claim"
    assert claim.exists()
    assert isolation.reap_orphans() == []  # held by a live lease: not stale
    lease.release()
    assert not claim.exists()


@pytest.mark.parametrize("writer, returncode", [
    # Python ignores SIGXFSZ: its writes past the cap fail (EFBIG); it goes on as it likes.
    ([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'x' * 100000); sys.stdout.flush()"], None),
    # A C program is killed by SIGXFSZ at the cap.
    (["head", "-c", "100000", "/dev/zero"], -25),
])
def test_an_engine_log_stops_at_its_cap(tmp_path, writer, returncode):
    # The cap is set once the spawn is over: the child waits to see it before writing.
    argv = ["sh", "-c", 'while [ "$(ulimit -f)" = unlimited ]; do sleep 0.01; done; exec "$@"', "sh", *writer]
    proc = EngineProcess(argv, env=dict(os.environ), cwd=tmp_path / "s", log_path=tmp_path / "engine.log",
                         cores=[isolation.usable_cores()[0]], port=isolation.lease_port().port,
                         max_log_bytes=4096)
    proc.popen.wait(timeout=20)
    report = proc.stop()
    assert (tmp_path / "engine.log").stat().st_size == 4096 and proc.log_at_cap()
    assert report.signal_used == "none" and returncode in (None, report.returncode)
