"""Isolation of one engine process: cores, port, GPU devices, process group.

Every shadowlab process on a machine shares one lock directory
(``$SHADOWLAB_LOCK_DIR``, default ``/tmp/shadowlab-locks``). A core, a GPU device or a port
is *leased* by holding an exclusive ``flock`` on ``core-<n>.lock`` / ``gpu-<n>.lock`` /
``port-<n>.lock`` in it. The kernel drops a flock when its holder dies, so a crashed or killed
shadowlab never leaves a stale lease behind, and two shadowlab runs started at
once on one machine can never hand the same core or port to two engines.

An engine runs in its own session (``start_new_session``), so it and anything it
forks form one process group that :meth:`EngineProcess.stop` signals as a whole
(TERM, bounded wait, KILL) and then verifies is gone, together with its port. What left the
group (``setsid``) is found by the engine's marker in its environment, or as a holder of the
engine's listening socket, and killed too; what cannot be killed is named (pid and command).

An engine's output goes straight to its log file (no pipe through shadowlab, which would
slow a fast-logging engine down and skew its timings); the kernel caps that file instead
(``RLIMIT_FSIZE``), so a flooding engine cannot fill the disk however fast it writes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import psutil

from shadowlab.run import listeners

LOCK_DIR_ENV = "SHADOWLAB_LOCK_DIR"
DEFAULT_LOCK_DIR = Path("/tmp/shadowlab-locks")

# Ports are drawn below Linux's default ephemeral range (32768-60999) so that
# outgoing connections of other programs do not take them between the check and
# the engine's bind.
PORT_RANGE = range(20000, 32000)

# Set in every engine's environment to a value unique to that engine process: `<pid>:<start>:<random>`,
# the pid and creation time of the shadowlab that started it (reap_orphans: is that one gone?).
ENGINE_MARKER_ENV = "SHADOWLAB_ENGINE_MARKER"
_MARKER_RE = re.compile(r"(\d+):(\d+\.\d+):[0-9a-f]+\Z")
# Escaped processes are killed round after round (each round finds what the last one's forked
# before dying) for at most this long; what is still alive then is a survivor.
ESCAPED_KILL_S = 5.0

# Environment variables that make GPU runtimes see no device.
GPU_VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")

# Thread-count knobs of the common math libraries; set to the cell's core count so an
# engine does not oversubscribe its pinned cores.
THREAD_COUNT_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def lock_dir() -> Path:
    path = Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


class LeaseUnavailable(Exception):
    """No free core set or port right now (the caller waits or gives up)."""


class _Lease:
    """An exclusive, non-blocking flock on one file; released on release() or death."""

    def __init__(self, path: Path) -> None:
        # thread_local=False: a lease taken by a worker thread may be released by the
        # main thread when shadowlab is interrupted.
        self._lock = filelock.FileLock(str(path), timeout=0, thread_local=False)

    def try_acquire(self) -> bool:
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            return False
        return True

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


# ---------------------------------------------------------------------------- cores


def usable_cores() -> list[int]:
    """The cores this process may run on (its own affinity), in order."""
    return sorted(os.sched_getaffinity(0))


@dataclass
class CoreLease:
    """A cell's cores, and the GPU devices it leased with them (None: every GPU hidden)."""

    cores: tuple[int, ...]
    _leases: list[_Lease] = field(default_factory=list, repr=False)
    devices: tuple[int, ...] | None = None
    _device_leases: list[_Lease] = field(default_factory=list, repr=False)

    def claim(self, pid: int) -> None:
        """Note which engine runs on these cores (see reap_orphans)."""
        try:
            created = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            return
        data = json.dumps({"pid": pid, "create_time": created, "shadowlab_pid": os.getpid()})
        for core in self.cores:
            path = _claim_path(core)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(data)
            os.replace(tmp, path)

    def release(self) -> None:
        for core in self.cores if self._leases else ():
            _claim_path(core).unlink(missing_ok=True)
        for lease in [*self._leases, *self._device_leases]:
            lease.release()
        self._leases.clear()
        self._device_leases.clear()


def _claim_path(core: int) -> Path:
    return lock_dir() / f"core-{core}.claim"


