"""The loopback check read from the kernel (shadowlab/run/listeners.py): the /proc/net/tcp{,6} parser
on captured tables, the netlink dump against those tables, attribution of a listener to the
processes that hold it, an engine process seeing its own port and its child's listener on
0.0.0.0 (from the kernel, and through psutil where /proc is absent), and, live, an engine whose
child starts listening beyond loopback after the first answer, caught by the runner's per-turn
check.

The fixtures tests/fixtures/proc_net/tcp and tcp6 are this x86 host's tables, cut to the lines
of one process: listeners on 127.0.0.1:41039 (inode 498533), 0.0.0.0:56171 (498534),
[::]:37741 (498535), [::1]:54627 (498536), [::ffff:127.0.0.1]:45229 (498537, v4-mapped), and
an established connection on each family (not listeners).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowlab.run import isolation, listeners, process_group
from shadowlab.run.listeners import Listener
from shadowlab.results.records import CellStatus
from test_hostile import check, run_cli  # the hostile engine's one-turn matrix, run as a user runs it

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "proc_net"

pytestmark = pytest.mark.skipif(not listeners.available(), reason="needs Linux /proc")


def test_the_ipv4_table_yields_its_listeners_and_nothing_else():
    table = (FIXTURES / "tcp").read_bytes()
    assert listeners.parse_tcp_table(table, socket.AF_INET, "little") == [
        Listener("127.0.0.1", 41039, 498533), Listener("0.0.0.0", 56171, 498534)]


def test_the_ipv6_table_yields_any_loopback_and_v4_mapped_listeners():
    table = (FIXTURES / "tcp6").read_bytes()
    assert sorted(listeners.parse_tcp_table(table, socket.AF_INET6, "little"), key=lambda e: e.inode) == [
        Listener("::", 37741, 498535), Listener("::1", 54627, 498536),
        Listener("::ffff:127.0.0.1", 45229, 498537)]


def test_the_table_of_a_big_endian_host_reads_the_same_addresses():
    # A big-endian kernel prints each 32-bit word of the address as it lies in memory.
    table = (FIXTURES / "tcp").read_bytes().replace(b"0100007F:", b"7F000001:")
    assert listeners.parse_tcp_table(table, socket.AF_INET, "big")[0] == Listener("127.0.0.1", 41039, 498533)
    # ...which, read as little-endian, is another address: the byte order matters.
    assert listeners.parse_tcp_table(table, socket.AF_INET, "little")[0].ip == "1.0.0.127"


def test_which_addresses_count_as_loopback():
    for ip in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert process_group._is_loopback(ip), ip
    for ip in ("0.0.0.0", "::", "::ffff:0.0.0.0", "10.0.0.1", "fe80::1"):
        assert not process_group._is_loopback(ip), ip
    assert Listener("::", 80, 1).address() == "[::]:80" and Listener("0.0.0.0", 80, 1).address() == "0.0.0.0:80"


def listening(family: int, host: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_the_netlink_dump_agrees_with_the_proc_tables():
    held = [listening(socket.AF_INET, "0.0.0.0"), listening(socket.AF_INET6, "::"),
            listening(socket.AF_INET6, "::ffff:127.0.0.1")]
    try:
        # Listeners come and go on a shared host between two reads: compare those of this process.
        mine = {os.fstat(s.fileno()).st_ino for s in held}
        dumped = {e for f in (socket.AF_INET, socket.AF_INET6) for e in listeners.netlink_listeners(f)
                  if e.inode in mine}
        tables = {e for e in listeners._namespace_listeners(os.getpid(), own_namespace=False) if e.inode in mine}
        assert dumped == tables and len(dumped) == 3
        assert {e.address() for e in dumped} == {f"0.0.0.0:{held[0].getsockname()[1]}",
                                                 f"[::]:{held[1].getsockname()[1]}",
                                                 f"[::ffff:127.0.0.1]:{held[2].getsockname()[1]}"}
    finally:
        for sock in held:
            sock.close()


OTHER_LISTENER = """
import socket, sys
sock = socket.socket()
sock.bind(("0.0.0.0", 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("netlink", [True, False], ids=["netlink", "proc-tables"])
def test_a_listener_belongs_to_the_process_holding_it(monkeypatch, netlink):
    if not netlink:  # netlink refused (a sandbox): the /proc tables answer alike
        def refused(family):
            raise listeners.NetlinkUnavailable("refused")
        monkeypatch.setattr(listeners, "netlink_listeners", refused)
    other = subprocess.Popen([sys.executable, "-c", OTHER_LISTENER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    mine = listening(socket.AF_INET, "127.0.0.1")
    try:
        port = int(other.stdout.readline())
        assert [e.address() for e in listeners.listeners([other.pid])] == [f"0.0.0.0:{port}"]
        assert [e.port for e in listeners.listeners([os.getpid()])] == [mine.getsockname()[1]]
        assert listeners.listeners([]) == []
    finally:
        mine.close()
        other.kill()
        other.wait()


def test_descendants_are_found_below_their_parent():
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & echo forked; wait"], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert tree.stdout.readline() == b"forked\n"
        found = listeners.descendants(os.getpid())
        below = listeners.descendants(tree.pid)
        assert tree.pid in found and len(below) == 2 and set(below) < set(found)
        assert listeners.descendants(below[0]) == []
    finally:
        os.killpg(tree.pid, signal.SIGKILL)  # the shell and its sleeps: its own group
        tree.wait()


def test_a_child_listening_beyond_loopback_after_the_first_answer_fails_its_cell(tmp_path, capsys):
    code, out, _ = run_cli(tmp_path, ["child-binds-all-later"], capsys)  # one turn, then the check
    metas = check(tmp_path, out, status=(CellStatus.FAILED, CellStatus.SKIPPED), reason="")
    warm = next(m for m in metas.values() if m.status is CellStatus.FAILED)
    assert "listens beyond loopback on [::]:" in warm.reason and "after turn 0" in warm.reason, warm.reason
    assert len(warm.turns) == 1 and warm.turns[0].error is None  # it answered, then was caught
    assert code == 3
    port = int(re.search(r"\[::\]:(\d+)", warm.reason).group(1))
    assert all(e.port != port for e in listeners.netlink_listeners(socket.AF_INET6))  # stopped with its engine


ENGINE_WITH_A_CHILD = """
import signal, socket, subprocess, sys
own = socket.create_server(("127.0.0.1", int(sys.argv[1])))
child = subprocess.Popen([sys.executable, "-c", (
    "import signal, socket; exposed = socket.create_server(('0.0.0.0', 0)); "
    "print(exposed.getsockname()[1], flush=True); signal.pause()")], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
signal.pause()
"""


def first_line(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if text.endswith("\n"):
            return text.splitlines()[0]
        time.sleep(0.02)
    raise AssertionError(f"nothing written to {path} in {timeout} s")


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-reads", "psutil-without-proc"])
def test_an_engine_process_sees_its_port_and_its_childs_exposed_listener(tmp_path, monkeypatch, kernel):
    if not kernel:  # where /proc is absent, psutil answers the same questions
        monkeypatch.setattr(listeners, "available", lambda: False)
    port = isolation.lease_port()
    proc = process_group.EngineProcess(
        [sys.executable, "-c", ENGINE_WITH_A_CHILD, str(port.port)], env=dict(os.environ),
        cwd=tmp_path / "s", log_path=tmp_path / "engine.log", cores=isolation.usable_cores(), port=port.port)
    try:
        exposed_port = int(first_line(tmp_path / "engine.log"))  # the child listens now
        assert proc.listens_on_port()
        assert proc.exposed_listeners() == [f"0.0.0.0:{exposed_port}"]
        report = proc.stop()
        assert report.survivors == [] and report.port_free
    finally:
        proc.stop()
        port.release()
