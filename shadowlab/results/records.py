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
(``python -m shadowlab.results.records > docs/records.md``; a test keeps them equal).

Versioning (asv's habit): every meta.json carries ``schema_version``. Readers
upgrade older files step by step through ``_UPGRADES`` and refuse files newer than
``SCHEMA_VERSION`` instead of misreading them. All JSON is written atomically
(temp file in the same directory, fsync, rename), so an interrupted run never
leaves a half-written record.

Engine output (completion text, props, log tail) is stored as data: strings and
numbers copied from the engine, never evaluated or used as paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.errors import InfrastructureError, RunDirError
from shadowlab.escape import visible

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
    startup_ms: float | None = doc("Spawn → ready (`/health` 200 and the engine kind's ready probe answered).")
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


class _FieldError(ValueError):
    """A record value of the wrong type; `where` is its field path (`turns[2].prompt_tokens`)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or '(top level)'}: {message}")


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def from_jsonable(tp: Any, value: Any) -> Any:
    """The JSON dataclass codec's reader for shadowlab's own derived files (verdicts.json):
    unknown keys are ignored and a missing key takes the field's default (files of older
    schemas), scalars are kept as stored; a value of the wrong shape is a ValueError naming its
    field path. (Cell records go through ``meta_from_dict``: every field checked.)"""
    return _from_jsonable(tp, value, lenient=True)


def _from_jsonable(tp: Any, value: Any, where: str = "", *, lenient: bool = False) -> Any:
    """`value` (parsed JSON) as type `tp`, checked all the way down: a record is engine-made
    and disk-made data, so a wrong type is reported with its field path, never met later."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(inner) != 1:
            raise TypeError(f"unsupported record type {tp}")  # a schema bug, not a bad record
        return _from_jsonable(inner[0], value, where, lenient=lenient)
    if value is None:
        if lenient:
            return None
        raise _FieldError(where, f"missing or null; expected {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _FieldError(where, f"expected an object, got {_json_type_name(value)}")
        hints = typing.get_type_hints(tp)
        prefix = f"{where}." if where else ""
        fields = dataclasses.fields(tp)
        if lenient:  # missing: the field's default
            fields = [f for f in fields if f.name in value or not _has_default(f)]
        return tp(**{f.name: _from_jsonable(hints[f.name], value.get(f.name), prefix + f.name, lenient=lenient)
                     for f in fields})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        known = [m.value for m in tp]
        if value not in known:
            raise _FieldError(where, f"{_json_type_name(value)} is not one of "
                              + ", ".join(map(str, known)))
        return tp(value)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise _FieldError(where, f"expected a list, got {_json_type_name(value)}")
        return [_from_jsonable(item, v, f"{where}[{i}]", lenient=lenient) for i, v in enumerate(value)]
    if origin is tuple:  # tuple[X, ...]
        item = (typing.get_args(tp) or (Any,))[0]
        if not isinstance(value, list):
            raise _FieldError(where, f"expected a list, got {_json_type_name(value)}")
        return tuple(_from_jsonable(item, v, f"{where}[{i}]", lenient=lenient) for i, v in enumerate(value))
    if origin is dict:
        _, item = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise _FieldError(where, f"expected an object, got {_json_type_name(value)}")
        return {k: _from_jsonable(item, v, f"{where}.{k}", lenient=lenient) for k, v in value.items()}
    return value if lenient else _scalar(tp, value, where)


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _scalar(tp: Any, value: Any, where: str) -> Any:
    if tp is float:  # JSON has one number type: 3 is a valid float
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _wrong(where, "a number", value)
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _wrong(where, "an integer", value)
    if tp in (str, bool):
        return value if isinstance(value, tp) else _wrong(where, {str: "a string", bool: "true or false"}[tp], value)
    raise TypeError(f"unsupported record type {tp}")


def _wrong(where: str, expected: str, value: Any) -> typing.NoReturn:
    raise _FieldError(where, f"expected {expected}, got {_json_type_name(value)}")


def meta_from_dict(data: dict[str, Any], *, source: str = "<meta>") -> CellMeta:
    """Read a meta.json object, upgrading older schemas; refuse newer ones and wrong types
    (RunDirError naming the file and the field)."""
    if not isinstance(data, dict):
        raise RunDirError("meta.json is not a JSON object", path=source)
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RunDirError(f"no valid schema_version ({_json_type_name(version)})", path=source)
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
    try:
        return _from_jsonable(CellMeta, data)
    except _FieldError as exc:
        raise RunDirError(f"not a valid cell record: {exc}", path=source,
                          hint="the record was damaged or written by something else; "
                               "rerun the cell with `shadowlab run --resume`") from None


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


# schema_version n -> n + 1.
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _upgrade_v1, 2: _upgrade_v2}


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


