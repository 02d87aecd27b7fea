"""One engine process in its own process group (`EngineProcess`), on the cores, port and devices
`isolation` leased it.

An engine runs in its own session (``start_new_session``), so it and anything it
forks form one process group that :meth:`EngineProcess.stop` signals as a whole
(TERM, bounded wait, KILL) and then verifies is gone, together with its port. What left the
group (``setsid``) is found by the engine's marker in its environment, or as a holder of the
engine's listening socket, and killed too; what cannot be killed is named (pid and command)
(`StopReport`, `ProcessSurvived`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from shadowlab.run import listeners
from shadowlab.run.isolation import (ENGINE_MARKER_ENV, ESCAPED_KILL_S, cap_file_size, new_marker, port_is_free,
                                     read_log_tail, wait_port_free)


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "localhost") or ip.startswith("::ffff:127.")


def _psutil_listeners(members: Iterable[psutil.Process]) -> list[listeners.Listener]:
    """listeners.listeners where there is no /proc (psutil's scan: slower, same answer)."""
    found = []
    for member in members:
        try:
            conns = member.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [listeners.Listener(c.laddr.ip, c.laddr.port, -1) for c in conns
                  if c.status == psutil.CONN_LISTEN and c.laddr]
    return found


class ProcessSurvived(Exception):
    """A process of a stopped engine's group is still alive, or its port is still bound."""


def _set_thread_affinity(cores: Iterable[int]) -> None:
    # pid 0 is the *calling thread* for sched_setaffinity on Linux.
    os.sched_setaffinity(0, set(cores))


_SPAWN_LOCK = threading.Lock()


def _spawn_pinned(
    argv: Sequence[str], cores: Sequence[int], **popen_kwargs: object
) -> subprocess.Popen[bytes]:
    """Popen with the child's affinity already set to ``cores`` when it execs.

    A forked child inherits the affinity of the thread that forked it, so the
    spawning thread narrows its own affinity around the fork. This is what a
    ``preexec_fn`` would do, without running Python in the child of a
    multi-threaded parent (which the subprocess docs warn can deadlock).
    """
    with _SPAWN_LOCK:
        previous = os.sched_getaffinity(0)
        _set_thread_affinity(cores)
        try:
            return subprocess.Popen(list(argv), **popen_kwargs)  # type: ignore[call-overload]
        finally:
            _set_thread_affinity(previous)


@dataclass
class StopReport:
    returncode: int | None
    signal_used: str  # "none" (had exited), "TERM" or "KILL"
    stop_ms: float
    survivors: list[int]
    port_free: bool
    # Who holds a listener on the port when it is still bound: pid -> command line. A holder of
    # the engine's own socket is a survivor too; another is a program that took the port since.
    port_holders: dict[int, str] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)  # survivor pid -> command line

    def problem(self) -> str | None:
        """What was left, with pids and commands (untrusted text: escaped where shown); None: all gone."""
        parts = [f"could not stop {_named(self.survivors, self.commands)}"] if self.survivors else []
        if not self.port_free:
            holders = _named(list(self.port_holders), self.port_holders) if self.port_holders \
                else "a process shadowlab may not see"
            parts.append(f"its port is still bound, held by {holders}")
        return "; ".join(parts) or None


def _named(pids: Sequence[int], commands: Mapping[int, str], shown: int = 5) -> str:
    """`pid 12 (python x.py), pid 13 (?)`, the first `shown` of them and how many more."""
    text = ", ".join(f"pid {pid} ({commands.get(pid) or '?'})" for pid in pids[:shown])
    return text + (f" and {len(pids) - shown} more" if len(pids) > shown else "")


