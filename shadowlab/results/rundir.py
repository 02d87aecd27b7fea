"""The one reader of a run directory: everything verdicts, report and gate need, loaded once.

    run = load(run_dir)                       # RunDirError / MatrixError: exit 2
    run.matrix, run.plan, run.planned, run.environment, run.prompts, run.metas, run.saved_verdicts
    run.parse_log(cell_id, family, patterns)  # a cell's engine.log, parsed (None: no log)

Each file is read once, through the bounded readers of ``files.py`` (regular files only, size
and depth bounded), typed by ``records.py`` and versioned by ``versions.py``; ``layout.RunLayout``
spells the paths. The same readers serve the runner's ``--resume`` (its shard.json, matrix bytes,
cell records), split controls and ``simulate RUN/cells/CELL``; every stage after the run takes a
``RunDir``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.errors import RunDirError, ShadowlabError
from shadowlab.matrix import Matrix
from shadowlab.matrix import load as load_matrix
from shadowlab.results import files, records, versions
from shadowlab.results.layout import RunLayout
from shadowlab.results.records import CellMeta

# The names, as RunLayout spells them (kept here for the callers that import them from here).
VERDICTS_NAME = RunLayout.VERDICTS
SHARD_NAME = RunLayout.SHARD
MERGE_NAME = RunLayout.MERGE


@dataclass(frozen=True)
class RunDir:
    """A run directory as loaded. ``matrix`` is None only where it was loaded with
    ``need_matrix=False`` and has no usable matrix.yaml (a directory assembled by a test)."""

    root: Path
    matrix: Matrix | None
    plan: Mapping[str, Any] = field(default_factory=dict)
    planned: tuple[str, ...] = ()  # cell ids of plan.json, in plan order
    environment: Mapping[str, Any] = field(default_factory=dict)
    prompts: Mapping[str, Mapping[str, list[int]]] = field(default_factory=dict)  # engine -> id -> ids
    metas: Mapping[str, CellMeta] = field(default_factory=dict)  # plan order, then the rest by name
    has_cells: bool = False  # cells/ exists (the verdicts are then computed from the records)
    saved_verdicts: Mapping[str, Any] | None = None  # verdicts.json, read only without cells/

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.root)

    @property
    def run_id(self) -> str:
        return self.root.name

    def log_patterns(self, engine: str) -> tuple[str, ...]:
        """The matrix's `engines.<engine>.log_patterns` (empty without a matrix)."""
        spec = self.matrix.engines.get(engine) if self.matrix is not None else None
        return tuple(spec.log_patterns) if spec is not None else ()

    def has_log(self, cell_id: str) -> bool:
        return self.layout.engine_log(cell_id).exists()

    def parse_log(self, cell_id: str, family: str, patterns: Sequence[Any] = ()) -> Any:
        """The cell's engine.log through ``logparse.parse`` (bounded per line, streamed), or None
        when the cell left no log."""
        from shadowlab.logs import parse as logparse  # the C scanner loads only when a log is read

        path = self.layout.engine_log(cell_id)
        return logparse.parse(path, family, patterns) if path.exists() else None


def load(run_dir: str | Path, *, need_matrix: bool = True) -> RunDir:
    """Read a run directory once. ``need_matrix``: matrix.yaml must be there and valid (report,
    gate); without it (verdicts of a bare directory) a missing or invalid matrix is None."""
    root = Path(run_dir)
    layout = RunLayout(root)
    if not root.is_dir():
        raise RunDirError("not a directory", path=str(root), hint="pass reports/<run-id>")
    matrix = _matrix(layout, need_matrix)
    plan = read_plan(layout)
    planned = records.planned_cell_ids(plan, source=str(layout.plan))
    environment = environment_fields(read_object(layout.environment)) if layout.environment.exists() else {}
    has_cells = layout.cells_dir.is_dir()
    saved = None
    if not has_cells and layout.verdicts.is_file():
        saved = read_object(layout.verdicts)
    return RunDir(
        root=root, matrix=matrix, plan=plan, planned=planned, environment=environment,
        prompts=read_prompts(layout) if has_cells else {},
        metas=read_cell_metas(root, planned) if has_cells else {},
        has_cells=has_cells, saved_verdicts=saved,
    )


def _matrix(layout: RunLayout, need_matrix: bool) -> Matrix | None:
    if not layout.matrix.exists():
        if not need_matrix:
            return None
        raise RunDirError("no matrix.yaml: not a shadowlab run directory", path=str(layout.root),
                          hint="pass the directory `shadowlab run` wrote (reports/<run-id>)")
    try:
        return load_matrix(layout.matrix, check_files=False)  # MatrixError: exit 2
    except ShadowlabError:
        if need_matrix:
            raise
        return None  # verdicts alone: a damaged matrix copy costs only its log patterns


def read_object(path: Path) -> dict[str, Any]:
    """A record's JSON object through files.read_json; RunDirError naming the file otherwise."""
    data = files.read_json(path)
    if not isinstance(data, dict):
        raise RunDirError("not a JSON object", path=str(path))
    return data


