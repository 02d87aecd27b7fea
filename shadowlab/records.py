"""The run directory and the per-cell record (``meta.json``): defined once, here.

Layout of one run (DESIGN.md §4)::

    reports/<run-id>/
      matrix.yaml            resolved matrix (as loaded, defaults filled)
      plan.json              the cells, in order
      environment.json       host, CPU, cores, Python + packages, shadowlab version + commit
      prompts/<engine>.json  {prompt_id: {"kind", "tokens": [...], "sha256", "text_seed"}}
      prompts/<engine>.engine.log            log of the engine process that tokenized them
      cells/<cell-id>/meta.json              this module's CellMeta
      cells/<cell-id>/engine.log             the engine's full output (stdout + stderr)
      cells/<cell-id>/responses/turn-<i>.json   raw HTTP response bodies
      cells/<cell-id>/scratch/               the engine's working directory

The schema is the dataclasses below; every field carries its documentation in
``metadata["doc"]`` and ``docs/records.md`` is generated from them
(``python -m shadowlab.records > docs/records.md``; a test keeps them equal).

Versioning (asv's habit): every meta.json carries ``schema_version``. Readers
upgrade older files step by step through ``_UPGRADES`` and refuse files newer than
``SCHEMA_VERSION`` instead of misreading them. All JSON is written atomically
(temp file in the same directory, fsync, rename), so an interrupted run never
leaves a half-written record.

Engine output (completion text, props, log tail) is stored as data: strings and
numbers copied from the engine, never evaluated or used as paths.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.errors import RunDirError
from shadowlab.escape import visible

SCHEMA_VERSION = 1


def doc(text: str, **kwargs: Any) -> Any:
    """A dataclass field documented in place (the single source for docs/records.md)."""
    return field(metadata={"doc": text}, **kwargs)


class CellStatus(str, enum.Enum):
    """How a cell ended (nox's habit: one enum, decided once)."""

    OK = "ok"  # every turn answered; the cell can be judged
    FAILED = "failed"  # the engine never became ready, died, hung, or answered garbage
    SKIPPED = "skipped"  # not run (e.g. its engine could not be prepared)
    ABORTED = "aborted"  # shadowlab was interrupted while the cell ran


@dataclass
class Completion:
    text: str = doc("Completion text as the engine returned it (its `content`).")
    tokens: list[int] = doc("Completion token ids as the engine returned them.")
    sha256: str = doc("sha256 of the UTF-8 bytes of `text`.")
    stop_type: str | None = doc("Why generation stopped, as the engine said (`limit`, `eos`, ...).")


@dataclass
class TurnRecord:
    index: int = doc("Turn number within the cell's sequence, from 0.")
    prompt_id: str = doc("Prompt name from the matrix (`A`, `C`, ...).")
    prompt_sha256: str = doc(
        "sha256 of the prompt: of its token ids as little-endian int32 for token prompts "
        "(as in prompts/<engine>.json), of the messages as compact key-sorted JSON for chat turns."
    )
    prompt_tokens: int | None = doc(
        "Prompt length in tokens (for chat: as the engine counted it, `usage.prompt_tokens`)."
    )
    prompt_token_ids: list[int] | None = doc(
        "The exact prompt token ids sent (raw prompts); the slot LCP is computed from these. "
        "None for chat turns."
    )
    messages: list[dict[str, str]] | None = doc(
        "Chat messages sent (chat turns); earlier assistant replies are the warm run's own."
    )
    endpoint: str = doc("HTTP path of the request (`/completion`, `/v1/chat/completions`).")
    http_status: int | None = doc("HTTP status of the answer; None when none came.")
    error: str | None = doc("Why the turn failed (timeout, connection lost, HTTP error); None if ok.")
    timings: dict[str, Any] = doc("The engine's raw `timings` object.")
    reused_tokens: int | None = doc("Prompt tokens reused from cache, as the engine's API reports.")
    processed_tokens: int | None = doc("Prompt tokens processed, as the engine's API reports.")
    prefill_ms: float | None = doc("Prefill time as the engine reports it (`timings.prompt_ms`).")
    ttft_ms: float | None = doc(
        "Client-side time from sending the request to the first byte of the answer. Requests "
        "are not streamed, so this includes generating `n_predict` tokens; compare it across "
        "cells with the same generation settings only."
    )
    response_ms: float | None = doc("Client-side time from sending the request to the whole answer.")
    completion: Completion | None = doc("The generated completion; None when the turn failed.")
    log_offsets: list[int] = doc(
        "[start, end) byte offsets into engine.log of this turn's lines. The end waits "
        "(bounded) for the turn's `prompt eval time` line."
    )
    log_complete: bool = doc("True when the turn's `prompt eval time` line was seen before the span closed.")
    task_ids: list[int] = doc("llama.cpp task ids seen in the span (`| task N |`).")
    response_file: str | None = doc("Raw response body, relative to the cell directory.")


@dataclass
class Cores:
    requested: int = doc("Cores per cell from the matrix's isolation settings.")
    leased: list[int] = doc("Core ids leased for this cell (disjoint from every other live cell).")
    observed_affinity: list[int] = doc(
        "Allowed-CPU list read from the running engine process (psutil cpu_affinity)."
    )
    threads: int = doc("Thread count given to the engine (`-t`, OMP_NUM_THREADS, ...).")


@dataclass
class Gpu:
    requested: int | None = doc("Device index the cell asked for; None = GPU hidden.")
    visibility_env: dict[str, str] = doc("CUDA/HIP/ROCR visibility variables set for the engine.")
    reported_device: str | None = doc("Device the engine reports it computes on (`/props` device).")
    verified: bool | None = doc(
        "True when the reported device agrees with the request (cpu when hidden); "
        "None when the engine reports no device."
    )


@dataclass
class EngineRecord:
    name: str = doc("Engine name in the matrix.")
    kind: str = doc("Adapter kind (`reference`, `llama-server`, `openai`).")
    log_family: str = doc("Log format family the parser uses for engine.log.")
    binary_path: str = doc("Executable (or module) that ran.")
    binary_sha256: str = doc("sha256 of that executable file.")
    version: str = doc("Version string the engine reports (`--version` or build info).")
    model_path: str = doc("Model file the engine loaded.")
    model_sha256: str = doc("sha256 of the model file.")
    props: dict[str, Any] = doc("The engine's `/props` answer at start-up (data, as returned).")
    extra: dict[str, Any] = doc("Adapter-specific identity details.")


@dataclass
class StopRecord:
    signal: str = doc("`none` (it had exited), `TERM`, or `KILL` (did not stop within the grace time).")
    returncode: int | None = doc("Exit status of the engine process (negative: killed by that signal).")
    stop_ms: float = doc("Time from the stop request until the group was gone.")
    survivors: list[int] = doc("Pids of the engine's group still alive after stop (should be empty).")
    port_free: bool = doc("Whether the port could be bound again after stop.")


@dataclass
class CellMeta:
    schema_version: int = doc("Version of this schema; readers refuse newer ones.")
    run_id: str = doc("Run this cell belongs to (the run directory's name).")
    cell_id: str = doc("Cell id, unique in the run (the cell directory's name).")
    cell: dict[str, Any] = doc(
        "The planned cell as in plan.json: kind (`warm`, `cold`, `control`), engine, "
        "configuration, sequence, turns."
    )
    status: CellStatus = doc("`ok`, `failed`, `skipped` or `aborted`.")
    reason: str | None = doc("Why the cell is not `ok`.")
    log_tail: str | None = doc("Last lines of engine.log when the cell failed.")
    command: list[str] = doc("The engine's argv.")
    env_delta: dict[str, str] = doc("Environment variables set on top of shadowlab's own.")
    scratch_dir: str = doc("The engine's working directory, relative to the cell directory.")
    cores: Cores | None = doc("CPU pinning (None when the cell never got cores).")
    gpu: Gpu | None = doc("GPU visibility.")
    port: int | None = doc("TCP port on 127.0.0.1 the engine served on.")
    port_attempts: int = doc("Launch attempts (a bind failure on a port retries with a new one).")
    pid: int | None = doc("Engine process id (also its process-group id).")
    engine: EngineRecord | None = doc("What ran: binary, version, model, props.")
    started_at: str | None = doc("UTC time the engine was spawned (ISO 8601).")
    health_ms: float | None = doc("Spawn → first `/health` 200.")
    startup_ms: float | None = doc("Spawn → ready (`/health` 200 and one `/tokenize` answered).")
    elapsed_ms: float | None = doc("Whole cell: lease → stopped.")
    stop: StopRecord | None = doc("How the engine was stopped and verified gone.")
    turns: list[TurnRecord] = doc("One entry per turn answered or attempted, in order.")


# ---------------------------------------------------------------- (de)serialisation


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _from_jsonable(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_jsonable(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {f.name: _from_jsonable(hints[f.name], value.get(f.name)) for f in dataclasses.fields(tp)}
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return [_from_jsonable(item, v) for v in value]
    return value


def meta_from_dict(data: dict[str, Any], *, source: str = "<meta>") -> CellMeta:
    """Read a meta.json object, upgrading older schemas; refuse newer ones."""
    version = data.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise RunDirError(f"no valid schema_version ({version!r})", path=source)
    if version > SCHEMA_VERSION:
        raise RunDirError(
            f"meta.json schema_version {version} is newer than this shadowlab understands "
            f"({SCHEMA_VERSION})",
            path=source,
            hint="upgrade shadowlab to read this run directory",
        )
    while version < SCHEMA_VERSION:
        data = _UPGRADES[version](data)
        version = data["schema_version"]
    return _from_jsonable(CellMeta, data)


# schema_version n -> n + 1. Empty while there is only version 1.
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


# ---------------------------------------------------------------- atomic files


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, json_bytes(to_jsonable(obj)))


def json_bytes(obj: Any) -> bytes:
    """Strict JSON, whatever an engine put in ``obj``: NaN/Infinity become null (Python would
    write the invalid tokens `NaN`), lone surrogates (an engine's invalid UTF-8, escaped in its
    JSON) are written as `\\udcNN` escapes instead of failing to encode."""
    try:
        text = json.dumps(obj, indent=1, ensure_ascii=False, allow_nan=False)
    except ValueError:
        obj = _finite(obj)
        text = json.dumps(obj, indent=1, ensure_ascii=False, allow_nan=False)
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(obj, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def terminal_safe(text: str) -> str:
    """Text for a terminal or CI log: `shadowlab.escape.visible` (the one escape every output
    uses: control bytes, bidirectional controls, lone surrogates; newlines and tabs kept)."""
    return visible(text)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise RunDirError(f"not valid JSON ({exc})", path=str(path)) from None


def sha256_json(obj: Any) -> str:
    """sha256 of compact, key-sorted JSON: how prompt token lists and messages are hashed."""
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", errors="surrogatepass")).hexdigest()


def sha256_text(text: str) -> str:
    # surrogatepass: an engine's text may hold lone surrogates (invalid UTF-8 it escaped).
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


# ---------------------------------------------------------------- run directory


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run directory; the only place that spells them."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def matrix(self) -> Path:
        return self.root / "matrix.yaml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def environment(self) -> Path:
        return self.root / "environment.json"

    @property
    def options(self) -> Path:
        """The command-line options that change results (--fault, --request-timeout)."""
        return self.root / "options.json"

    @property
    def lock(self) -> Path:
        """flock'd by the shadowlab running in this directory; holds its pid."""
        return self.root / ".shadowlab.lock"

    @property
    def prompts_dir(self) -> Path:
        return self.root / "prompts"

    def prompts(self, engine: str) -> Path:
        return self.prompts_dir / f"{engine}.json"

    @property
    def cells_dir(self) -> Path:
        return self.root / "cells"

    def cell_dir(self, cell_id: str) -> Path:
        return self.cells_dir / cell_id

    def meta(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "meta.json"

    def engine_log(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "engine.log"

    def scratch(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "scratch"

    def response(self, cell_id: str, turn_index: int) -> Path:
        return self.cell_dir(cell_id) / "responses" / f"turn-{turn_index}.json"


def write_meta(layout: RunLayout, meta: CellMeta) -> Path:
    path = layout.meta(meta.cell_id)
    write_json_atomic(path, meta)
    return path


def read_meta(path: Path) -> CellMeta:
    data = read_json(path)
    if not isinstance(data, dict):
        raise RunDirError("meta.json is not a JSON object", path=str(path))
    return meta_from_dict(data, source=str(path))


def read_cell_metas(root: Path) -> dict[str, CellMeta]:
    """Every cell's meta.json of a run directory, by cell id (plan order when plan.json exists)."""
    layout = RunLayout(root)
    order: list[str] = []
    if layout.plan.exists():
        plan = read_json(layout.plan)
        cells = plan.get("cells", []) if isinstance(plan, dict) else plan
        order = [c.get("id") or c.get("cell_id") for c in cells if isinstance(c, dict)]
    found = sorted(p.parent.name for p in layout.cells_dir.glob("*/meta.json"))
    ids = [c for c in order if c in found] + [c for c in found if c not in order]
    return {cell_id: read_meta(layout.meta(cell_id)) for cell_id in ids}


# ---------------------------------------------------------------- documentation


def _type_name(tp: Any) -> str:
    text = str(tp) if not isinstance(tp, type) else tp.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", text)


# The layout block of the module docstring, for the generated documentation.
_LAYOUT_BLOCK = (__doc__ or "").split("::", 1)[1].split("\n\n")[1]


def schema_markdown() -> str:
    """docs/records.md, generated from the dataclasses above."""
    lines = [
        "# Run records (`meta.json`)",
        "",
        "<!-- generated by `python -m shadowlab.records > docs/records.md`; do not edit -->",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. Readers refuse files with a newer "
        "`schema_version`; older ones are upgraded step by step. Every file is written "
        "atomically (temp file + rename).",
        "",
        "```",
        *textwrap.dedent(_LAYOUT_BLOCK).strip("\n").splitlines(),
        "```",
        "",
        "`status` is one of: "
        + ", ".join(f"`{s.value}`" for s in CellStatus)
        + ".",
    ]
    for cls in (CellMeta, TurnRecord, Completion, Cores, Gpu, EngineRecord, StopRecord):
        hints = typing.get_type_hints(cls)
        lines += ["", f"## {cls.__name__}", "", "| field | type | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            meaning = f.metadata.get("doc", "").replace("|", "\\|")
            type_text = _type_name(hints[f.name]).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{type_text}` | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
