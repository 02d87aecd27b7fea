"""The parts of a sharded run, merged into one run directory that report and gate read unchanged.

``merge(parts, out)`` is a short sequence of steps::

    load_part (each) → check_same_experiment → check_shards → check_recorded → write_merged

Every check runs before anything is written, and the merged directory is assembled beside
``out`` and renamed into place at the end, so a refused or failed merge leaves nothing behind.
A refusal is a RunDirError (exit 2) naming the part and the difference. DESIGN §8 is the
contract.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowlab.errors import RunDirError
from shadowlab.plan.shard import ShardRecord, describe_identity, matrix_sha256
from shadowlab.results import records, rundir, versions
from shadowlab.results.layout import RunLayout
from shadowlab.results.records import CellStatus, EngineBuild

MERGE_VERSION = versions.MERGE.current
WRITE_HINT = "free space or choose a writable --out, then merge again"
RESULT_OPTIONS_OF_A_PART = ("shard",)  # options.json keys a part adds to a whole run's


@dataclass(frozen=True)
class Part:
    root: Path
    run: rundir.RunDir
    shard: ShardRecord
    options: Mapping[str, Any]  # options.json without the part's own keys
    matrix_bytes: bytes

    @property
    def name(self) -> str:
        return f"{self.root} (shard {self.shard.spec})"


@dataclass(frozen=True)
class MergeOutcome:
    out: Path
    parts: tuple[Part, ...]
    cells: int


def merge(part_dirs: Sequence[Path], out: Path) -> MergeOutcome:
    parts = tuple(load_part(Path(p)) for p in part_dirs)
    check_same_experiment(parts)
    check_shards(parts)
    check_recorded(parts)
    with records.storage_errors(WRITE_HINT):
        write_merged(parts, out)
    return MergeOutcome(out, parts, len(parts[0].shard.owners))


# ---------------------------------------------------------------- reading and checking


def load_part(root: Path) -> Part:
    run = rundir.load(root)  # RunDirError / MatrixError: exit 2
    shard = rundir.read_shard(root)
    matrix_bytes = rundir.read_matrix_bytes(root)
    if matrix_sha256(matrix_bytes) != shard.matrix_sha256:
        raise RunDirError("matrix.yaml does not hash to the matrix_sha256 its shard.json records "
                          "(changed after the run?)", path=str(root), hint="merge the parts as their shards wrote them")
    options = rundir.read_object(run.layout.options) if run.layout.options.exists() else {}
    if options.get("shard") != str(shard.spec):
        raise RunDirError(f"options.json says shard {options.get('shard')!r}, shard.json {shard.spec}",
                          path=str(root))
    planned = tuple(c for c in run.planned if c not in _split_controls(run.plan, shard.cells))
    if planned != shard.cells or any(shard.owners.get(c) != shard.index for c in shard.cells):
        raise RunDirError(f"plan.json's cells are not the cells shard.json says shard {shard.spec} owns",
                          path=str(root))
    part = Part(root, run, shard, {k: v for k, v in options.items() if k not in RESULT_OPTIONS_OF_A_PART},
                matrix_bytes)
    _check_meta_engines(part)
    return part


def _check_meta_engines(part: Part) -> None:
    """A cell recorded by another engine build than its part claims was run elsewhere."""
    for cell_id, meta in part.run.metas.items():
        claim = part.shard.engines.get(meta.engine.name) if meta.engine is not None else None
        if meta.engine is None or claim is None:
            continue
        build, claimed = EngineBuild.of(meta.engine), EngineBuild.of(claim)
        if build != claimed:
            raise RunDirError(f"cell {cell_id} was run by engine {meta.engine.name!r} {build.describe()}; "
                              f"its shard.json says {claimed.describe()}", path=str(part.root))


def check_same_experiment(parts: Sequence[Part]) -> None:
    """Every part of one matrix, one plan, one engine build, one set of result options."""
    first = parts[0]
    for part in parts[1:]:
        a, b = first.shard, part.shard
        if b.matrix_sha256 != a.matrix_sha256:
            _foreign(part, first, f"is a part of matrix {b.matrix_name!r} (sha256 {b.matrix_sha256[:12]}), "
                     f"the first of matrix {a.matrix_name!r} (sha256 {a.matrix_sha256[:12]})")
        if (b.plan_sha256, b.count) != (a.plan_sha256, a.count):
            _foreign(part, first, f"is shard {b.spec} of plan {b.plan_sha256[:12]}; the first is shard "
                     f"{a.spec} of plan {a.plan_sha256[:12]}")
        if dict(b.owners) != dict(a.owners):
            _foreign(part, first, "assigns the cells to other shards (another shadowlab version?)")
        for name in sorted(set(a.engines) | set(b.engines)):
            if a.engines.get(name) != b.engines.get(name):
                _foreign(part, first, f"ran engine {name!r} {describe_identity(b.engines.get(name))}; "
                         f"the first {describe_identity(a.engines.get(name))} (another engine build)")
        if dict(part.options) != dict(first.options):
            _foreign(part, first, f"ran with options {dict(part.options)}, the first with {dict(first.options)}")
        if part.run.prompts != first.run.prompts:
            _foreign(part, first, "tokenized the prompts differently (another tokenizer)")


def _foreign(part: Part, first: Part, difference: str) -> None:
    raise RunDirError(f"foreign shard: {part.name} {difference}; first part {first.root}",
                      path=str(part.root), hint="merge only the parts of one `shadowlab run --shard` fan-out")


def check_shards(parts: Sequence[Part]) -> None:
    """Exactly one part per shard index: a duplicate or a missing shard is named."""
    by_index: dict[int, Part] = {}
    for part in parts:
        seen = by_index.get(part.shard.index)
        if seen is not None:
            raise RunDirError(f"duplicate shard {part.shard.spec}: {seen.root} and {part.root}",
                              path=str(part.root), hint="pass one part per shard")
        by_index[part.shard.index] = part
    first = parts[0].shard
    missing = [i for i in range(1, first.count + 1) if i not in by_index]
    if missing:
        owed = [f"shard {i}/{first.count} (cells: {', '.join(_owned(first, i)) or 'none'})" for i in missing]
        raise RunDirError(f"missing shards: {'; '.join(owed)}", path=str(parts[0].root),
                          hint="pass every shard's part; run a missing shard with --shard I/N")


def _owned(shard: ShardRecord, index: int) -> list[str]:
    return [cell_id for cell_id, owner in shard.owners.items() if owner == index]


def check_recorded(parts: Sequence[Part]) -> None:
    """Every cell a part owns recorded there and finished (not aborted); no other cell there."""
    for part in parts:
        metas = part.run.metas
        extra = [c for c in metas if c not in part.shard.cells
                 and c not in _split_controls(part.run.plan, part.shard.cells)]
        if extra:
            raise RunDirError(f"{part.name} holds cells it does not own: {', '.join(extra)}",
                              path=str(part.root))
        unrecorded = [c for c in part.shard.cells if c not in metas]
        aborted = [c for c in part.shard.cells if c in metas and metas[c].status is CellStatus.ABORTED]
        if unrecorded or aborted:
            what = "; ".join(text for text in (
                f"not recorded: {', '.join(unrecorded)}" if unrecorded else "",
                f"aborted: {', '.join(aborted)}" if aborted else "") if text)
            raise RunDirError(f"{part.name} did not finish: cells it owes are {what}", path=str(part.root),
                              hint=f"finish it: shadowlab run MATRIX --shard {part.shard.spec} "
                                   f"--out {part.root} --resume")


# ---------------------------------------------------------------- writing


def write_merged(parts: Sequence[Part], out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunDirError("the merged run directory already exists and is not empty", path=str(out),
                          hint="choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.merging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _write(parts, RunLayout(staging), run_id=out.name)
        os.replace(staging, out)  # an empty `out` is replaced; a merge is all or nothing
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write(parts: Sequence[Part], layout: RunLayout, run_id: str) -> None:
    first = parts[0]
    records.write_bytes_atomic(layout.matrix, first.matrix_bytes)
    records.write_json_atomic(layout.options, dict(first.options))
    records.write_json_atomic(layout.plan, merged_plan(parts))
    records.write_json_atomic(layout.environment, {
        **first.run.environment,
        "shards": [{"index": p.shard.index, "host": p.shard.host, "environment": dict(p.run.environment)}
                   for p in sorted(parts, key=lambda p: p.shard.index)]})
    if first.run.layout.prompts_dir.is_dir():
        _copy_tree(first.run.layout.prompts_dir, layout.prompts_dir)
    for part in parts:
        for cell_id, meta in part.run.metas.items():
            _copy_tree(part.run.layout.cell_dir(cell_id), layout.cell_dir(cell_id))
            meta.run_id = run_id  # the record now belongs to the merged run
            records.write_meta(layout, meta)
    records.write_json_atomic(layout.merge, {
        versions.MERGE.key: MERGE_VERSION, "matrix_sha256": first.shard.matrix_sha256,
        "plan_sha256": first.shard.plan_sha256, "count": first.shard.count,
        "parts": [{"index": p.shard.index, "path": str(p.root.resolve()), "host": p.shard.host,
                   "cells": list(p.shard.cells)} for p in sorted(parts, key=lambda p: p.shard.index)]})


def merged_plan(parts: Sequence[Part]) -> dict[str, Any]:
    """The whole plan, in the order every part's shard.json records: what a whole run writes."""
    cells = {c["id"]: c for p in parts for c in p.run.plan.get("cells", ())}
    first = parts[0]
    plan = {"plan_version": first.run.plan.get("plan_version"),
            "cells": [cells[cell_id] for cell_id in first.shard.owners]}
    if records.sha256_json(plan) != first.shard.plan_sha256:
        raise RunDirError("the parts' cells do not add up to the plan their shard.json records",
                          path=str(first.root), hint="merge parts written by one shadowlab version")
    # Split controls (DESIGN §5) are planned by a part after its warm cells: after the plan.
    splits = [c for p in parts for c in p.run.plan.get("cells", ())
              if c["id"] in _split_controls(p.run.plan, p.shard.cells)]
    return {**plan, "cells": [*plan["cells"], *splits]}


def _split_controls(plan: dict[str, Any], owned: Sequence[str]) -> set[str]:
    """The split-control cells a part planned for warm cells it owns (issue 16)."""
    return {c["id"] for c in plan.get("cells", ()) if isinstance(c, dict)
            and c.get("kind") == "split_control" and c.get("control_of") in owned}


def _copy_tree(source: Path, target: Path) -> None:
    """Hard links where the file system allows (engine logs may be large), copies elsewhere;
    meta.json is rewritten through the atomic writer, so a link never changes a part's record."""
    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy, symlinks=True)


__all__ = ["MERGE_VERSION", "MergeOutcome", "Part", "check_recorded", "check_same_experiment", "check_shards",
           "load_part", "merge", "merged_plan", "write_merged"]