def reap_orphans() -> list[int]:
    """Kill engines left behind by a shadowlab that died without stopping them (SIGKILL).

    A claim file names the engine running on a leased core. Its lease is a flock the
    kernel dropped when that shadowlab died, so a claim whose core lock we can take now
    is stale: its engine, if still alive (same pid *and* creation time), is an orphan
    holding a port and memory, and its process group is killed. lease_cores() does the
    same for each core it takes, so a stale claim is never overwritten unreaped.
    """
    reaped: list[int] = []
    for claim in sorted(lock_dir().glob("core-*.claim")):
        lease = _Lease(claim.with_suffix(".lock"))
        if not lease.try_acquire():
            continue  # a live shadowlab holds this core
        try:
            reaped += _reap_claim(claim)
        finally:
            lease.release()
    return reaped + [pid for pid in _reap_marked_orphans() if pid not in reaped]


def new_marker() -> str:
    """A marker for one engine: this shadowlab's pid and creation time, and 48 random bits."""
    return f"{os.getpid()}:{psutil.Process().create_time():.2f}:{random.getrandbits(48):x}"


def _marker_owner_alive(marker: str) -> bool | None:
    """Whether the shadowlab that wrote ``marker`` still runs (same pid, same creation time);
    None for a marker of another form (an older shadowlab's: not judged)."""
    match = _MARKER_RE.match(marker)
    if match is None:
        return None
    try:
        owner = psutil.Process(int(match.group(1)))
        return abs(owner.create_time() - float(match.group(2))) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError):
        return False


def _reap_marked_orphans() -> list[int]:
    """Kill every process carrying an engine marker whose shadowlab is gone: a descendant that
    escaped its engine's stop (setsid) and outlived the run, or the engines of a killed shadowlab
    whose claims are lost. Their shadowlab stops its engines before it exits, so nothing it
    marked may outlive it."""
    if not listeners.available():
        return []
    reaped = []
    for pid, marker in listeners.environment_values(ENGINE_MARKER_ENV).items():
        if pid == os.getpid() or _marker_owner_alive(marker) is not False:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            orphan = psutil.Process(pid)
            if listeners.environment_value(pid, ENGINE_MARKER_ENV) == marker:  # not a pid recycled since
                orphan.kill()  # psutil refuses when the pid was recycled after its creation time was read
                reaped.append(pid)
    return reaped


def _reap_claim(claim: Path) -> list[int]:
    """Kill the engine a stale claim names (caller holds the core's lock); drop the claim."""
    try:
        data = json.loads(claim.read_text())
        engine = psutil.Process(int(data["pid"]))
        if abs(engine.create_time() - float(data["create_time"])) >= 0.05:
            return []  # the pid was recycled: not our engine
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(engine.pid, signal.SIGKILL)  # it leads its own group
        engine.kill()
        return [engine.pid]
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError, ValueError, KeyError, TypeError):
        return []
    finally:
        claim.unlink(missing_ok=True)


def lease_cores(count: int, candidates: Sequence[int] | None = None) -> CoreLease:
    """Lease ``count`` cores no other cell (of any shadowlab on this machine) holds.

    Raises LeaseUnavailable when fewer are free now; raises ValueError when the
    machine (this process's affinity) has fewer cores than asked for at all.
    """
    pool = list(candidates) if candidates is not None else usable_cores()
    if count < 1 or count > len(pool):
        raise ValueError(f"cannot pin {count} cores: this process may use {len(pool)} ({pool})")
    directory = lock_dir()
    held: list[_Lease] = []
    cores: list[int] = []
    for core in pool:
        lease = _Lease(directory / f"core-{core}.lock")
        if lease.try_acquire():
            if _claim_path(core).exists():  # left by a shadowlab that was killed
                _reap_claim(_claim_path(core))
            held.append(lease)
            cores.append(core)
            if len(cores) == count:
                return CoreLease(tuple(cores), held)
    for lease in held:
        lease.release()
    raise LeaseUnavailable(f"fewer than {count} free cores among {pool}")


def lease_cell(cores: int, devices: int = 0, pool: Sequence[int] | None = None) -> CoreLease:
    """``cores`` cores and, with a device ``pool``, ``devices`` of its GPU devices, all or none:
    a cell never starts on a device another cell (of any shadowlab on the host) holds.
    LeaseUnavailable when either is all held now; ValueError when the pool is too small."""
    lease = lease_cores(cores)
    if pool is None:
        return lease
    try:
        lease.devices, lease._device_leases = _lease_devices(devices, pool)
    except BaseException:
        lease.release()
        raise
    return lease


