"""The run stage: matrix → plan → one fresh, isolated engine process per cell → records.

``run(options)`` is a short sequence of named steps (nox's habit)::

    load_matrix → build_plan → open_run_dir → write_run_records
      → prepare_engines → materialize_prompts → run_cells

Only this module (with ``isolation`` and ``engines``) touches processes and
sockets; everything after it reads the run directory. A cell's life is in
:class:`CellRunner`: lease cores and a port, spawn the engine pinned and hidden
from GPUs, wait until ready, send the turns, stop the engine's whole process
group, verify it is gone and its port is free, write ``meta.json`` atomically.

Interruption (SIGINT, SIGTERM) raises :class:`Interrupted` in the main thread; the
run stops every live engine, lets running cells record ``aborted``, and re-raises
(the CLI exits 130 / 143). ``--resume`` then reruns every cell not ``ok``. The machine
failing the run (no free port, the run directory full or read-only) stops it the same way
with an :class:`InfrastructureError` (exit 3), the aborted cells saying why.

One shadowlab at a time per run directory: ``RUN_DIR/.shadowlab.lock`` is flock'd for the
whole run, and ``options.json`` keeps the options that change results, which a resume must
repeat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from shadowlab.run import environment, isolation, prompts
from shadowlab.results import records
from shadowlab import matrix as matrix_module
from shadowlab import plan as plan_module
from shadowlab.results import rundir
from shadowlab.plan import shard as shard_module
from shadowlab.run import split_controls, streamed
from shadowlab.engines import EngineAdapter, EngineIdentity, TurnRequest, get_adapter
from shadowlab.errors import (
    EngineCrashError,
    EngineError,
    EngineStartError,
    InfrastructureError,
    ProtocolError,
    RunDirError,
)
from shadowlab.run.isolation import EngineProcess
from shadowlab.matrix import ChatPrompt, EngineSpec, Matrix, TrafficSequence
from shadowlab.plan import Cell, Plan, Turn
from shadowlab.run.prompts import MaterializedPrompt, tokens_sha256
from shadowlab.results.records import CellMeta, CellStatus, RunLayout

# Bounds on waiting for the engine's log after an answer (the `prompt eval time` line is
# written just before or after the HTTP response; it is normally there within milliseconds).
LOG_SPAN_WAIT_S = 5.0
# Bounded repetitions: a match is at most SPAN_OVERLAP bytes, so a span is read in chunks that
# overlap by that much and nothing of an engine's log is ever held whole (it may be one line
# of a gigabyte).
PROMPT_EVAL_RE = re.compile(rb"prompt eval time\s{0,16}=")
TASK_ID_RE = re.compile(rb"\| task (\d{1,18}) \|")
SPAN_CHUNK = 1 << 20
SPAN_OVERLAP = 64
PORT_ATTEMPTS = 3
DEFAULT_REQUEST_TIMEOUT_S = 300.0
CRASH_WAIT_S = 1.0  # after a broken connection, how long to wait for the engine's exit status
MAX_RESPONSE_BYTES = 64 << 20  # an answer larger than this is an engine error, not a record
# Exit statuses an engine may end with when shadowlab stops it: anything else (or exiting
# before it was stopped) is the engine's own doing, and fails its cell.
STOPPED_EXITS = {"TERM": {0, -signal.SIGTERM, 128 + signal.SIGTERM},
                 "KILL": {0, -signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGKILL}}
# Errors of the machine, not of shadowlab, when it writes the run directory (records.py: the
# one mapping of a failed write, shared with every writer of derived files).
STORAGE_ERRNOS = records.STORAGE_ERRNOS
RESUME_HINT = "free space or choose a writable --out, then rerun with --resume"
INTERRUPTED_REASON = "shadowlab was interrupted; rerun with --resume"


class ResponseTooLarge(Exception):
    pass


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; engines are being stopped. Exit code 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


@dataclass(frozen=True)
class RunOptions:
    matrix_path: Path
    out: Path | None = None
    resume: bool = False
    dry_run: bool = False
    jobs: int | None = None  # None: the matrix's isolation.jobs
    faults: tuple[str, ...] = ()  # --fault: each cell gets its adapter's fault_flags for them
    request_timeout_s: float | None = None  # --request-timeout; None: DEFAULT_REQUEST_TIMEOUT_S
    shard: shard_module.ShardSpec | None = None  # --shard I/N: run only that shard's cells
    reports_dir: Path = Path("reports")
    model_cache: Path = Path("models")
    progress: Callable[[str], None] | None = None  # default: a line on stderr


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path | None
    statuses: Mapping[str, CellStatus] = field(default_factory=dict)

    @property
    def all_ran(self) -> bool:
        return all(s is CellStatus.OK for s in self.statuses.values())


# ================================================================ the steps


def run(options: RunOptions) -> RunOutcome:
    matrix = load_matrix(options.matrix_path)
    plan = build_plan(matrix)
    say = options.progress or _stderr_line
    matrix_module.check_machine(matrix, cores=len(isolation.usable_cores()), warn=say if options.dry_run else None)
    assignment = shard_module.assign(plan, matrix, options.shard.count) if options.shard else None
    if options.dry_run:
        print(assignment.describe(plan, mark=options.shard.index) if assignment else plan.describe())
        return RunOutcome(None)
    whole, plan = plan, assignment.part(plan, options.shard.index) if assignment else plan
    with storage_errors():
        layout = open_run_dir(options, matrix)
        with lock_run_dir(layout, resume=options.resume):
            write_run_records(layout, matrix, plan, options)
            say(f"shadowlab: run directory {layout.root}")
            with RunContext(layout, matrix, options, say) as ctx:
                prepare_engines(ctx)
                if assignment is not None:
                    write_shard_record(ctx, whole, assignment)
                materialize_prompts(ctx)
                statuses = run_cells(ctx, plan)
    return RunOutcome(layout.root, statuses)


def load_matrix(path: Path) -> Matrix:
    return matrix_module.load(path)


def build_plan(matrix: Matrix) -> Plan:
    return plan_module.build_plan(matrix)


def open_run_dir(options: RunOptions, matrix: Matrix) -> RunLayout:
    """The run directory: new, or an existing one with --resume; anything else is refused."""
    if options.out is not None:
        root = options.out
    else:
        if options.resume:
            raise RunDirError("--resume needs --out (the run directory to resume)", path=".")
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        root = records.child_dir(options.reports_dir, f"{matrix.name}-{stamp}")
        suffix = 1
        while root.exists():  # two runs started within the same second
            suffix += 1
            root = records.child_dir(options.reports_dir, f"{matrix.name}-{stamp}-{suffix}")
    layout = RunLayout(root)
    if root.exists() and not root.is_dir():
        raise InfrastructureError(f"{root}: the run directory is not a directory",
                                  hint="choose another --out")
    check_run_dir(layout, resume=options.resume)
    root.mkdir(parents=True, exist_ok=True)
    return layout


def check_run_dir(layout: RunLayout, *, resume: bool, locked: bool = False) -> None:
    """A new run needs an empty directory, a resume one with a plan.json; neither one that
    another shadowlab is running in (``locked``: this process holds the lock)."""
    root = layout.root
    holder = None if locked else _lock_holder(layout)
    if holder is not None:
        raise _in_use(layout, holder)
    exists = root.is_dir() and any(p.name != layout.lock.name for p in root.iterdir())
    if exists and not resume:
        raise RunDirError(
            "the run directory already exists and is not empty",
            path=str(root),
            hint="pass --resume to finish that run, or choose another --out",
        )
    if resume and not layout.plan.exists():
        raise RunDirError("nothing to resume: no plan.json", path=str(root),
                          hint="start the run without --resume")


@contextlib.contextmanager
def lock_run_dir(layout: RunLayout, *, resume: bool) -> Iterator[None]:
    """Hold an exclusive flock on RUN_DIR/.shadowlab.lock for the whole run.

    Two shadowlab in one directory would run the same cells and overwrite each other's
    records; the second is refused at once, naming the first's pid. The kernel drops the
    lock when its holder dies (kill -9 included), so it is never stale. The file is left in
    place: unlinking it would let a third process lock a fresh file while the second still
    holds the old one.
    """
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(layout, os.pread(fd, 32, 0)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        check_run_dir(layout, resume=resume, locked=True)  # again, now that no other run can
        yield
    finally:
        os.close(fd)  # drops the flock


def _lock_holder(layout: RunLayout) -> bytes | None:
    """What the lock file says when another process holds it (its pid), else None."""
    try:
        fd = os.open(layout.lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None  # free (closing the fd below releases it)
    except BlockingIOError:
        return os.pread(fd, 32, 0)
    finally:
        os.close(fd)


def _in_use(layout: RunLayout, holder: bytes) -> RunDirError:
    pid = holder.decode("ascii", "replace").strip()
    return RunDirError(f"another shadowlab (pid {pid if pid.isdigit() else 'unknown'}) is running in "
                       "this run directory", path=str(layout.root),
                       hint="wait for it to end (or stop it), then --resume")


def storage_errors() -> contextlib.AbstractContextManager[None]:
    """The run directory (or the disk under it) failing a write is the machine's failure:
    one line naming the file and the cause, exit 3, never a traceback."""
    return records.storage_errors(RESUME_HINT)


def storage_failure(exc: OSError) -> InfrastructureError:
    return records.storage_failure(exc, RESUME_HINT)


def request_timeout(given: float | None) -> float:
    """The seconds a turn may take: --request-timeout, else the default (one value however spelled)."""
    return DEFAULT_REQUEST_TIMEOUT_S if given is None else float(given)


def result_options(options: RunOptions) -> dict[str, Any]:
    """The options that change what a run measures, as they take effect: a resume must repeat them."""
    shard = {"shard": str(options.shard)} if options.shard else {}  # a whole run's file stays as it was
    return {"faults": list(options.faults), "request_timeout_s": request_timeout(options.request_timeout_s),
            **shard}


def write_run_records(layout: RunLayout, matrix: Matrix, plan: Plan, options: RunOptions) -> None:
    resolved = yaml.safe_dump(matrix.to_dict(), sort_keys=False, allow_unicode=True)
    if options.resume:
        if layout.matrix.read_text(encoding="utf-8") != resolved:
            raise RunDirError(
                "the matrix changed since this run started; its cells would not be comparable",
                path=str(layout.root),
                hint="resume with the same matrix, or start a new run",
            )
        check_resumed_options(layout, result_options(options))
        return
    records.write_bytes_atomic(layout.matrix, resolved.encode("utf-8"))
    records.write_json_atomic(layout.options, result_options(options))  # before plan.json:
    records.write_json_atomic(layout.plan, plan.to_dict())  # a resumable run always has both
    records.write_json_atomic(layout.environment, environment.capture())


def check_resumed_options(layout: RunLayout, now: dict[str, Any]) -> None:
    """--resume with other --fault or --request-timeout would mix two experiments: refuse."""
    try:
        then = records.read_json(layout.options)
    except (RunDirError, OSError, ValueError):
        then = None
    if not isinstance(then, dict):
        raise RunDirError("no readable options.json: the --fault and --request-timeout this run "
                          "started with are unknown", path=str(layout.root),
                          hint="start a new run")
    if then.get("request_timeout_s") is None:  # written before options.json held the timeout in effect
        then = {**then, "request_timeout_s": request_timeout(None)}
    flags = {"faults": "--fault", "request_timeout_s": "--request-timeout", "shard": "--shard"}
    changed = [f"{flag} {_shown(then.get(key))} then, {_shown(now.get(key))} now"
               for key, flag in flags.items() if then.get(key) != now.get(key)]
    if changed:
        raise RunDirError(f"options changed since this run started ({'; '.join(changed)}); its "
                          "cells would not be comparable", path=str(layout.root),
                          hint="resume with the options it started with, or start a new run")


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "not given"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def prepare_engines(ctx: RunContext) -> None:
    """Adapter per engine; locate/build/hash binary and model (generated once, cached).

    An engine that cannot be prepared is recorded as unavailable: its cells are skipped
    with the reason, the other engines' cells still run.
    """
    for name, spec in ctx.matrix.engines.items():
        try:
            adapter = get_adapter(spec.kind)
            identity = adapter.prepare(spec, ctx.options.model_cache)
        except Exception as exc:  # noqa: BLE001 - adapters are pluggable; report, go on
            ctx.unavailable[name] = f"engine {name!r} could not be prepared: {type(exc).__name__}: {exc}"
            ctx.say(f"shadowlab: {ctx.unavailable[name]}")
            continue
        ctx.engines[name] = PreparedEngine(spec, adapter, identity)
    if ctx.options.resume:
        check_resumed_identity(ctx)


def check_resumed_identity(ctx: RunContext) -> None:
    """--resume with another engine binary or model would mix two experiments: refuse."""
    first: dict[str, records.EngineRecord] = {}
    for path in sorted(ctx.layout.cells_dir.glob("*/meta.json")) if ctx.layout.cells_dir.is_dir() else ():
        try:
            meta = records.read_meta(path)
        except (RunDirError, OSError, ValueError, TypeError):
            continue
        if meta.engine is not None:
            first.setdefault(meta.engine.name, meta.engine)
    for name, engine in ctx.engines.items():
        before = first.get(name)
        if before is None:
            continue
        for what, old, new in records.EngineBuild.of(before).changes(records.EngineBuild.of(engine.identity)):
            raise RunDirError(
                f"engine {name!r}: the {what} changed since this run started "
                f"(sha256 {old[:12] or 'none'} then, {new[:12] or 'none'} now); "
                "its cells would not be comparable",
                path=str(ctx.layout.root), hint="resume with the same engine and model, or start a new run")


def write_shard_record(ctx: RunContext, whole: Plan, assignment: shard_module.Assignment) -> None:
    """shard.json: what this part is a part of (DESIGN §8); a resumed part must be the same."""
    assert ctx.options.shard is not None
    identities = shard_module.engine_identities(ctx.engines, list(ctx.matrix.engines))
    now = shard_module.record_for(ctx.options.shard, assignment, whole, ctx.matrix,
                                  rundir.read_matrix_bytes(ctx.layout.root), identities)
    path = ctx.layout.root / rundir.SHARD_NAME
    if ctx.options.resume and path.exists():
        shard_module.check_resumed(rundir.read_shard(ctx.layout.root), now, str(path))
        return
    records.write_json_atomic(path, now.to_dict())


def materialize_prompts(ctx: RunContext) -> None:
    """Exact token prompts per engine, tokenized by that engine; reused on --resume."""
    for name, engine in ctx.engines.items():
        path = ctx.layout.prompts(name)
        if path.exists():
            engine.prompts = prompts.load(path)
            continue
        traffic = [s for s in ctx.matrix.sequences.values() if isinstance(s, TrafficSequence)]
        if not traffic and all(isinstance(spec, ChatPrompt) for spec in ctx.matrix.prompts.values()):
            prompts.save({}, path)  # chat only: messages are sent as text, nothing to tokenize
            continue
        log_path = ctx.layout.prompts_log(name)
        try:
            with ctx.cores(1) as cores, ctx.serving(engine, cores, cell_flags=(), cell_env={},
                                                   log_path=log_path) as live:
                engine.prompts = prompts.materialize(ctx.matrix.prompts, live.tokenize)
                for sequence in traffic:
                    engine.prompts.update(prompts.materialize_traffic(sequence, live.tokenize))
        except (EngineError, httpx.HTTPError, ValueError, ResponseTooLarge) as exc:
            hint = f" (kind {engine.spec.kind}: {engine.adapter.tokenize_hint})" \
                if engine.adapter.tokenize_hint else ""
            ctx.unavailable[name] = f"prompts could not be tokenized: {exc}{hint}"
            ctx.say(f"shadowlab: engine {name!r}: {ctx.unavailable[name]}")
            continue
        except isolation.ProcessSurvived as exc:
            ctx.unavailable[name] = f"the engine process that tokenized its prompts could not be stopped: {exc}"
            ctx.say(f"shadowlab: engine {name!r}: {ctx.unavailable[name]}")
            continue
        finally:
            shutil.rmtree(log_path.parent / RunLayout.SCRATCH, ignore_errors=True)
        prompts.save(engine.prompts, path)


def run_cells(ctx: RunContext, plan: Plan) -> dict[str, CellStatus]:
    statuses = CellScheduler(ctx, plan).run()
    return {**statuses, **run_split_controls(ctx, plan)}


def run_split_controls(ctx: RunContext, plan: Plan) -> dict[str, CellStatus]:
    """Issue 16: the split controls the finished warm cells call for (DESIGN §5), appended to
    plan.json before they start, so a resumed or loaded run directory knows them."""
    extra = split_controls.plan_cells(ctx.layout.root, ctx.matrix, plan)
    if not extra:
        return {}
    written = Plan.from_dict(records.read_json(ctx.layout.plan))
    known = {c.id for c in written.cells}
    cells = (*written.cells, *(c for c in extra if c.id not in known))
    records.write_json_atomic(ctx.layout.plan, Plan(cells).to_dict())
    ctx.say(f"shadowlab: {len(extra)} split control(s) for restored warm turns")
    return CellScheduler(ctx, Plan(tuple(extra))).run()


# ================================================================ run context


@dataclass
class PreparedEngine:
    spec: EngineSpec
    adapter: EngineAdapter
    identity: EngineIdentity
    prompts: dict[str, MaterializedPrompt] = field(default_factory=dict)


class RunContext:
    """What the cells of one run share: matrix, layout, engines, live processes, stop flag."""

    def __init__(self, layout: RunLayout, matrix: Matrix, options: RunOptions,
                 say: Callable[[str], None]) -> None:
        self.layout = layout
        self.matrix = matrix
        self.options = options
        self.say = say
        self.engines: dict[str, PreparedEngine] = {}
        self.unavailable: dict[str, str] = {}  # engine name -> why its cells cannot run
        self.stop = threading.Event()
        self.stop_reason = INTERRUPTED_REASON  # what the cells aborted by `stop` record
        self._live: set[EngineProcess] = set()
        self._live_lock = threading.Lock()
        self._previous_handlers: dict[int, Any] = {}

    # -- interruption ------------------------------------------------------------------

    def __enter__(self) -> RunContext:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        reaped = isolation.reap_orphans()
        if reaped:
            self.say(f"shadowlab: killed {len(reaped)} engine(s) left behind by a killed shadowlab: "
                     f"pids {', '.join(map(str, reaped))}")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop.set()
        try:
            self.stop_all()
        finally:
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Further signals during cleanup must not cut the cleanup short.
        for sig in self._previous_handlers:
            signal.signal(sig, signal.SIG_IGN)
        self.stop.set()
        raise Interrupted(signum)

    def halt(self, reason: str) -> None:
        """Stop the run for a reason other than a signal (the machine failed it)."""
        if not self.stop.is_set():
            self.stop_reason = f"the run stopped: {reason}; rerun with --resume once it is fixed"
        self.stop.set()

    @property
    def max_log_bytes(self) -> int:
        return self.matrix.isolation.max_log_mib << 20

    # -- live engines --------------------------------------------------------------------

    def track(self, proc: EngineProcess) -> None:
        with self._live_lock:
            self._live.add(proc)

    def untrack(self, proc: EngineProcess) -> None:
        with self._live_lock:
            self._live.discard(proc)

    def stop_all(self) -> None:
        with self._live_lock:
            live = list(self._live)
        for proc in live:
            with contextlib.suppress(isolation.ProcessSurvived):
                proc.stop()

    # -- resources -----------------------------------------------------------------------

    @property
    def device_request(self) -> tuple[int, tuple[int, ...] | None]:
        """(devices per cell, the pool) every engine process of this run leases with its cores."""
        return self.matrix.isolation.gpus_per_cell, self.matrix.isolation.devices

    @contextlib.contextmanager
    def cores(self, count: int) -> Iterator[isolation.CoreLease]:
        try:
            lease = isolation.wait_for_cores(count, time.monotonic() + 3600, self.stop,
                                             *self.device_request)
        except isolation.LeaseUnavailable as exc:
            if self.stop.is_set():
                raise
            raise InfrastructureError(f"no {count} free cores within an hour: {exc}",
                                      hint="another shadowlab holds them; rerun with --resume") from None
        try:
            yield lease
        finally:
            lease.release()

    @contextlib.contextmanager
    def serving(self, engine: PreparedEngine, cores: isolation.CoreLease, *,
                cell_flags: Sequence[str], cell_env: Mapping[str, str],
                log_path: Path, scratch: Path | None = None) -> Iterator[LiveEngine]:
        live = start_engine(self, engine, cores, cell_flags=cell_flags, cell_env=cell_env,
                            log_path=log_path, scratch=scratch or log_path.parent / RunLayout.SCRATCH)
        try:
            yield live
        finally:
            live.close()


# ================================================================ one engine process


@dataclass
class LiveEngine:
    """A started, ready engine: its process, port lease, HTTP client and what it reported."""

    ctx: RunContext
    engine: PreparedEngine
    proc: EngineProcess
    port: isolation.PortLease
    client: httpx.Client
    command: list[str]
    env_delta: dict[str, str]
    attempts: int
    started_at: str
    health_ms: float
    startup_ms: float
    props: dict[str, Any] = field(default_factory=dict)
    stop_report: isolation.StopReport | None = None

    def tokenize(self, text: str) -> list[int]:
        return self.engine.adapter.tokenize(self.client, text)

    def close(self) -> isolation.StopReport | None:
        """Stop the group and verify it is gone; idempotent."""
        if self.stop_report is None:
            self.client.close()
            try:
                self.stop_report = self.proc.stop()
            except isolation.ProcessSurvived:
                self.stop_report = self.proc.stop_report
                raise
            finally:
                self.ctx.untrack(self.proc)
                self.port.release()
        return self.stop_report


def controlled_env_names(matrix: Matrix) -> set[str]:
    """Variables the matrix sets somewhere: a cell gets them only from its own delta."""
    names = {"SHADOWLAB_ENGINE_FAULTS", *isolation.GPU_VISIBILITY_VARS, *isolation.THREAD_COUNT_VARS}
    for spec in matrix.engines.values():
        names.update(spec.env)
    for conf in matrix.configurations.values():
        names.update(conf.env)
    return names


def cell_environment(ctx: RunContext, engine: PreparedEngine, cell_env: Mapping[str, str],
                     threads: int, devices: Sequence[int] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(full env, delta): shadowlab's env minus matrix-controlled names, plus the cell's delta
    (the GPU devices its lease holds visible, no other)."""
    delta = engine.adapter.env(engine.spec, cell_env)
    delta |= isolation.gpu_env(devices) | isolation.thread_env(threads)
    base = {k: v for k, v in os.environ.items() if k not in controlled_env_names(ctx.matrix)}
    return base | delta, delta


