"""One cell, start to finish (``CellRunner``): a fresh directory, the engine started from the
cell's plan entry, its turns sent, checked between turns, stopped and verified gone, and
``meta.json`` written atomically whatever happened. An engine's failure is recorded, never
raised; only an interruption or the machine failing the run stops the run.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import time
import traceback

from shadowlab.errors import EngineCrashError, EngineError, EngineStartError, InfrastructureError, ProtocolError
from shadowlab.plan import Cell, Turn
from shadowlab.results import records
from shadowlab.results.records import CellMeta, CellStatus
from shadowlab.run import isolation
from shadowlab.run.context import RunContext
from shadowlab.run.directory import storage_errors
from shadowlab.run.engine import LiveEngine, gpu_record, start_engine
from shadowlab.run.process_group import ProcessSurvived
from shadowlab.run.turns import ConcurrentTurns, LogSpan, TurnExchange, line_boundary

CRASH_WAIT_S = 1.0  # after a broken connection, how long to wait for the engine's exit status
# Exit statuses an engine may end with when shadowlab stops it: anything else (or exiting
# before it was stopped) is the engine's own doing, and fails its cell.
STOPPED_EXITS = {"TERM": {0, -signal.SIGTERM, 128 + signal.SIGTERM},
                 "KILL": {0, -signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGKILL}}


def empty_meta(ctx: RunContext, cell: Cell) -> CellMeta:
    return CellMeta(
        schema_version=records.SCHEMA_VERSION, run_id=ctx.layout.run_id, cell_id=cell.id,
        cell=cell.to_dict(), status=CellStatus.FAILED, reason=None, log_tail=None, command=[],
        env_delta={}, scratch_dir=records.RunLayout.SCRATCH, cores=None, gpu=None, port=None, port_attempts=0,
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
                live = self._start()
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
            if not self.ctx.isolation.keep_scratch:
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

    def _start(self) -> LiveEngine:
        """The engine as the plan starts it: its own flags and env, then the configuration's."""
        cell = self.cell
        return start_engine(self.ctx, self.engine, self.cores, flags=[*cell.engine_flags, *cell.flags],
                            env={**cell.engine_env, **cell.env}, log_path=self.ctx.layout.engine_log(cell.id),
                            scratch=self.ctx.layout.scratch(cell.id))

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
        m.cores = records.Cores(self.ctx.isolation.cores_per_cell, list(self.cores.cores),
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

    def _run_turns(self, live: LiveEngine) -> None:
        if self.cell.in_flight > 1:
            self._run_concurrent(live)
            return
        replies = self._earlier_replies()
        log, family = live.proc.log_path, self.engine.family
        previous: tuple[records.TurnRecord, LogSpan] | None = None
        for turn in self.cell.turns:
            span = LogSpan(log, line_boundary(log), family)
            if previous is not None:
                # Spans are contiguous: lines written after a turn's `prompt eval time` line
                # (release, stop processing) belong to it, up to the next request.
                previous[1].extend(span.start)
                previous[1].apply(previous[0])
            record = TurnExchange(self.ctx, self.engine, live, self.dir, turn, replies,
                                  generation=self.cell.generation).run(span)
            self.meta.turns.append(record)
            previous = record, span
            if record.error is None:
                self._check_between_turns(live, turn)
            else:
                self._raise_turn_failure(live, turn, record)
            if record.completion is not None:
                replies[turn.index] = record.completion.text

    def _run_concurrent(self, live: LiveEngine) -> None:
        turns = ConcurrentTurns(self.ctx, self.engine, live, self.dir, self.cell,
                                lambda turn: self._check_between_turns(live, turn))
        failed = turns.run(self.meta.turns)
        if failed is not None:
            self._raise_turn_failure(live, *failed)
        if self.engine.family.read:
            turns.tie(self.meta.turns)

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
        return (f"engine.log reached its cap of {self.ctx.isolation.max_log_mib} MiB "
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
        except ProcessSurvived as exc:
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