def _lease_devices(count: int, pool: Sequence[int]) -> tuple[tuple[int, ...], list[_Lease]]:
    if count < 1 or count > len(pool):
        raise ValueError(f"cannot lease {count} GPU devices from the {len(pool)} of isolation.gpu ({list(pool)})")
    held: list[_Lease] = []
    chosen: list[int] = []
    for device in pool:
        lease = _Lease(lock_dir() / f"gpu-{device}.lock")
        if lease.try_acquire():
            held.append(lease)
            chosen.append(device)
            if len(held) == count:
                return tuple(chosen), held
    for lease in held:
        lease.release()
    raise LeaseUnavailable(f"fewer than {count} free GPU devices among {list(pool)}")


def wait_for_cores(count: int, deadline: float, stop: threading.Event | None = None,
                   devices: int = 0, pool: Sequence[int] | None = None) -> CoreLease:
    """Poll lease_cell until it succeeds, the monotonic deadline passes, or stop is set."""
    while True:
        try:
            return lease_cell(count, devices, pool)
        except LeaseUnavailable:
            if time.monotonic() >= deadline:
                raise
            if stop is not None and stop.wait(0.05):
                raise
            if stop is None:
                time.sleep(0.05)


# ---------------------------------------------------------------------------- ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could bind host:port now.

    SO_REUSEADDR mirrors what HTTP servers set, so a port whose old connections sit
    in TIME_WAIT counts as free (the engine will be able to bind it).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


@dataclass
class PortLease:
    port: int
    _lease: _Lease | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def lease_port(host: str = "127.0.0.1", exclude: Iterable[int] = ()) -> PortLease:
    """Lease a port that no shadowlab holds and that is free to bind now.

    The choice is made under the machine-wide ``ports.lock`` so two shadowlab
    processes never test and take the same candidate at once; the per-port lease
    then keeps it ours until the engine is stopped.
    """
    directory = lock_dir()
    skip = set(exclude)
    candidates = [p for p in PORT_RANGE if p not in skip]
    random.Random().shuffle(candidates)
    tried = candidates[:500]
    try:
        with filelock.FileLock(str(directory / "ports.lock"), timeout=30):
            for port in tried:
                lease = _Lease(directory / f"port-{port}.lock")
                if not lease.try_acquire():
                    continue
                if port_is_free(port, host):
                    return PortLease(port, lease)
                lease.release()
    except filelock.Timeout:
        raise LeaseUnavailable(f"{directory / 'ports.lock'} held by another process for 30 s") from None
    raise LeaseUnavailable(f"no free port on {host}: {len(tried)} candidates in "
                           f"{min(PORT_RANGE)}-{max(PORT_RANGE)} are all bound or leased")


# ---------------------------------------------------------------------------- GPU


def gpu_env(devices: int | Sequence[int] | None) -> dict[str, str]:
    """Visibility variables: all empty (no GPU) or naming the cell's device indices ("0,1")."""
    if devices is None:
        value = ""
    elif isinstance(devices, int):
        value = str(devices)
    else:
        value = ",".join(map(str, devices))
    return {name: value for name in GPU_VISIBILITY_VARS}


def thread_env(threads: int) -> dict[str, str]:
    return {name: str(threads) for name in THREAD_COUNT_VARS}


# ---------------------------------------------------------------------------- process


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


def cap_file_size(pid: int, limit: int) -> None:
    """RLIMIT_FSIZE on a started process: the kernel refuses its writes past ``limit`` bytes of
    any file (a short write up to the limit, then EFBIG, or SIGXFSZ for a program that does not
    ignore it). Set right after the spawn, so it holds for all the engine writes and forks."""
    with contextlib.suppress(ProcessLookupError):
        _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        limit = min(limit, 1 << 62) if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))


def wait_port_free(port: int, deadline: float, host: str = "127.0.0.1") -> bool:
    while True:
        if port_is_free(port, host):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def read_log_tail(path: Path, max_bytes: int = 4000) -> str:
    """The last max_bytes of a log as text (engine output is data: bad bytes replaced)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            # At most max_bytes: the engine may still be writing (a flood without newline), and
            # a read to the end of the file would chase it and hold all it writes.
            return fh.read(max_bytes).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


ADDRESS_IN_USE_MARKERS = ("address already in use", "address in use", "couldn't bind", "eaddrinuse")


def log_says_address_in_use(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in ADDRESS_IN_USE_MARKERS)