def start_engine(ctx: RunContext, engine: PreparedEngine, cores: isolation.CoreLease, *,
                 cell_flags: Sequence[str], cell_env: Mapping[str, str],
                 log_path: Path, scratch: Path) -> LiveEngine:
    """Spawn pinned on ``cores`` and wait until ready; a port taken under us is retried."""
    threads = min(engine.spec.threads, len(cores.cores))
    flags = [*cell_flags, *engine.adapter.fault_flags(ctx.options.faults)]
    env, delta = cell_environment(ctx, engine, cell_env, threads, cores.devices)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            port = isolation.lease_port()
        except isolation.LeaseUnavailable as exc:
            raise InfrastructureError(f"no loopback port for an engine: {exc}",
                                      hint="free some ports (or stop what holds them), then rerun "
                                           "with --resume") from None
        argv = engine.adapter.command(engine.spec, flags, port.port, threads, log_path)
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        try:
            proc = EngineProcess(argv, env=env, cwd=scratch, log_path=log_path, cores=cores.cores,
                                 port=port.port, max_log_bytes=ctx.max_log_bytes)
        except OSError as exc:
            port.release()
            if exc.errno in STORAGE_ERRNOS and exc.filename != argv[0]:
                raise storage_failure(exc) from None  # its log or scratch, not its binary
            raise EngineStartError(f"cannot start {argv[0]!r}: {exc}", engine=engine.spec.name) from None
        ctx.track(proc)
        cores.claim(proc.pid)
        # verify=False: plain HTTP on loopback, no TLS; the default loads the CA bundle (~39 ms a
        # cell, counted in the engine's start-up since the first /health poll waits for it).
        client = httpx.Client(base_url=f"http://127.0.0.1:{port.port}", timeout=10.0,
                              transport=DeadlineTransport(verify=False))
        live = LiveEngine(ctx, engine, proc, port, client, argv, delta, attempt, started_at, 0.0, 0.0)
        try:
            wait_ready(live, engine.spec.ready_timeout_s)
            return live
        except EngineStartError as exc:
            retry = attempt < PORT_ATTEMPTS and isolation.log_says_address_in_use(proc.log_tail())
            with contextlib.suppress(isolation.ProcessSurvived):
                live.close()
            if not retry:
                exc.failed_start = live  # type: ignore[attr-defined] - for the cell's record
                raise exc from None
        except BaseException:
            with contextlib.suppress(isolation.ProcessSurvived):
                live.close()
            raise
    raise AssertionError("unreachable")


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's read timeout bounds each read: an answer trickled a byte at a time never trips
    it. Here the read timeout bounds the status line and headers, and then the whole body
    (an engine's answer is untrusted; it may never end)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        if timeout is None:
            return super().handle_request(request)
        deadline = time.monotonic() + float(timeout)
        response = _within(float(timeout), lambda: super(DeadlineTransport, self).handle_request(request))
        response.stream = _DeadlineStream(response.stream, deadline)
        return response


def _within(seconds: float, call: Callable[[], httpx.Response]) -> httpx.Response:
    """call() in a daemon thread, given up after `seconds`. A blocked socket read cannot be
    interrupted from here; the abandoned thread ends when the cell stops its engine (the
    socket closes), which every timed-out request leads to."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["response"] = call()
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="engine-request", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise httpx.ReadTimeout("the engine's status line and headers did not arrive in time")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["response"]


class _DeadlineStream(httpx.SyncByteStream):
    def __init__(self, stream: Any, deadline: float) -> None:
        self._stream, self._deadline = stream, deadline

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            if time.monotonic() > self._deadline:
                raise httpx.ReadTimeout("the answer did not end in time")
            yield chunk

    def close(self) -> None:
        self._stream.close()


def wait_ready(live: LiveEngine, timeout_s: float) -> None:
    """Ready = /health 200, the engine itself listening on its port, and the kind's own ready
    probe answered (`adapter.ready_probe`: one /tokenize by default, GET /v1/models for openai)."""
    proc, name = live.proc, live.engine.spec.name
    deadline = proc.started_at + timeout_s
    # Each /health poll costs the engine CPU on its pinned core while it loads: start
    # fast (a quick engine is ready in ms) and back off to 25 ms (at most ~12 ms late).
    interval = 0.002
    while True:
        if live.ctx.stop.is_set():
            raise EngineStartError("run interrupted during start-up", engine=name)
        code = proc.poll()
        if code is not None:
            raise EngineStartError(f"engine exited with code {code} during start-up", engine=name,
                                   log_tail=_tail_lines(proc))
        with contextlib.suppress(httpx.TransportError):
            if live.client.get("/health", timeout=2.0).status_code == 200:
                break
        if time.monotonic() >= deadline:
            raise EngineStartError(f"not ready after {timeout_s:g} s (/health never answered 200)",
                                   engine=name, log_tail=_tail_lines(proc))
        time.sleep(interval)
        interval = min(interval * 1.5, 0.025)
    live.health_ms = (time.monotonic() - proc.started_at) * 1000.0
    code = proc.poll()
    if code is not None:
        raise EngineStartError(f"engine exited with code {code} right after /health answered",
                               engine=name, log_tail=_tail_lines(proc))
    exposed = proc.exposed_listeners()
    if exposed:
        raise EngineStartError(f"engine listens beyond loopback on {', '.join(exposed)}; engines must "
                               "bind to 127.0.0.1 only (refused)", engine=name, log_tail=_tail_lines(proc))
    if not proc.listens_on_port():
        raise EngineStartError(f"port {live.port.port} answers, but not from the engine's process",
                               engine=name, log_tail=_tail_lines(proc))
    try:  # the kind's own probe (default: one /tokenize; openai: GET /v1/models)
        live.engine.adapter.ready_probe(live.client)
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineStartError(f"ready probe failed: {exc}", engine=name,
                               log_tail=_tail_lines(proc)) from None
    live.startup_ms = (time.monotonic() - proc.started_at) * 1000.0
    with contextlib.suppress(httpx.HTTPError, ValueError):
        live.props = live.engine.adapter.props(live.client)


def _tail_lines(proc: EngineProcess, count: int = 20) -> list[str]:
    return proc.log_tail().splitlines()[-count:]


# ================================================================ cells


class CellScheduler:
    """Runs the plan's cells, ``jobs`` at a time, each on its own leased cores."""

    def __init__(self, ctx: RunContext, plan: Plan) -> None:
        self.ctx = ctx
        self.plan = plan
        self.jobs = ctx.options.jobs or ctx.matrix.isolation.jobs
        self.statuses: dict[str, CellStatus] = {}
        self.durations: list[float] = []

    def run(self) -> dict[str, CellStatus]:
        pending = self._pending()
        total = len(self.plan.cells)
        running: dict[Future[CellStatus], tuple[Cell, isolation.CoreLease, float]] = {}
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="cell") as pool:
            try:
                while pending or running:
                    waiting_for_cores = self._start_ready_cells(pending, running, pool, total)
                    if not running:
                        if waiting_for_cores:  # cores held by another shadowlab: poll for them
                            self.ctx.stop.wait(0.1)
                        else:  # only cells whose dependency can never run are left
                            self._skip_orphans(pending)
                        continue
                    done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
                    for future in done:
                        self._finish(future, running.pop(future), total, len(pending) + len(running))
            except BaseException:
                self.ctx.stop.set()
                self.ctx.stop_all()
                for future, (cell, cores, _) in running.items():
                    with contextlib.suppress(BaseException):
                        future.result(timeout=30)
                    cores.release()
                raise
        return self.statuses

    def _pending(self) -> list[Cell]:
        pending = []
        for cell in self.plan.cells:
            meta = self.ctx.layout.meta(cell.id)
            if self.ctx.options.resume and meta.exists() and _status_of(meta) is CellStatus.OK:
                self.statuses[cell.id] = CellStatus.OK
                self.ctx.say(f"[{cell.id}] ok (kept from the resumed run)")
                continue
            pending.append(cell)
        return pending

    def _start_ready_cells(self, pending: list[Cell], running: dict, pool: ThreadPoolExecutor,
                           total: int) -> bool:
        """Start what may start now; True when a cell is waiting for free cores."""
        if self.ctx.stop.is_set():  # halted: a cell finishing will raise why, start nothing
            return False
        for cell in list(pending):
            if len(running) >= self.jobs:
                return False
            if cell.engine in self.ctx.unavailable:
                pending.remove(cell)
                self._record_skipped(cell, self.ctx.unavailable[cell.engine])
                continue
            blocker = cell.depends_on
            if blocker and blocker not in self.statuses:
                continue  # its warm cell is still to run
            if blocker and self.statuses[blocker] is not CellStatus.OK:
                pending.remove(cell)
                self._record_skipped(cell, f"depends on cell {blocker}, which is {self.statuses[blocker].value}")
                continue
            try:
                cores = isolation.lease_cell(self.ctx.matrix.isolation.cores_per_cell, *self.ctx.device_request)
            except isolation.LeaseUnavailable:
                return True
            except ValueError as exc:  # more cores per cell than this process may use
                raise InfrastructureError(str(exc), hint="lower isolation.cores_per_cell") from None
            pending.remove(cell)
            index = total - len(pending)  # cells started, kept or skipped so far
            self.ctx.say(f"[{index}/{total}] start {cell.id} (cores {','.join(map(str, cores.cores))})")
            future = pool.submit(CellRunner(self.ctx, cell, cores).run)
            running[future] = (cell, cores, time.monotonic())
        return False

    def _skip_orphans(self, pending: list[Cell]) -> None:
        for cell in list(pending):
            pending.remove(cell)
            self._record_skipped(cell, f"depends on cell {cell.depends_on}, which did not run")

    def _finish(self, future: Future, entry: tuple[Cell, isolation.CoreLease, float], total: int,
                remaining: int) -> None:
        cell, cores, started = entry
        cores.release()
        status = future.result()  # CellRunner.run records failures itself; only interrupts raise
        elapsed = time.monotonic() - started
        self.statuses[cell.id] = status
        self.durations.append(elapsed)
        eta = sum(self.durations) / len(self.durations) * remaining / self.jobs
        done = len(self.statuses)
        self.ctx.say(f"[{done}/{total}] {status.value:<7} {cell.id} {elapsed:.1f}s  ETA {eta:.0f}s")

    def _record_skipped(self, cell: Cell, reason: str) -> None:
        meta = empty_meta(self.ctx, cell)
        meta.status, meta.reason = CellStatus.SKIPPED, reason
        records.write_meta(self.ctx.layout, meta)
        self.statuses[cell.id] = CellStatus.SKIPPED
        self.ctx.say(f"[{cell.id}] skipped: {reason}")