# environment.json's fields (run/environment.py writes them): a field of another type, as a
# hand-edited or hostile file may hold, is left out and reads as missing ('—' on the report).
_TEXT, _COUNT = (str,), (int,)
_ENVIRONMENT: dict[str, Any] = {
    "captured_at": _TEXT, "host": _TEXT, "memory_bytes": _COUNT,
    "os": {"system": _TEXT, "release": _TEXT, "machine": _TEXT},
    "cpu": {"model": _TEXT, "logical_cores": _COUNT, "usable_cores": [_COUNT]},
    "python": {"version": _TEXT, "executable": _TEXT},
    "packages": {str: (str, type(None))},
    "shadowlab": {"version": (str, type(None)), "commit": (str, type(None)), "dirty": (bool, type(None))},
}
_ENVIRONMENT["shards"] = [{"index": _COUNT, "host": (str, type(None)), "environment": _ENVIRONMENT}]  # merge.py


def environment_fields(doc: Mapping[str, Any], shape: Any = None) -> dict[str, Any]:
    """environment.json's object with only the fields of the types it is written with."""
    shape = _ENVIRONMENT if shape is None else shape
    out: dict[str, Any] = {}
    for key, value in doc.items():
        want = shape.get(key, shape.get(str)) if isinstance(key, str) else None
        if want is None:
            continue
        if isinstance(want, dict):
            if isinstance(value, Mapping):
                out[key] = environment_fields(value, want)
        elif isinstance(want, list):
            if isinstance(value, list) and isinstance(want[0], dict):
                out[key] = [environment_fields(v, want[0]) for v in value if isinstance(v, Mapping)]
            elif isinstance(value, list) and all(_is(v, want[0]) for v in value):
                out[key] = list(value)
        elif _is(value, want):
            out[key] = value
    return out


def _is(value: Any, types: tuple[type, ...]) -> bool:
    """An instance of one of `types`; bool is no count, and a count is not negative."""
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types) and not (isinstance(value, int) and not isinstance(value, bool) and value < 0)


def read_plan(layout: RunLayout) -> dict[str, Any]:
    """plan.json as JSON ({} where there is none yet), its version checked (versions.PLAN): a
    plan of a newer shadowlab is refused, naming the file, never misread."""
    if not layout.plan.exists():
        return {}
    return versions.PLAN.read(read_object(layout.plan), source=str(layout.plan))


def read_saved_verdicts(run_dir: str | Path) -> dict[str, Any]:
    """verdicts.json of a run directory, as JSON (``verdicts.read`` makes it a RunVerdict)."""
    return read_object(RunLayout(Path(run_dir)).verdicts)


def read_shard(run_dir: str | Path) -> Any:
    """shard.json of a part as a ``shard.ShardRecord``; RunDirError when it is missing or bad."""
    from shadowlab.plan.shard import ShardRecord

    path = RunLayout(Path(run_dir)).shard
    if not path.exists():
        raise RunDirError("no shard.json: not a part of a sharded run", path=str(run_dir),
                          hint="merge the directories `shadowlab run --shard I/N` wrote")
    return ShardRecord.from_dict(files.read_json(path), source=str(path))


def read_matrix_bytes(run_dir: str | Path) -> bytes:
    """The resolved matrix.yaml as written (what a part's matrix_sha256 hashes), bounded."""
    return files.read_regular_file(RunLayout(Path(run_dir)).matrix, files.MAX_RECORD_BYTES)


def read_prompts(layout: RunLayout) -> dict[str, dict[str, list[int]]]:
    """{engine: {prompt_id: token ids}} from prompts/<engine>.json (absent files: empty)."""
    out: dict[str, dict[str, list[int]]] = {}
    if not layout.prompts_dir.is_dir():
        return out
    for path in sorted(layout.prompts_dir.glob("*.json")):
        data = files.read_json(path)  # bounded; a link to /dev/zero was read until OOM
        if not isinstance(data, dict):
            raise RunDirError("not a JSON object of prompt id → prompt", path=str(path))
        out[path.stem] = {
            pid: list(entry["tokens"])
            for pid, entry in data.items()
            if isinstance(entry, dict) and isinstance(entry.get("tokens"), list)
        }
    return out


def read_cell_metas(root: Path, order: Sequence[str] | None = None) -> dict[str, CellMeta]:
    """Every cell's meta.json of a run directory, by cell id: ``order`` first (default: plan.json's
    order), then the rest by name. A record whose cell_id is not its directory's name is refused:
    readers use the id in paths."""
    layout = RunLayout(Path(root))
    if order is None:
        order = records.planned_cell_ids(read_plan(layout), source=str(layout.plan))
    found = sorted(p.parent.name for p in layout.cells_dir.glob(f"*/{RunLayout.META}"))
    ids = [c for c in order if c in found] + [c for c in found if c not in order]
    metas = {}
    for cell_id in ids:
        path = layout.meta(cell_id)
        meta = records.read_meta(path)
        if meta.cell_id != cell_id:
            raise RunDirError(f"cell_id: {meta.cell_id!r} is not the name of its directory",
                              path=str(path))
        metas[cell_id] = meta
    return metas


__all__ = ["MERGE_NAME", "RunDir", "SHARD_NAME", "VERDICTS_NAME", "load", "read_cell_metas", "read_matrix_bytes",
           "read_object", "read_plan", "read_prompts", "read_saved_verdicts", "read_shard"]
