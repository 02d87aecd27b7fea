"""What the cells of one run share: the options, the prepared engines, the live processes and
the stop flag (``RunContext``), and how a run is interrupted (``Interrupted``).

The context holds the run-wide settings the cells need (the isolation section, the prompt
definitions chat turns are built from) and never the matrix: each cell is run from its plan
cell alone (plan.json carries the engine flags, `in_flight`, the delimiters and the generation).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.engines import EngineAdapter, EngineIdentity, LogFamily, log_family
from shadowlab.errors import InfrastructureError
from shadowlab.matrix import EngineSpec, Isolation
from shadowlab.plan import Cell, Plan
from shadowlab.plan import shard as shard_module
from shadowlab.results.records import CellStatus, RunLayout
from shadowlab.run import isolation
from shadowlab.run.process_group import EngineProcess, ProcessSurvived
from shadowlab.run.prompts import MaterializedPrompt

DEFAULT_REQUEST_TIMEOUT_S = 300.0
INTERRUPTED_REASON = "shadowlab was interrupted; rerun with --resume"


@dataclass(frozen=True)
class Judging:
    """The judgements a run makes while it runs, implemented by the judge stage
    (shadowlab/judge/attribution.py), so that run/ reads no log and never imports the judges.

    ``tie_turns(log, family, start, turns, claims)``: ties turns sent concurrently (records of
    one cell, their log from byte ``start``; ``claims``: turn index -> the answer's (slot, task))
    to the tasks that served them, setting each record's task_ids and log span; returns why a
    turn could not be tied, None when every one was. ``split_controls(root, plan, every)``: the
    split-control cells the finished warm cells of ``root`` call for (``every``: the matrix's
    `identity.split_controls: all`)."""

    tie_turns: Callable[[Path, LogFamily, int, Sequence[Any], Mapping[int, tuple[int | None, int | None]]],
                        str | None]
    split_controls: Callable[[Path, Plan, bool], Sequence[Cell]]


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
    only: tuple[str, ...] = ()  # -k: only these warm cells and their references (plan/select.py)
    gate_candidate: str | None = None  # --gate-candidate: checked against the plan before anything starts
    overrides: Any = None  # --binary/--model and their variables (matrix/overrides.py)
    reports_dir: Path = Path("reports")
    model_cache: Path = Path("models")
    progress: Callable[[str], None] | None = None  # default: a line on stderr
    # What the run needs judged while it runs (tying turns sent concurrently to their tasks, the
    # split controls finished warm cells call for): the judge stage's, handed in by the layer
    # above (commands/run.py gives `attribution.RUN_JUDGING`). None: neither is done.
    judging: Judging | None = None


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path | None
    statuses: Mapping[str, CellStatus] = field(default_factory=dict)

    @property
    def all_ran(self) -> bool:
        return all(s is CellStatus.OK for s in self.statuses.values())


def request_timeout(given: float | None) -> float:
    """The seconds a turn may take: --request-timeout, else the default (one value however spelled)."""
    return DEFAULT_REQUEST_TIMEOUT_S if given is None else float(given)


@dataclass
class PreparedEngine:
    spec: EngineSpec
    adapter: EngineAdapter
    identity: EngineIdentity
    prompts: dict[str, MaterializedPrompt] = field(default_factory=dict)

    @property
    def family(self) -> LogFamily:
        """The log family the matrix reads this engine's log as."""
        return log_family(self.spec.log_family)


class RunContext:
    """What the cells of one run share: layout, options, the run-wide settings (isolation, the
    prompt definitions chat turns are built from), engines, live processes, stop flag."""

    def __init__(self, layout: RunLayout, options: RunOptions, say: Callable[[str], None], *,
                 isolation: Isolation, prompt_specs: Mapping[str, Any], plan: Plan) -> None:
        self.layout = layout
        self.options = options
        self.say = say
        self.isolation = isolation
        self.prompt_specs = prompt_specs
        self.plan = plan  # every cell this run may start (its env names are the controlled ones)
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
        return self.isolation.max_log_mib << 20

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
            with contextlib.suppress(ProcessSurvived):
                proc.stop()

    # -- resources -----------------------------------------------------------------------

    @property
    def device_request(self) -> tuple[int, tuple[int, ...] | None]:
        """(devices per cell, the pool) every engine process of this run leases with its cores."""
        return self.isolation.gpus_per_cell, self.isolation.devices

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