def _status_of(meta_path: Path) -> CellStatus | None:
    try:
        return records.read_meta(meta_path).status
    except (RunDirError, OSError, ValueError, TypeError):
        return None


def empty_meta(ctx: RunContext, cell: Cell) -> CellMeta:
    return CellMeta(
        schema_version=records.SCHEMA_VERSION, run_id=ctx.layout.run_id, cell_id=cell.id,
        cell=cell.to_dict(), status=CellStatus.FAILED, reason=None, log_tail=None, command=[],
        env_delta={}, scratch_dir=RunLayout.SCRATCH, cores=None, gpu=None, port=None, port_attempts=0,
        pid=None, engine=None, started_at=None, health_ms=None, startup_ms=None,
        elapsed_ms=None, stop=None, turns=[],
    )


class CellRunner:
    """One cell, start to finish. Never raises for an engine failure: it records it."""

    def __init__(self, ctx: RunContext, cell: Cell, cores: isolation.CoreLease) -> None:
        self.ctx = ctx
        self.cell = cell
        self.cores = cores
        self.engine = ctx.engines[cell.engine]
        self.meta = empty_meta(ctx, cell)
        self.dir = ctx.layout.cell_dir(cell.id)

    def run(self) -> CellStatus:
        """Run the cell and record it. Raises only when the run must stop: interrupted, or an
        InfrastructureError (no port, the run directory unwritable), the cell then aborted."""
        t0 = time.monotonic()
        live: LiveEngine | None = None
        halted: InfrastructureError | None = None
        try:
            with storage_errors():
                self._fresh_directory()
                live = self.ctx_serving()
                self._record_start(live)
                self._run_turns(live)
            self.meta.status = CellStatus.OK
        except EngineError as exc:
            live = live or getattr(exc, "failed_start", None)
            self._fail(exc.reason, live)
        except InfrastructureError as exc:  # the machine's failure, not this cell's
            halted = exc
            self.ctx.halt(exc.message)
        except Exception as exc:  # noqa: BLE001 - one cell's surprise must not stop the run
            traceback.print_exc(file=sys.stderr)
            self._fail(f"{type(exc).__name__}: {exc}", live)
        finally:
            self._stop(live)
            self._check_log_cap(live)
            self.meta.elapsed_ms = (time.monotonic() - t0) * 1000.0
            if self.ctx.stop.is_set() and self.meta.status is not CellStatus.OK:
                self.meta.status = CellStatus.ABORTED
                self.meta.reason = self.ctx.stop_reason
            if not self.ctx.matrix.isolation.keep_scratch:
                shutil.rmtree(self.ctx.layout.scratch(self.cell.id), ignore_errors=True)
            try:
                with storage_errors():
                    records.write_meta(self.ctx.layout, self.meta)
            except InfrastructureError as exc:  # unrecorded, so --resume runs the cell again
                halted = halted or exc
                self.ctx.halt(exc.message)
        if halted is not None:
            raise halted
        return self.meta.status

    def ctx_serving(self) -> LiveEngine:
        return start_engine(self.ctx, self.engine, self.cores, cell_flags=self.cell.flags,
                            cell_env=self.cell.env, log_path=self.ctx.layout.engine_log(self.cell.id),
                            scratch=self.ctx.layout.scratch(self.cell.id))

    def _fresh_directory(self) -> None:
        # A rerun (--resume) starts from nothing: no stale log or responses of the old attempt.
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)

    def _record_start(self, live: LiveEngine) -> None:
        m, identity, spec = self.meta, self.engine.identity, self.engine.spec
        m.command, m.env_delta, m.port, m.port_attempts = live.command, live.env_delta, live.port.port, live.attempts
        m.pid, m.started_at = live.proc.pid, live.started_at
        m.health_ms, m.startup_ms = live.health_ms, live.startup_ms
        threads = min(spec.threads, len(self.cores.cores))
        m.cores = records.Cores(self.ctx.matrix.isolation.cores_per_cell, list(self.cores.cores),
                                live.proc.observed_affinity(), threads)
        m.gpu = gpu_record(self.cores.devices, live)
        m.engine = records.EngineRecord(
            name=spec.name, kind=spec.kind, log_family=spec.log_family,
            binary_path=identity.binary_path, binary_sha256=identity.binary_sha256,
            version=identity.version, model_path=identity.model_path,
            model_sha256=identity.model_sha256, props=live.props, extra=dict(identity.extra),
        )
        if m.cores.observed_affinity != list(self.cores.cores):
            raise EngineStartError(f"engine runs on cores {m.cores.observed_affinity}, "
                                   f"not the leased {list(self.cores.cores)}", engine=spec.name)
        if m.gpu.verified is False:
            raise EngineStartError(f"engine reports device {m.gpu.reported_device!r}; the cell asked "
                                   f"for {'no GPU' if m.gpu.requested is None else m.gpu.requested}",
                                   engine=spec.name)

    def _in_flight(self) -> int:
        """Requests the cell keeps in flight: a traffic's `in_flight` for its warm cell, else 1."""
        seq = self.ctx.matrix.sequences.get(self.cell.sequence) if self.cell.sequence else None
        if isinstance(seq, TrafficSequence) and self.cell.kind is plan_module.CellKind.WARM:
            return seq.in_flight
        return 1

    def _delimiters(self) -> bool:
        conf = self.ctx.matrix.configurations.get(self.cell.configuration)
        return conf is not None and conf.message_delimiters

    def _run_turns(self, live: LiveEngine) -> None:
        if self._in_flight() > 1:
            ConcurrentTurns(self, live, self._in_flight()).run()
            return
        replies = self._earlier_replies()
        log = live.proc.log_path
        previous: tuple[records.TurnRecord, LogSpan] | None = None
        for turn in self.cell.turns:
            span = LogSpan(log, _line_boundary(log))
            if previous is not None:
                # Spans are contiguous: lines written after a turn's `prompt eval time` line
                # (release, stop processing) belong to it, up to the next request.
                previous[1].extend(span.start)
                previous[1].apply(previous[0])
            record = TurnExchange(self.ctx, self.engine, live, self.dir, turn, replies,
                                  delimiters=self._delimiters()).run(span)
            self.meta.turns.append(record)
            previous = record, span
            if record.error is None:
                self._check_between_turns(live, turn)
            else:
                self._raise_turn_failure(live, turn, record)
            if record.completion is not None:
                replies[turn.index] = record.completion.text

    def _raise_turn_failure(self, live: LiveEngine, turn: Turn, record: records.TurnRecord) -> None:
        code = live.proc.poll()
        if code is None and record.http_status is None:
            # The connection broke: an engine that is dying says so within moments.
            with contextlib.suppress(Exception):
                code = live.proc.popen.wait(timeout=CRASH_WAIT_S)
        if code is not None:
            raise EngineCrashError(f"engine exited with code {code} during turn {turn.index}: "
                                   f"{record.error}", engine=self.engine.spec.name, returncode=code)
        raise ProtocolError(f"turn {turn.index} failed: {record.error}", engine=self.engine.spec.name)

    def _check_between_turns(self, live: LiveEngine, turn: Turn) -> None:
        """After every answer: the engine still running, on loopback only, its log not full.
        Checked at start-up alone, an engine could turn any of them later and be qualified."""
        name = self.engine.spec.name
        code = live.proc.poll()
        if code is not None:
            raise EngineCrashError(f"engine exited on its own with code {code} after answering "
                                   f"turn {turn.index}", engine=name, returncode=code)
        exposed = live.proc.exposed_listeners()
        if exposed:
            raise EngineError(f"engine listens beyond loopback on {', '.join(exposed)} after turn "
                              f"{turn.index}; engines must bind to 127.0.0.1 only", engine=name)
        if live.proc.log_at_cap():
            raise EngineError(self._log_cap_reason(), engine=name)

    def _log_cap_reason(self) -> str:
        return (f"engine.log reached its cap of {self.ctx.matrix.isolation.max_log_mib} MiB "
                "(isolation.max_log_mib); the engine's further output was dropped")

    def _check_log_cap(self, live: LiveEngine | None) -> None:
        """A log that reached its cap fails the cell, whatever else happened (a crash by
        SIGXFSZ, a turn without its log line), and says so in the log itself."""
        if live is None or not live.proc.log_at_cap():
            return
        reason = self._log_cap_reason()
        if self.meta.status is CellStatus.OK or not self.meta.reason:
            self.meta.reason = reason
        elif reason not in self.meta.reason:
            self.meta.reason = f"{reason} ({self.meta.reason})"
        self.meta.status = CellStatus.FAILED
        with contextlib.suppress(OSError), open(live.proc.log_path, "ab") as fh:
            fh.write(f"\n[shadowlab] {reason}\n".encode("ascii"))

    def _earlier_replies(self) -> dict[int, str]:
        """Replies a dependent chat cell splices in: its warm cell's answers, by turn index."""
        if not self.cell.depends_on:
            return {}
        warm = records.read_meta(self.ctx.layout.meta(self.cell.depends_on))
        return {t.index: t.completion.text for t in warm.turns if t.completion is not None}

    def _fail(self, reason: str, live: LiveEngine | None) -> None:
        self.meta.status = CellStatus.FAILED
        self.meta.reason = reason
        self.meta.log_tail = isolation.read_log_tail(self.ctx.layout.engine_log(self.cell.id), 4000)
        if live is not None and not self.meta.command:  # it never became ready
            m = self.meta
            m.command, m.env_delta, m.port = live.command, live.env_delta, live.port.port
            m.port_attempts, m.pid, m.started_at = live.attempts, live.proc.pid, live.started_at

    def _stop(self, live: LiveEngine | None) -> None:
        if live is None:
            return
        try:
            report = live.close()
        except isolation.ProcessSurvived as exc:
            report = live.stop_report
            if self.meta.status is CellStatus.OK:
                self.meta.status, self.meta.reason = CellStatus.FAILED, str(exc)
        if report is None:
            return
        self.meta.stop = records.StopRecord(report.signal_used, report.returncode, report.stop_ms,
                                            report.survivors, report.port_free)
        if self.meta.status is CellStatus.OK and report.returncode is not None:
            if report.signal_used == "none":  # it had exited before shadowlab stopped it
                self.meta.status = CellStatus.FAILED
                self.meta.reason = (f"engine exited on its own with code {report.returncode} "
                                    "before shadowlab stopped it")
            elif report.returncode not in STOPPED_EXITS[report.signal_used]:
                self.meta.status = CellStatus.FAILED
                self.meta.reason = (f"engine exited with code {report.returncode} when stopped "
                                    f"by SIG{report.signal_used} (a crash, not the stop signal)")


