"""Opening a log and reading its text: `open_log` (the one place a log's path is opened), the
source check before anything is read, and `LogText` (gunzipped as it is read when it starts
with the gzip magic bytes, salvaged up to corrupt data). Split out of `shadowlab.logs.parse`,
which re-exports the names its importers use."""

from __future__ import annotations

import io
import os
import stat
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from shadowlab.errors import LogSourceError


GZIP_MAGIC = b"\x1f\x8b"
GZIP_STEP = 1 << 16  # compressed bytes read at a time (a corrupt stream is salvaged up to the error)
GZIP_OUT = 1 << 20  # text decompressed ahead at most: a gzip bomb costs time, not memory


# --------------------------------------------------------------------------- reading


def open_log(path: str | os.PathLike[str]) -> BinaryIO:
    """The one place a log's path is opened (``parse``, ``iter_events`` and ``shadowlab logs``):
    an unbuffered binary file, or LogSourceError before a byte is read when the path is missing,
    unreadable or not a regular file. The path is opened without waiting (O_NONBLOCK: a FIFO's
    open() would wait for a writer) and judged by what was opened (fstat), so a FIFO, a device
    (/dev/zero reads forever) or a directory is refused whatever the path was when checked
    before. A stream (stdin, a pipe) is a file object: `LogText` reads either."""
    shown = os.fspath(path)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        text = "\n" in os.fspath(path)
        raise LogSourceError(
            f"cannot open: {getattr(exc, 'strerror', None) or exc}", source=repr(shown),
            hint="a str is a path; to parse log text pass text.splitlines()" if text else "check the path",
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LogSourceError(
                f"not a regular file ({_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')})", source=repr(shown),
                hint="pass a log file; a stream can be given as a binary file object",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}


def _check_source(source: Any) -> None:
    """Refuse what is not a log before anything is read: bytes (log text is not a path; pass a
    path, a binary file or its lines), a path `open_log` refuses, a text-mode file, anything not
    iterable."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        raise LogSourceError(
            f"got {type(source).__name__} ({len(source)} bytes), not a log source", source="parse()",
            hint="pass the log's path, a file opened with open(path, 'rb'), or its lines (data.splitlines())",
        )
    if isinstance(source, (str, os.PathLike)):
        open_log(source).close()
        return
    if isinstance(source, io.TextIOBase):
        raise LogSourceError(
            "a file opened in text mode", source=repr(getattr(source, "name", "<file>")),
            hint="open the log with open(path, 'rb') (or pass its path): offsets are byte offsets",
        )
    if not (callable(getattr(source, "read", None)) or isinstance(source, Iterable)):
        raise LogSourceError(
            f"got {type(source).__name__}, not a log source", source="parse()",
            hint="pass the log's path, a binary file object or an iterable of lines",
        )


class LogText(io.RawIOBase):
    """The text of one log file or binary stream, for every reader of logs (logparse's own and
    ``shadowlab logs``' pieces): gunzipped as it is read when it starts with the gzip magic bytes
    (one member or several, whatever the name), else as it is. A read error, or corrupt or
    truncated gzip data, ends the text there as zcat ends it: every byte decompressed before the
    damage is given (zlib gives nothing of a call that fails, so the failing input is fed again
    a byte at a time), and ``damage`` says what and where (None otherwise). ``readinto`` fills
    the buffer it is given, up to its end or the end of the text (plain text is read straight
    into it: the caller's own buffer object); a gzip bomb costs time, not memory (at most
    GZIP_OUT bytes are decompressed ahead). ``compressed`` is known after the first read."""

    def __init__(self, fh: BinaryIO) -> None:
        super().__init__()
        self.fh = fh
        self.damage: str | None = None
        self.raw_read = 0  # bytes read from fh (compressed bytes for a gzip)
        self.compressed: bool | None = None
        self._chunks: Iterator[bytes] | None = None
        self._out = memoryview(b"")  # decompressed, not handed on yet

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.compressed is None:  # the first read tells: the gzip magic, or text
            n = self._raw_into(b)
            while 0 < n < 2 and (more := self._raw_into(memoryview(b)[n:])):
                n += more
            self.compressed = bytes(b[:2]) == GZIP_MAGIC
            if not self.compressed:
                return n
            self._chunks = self._gunzip(bytes(b[:n]))
        elif self._chunks is None:
            return self._raw_into(b)
        view = memoryview(b).cast("B")
        n = 0
        while n < len(view):
            if not self._out:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._out = memoryview(chunk)
            take = min(len(self._out), len(view) - n)
            view[n : n + take] = self._out[:take]
            self._out = self._out[take:]
            n += take
        return n

    def _raw(self, size: int) -> bytes:
        """Up to `size` bytes of fh; b"" at its end or after a read error (then `damage`)."""
        if self.damage is not None:
            return b""
        try:
            data = self.fh.read(size)
        except (OSError, ValueError) as exc:  # EIO, a closed file, ...
            self.damage = f"reading stopped after byte {self.raw_read:,}: {exc}"
            return b""
        if data is None:  # a non-blocking stream with nothing yet: read as its end
            return b""
        if not isinstance(data, (bytes, bytearray)):
            raise LogSourceError(
                f"the file object gave {type(data).__name__}, not bytes", source=repr(getattr(self.fh, "name", "<file>")),
                hint="open the log with open(path, 'rb')",
            )
        self.raw_read += len(data)
        return bytes(data)

    def _raw_into(self, b: Any) -> int:
        readinto = getattr(self.fh, "readinto", None)
        if readinto is None:
            data = self._raw(len(b))
            memoryview(b)[: len(data)] = data
            return len(data)
        if self.damage is not None:
            return 0
        try:
            got = readinto(b) or 0
        except (OSError, ValueError) as exc:
            self.damage = f"reading stopped after byte {self.raw_read:,}: {exc}"
            return 0
        self.raw_read += got
        return got

    def _inputs(self, first: bytes) -> Iterator[bytes]:
        """The compressed bytes in pieces of at most GZIP_STEP: what the first read brought,
        then fh's (a failing piece is salvaged byte by byte, so a piece bounds that work)."""
        for i in range(0, len(first), GZIP_STEP):
            yield first[i : i + GZIP_STEP]
        while data := self._raw(GZIP_STEP):
            yield data

    def _gunzip(self, first: bytes) -> Iterator[bytes]:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        inputs = self._inputs(first)
        data, at = b"", 0  # at: compressed bytes consumed before `data`
        while True:
            if not data and not (data := next(inputs, b"")):
                break
            if d.eof:  # a member ended and more follows (`cat a.gz b.gz`)
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            saved = d.copy()
            try:
                out = d.decompress(data, GZIP_OUT)
            except zlib.error as exc:
                good = yield from _salvage(saved, data)
                self.damage = f"corrupt gzip data at compressed byte {at + good:,} ({exc})"
                if "check" in str(exc):  # the member's CRC or length: damaged where zlib could not see
                    self.damage += "; the text of that gzip member is damaged somewhere before it (where is unknown)"
                return
            if out:
                yield out
            rest = d.unconsumed_tail or (d.unused_data if d.eof else b"")
            at += len(data) - len(rest)
            data = rest
        if not d.eof and self.damage is None:
            self.damage = f"the gzip data ends early, after {at:,} compressed bytes (truncated)"


def _salvage(d: Any, data: bytes) -> Iterator[bytes]:
    """What `data` decompresses to before the byte zlib rejects (fed 256 bytes at a time, the
    failing piece again a byte at a time); returns how many bytes of `data` were good."""
    for i in range(0, len(data), 256):
        saved = d.copy()
        try:
            out = d.decompress(data[i : i + 256])
        except zlib.error:
            for j in range(i, min(i + 256, len(data))):
                try:
                    out = saved.decompress(data[j : j + 1])
                except zlib.error:
                    return j
                if out:
                    yield out
            return min(i + 256, len(data))
        if out:
            yield out
        if d.eof:
            return i + 256
    return len(data)
