"""Files of a run directory on disk: written atomically, read bounded, hashed one way.

    write_json_atomic(path, obj) / write_bytes_atomic(path, data) / atomic_path(path)
    read_json(path) / read_regular_file(path, max_bytes) / parse_json(data)
    storage_errors(hint)          a failed write the machine caused: one line, exit 3
    sha256_file(path) / sha256_json(obj) / sha256_text(text) / sha256_bytes(data)

Writes go to a temp file in the same directory, fsync, rename: an interrupted run never leaves a
half-written record, and readers see the old file or the new one. Reads refuse anything that is
not a regular file, or larger than its cap, unread, and JSON nested deeper than MAX_JSON_DEPTH:
bounded in time and memory whatever a run directory holds (DESIGN §4).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shadowlab.errors import InfrastructureError, RunDirError
from shadowlab.results.codec import to_jsonable


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
            raise FileRefused(f"{st.st_size} bytes, more than the {size_text(max_bytes)} this file may hold; "
                              "nothing was read")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:  # it grew while being read
            raise FileRefused(f"more than the {size_text(max_bytes)} this file may hold")
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


def size_text(n: int) -> str:
    """A byte count as messages say it (`256 MiB`, `100 bytes`)."""
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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks (an engine binary, a model of many GiB): the one
    file hash of the harness (engine identities, model files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