class ConcurrentTurns:
    """A traffic's warm cell with `in_flight` N > 1 (DESIGN §2): up to N requests in flight, sent
    in the traffic's order, each once its conversation's previous request has been answered (a
    request that must wait holds back the ones after it, so the send order stays the traffic's).
    Their log lines interleave: after the last answer every turn is tied to its task
    (shadowlab/judge/attribution.py), and a turn that cannot be tied fails the cell."""

    def __init__(self, runner: CellRunner, live: LiveEngine, in_flight: int) -> None:
        self.runner, self.live, self.in_flight = runner, live, in_flight
        self.exchanges: dict[int, TurnExchange] = {}

    def run(self) -> None:
        r, live = self.runner, self.live
        start = _line_boundary(live.proc.log_path)
        pending = list(r.cell.turns)  # the traffic's order
        running: dict[Future, tuple[Turn, float, int]] = {}
        answered: dict[int, records.TurnRecord] = {}
        busy: set[str] = set()  # conversations with a request in flight
        failed: tuple[Turn, records.TurnRecord] | None = None
        first_sent: float | None = None
        pool = ThreadPoolExecutor(max_workers=self.in_flight, thread_name_prefix="shadowlab-turn")
        try:
            while running or (pending and failed is None):  # after a failure: wait for the rest only
                while (failed is None and pending and len(running) < self.in_flight
                       and pending[0].conversation not in busy):
                    turn = pending.pop(0)
                    exchange = TurnExchange(r.ctx, r.engine, live, r.dir, turn, {}, delimiters=r._delimiters())
                    self.exchanges[turn.index] = exchange
                    now = time.monotonic()
                    first_sent = now if first_sent is None else first_sent
                    running[pool.submit(exchange.run, None)] = (turn, (now - first_sent) * 1000.0, len(running) + 1)
                    if turn.conversation is not None:
                        busy.add(turn.conversation)
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    turn, sent_ms, in_flight = running.pop(future)
                    record = future.result()
                    record.sent_ms, record.in_flight = round(sent_ms, 3), in_flight
                    answered[turn.index] = record
                    busy.discard(turn.conversation)  # type: ignore[arg-type]
                    if record.error is not None:
                        failed = failed or (turn, record)
                    elif failed is None:
                        r._check_between_turns(live, turn)
        finally:
            # Requests still in flight end when the engine is stopped; never wait on them here.
            pool.shutdown(wait=False, cancel_futures=True)
            r.meta.turns = [answered[i] for i in sorted(answered)]
        if failed is not None:
            r._raise_turn_failure(live, *failed)
        if r.engine.spec.log_family != "none":
            self._attribute(start)

    def _attribute(self, start: int) -> None:
        from shadowlab.judge import attribution  # the C scanner loads only when a log is read
        from shadowlab.logs import parse as logparse

        r, log = self.runner, self.live.proc.log_path
        turns = r.meta.turns
        self._wait_for_lines(start, len(turns))
        events = [ev for ev in logparse.parse(log, r.engine.spec.log_family).events if ev.offset >= start]
        claims = [attribution.Claim(t.index, t.prompt_tokens, t.processed_tokens, t.prefill_ms,
                                    *self.exchanges[t.index].claimed) for t in turns]
        tied = attribution.tie(claims, attribution.tasks(events))
        if tied.untied:
            first = min(tied.untied)
            more = f" ({len(tied.untied) - 1} more turns untied)" if len(tied.untied) > 1 else ""
            raise ProtocolError(f"requests sent concurrently: {tied.untied[first]}{more}",
                                engine=r.engine.spec.name)
        ends = {task.task: _line_end(log, task.last) for task in tied.tasks.values()}
        spans = attribution.spans(tied.tasks, ends, start)
        for t in turns:
            task = tied.tasks[t.index]
            t.task_ids, t.log_offsets, t.log_complete = [task.task], list(spans[t.index]), True
            t.log_attribution = "task"

    def _wait_for_lines(self, start: int, count: int) -> None:
        """Wait (bounded) until the log holds a `prompt eval time` line per turn: llama-server
        prints it before the answer, an engine may flush it later."""
        log, deadline = self.live.proc.log_path, time.monotonic() + LOG_SPAN_WAIT_S
        seen, at = 0, start
        while True:
            end = _line_boundary(log)
            seen += _count_lines(log, at, end, PROMPT_EVAL_RE)
            at = end
            if seen >= count or time.monotonic() >= deadline or self.live.proc.poll() is not None:
                return
            time.sleep(0.02)


