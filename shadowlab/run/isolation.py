"""Isolation of one engine process: cores, port, GPU devices, environment, log file cap.

Every shadowlab process on a machine shares one lock directory
(``$SHADOWLAB_LOCK_DIR``, default ``/tmp/shadowlab-locks``). A core, a GPU device or a port
is *leased* by holding an exclusive ``flock`` on ``core-<n>.lock`` / ``gpu-<n>.lock`` /
``port-<n>.lock`` in it. The kernel drops a flock when its holder dies, so a crashed or killed
shadowlab never leaves a stale lease behind, and two shadowlab runs started at
once on one machine can never hand the same core or port to two engines.

An engine's output goes straight to its log file (no pipe through shadowlab, which would
slow a fast-logging engine down and skew its timings); the kernel caps that file instead
(``RLIMIT_FSIZE``, `cap_file_size`), so a flooding engine cannot fill the disk however fast it
writes; its tail is read bounded (`read_log_tail`).

The engine process itself, in its own process group, is `process_group.EngineProcess`.
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
import threading
import time
from collections.abc import Iterable, Sequence
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


# ---------------------------------------------------------------------------- log file, port release


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