# The machine, not the input, failing a write: a full or read-only disk, a quota, a path that
# is no directory. Every writer maps these to one InfrastructureError line (exit 3).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                            errno.EIO, errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
                            errno.EMFILE, errno.ENFILE})


# The hint of a derived file of a run directory (verdicts.json, report.html/md, junit.xml).
DERIVED_WRITE_HINT = "free space or make the run directory writable, then run `shadowlab report` again"


def storage_failure(exc: OSError, hint: str) -> InfrastructureError:
    """`cannot write FILE: <strerror> (ENOSPC)`: the one wording of a failed write, exit 3."""
    where = exc.filename if exc.filename is not None else "the run directory"
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return InfrastructureError(f"cannot write {where}: {exc.strerror or exc} ({code})", hint=hint)


@contextlib.contextmanager
def storage_errors(hint: str) -> Iterator[None]:
    """Writes in the block that the machine fails (STORAGE_ERRNOS) become `storage_failure`:
    one line naming the file and the errno, never a traceback. Other OSErrors pass."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:
            raise
        raise storage_failure(exc, hint) from None


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename: readers see old or new, never half."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A new empty file beside ``path`` for the caller to fill (by name, e.g. a library's
    writer); when the block ends it is fsynced and renamed over ``path``, or removed if the
    block raised. Every atomic writer of shadowlab goes through here.

    The temp file is created with ``os.open(..., 0o666)``, so the kernel applies the umask
    (and a default ACL) exactly as for a plain ``open()``: ``tempfile.mkstemp`` would make
    every record 0600 whatever the user's umask, unlike engine.log beside it."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_temp_file(path)
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and (exc.filename is None or str(exc.filename) == str(tmp)):
            exc.filename = str(path)  # a write names no file, the temp name means nothing to a reader
        raise


def _new_temp_file(path: Path) -> Path:
    # The name keeps at most 200 bytes of the target's: the temp name must fit NAME_MAX too.
    stem = os.fsencode(path.name)[:200].decode("utf-8", "ignore")
    for _ in range(100):
        tmp = path.with_name(f".{stem}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


# ---------------------------------------------------------------- bounded reading

# A record file larger than this is refused unread. meta.json is the largest record a real run
# writes: prompt token ids and completion text per turn, each answer bounded by the runner's
# 64 MiB response cap; 256 MiB leaves room for a few such turns and still bounds the reader
# (json.loads takes roughly 10x the file size in memory).
MAX_RECORD_BYTES = 256 << 20
# JSON nested deeper than this is refused: shadowlab's own records nest under 10 levels (an
# engine's /props a few more), and every later stage walks them recursively.
MAX_JSON_DEPTH = 100


class FileRefused(OSError):
    """A path that is not a regular file (a device such as /dev/zero, a FIFO, a directory), or
    one larger than its cap: refused without reading it, so the reader can neither hang nor
    exhaust memory."""


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (a symlink to one is fine) of at most
    ``max_bytes``; else FileRefused. Other OSErrors (missing, no permission) pass through."""
    # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; it is then refused.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"not a regular file ({_file_kind(st.st_mode)}); nothing was read")
        if st.st_size > max_bytes:
            raise FileRefused(f"{st.st_size} bytes, more than the {_mib(max_bytes)} this file may hold; "
                              "nothing was read")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:  # it grew while being read
            raise FileRefused(f"more than the {_mib(max_bytes)} this file may hold")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_json(path: Path, *, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """A record file's JSON, or RunDirError naming the file: missing, not a regular file, over
    ``max_bytes``, not UTF-8, not strict JSON (NaN/Infinity are refused: shadowlab never writes
    them), or nested deeper than MAX_JSON_DEPTH. Bounded in time and memory whatever is there."""
    where = str(path)
    try:
        raw = read_regular_file(path, max_bytes)
    except FileNotFoundError:
        raise RunDirError("missing", path=where) from None
    except OSError as exc:
        raise RunDirError(f"cannot read: {exc.strerror or exc}", path=where) from None
    try:
        return parse_json(raw)
    except JSONRefused as exc:
        raise RunDirError(str(exc), path=where) from None


class JSONRefused(ValueError):
    """Bytes that `parse_json` does not take as JSON; the message says why."""


class JSONTooDeep(JSONRefused):
    """Valid JSON nested deeper than MAX_JSON_DEPTH."""


def parse_json(data: bytes | str) -> Any:
    """The one bounded JSON reader of every JSON input (run records, trace lines): UTF-8, strict
    JSON (NaN/Infinity refused: shadowlab never writes them), nested at most MAX_JSON_DEPTH
    levels. JSONRefused otherwise; json's RecursionError on deep input never escapes. The caller
    names the file (and line)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONRefused(f"not UTF-8 text (invalid byte at offset {exc.start})") from None
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise JSONTooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise JSONRefused(f"not valid JSON ({exc})") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise JSONTooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_depth(data: Any) -> int:
    """How deeply containers nest in parsed JSON (a scalar: 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
    return deepest


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
        return self.cells_dir / component(cell_id, where=self.cells_dir)

    def meta(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "meta.json"

    def engine_log(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "engine.log"

    def scratch(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "scratch"

    def response(self, cell_id: str, turn_index: int) -> Path:
        return self.cell_dir(cell_id) / "responses" / f"turn-{turn_index}.json"


NAME_MAX_BYTES = 255  # a directory entry's name, on every file system shadowlab runs on


def component(name: str, *, where: Path) -> str:
    """``name`` if it is one path component (not empty, `.` or `..`; no `/` or NUL; at most 255
    bytes), else RunDirError. Cell ids and run names come from a validated matrix; this is the
    check at the place a path is made from one, so a hostile plan.json cannot lead outside."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name
            or len(os.fsencode(name)) > NAME_MAX_BYTES):
        raise RunDirError(f"{str(name)[:80]!r} is not a single directory name", path=str(where),
                          hint="names may hold letters, digits, '_', '-' and '.', at most 255 bytes")
    return name


def child_dir(parent: Path, name: str) -> Path:
    """``parent/name``, verified to lie inside ``parent`` (also when ``name`` is an existing
    link): where a new run directory goes (``reports/<matrix name>-<time>``)."""
    path = Path(parent) / component(name, where=Path(parent))
    if path.resolve().parent != Path(parent).resolve():
        raise RunDirError(f"{name!r} would lead outside {parent}", path=str(path),
                          hint="remove the link, or pass --out")
    return path


def write_meta(layout: RunLayout, meta: CellMeta) -> Path:
    path = layout.meta(meta.cell_id)
    write_json_atomic(path, meta)
    return path


def read_meta(path: Path) -> CellMeta:
    return meta_from_dict(read_json(path), source=str(path))


def planned_cell_ids(plan: Any, *, source: str) -> tuple[str, ...]:
    """The cell ids of a plan.json object, in order; RunDirError when it is not shaped like one."""
    cells = plan.get("cells", []) if isinstance(plan, dict) else plan
    if not isinstance(cells, list):
        raise RunDirError(f"cells: expected a list, got {_json_type_name(cells)}", path=source)
    ids = []
    for index, cell in enumerate(cells):
        cell_id = cell.get("id") if isinstance(cell, dict) else None
        if not isinstance(cell_id, str):
            raise RunDirError(f"cells[{index}].id: expected a string, got {_json_type_name(cell_id)}",
                              path=source)
        ids.append(cell_id)
    return tuple(ids)


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
        "<!-- generated by `python -m shadowlab.results.records > docs/records.md`; do not edit -->",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. Readers refuse files with a newer "
        "`schema_version`; older ones are upgraded step by step. Every file is written "
        "atomically (temp file + rename), with the mode a plain `open()` gives (0666 & ~umask).",
        "",
        "Reading is bounded whatever a run directory holds: a record that is not a regular file "
        "(a directory, a FIFO, a link to a device such as /dev/zero) is refused unread, and so is "
        f"one larger than {_mib(MAX_RECORD_BYTES)}; JSON must be strict (no NaN) and nested at "
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
            type_text = _type_name(hints[f.name]).replace("|", "\\|")
            lines.append(f"| `{f.name}` | `{type_text}` | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