class EngineProcess:
    """One engine process in its own process group, with its log going to a file."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        cores: Sequence[int],
        port: int,
        host: str = "127.0.0.1",
        max_log_bytes: int | None = None,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.host = host
        self.cores = tuple(cores)
        self.log_path = log_path
        cwd.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab", buffering=0)  # noqa: SIM115 - closed in stop()
        self.started_at = time.monotonic()
        # Inherited by everything the engine starts: finds a descendant that left the group
        # *and* the process tree (setsid, then its parent exited) when the engine is stopped.
        self.marker = new_marker()
        try:
            self.popen = _spawn_pinned(
                self.argv,
                self.cores,
                env={**env, ENGINE_MARKER_ENV: self.marker},
                cwd=str(cwd),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            self._log.close()
            raise
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the child leads a new session and group
        self.max_log_bytes = max_log_bytes
        if max_log_bytes is not None:
            cap_file_size(self.pid, max_log_bytes)
        # Descendants ever seen, as psutil handles: they check the process's creation
        # time, so a recycled pid is never mistaken for (or signalled as) one of ours.
        self._members: dict[int, psutil.Process] = {}
        self._remember(self.pid)
        # Inodes of the listening sockets the engine held on its port: a process holding one of
        # them after the stop holds the engine's own socket (inherited), whatever its environment.
        self._port_inodes: set[int] = set()
        self._stopped: StopReport | None = None
        self._stop_lock = threading.Lock()

    # -- observation -----------------------------------------------------------

    def poll(self) -> int | None:
        return self.popen.poll()

    def observed_affinity(self) -> list[int]:
        return sorted(psutil.Process(self.pid).cpu_affinity())

    def remember_members(self) -> None:
        """Record the engine's current descendants, so stop() can check them too."""
        if not listeners.available():
            try:
                children = psutil.Process(self.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for child in children:
                self._members.setdefault(child.pid, child)
            return
        for pid in listeners.descendants(self.pid):  # no scan of every process on the host
            if pid not in self._members or not self._members[pid].is_running():
                self._remember(pid)

    def remember_marked(self) -> None:
        """Record every process that carries this engine's marker in its environment."""
        if listeners.available():
            for pid, marker in listeners.environment_values(ENGINE_MARKER_ENV).items():
                if marker == self.marker and pid != os.getpid() and not self._is_member(pid):
                    self._remember(pid, lambda: listeners.environment_value(pid, ENGINE_MARKER_ENV) == self.marker)
            return
        uid = os.getuid()
        for proc in psutil.process_iter(["pid", "uids"]):
            try:
                uids = proc.info["uids"]
                if proc.pid == os.getpid() or proc.pid in self._members or (uids and uids.real != uid):
                    continue
                if proc.environ().get(ENGINE_MARKER_ENV) == self.marker:
                    self._members.setdefault(proc.pid, proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue

    def _remember(self, pid: int, still: Callable[[], bool] | None = None) -> None:
        """Hold ``pid`` as a member; with ``still``, only if it still says so once its handle (which
        pins its creation time) exists: the pid was found by a scan, and may have been recycled since."""
        try:
            member = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return
        if still is None or still():
            self._members[pid] = member

    def _is_member(self, pid: int) -> bool:
        known = self._members.get(pid)
        return known is not None and known.is_running()

    def group_members(self) -> list[int]:
        """Live processes in the engine's group, or that were ever seen as its descendants."""
        alive: list[int] = []
        for proc in psutil.process_iter(["pid"]):
            pid = proc.info["pid"]
            try:
                in_group = os.getpgid(pid) == self.pgid
            except (ProcessLookupError, PermissionError):
                continue
            if in_group or self._is_member(pid):
                try:
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(pid)
                except psutil.NoSuchProcess:
                    continue
        return alive

    def listening_sockets(self) -> list[listeners.Listener]:
        """Every listening TCP socket that the engine or a descendant holds (checked after every
        turn, so read from the kernel directly: shadowlab/run/listeners.py; psutil where /proc is absent)."""
        self.remember_members()
        alive = [pid for pid, member in list(self._members.items()) if member.is_running()]
        if not listeners.available():
            return _psutil_listeners(self._members[pid] for pid in alive)
        found = listeners.listeners(alive)
        self._port_inodes |= {entry.inode for entry in found if entry.port == self.port}
        return found

    def listens_on_port(self) -> bool:
        """True when the engine (or a descendant) holds a listening socket on its port.

        Guards against talking to some other program that took the port between our
        check and the engine's bind.
        """
        return any(entry.port == self.port for entry in self.listening_sockets())

    def exposed_listeners(self) -> list[str]:
        """`ip:port` of every listening socket of the engine (or a descendant) that is not on
        loopback: engines must bind to 127.0.0.1 only."""
        return sorted({entry.address() for entry in self.listening_sockets() if not _is_loopback(entry.ip)})

    def log_tail(self, max_bytes: int = 4000) -> str:
        return read_log_tail(self.log_path, max_bytes)

    def log_at_cap(self) -> bool:
        """True when the log has reached max_log_bytes: the engine can write no more to it."""
        if self.max_log_bytes is None:
            return False
        try:
            return self.log_path.stat().st_size >= self.max_log_bytes
        except FileNotFoundError:
            return False

    # -- stop --------------------------------------------------------------------

    def stop(self, grace_s: float = 5.0, port_wait_s: float = 5.0) -> StopReport:
        """TERM the group, wait up to grace_s, KILL what is left, then verify.

        Idempotent and thread-safe (an interrupted run stops every engine from the main
        thread while the cells' threads stop their own): a second caller waits for the
        first and gets its report. Raises ProcessSurvived when a member is still alive
        after KILL or the port is still bound after port_wait_s; the report is kept.
        """
        with self._stop_lock:
            if self._stopped is None:
                self._stop(grace_s, port_wait_s)
            assert self._stopped is not None
            problem = self._stopped.problem()
            if problem is not None:
                raise ProcessSurvived(f"engine pid {self.pid} on port {self.port}: {problem}")
            return self._stopped

    @property
    def stop_report(self) -> StopReport | None:
        return self._stopped

    def _stop(self, grace_s: float, port_wait_s: float) -> None:
        t0 = time.monotonic()
        self.listening_sockets()  # its descendants now, and the sockets they listen on
        self.remember_marked()
        signal_used = "none"
        if self.popen.poll() is None or self.group_members():
            signal_used = "TERM"
            self._signal_group(signal.SIGTERM)
            if not self._wait_group_gone(t0 + grace_s):
                signal_used = "KILL"
                self._signal_group(signal.SIGKILL)
                self._wait_group_gone(time.monotonic() + 5.0)
        self._kill_escaped(time.monotonic() + ESCAPED_KILL_S)
        try:
            self.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
        survivors = self.group_members()
        port_free = wait_port_free(self.port, time.monotonic() + port_wait_s, self.host)
        holders = {} if port_free else {pid: listeners.command_line(pid) for pid in self._port_holders()}
        self._stopped = StopReport(
            returncode=self.popen.returncode,
            signal_used=signal_used,
            stop_ms=(time.monotonic() - t0) * 1000.0,
            survivors=survivors,
            port_free=port_free,
            port_holders=holders,
            commands={pid: listeners.command_line(pid) for pid in survivors},
        )

    def _kill_escaped(self, deadline: float) -> None:
        """KILL what left the group and is alive once the group is gone: a descendant that called
        setsid() (found by its marker or as a holder of the engine's socket), also one forked at
        the stop itself (on SIGTERM), after the scans that came before the signal. Round after
        round, until two scans in a row find none: a killed process forks no more, and the next
        scan finds what it forked before. Two, because a scan lists the processes first and reads
        each one after: a parent that forks after the listing and exits before its read (a double
        fork's middle process) is missed, and its child is not listed yet; the next scan lists it."""
        clean = 0
        while clean < 2 and time.monotonic() < deadline:
            escaped = self._escaped()
            clean = 0 if escaped else clean + 1
            for member in escaped:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    member.send_signal(signal.SIGKILL)  # psutil refuses when the pid was recycled
            while any(_alive(m) for m in escaped) and time.monotonic() < deadline:
                time.sleep(0.005)

    def _escaped(self) -> list[psutil.Process]:
        """Live members other than the engine itself, after a fresh look for marked processes and,
        while the port is bound, for holders of the engine's listening socket (a process that
        overwrote its environment still holds that)."""
        self.remember_marked()
        if self._port_inodes and not port_is_free(self.port, self.host):
            for pid in listeners.socket_holders(self._port_inodes):
                if pid != os.getpid() and not self._is_member(pid):
                    self._remember(pid, lambda: bool(listeners.socket_inodes(pid) & self._port_inodes))
        return [m for pid, m in list(self._members.items()) if pid != self.pid and _alive(m)]

    def _port_holders(self) -> list[int]:
        """Processes holding a listener on the port (any address), ours or not."""
        if not listeners.available():
            return []
        return listeners.socket_holders({entry.inode for entry in listeners.on_port(self.port)})

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        # Descendants that left the group (setsid) still get the signal.
        for pid, member in list(self._members.items()):
            if pid == self.pid:
                continue
            try:
                member.send_signal(sig)  # psutil refuses when the pid was recycled
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass

    def _wait_group_gone(self, deadline: float) -> bool:
        while True:
            # Scanning every process is the expensive part: do it once the leader is gone
            # (reaped, so it does not linger as a zombie), or at the deadline.
            leader_gone = self.popen.poll() is not None
            if (leader_gone or time.monotonic() >= deadline) and not self.group_members():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005 if not leader_gone else 0.02)


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a killed orphan stays one until its new parent reaps it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
