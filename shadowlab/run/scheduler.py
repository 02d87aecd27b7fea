"""The plan's cells, ``jobs`` at a time, each on its own leased cores (``CellScheduler``): a cell
starts once its dependency ran ok (else it is recorded skipped), a resumed run keeps the cells
already ok, and an interruption stops every running cell before it is re-raised.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from shadowlab.errors import InfrastructureError, RunDirError
from shadowlab.plan import Cell, Plan
from shadowlab.results import records
from shadowlab.results.records import CellStatus
from shadowlab.run import isolation
from shadowlab.run.cell import CellRunner, empty_meta
from shadowlab.run.context import RunContext


class CellScheduler:
    """Runs the plan's cells, ``jobs`` at a time, each on its own leased cores."""

    def __init__(self, ctx: RunContext, plan: Plan) -> None:
        self.ctx = ctx
        self.plan = plan
        self.jobs = ctx.options.jobs or ctx.isolation.jobs
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
                cores = isolation.lease_cell(self.ctx.isolation.cores_per_cell, *self.ctx.device_request)
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
