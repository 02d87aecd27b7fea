"""The run stage as a short sequence of named steps (nox's habit)::

    load_matrix → build_plan → open_run_dir → write_run_records
      → prepare_engines → materialize_prompts → run_cells (→ split controls)

The steps before `run_cells` read the matrix (its engines to prepare, its prompts to
materialise); the cells are run from the plan alone.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import httpx

from shadowlab import matrix as matrix_module
from shadowlab import plan as plan_module
from shadowlab.engines import get_adapter
from shadowlab.errors import EngineError, RunDirError
from shadowlab.matrix import ChatPrompt, Matrix, TrafficSequence
from shadowlab.plan import Plan
from shadowlab.plan import select as plan_select
from shadowlab.plan import shard as shard_module
from shadowlab.results import records, rundir
from shadowlab.results.records import CellStatus
from shadowlab.run import isolation, prompts
from shadowlab.run.context import PreparedEngine, RunContext, RunOptions, RunOutcome
from shadowlab.run.directory import lock_run_dir, open_run_dir, storage_errors, write_run_records
from shadowlab.run.engine import serving
from shadowlab.run.process_group import ProcessSurvived
from shadowlab.run.scheduler import CellScheduler
from shadowlab.run.turns import ResponseTooLarge


def run(options: RunOptions) -> RunOutcome:
    matrix, notes = plan_select.prepare(load_matrix(options.matrix_path), options.overrides, options.only,
                                        options.gate_candidate, count_cells=lambda m: len(build_plan(m).cells))
    plan = dataclasses.replace(build_plan(matrix), notes=notes)
    say = options.progress or _stderr_line
    partial = plan_select.Partial.from_dict(notes.get("selection"))
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
            if partial is not None:  # said before any cell starts, not only in the summary
                say(f"shadowlab: {partial.describe()}")
            with RunContext(layout, options, say, isolation=matrix.isolation, prompt_specs=matrix.prompts,
                            plan=plan) as ctx:
                prepare_engines(ctx, matrix)
                if assignment is not None:
                    write_shard_record(ctx, matrix, whole, assignment)
                materialize_prompts(ctx, matrix)
                statuses = run_cells(ctx, plan, every_split_control=matrix.identity.split_controls == "all")
    return RunOutcome(layout.root, statuses)


def load_matrix(path: Path) -> Matrix:
    return matrix_module.load(path)


def build_plan(matrix: Matrix) -> Plan:
    return plan_module.build_plan(matrix)


def prepare_engines(ctx: RunContext, matrix: Matrix) -> None:
    """Adapter per engine; locate/build/hash binary and model (generated once, cached).

    An engine that cannot be prepared is recorded as unavailable: its cells are skipped
    with the reason, the other engines' cells still run.
    """
    for name, spec in matrix.engines.items():
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


def write_shard_record(ctx: RunContext, matrix: Matrix, whole: Plan, assignment: shard_module.Assignment) -> None:
    """shard.json: what this part is a part of (DESIGN §8); a resumed part must be the same."""
    assert ctx.options.shard is not None
    identities = shard_module.engine_identities(ctx.engines, list(matrix.engines))
    now = shard_module.record_for(ctx.options.shard, assignment, whole, matrix,
                                  rundir.read_matrix_bytes(ctx.layout.root), identities)
    path = ctx.layout.root / rundir.SHARD_NAME
    if ctx.options.resume and path.exists():
        shard_module.check_resumed(rundir.read_shard(ctx.layout.root), now, str(path))
        return
    records.write_json_atomic(path, now.to_dict())


def materialize_prompts(ctx: RunContext, matrix: Matrix) -> None:
    """Exact token prompts per engine (the matrix's prompts and traffic), tokenized by that
    engine started with its own flags; reused on --resume."""
    for name, engine in ctx.engines.items():
        path = ctx.layout.prompts(name)
        if path.exists():
            engine.prompts = prompts.load(path)
            continue
        traffic = [s for s in matrix.sequences.values() if isinstance(s, TrafficSequence)]
        if not traffic and all(isinstance(spec, ChatPrompt) for spec in matrix.prompts.values()):
            prompts.save({}, path)  # chat only: messages are sent as text, nothing to tokenize
            continue
        log_path = ctx.layout.prompts_log(name)
        try:
            with ctx.cores(1) as cores, serving(ctx, engine, cores, flags=plan_module.engine_flags(engine.spec),
                                                env=dict(engine.spec.env), log_path=log_path) as live:
                engine.prompts = prompts.materialize(matrix.prompts, live.tokenize)
                for sequence in traffic:
                    engine.prompts.update(prompts.materialize_traffic(sequence, live.tokenize))
        except (EngineError, httpx.HTTPError, ValueError, ResponseTooLarge) as exc:
            hint = f" (kind {engine.spec.kind}: {engine.adapter.tokenize_hint})" \
                if engine.adapter.tokenize_hint else ""
            ctx.unavailable[name] = f"prompts could not be tokenized: {exc}{hint}"
            ctx.say(f"shadowlab: engine {name!r}: {ctx.unavailable[name]}")
            continue
        except ProcessSurvived as exc:
            ctx.unavailable[name] = f"the engine process that tokenized its prompts could not be stopped: {exc}"
            ctx.say(f"shadowlab: engine {name!r}: {ctx.unavailable[name]}")
            continue
        finally:
            shutil.rmtree(log_path.parent / records.RunLayout.SCRATCH, ignore_errors=True)
        prompts.save(engine.prompts, path)


def run_cells(ctx: RunContext, plan: Plan, *, every_split_control: bool = False) -> dict[str, CellStatus]:
    statuses = CellScheduler(ctx, plan).run()
    return {**statuses, **run_split_controls(ctx, plan, every_split_control)}


def run_split_controls(ctx: RunContext, plan: Plan, every: bool) -> dict[str, CellStatus]:
    """Issue 16: the split controls the finished warm cells call for (DESIGN §5; judged by the
    run's judging step from their records), appended to plan.json before they start, so a
    resumed or loaded run directory knows them. Without a judging step there are none."""
    if ctx.options.judging is None:
        return {}
    extra = list(ctx.options.judging.split_controls(ctx.layout.root, plan, every))
    if not extra:
        return {}
    written = Plan.from_dict(records.read_json(ctx.layout.plan))
    known = {c.id for c in written.cells}
    cells = (*written.cells, *(c for c in extra if c.id not in known))
    records.write_json_atomic(ctx.layout.plan, dataclasses.replace(written, cells=cells).to_dict())
    ctx.say(f"shadowlab: {len(extra)} split control(s) for restored warm turns")
    return CellScheduler(ctx, Plan(tuple(extra))).run()


def _stderr_line(text: str) -> None:
    print(records.terminal_safe(text), file=sys.stderr, flush=True)  # may quote engine output
