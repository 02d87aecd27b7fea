"""The per-cell record (``meta.json``): its schema, defined once, here, and documented from it.

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
(``python -m shadowlab.results.records > docs/records.md``; a test keeps them equal).

Versioning (asv's habit): every meta.json carries ``schema_version``. Readers
upgrade older files step by step through ``META`` (the one version chain of the run
directory's files, ``versions.py``) and refuse files newer than ``SCHEMA_VERSION``
instead of misreading them. All JSON is written atomically (``files.py``: temp file in
the same directory, fsync, rename), so an interrupted run never leaves a half-written
record. The paths are ``layout.py``'s; the JSON codec is ``codec.py``'s. The names of
those modules are re-exported here, where callers have always found them.

Engine output (completion text, props, log tail) is stored as data: strings and
numbers copied from the engine, never evaluated or used as paths.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import textwrap
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.errors import RunDirError
from shadowlab.escape import visible
from shadowlab.results import files
from shadowlab.results.codec import FieldError, checked, from_jsonable, json_type_name, to_jsonable, type_name
from shadowlab.results.files import (  # re-exported: records is where callers find them
    DERIVED_WRITE_HINT, MAX_JSON_DEPTH, MAX_RECORD_BYTES, STORAGE_ERRNOS, FileRefused, JSONRefused, JSONTooDeep,
    atomic_path, json_bytes, json_depth, parse_json, read_json, read_regular_file, sha256_bytes, sha256_file,
    sha256_json, sha256_text, storage_errors, storage_failure, write_bytes_atomic, write_json_atomic)
from shadowlab.results.layout import NAME_MAX_BYTES, RunLayout, child_dir, component
from shadowlab.results.versions import Versioned

SCHEMA_VERSION = 3  # 2: TurnRecord.conversation; 3: log_attribution, sent_ms, in_flight


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
class TopLogprob:
    id: int = doc("A candidate token id.")
    logprob: float = doc("Its log probability, as the engine computed it.")


@dataclass
class Completion:
    text: str = doc("Completion text as the engine returned it (its `content`).")
    tokens: list[int] = doc("Completion token ids as the engine returned them.")
    sha256: str = doc("sha256 of the UTF-8 bytes of `text`.")
    stop_type: str | None = doc("Why generation stopped, as the engine said (`limit`, `eos`, ...).")
    top_logprobs: list[list[TopLogprob]] | None = doc(
        "Per generated token, the engine's top candidates (`generation.n_probs` of them, from "
        "llama.cpp's `completion_probabilities`); None when none were asked or given. Evidence for "
        "a mismatch's triage.", default=None)


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
        "Client-side time from sending the request to its first token. `/completion` turns on "
        "llama.cpp (upstream) and the reference engine are streamed: the first event carrying a "
        "token. Other answers (chat, `openai` and ik_llama.cpp kinds) are not, and it is the "
        "first byte of the answer, which includes generating `n_predict` tokens."
    )
    response_ms: float | None = doc("Client-side time from sending the request to the whole answer.")
    completion: Completion | None = doc("The generated completion; None when the turn failed.")
    log_offsets: list[int] = doc(
        "[start, end) byte offsets into engine.log of this turn's lines. The end waits "
        "(bounded) for the turn's `prompt eval time` line."
    )
    log_complete: bool = doc("True when the turn's `prompt eval time` line was seen before the span closed.")
    task_ids: list[int] = doc("llama.cpp task ids seen in the span (`| task N |`).")
    response_file: str | None = doc(
        "Raw response body, relative to the cell directory; a streamed answer's is the body its "
        "events add up to (the final event with the streamed `content` and `tokens`; "
        "`shadowlab_lost_ids` says why `tokens` is empty when the stream lost ids)."
    )
    conversation: str | None = doc(
        "The conversation the turn belongs to (the plan's turn: an ordered sequence's name); None "
        "for cold and control turns, a prompt alone in a fresh process. Schema 1 records get it "
        "from their planned cell.", default=None)
    log_attribution: str = doc(
        "How the turn's lines were found in engine.log: `span` (sent alone: the lines between its "
        "request and the next one) or `task` (sent while others were in flight, a traffic's "
        "`in_flight`: the lines of the one task whose figures match the answer's, `task_ids`; "
        "`log_offsets` then runs from the end of the task that finished before it to the end of "
        "its own last line, and its own lines may begin earlier). Schema 2 records: `span`.",
        default="span")
    sent_ms: float | None = doc(
        "Requests sent concurrently: when this one was sent, ms after the cell's first request; "
        "None for turns sent one after another.", default=None)
    in_flight: int | None = doc(
        "Requests sent concurrently: how many were in flight once this one was sent, itself "
        "included; None for turns sent one after another.", default=None)


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


@dataclass(frozen=True)
class EngineBuild:
    """What makes two engines the same build: the sha256 of the binary and of the model. The one
    comparison of engine identities (compare's refusal, merge's foreign parts, a part's and a
    run's --resume), and the one way a message names a build."""

    binary_sha256: str
    model_sha256: str

    @classmethod
    def of(cls, engine: Any) -> "EngineBuild | None":
        """The build of an EngineRecord, an adapter's EngineIdentity or shard.json's mapping
        (None: no engine, e.g. one that could not be prepared)."""
        if engine is None:
            return None
        if isinstance(engine, dict):
            return cls(str(engine.get("binary_sha256")), str(engine.get("model_sha256")))
        return cls(engine.binary_sha256, engine.model_sha256)

    def describe(self) -> str:
        return f"binary {self.binary_sha256[:12]}, model {self.model_sha256[:12]}"

    def changes(self, now: "EngineBuild") -> list[tuple[str, str, str]]:
        """(part, sha256 then, sha256 now) for the binary and the model, where they differ."""
        return [(what, old, new) for what, old, new in (("binary", self.binary_sha256, now.binary_sha256),
                                                          ("model", self.model_sha256, now.model_sha256))
                if old != new]


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
        "configuration, sequence, turns (read back only in that shape: names text or null, "
        "turns objects with an integer index)."
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
    startup_ms: float | None = doc("Spawn → ready (`/health` 200 and the engine kind's ready probe answered).")
    elapsed_ms: float | None = doc("Whole cell: lease → stopped.")
    stop: StopRecord | None = doc("How the engine was stopped and verified gone.")
    turns: list[TurnRecord] = doc("One entry per turn answered or attempted, in order.")



def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists: how a turn's divergence point is
    found from the records' prompt token ids, and how prompts are checked to share a prefix."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------- reading a record


def meta_from_dict(data: dict[str, Any], *, source: str = "<meta>") -> CellMeta:
    """Read a meta.json object, upgrading older schemas; refuse newer ones and wrong types
    (RunDirError naming the file and the field)."""
    data = META.read(data, source=source)
    try:
        meta = checked(CellMeta, data)
        _check_planned_cell(meta.cell)
        return meta
    except FieldError as exc:
        raise RunDirError(f"not a valid cell record: {exc}", path=source,
                          hint="the record was damaged or written by something else; "
                               "rerun the cell with `shadowlab run --resume`") from None


_PLANNED_TEXT = ("kind", "engine", "configuration", "sequence", "control_of")


def _check_planned_cell(cell: dict[str, Any]) -> None:
    """The planned cell a record holds (`cell`, free-form in the schema) in the shape its readers
    take: its names text (or null), its turns objects with an integer index. FieldError names
    the field."""
    for key in _PLANNED_TEXT:
        if cell.get(key) is not None and not isinstance(cell[key], str):
            raise FieldError(f"cell.{key}", f"expected a string, got {json_type_name(cell[key])}")
    turns = cell.get("turns", [])
    if not isinstance(turns, list):
        raise FieldError("cell.turns", f"expected a list, got {json_type_name(turns)}")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise FieldError(f"cell.turns[{i}]", f"expected an object, got {json_type_name(turn)}")
        if isinstance(turn.get("index"), bool) or not isinstance(turn.get("index"), int):
            raise FieldError(f"cell.turns[{i}].index", f"expected an integer, got {json_type_name(turn.get('index'))}")


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """meta.json 1 -> 2: turns gain `conversation`, taken from the planned cell the record holds
    (`cell.turns[i].conversation`, else a warm cell's sequence: before sequences had kinds every
    warm cell was one ordered conversation; else None). Shapes are checked after upgrading."""
    cell = data.get("cell") if isinstance(data.get("cell"), dict) else {}
    planned = cell.get("turns") if isinstance(cell.get("turns"), list) else []
    implied = cell.get("sequence") if cell.get("kind") == "warm" else None
    by_index = {t["index"]: t.get("conversation", implied) for t in planned
                if isinstance(t, dict) and isinstance(t.get("index"), int)}
    turns = data.get("turns")
    if isinstance(turns, list):  # an index of the wrong type is reported by the checked read
        turns = [{**t, "conversation": by_index.get(t["index"], implied)
                  if isinstance(t.get("index"), int) else implied} if isinstance(t, dict) else t
                 for t in turns]
    return {**data, "turns": turns, "schema_version": 2}


def _upgrade_v2(data: dict[str, Any]) -> dict[str, Any]:
    """meta.json 2 -> 3: every turn was sent alone, its lines found by span."""
    turns = data.get("turns")
    if isinstance(turns, list):
        turns = [{**t, "log_attribution": "span"} if isinstance(t, dict) else t for t in turns]
    return {**data, "turns": turns, "schema_version": 3}


# meta.json's version chain: schema_version n -> n + 1.
META = Versioned(RunLayout.META, "schema_version", SCHEMA_VERSION, {1: _upgrade_v1, 2: _upgrade_v2})


def terminal_safe(text: str) -> str:
    """Text for a terminal or CI log: `shadowlab.escape.visible` (the one escape every output
    uses: control bytes, bidirectional controls, lone surrogates; newlines and tabs kept)."""
    return visible(text)


# ---------------------------------------------------------------- run directory


def write_meta(layout: RunLayout, meta: CellMeta) -> Path:
    path = layout.meta(meta.cell_id)
    write_json_atomic(path, meta)
    return path


def read_meta(path: Path) -> CellMeta:
    return meta_from_dict(files.read_json(path), source=str(path))


def planned_cell_ids(plan: Any, *, source: str) -> tuple[str, ...]:
    """The cell ids of a plan.json object, in order; RunDirError when it is not shaped like one."""
    cells = plan.get("cells", []) if isinstance(plan, dict) else plan
    if not isinstance(cells, list):
        raise RunDirError(f"cells: expected a list, got {json_type_name(cells)}", path=source)
    ids = []
    for index, cell in enumerate(cells):
        cell_id = cell.get("id") if isinstance(cell, dict) else None
        if not isinstance(cell_id, str):
            raise RunDirError(f"cells[{index}].id: expected a string, got {json_type_name(cell_id)}",
                              path=source)
        ids.append(cell_id)
    return tuple(ids)


# ---------------------------------------------------------------- documentation


# The layout block of the module docstring, for the generated documentation.
_LAYOUT_BLOCK = (__doc__ or "").split("::", 1)[1].split("\n\n")[1]


def schema_markdown() -> str:
    """docs/records.md, generated from the dataclasses above."""
    lines = [
        "# Run records (`meta.json`)",
        "",
        "<!-- generated by `python -m shadowlab.results.records > docs/records.md`; do not edit -->",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. Readers refuse files with a newer "
        "`schema_version`; older ones are upgraded step by step. Every file is written "
        "atomically (temp file + rename), with the mode a plain `open()` gives (0666 & ~umask).",
        "",
        "Reading is bounded whatever a run directory holds: a record that is not a regular file "
        "(a directory, a FIFO, a link to a device such as /dev/zero) is refused unread, and so is "
        f"one larger than {files.size_text(MAX_RECORD_BYTES)}; JSON must be strict (no NaN) and nested at "
        f"most {MAX_JSON_DEPTH} levels; every field must have the type below (`X | None`: X or "
        "null). A record that breaks a rule is a RunDirError naming the file and the field path "
        "(`turns[2].prompt_tokens`): `shadowlab report` and `shadowlab gate` exit 2.",
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
            type_text = type_name(hints[f.name]).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{type_text}` | {meaning} |")
    return "\n".join(lines) + "\n"


__all__ = [
    # meta.json's schema and reading
    "SCHEMA_VERSION", "META", "CellMeta", "CellStatus", "Completion", "Cores", "EngineBuild", "EngineRecord", "Gpu",
    "StopRecord", "TopLogprob", "TurnRecord", "common_prefix", "meta_from_dict", "planned_cell_ids", "read_meta",
    "schema_markdown", "terminal_safe", "write_meta",
    # re-exported from codec.py, files.py and layout.py
    "DERIVED_WRITE_HINT", "MAX_JSON_DEPTH", "MAX_RECORD_BYTES", "NAME_MAX_BYTES", "STORAGE_ERRNOS", "FileRefused",
    "JSONRefused", "JSONTooDeep", "RunDirError", "RunLayout", "atomic_path", "child_dir", "component",
    "from_jsonable", "json_bytes", "json_depth", "parse_json", "read_json", "read_regular_file", "sha256_bytes",
    "sha256_file", "sha256_json", "sha256_text", "storage_errors", "storage_failure", "to_jsonable",
    "write_bytes_atomic", "write_json_atomic",
]


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
