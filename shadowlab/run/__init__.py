"""The run stage: matrix → plan → one fresh, isolated engine process per cell → records.

``run(options)`` is a short sequence of named steps (nox's habit; ``steps.py``)::

    load_matrix → build_plan → open_run_dir → write_run_records
      → prepare_engines → materialize_prompts → run_cells (→ split controls)

One module per job:

- ``steps``      the steps above, and ``run`` itself
- ``directory``  the run directory: new or resumed, its lock, the run-wide records and their
                 comparison on ``--resume``
- ``context``    what the cells of one run share (``RunContext``), the options, interruption
- ``engine``     one engine process: spawn pinned, wait until ready, stop and verify it gone
- ``scheduler``  the plan's cells, ``jobs`` at a time, each on its own leased cores
- ``cell``       one cell start to finish, recorded in ``meta.json`` whatever happened
- ``turns``      a cell's turns, one at a time or several in flight, and their log spans
- ``isolation``, ``process_group``, ``listeners``, ``environment``, ``prompts``: leased cores,
  ports and devices and the log file's cap; the engine's process group (``EngineProcess``);
  the engine's listening sockets; the machine's description; exact token prompts

Only this package (with ``engines``) touches processes and sockets; everything after it reads
the run directory. A cell is run from its plan entry alone (plan.json carries its engine flags
and env, ``in_flight``, the delimiters and the generation); what differs between engine kinds
is asked of the adapter (``shadowlab/engines``). The runner parses no log: a turn's span is
found with the log family's two bounded patterns, and what must be judged while the run goes
(turns sent concurrently tied to their tasks, split controls) is the judging step it is handed
(``RunOptions.judging``; ``shadowlab run`` gives ``shadowlab.judge.attribution.RUN_JUDGING``).

Interruption (SIGINT, SIGTERM) raises :class:`Interrupted` in the main thread; the run stops
every live engine, lets running cells record ``aborted``, and re-raises (the CLI exits 130 /
143). ``--resume`` then reruns every cell not ``ok``. The machine failing the run (no free
port, the run directory full or read-only) stops it the same way with an
:class:`~shadowlab.errors.InfrastructureError` (exit 3), the aborted cells saying why.
"""

from __future__ import annotations

from shadowlab.run.cell import CellRunner, empty_meta
from shadowlab.run.context import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Interrupted,
    Judging,
    PreparedEngine,
    RunContext,
    RunOptions,
    RunOutcome,
    request_timeout,
)
from shadowlab.run.directory import (
    check_resumed_options,
    check_run_dir,
    lock_run_dir,
    open_run_dir,
    result_options,
    storage_errors,
    storage_failure,
    write_run_records,
)
from shadowlab.run.engine import LiveEngine, gpu_record, start_engine
from shadowlab.run.scheduler import CellScheduler
from shadowlab.run.steps import run
from shadowlab.run.turns import SPAN_CHUNK, ConcurrentTurns, LogSpan, TurnExchange

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S", "SPAN_CHUNK", "CellRunner", "CellScheduler", "ConcurrentTurns", "Interrupted",
    "Judging", "LiveEngine", "LogSpan", "PreparedEngine", "RunContext", "RunOptions", "RunOutcome", "TurnExchange",
    "check_resumed_options", "check_run_dir", "empty_meta", "gpu_record", "lock_run_dir", "open_run_dir",
    "request_timeout", "result_options", "run", "start_engine", "storage_errors", "storage_failure",
    "write_run_records",
]