def _count_lines(path: Path, start: int, end: int, pattern: re.Pattern[bytes]) -> int:
    """Lines of [start, end) (whole lines) that match, read SPAN_CHUNK bytes at a time."""
    count, carry = 0, b""
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            chunk = fh.read(min(SPAN_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            body = carry + chunk
            cut = body.rfind(b"\n") + 1 if left > 0 else len(body)
            count += len(pattern.findall(body[:cut]))
            carry = body[cut:]
            if len(carry) > SPAN_CHUNK:  # one line longer than a chunk: count what it holds once
                count += len(pattern.findall(carry))
                carry = b""
    return count


def _line_end(path: Path, offset: int) -> int:
    """Offset just after the line that starts at ``offset`` (bounded: at most 64 KiB on)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(1 << 16)
    cut = chunk.find(b"\n")
    return offset + (cut + 1 if cut >= 0 else len(chunk))


def gpu_record(devices: int | Sequence[int] | None, live: LiveEngine) -> records.Gpu:
    """`requested` is the first leased device (the record's field is one index); `env` names all."""
    requested = devices[0] if isinstance(devices, Sequence) else devices
    reported = live.engine.adapter.reported_device(live.props)
    if reported is None:
        verified = None
    elif requested is None:
        verified = reported == "cpu"
    else:
        verified = reported != "cpu"
    return records.Gpu(requested, isolation.gpu_env(devices), reported, verified)


# ================================================================ one turn


def _extends(reused: int | None, processed: int | None, cached: int, length: int | None) -> str | None:
    """Why a split-control request did not compute exactly [cached, length) (None: it did): it
    must extend the cache its predecessor left (plain reuse, no restore), or the batch schedule
    is not the warm turn's."""
    if reused == cached and length is not None and processed == length - cached:
        return None
    return (f"split control: the {length}-token request reused {reused} and processed {processed} "
            f"tokens, not {cached} and {None if length is None else length - cached}: the engine did "
            "not extend its cache as the warm batch schedule needs")


class TurnExchange:
    """Send one turn, keep the raw answer, find the turn's span in engine.log."""

    def __init__(self, ctx: RunContext, engine: PreparedEngine, live: LiveEngine, cell_dir: Path,
                 turn: Turn, replies: Mapping[int, str], *, delimiters: bool = False) -> None:
        self.ctx, self.engine, self.live, self.cell_dir = ctx, engine, live, cell_dir
        self.turn = turn
        self.delimiters = delimiters  # traffic turns: the configuration's message_delimiters
        self.replies = replies
        self.prefix_only = False  # set by _request: a split control's request up to a batch break
        self.claimed: tuple[int | None, int | None] = (None, None)  # the answer's (id_slot, id_task)

    def run(self, span: LogSpan | None) -> records.TurnRecord:
        """Send the turn; its log span starts at ``span.start`` (a byte offset of engine.log).
        None: sent among others in flight, its lines found afterwards (ConcurrentTurns)."""
        request = self._request()
        path, body = self.engine.adapter.completion_request(request, self._generation())
        record = self._empty_record(request, path)
        try:
            status, raw, ttft_ms, response_ms = self._post(path, body)
        except httpx.TimeoutException:
            record.error = f"no answer within {self._timeout():g} s (request timeout)"
            return self._close_span(record, span)
        except httpx.TransportError as exc:
            record.error = f"connection failed: {type(exc).__name__}: {exc}"
            return self._close_span(record, span)
        except streamed.MalformedStream as exc:
            record.error = f"malformed streamed answer: {exc}"
            return self._close_span(record, span)
        except (httpx.HTTPError, ResponseTooLarge) as exc:  # malformed HTTP, oversized answer
            record.error = f"unreadable answer: {type(exc).__name__}: {exc}"
            return self._close_span(record, span)
        record.http_status, record.ttft_ms, record.response_ms = status, ttft_ms, response_ms
        response_path = self.ctx.layout.response(self.cell_dir.name, self.turn.index)
        records.write_bytes_atomic(response_path, raw)
        record.response_file = response_path.relative_to(self.cell_dir).as_posix()
        self._read_answer(record, status, raw)
        if record.error is None and self._by_requests():
            points = self.turn.split_points or ()
            record.error = _extends(record.reused_tokens, record.processed_tokens,
                                    points[-2] if len(points) > 1 else 0, record.prompt_tokens)
        return self._close_span(record, span)

    def _by_requests(self) -> bool:
        """A turn of a llama-server split control (DESIGN §5): one request of the sequence."""
        return self.turn.split_points is not None and split_controls.by_requests(self.engine.spec.kind)

    def _generation(self) -> Any:
        """A split control's request up to a batch break asks for one token (llama-server samples
        one even for 0), which is never decoded into the cache; the prompt itself the matrix's."""
        generation = self.ctx.matrix.generation
        return dataclasses.replace(generation, n_predict=1) if self.prefix_only else generation

    def _request(self) -> TurnRequest:
        spec = self.ctx.matrix.prompts.get(self.turn.prompt_id)
        if spec is None:  # a traffic turn (DESIGN §2): token ids, the conversation, maybe a slot
            return self._traffic_request()
        extra = {"message_delimiters": [dict(d) for d in prompts.CHATML_MESSAGE_DELIMITERS]} \
            if spec.message_delimiters else {}
        if self.turn.split_points is not None:  # a split control (DESIGN §5): the warm schedule
            extra = {**extra, **split_controls.request_fields(self.engine.spec.kind, self.turn.split_points)}
        index, pid = self.turn.index, self.turn.prompt_id
        if isinstance(spec, ChatPrompt) and self.turn.endpoint == "chat":
            messages = prompts.chat_messages(spec, self.replies)
            return TurnRequest(index, pid, messages=tuple(messages), extra_body=extra)
        if isinstance(spec, ChatPrompt):  # a conversation sent as ChatML tokens to /completion
            tokens = prompts.materialize_chat(spec, self.replies, self.live.tokenize).tokens
        else:
            tokens = self.engine.prompts[pid].tokens
        if self._by_requests():  # this request of a split control: the prompt up to its break
            self.prefix_only = self.turn.split_points[-1] < len(tokens)
            tokens = tokens[:self.turn.split_points[-1]]
        return TurnRequest(index, pid, prompt_tokens=tuple(tokens), extra_body=extra)

    def _traffic_request(self) -> TurnRequest:
        turn = self.turn
        extra: dict[str, Any] = {}
        if turn.conversation is not None:
            extra["prompt_cache_key"] = turn.conversation  # the engines' affinity field
        if turn.slot is not None:
            extra["id_slot"] = turn.slot
        if not turn.cache_prompt:
            extra["cache_prompt"] = False  # a replayed identity reference: no reuse
        if self.delimiters:  # the reference too: it differs from the warm turn only in reuse
            extra["message_delimiters"] = [dict(d) for d in prompts.CHATML_MESSAGE_DELIMITERS]
        tokens = self.engine.prompts[turn.prompt_id].tokens
        return TurnRequest(turn.index, turn.prompt_id, prompt_tokens=tuple(tokens), extra_body=extra)

    def _empty_record(self, request: TurnRequest, path: str) -> records.TurnRecord:
        if request.is_chat:
            messages = [dict(m) for m in request.messages or ()]
            sha, ids, count = records.sha256_json(messages), None, None
        else:
            messages, ids = None, list(request.prompt_tokens or ())
            sha, count = tokens_sha256(ids), len(ids)
        return records.TurnRecord(
            index=self.turn.index, prompt_id=self.turn.prompt_id, prompt_sha256=sha,
            prompt_tokens=count, prompt_token_ids=ids, messages=messages, endpoint=path,
            http_status=None, error=None, timings={}, reused_tokens=None, processed_tokens=None,
            prefill_ms=None, ttft_ms=None, response_ms=None, completion=None, log_offsets=[0, 0],
            log_complete=False, task_ids=[], response_file=None, conversation=self.turn.conversation,
        )

    def _timeout(self) -> float:
        return request_timeout(self.ctx.options.request_timeout_s)

    def _post(self, path: str, body: dict) -> tuple[int, bytes, float, float]:
        """(status, raw body, ms to the first token, ms to whole answer), client-side. A streamed
        answer (server-sent events) comes back as the body its events add up to, its first
        token timed at the first event that carries one; any other answer's at its first byte."""
        limit = self._timeout()
        timeout = httpx.Timeout(limit, connect=min(10.0, limit))
        sent = time.monotonic()
        deadline = sent + limit  # whole answer: httpx's timeouts are per read (a trickle never trips them)
        # ASCII JSON: a spliced reply may hold lone surrogates (the engine's own escapes), which
        # httpx's UTF-8 encoding of json= would refuse; escaped, they go back as they came.
        content = json.dumps(body).encode("ascii")
        with self.live.client.stream("POST", path, content=content, timeout=timeout,
                                     headers={"content-type": "application/json"}) as response:
            chunks = response.iter_raw()
            if streamed.is_event_stream(response.headers.get("content-type")):
                n_predict = body.get("n_predict", body.get("max_tokens"))
                answer = streamed.read(chunks, n_predict=n_predict if isinstance(n_predict, int) else None,
                                       max_bytes=MAX_RESPONSE_BYTES, deadline=deadline)
                return (response.status_code, json.dumps(answer.body).encode("ascii"),
                        (answer.first_token_at - sent) * 1000.0, (time.monotonic() - sent) * 1000.0)
            first = next(chunks, b"")
            ttft_ms = (time.monotonic() - sent) * 1000.0
            parts, size = [first], len(first)
            for chunk in chunks:
                parts.append(chunk)
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the answer did not end in time")
                if size > MAX_RESPONSE_BYTES:
                    raise ResponseTooLarge(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
        return response.status_code, b"".join(parts), ttft_ms, (time.monotonic() - sent) * 1000.0

    def _read_answer(self, record: records.TurnRecord, status: int, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            record.error = f"HTTP {status}: answer is not JSON ({len(raw)} bytes)"
            return
        if status != 200 or not isinstance(body, dict) or body.get("error") is not None:
            # An error body is an error whatever the status (some servers answer 200 with one).
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            record.error = f"HTTP {status}: {message[:500] if isinstance(message, str) else 'error answer'}"
            return
        try:
            result = self.engine.adapter.parse_response(body)
        except Exception as exc:  # noqa: BLE001 - the body is untrusted; a parser surprise is its error
            record.error = f"HTTP {status}: answer of an unexpected shape ({type(exc).__name__}: {exc})"
            return
        record.timings = dict(result.timings)
        self.claimed = result.slot, result.task
        record.reused_tokens, record.processed_tokens = result.reused_tokens, result.processed_tokens
        record.prefill_ms = result.prompt_ms
        if record.prompt_tokens is None and result.reused_tokens is not None and result.processed_tokens is not None:
            record.prompt_tokens = result.reused_tokens + result.processed_tokens
        top = None if result.top_logprobs is None else [
            [records.TopLogprob(tok, lp) for tok, lp in per_token] for per_token in result.top_logprobs]
        record.completion = records.Completion(result.text, list(result.tokens),
                                               records.sha256_text(result.text), result.stop_type, top)

    def _close_span(self, record: records.TurnRecord, span: LogSpan | None) -> records.TurnRecord:
        """Wait (bounded) for this turn's `prompt eval time` line; the span ends after it."""
        if span is None:
            return record
        # No line to wait for when the turn failed or the engine's log format is unknown.
        expect_line = record.error is None and self.engine.spec.log_family != "none"
        deadline = time.monotonic() + (LOG_SPAN_WAIT_S if expect_line else 0.0)
        while True:
            span.extend(_line_boundary(span.path))
            span.apply(record)
            # No line will come from an engine that exited or can write no more to its log.
            if span.complete or time.monotonic() >= deadline or self.live.proc.poll() is not None \
                    or self.live.proc.log_at_cap():
                return record
            time.sleep(0.01)


class LogSpan:
    """What a turn's span [start, end) of engine.log holds, read as it grows in chunks of
    SPAN_CHUNK bytes: memory stays bounded whatever the engine writes, and each byte is read
    about once however long the runner waits for the turn's `prompt eval time` line."""

    def __init__(self, path: Path, start: int) -> None:
        self.path, self.start, self.end = path, start, start
        self.complete = False  # holds a `prompt eval time` line
        self.task_ids: set[int] = set()

    def extend(self, end: int) -> None:
        if end <= self.end:
            return
        pos = max(self.start, self.end - SPAN_OVERLAP)  # a match cut by the previous end
        with open(self.path, "rb") as fh:
            while True:
                want = min(SPAN_CHUNK, end - pos)
                fh.seek(pos)
                chunk = fh.read(want)
                self.complete = self.complete or PROMPT_EVAL_RE.search(chunk) is not None
                self.task_ids.update(int(m) for m in TASK_ID_RE.findall(chunk))
                if len(chunk) < want or pos + want >= end:  # the span's end, or the file's
                    break
                pos += want - SPAN_OVERLAP
        self.end = end

    def apply(self, record: records.TurnRecord) -> None:
        record.log_offsets = [self.start, self.end]
        record.log_complete = self.complete
        record.task_ids = sorted(self.task_ids)


def _line_boundary(path: Path) -> int:
    """Offset just after the last complete line of a growing log."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        back = min(size, 1 << 16)
        fh.seek(size - back)
        tail = fh.read(back)
    cut = tail.rfind(b"\n")
    return size - back + cut + 1 if cut >= 0 else size - back


def _stderr_line(text: str) -> None:
    print(records.terminal_safe(text), file=sys.stderr, flush=True)  # may quote engine output
