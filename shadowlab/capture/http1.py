"""HTTP/1.1 message framing on asyncio streams, for the capture proxy and the mirror sink.

Only what forwarding needs: a message head is read whole (bounded) and kept as the bytes that
came, so it can be passed on unchanged; a body is copied as it arrives in whichever framing the
head declares (Content-Length, chunked, or until the connection closes), the raw bytes passed on
unchanged and the payload handed to a `Tap` that keeps a bounded copy for the recorder. Nothing
here parses JSON or knows about llama-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024  # the StreamReader limit; a longer head is refused (431)
READ_SIZE = 64 * 1024
TAIL_BYTES = 64 * 1024  # what a Tap keeps of a body longer than its head limit: the last events


class BadMessage(Exception):
    """The peer sent something that is not HTTP/1.1 framing we can forward."""


@dataclass(frozen=True)
class Head:
    """A request or response head: the bytes as they came and what framing needs from them."""

    raw: bytes
    start: tuple[str, str, str]  # request: method, target, version; response: version, status, reason
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    content_length: int | None
    chunked: bool

    @property
    def status(self) -> int:
        return int(self.start[1]) if self.start[1].isdigit() else 0

    def keep_alive(self) -> bool:
        version = self.start[0] if self.start[0].startswith("HTTP/") else self.start[2]
        connection = self.headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


def parse_head(raw: bytes, *, request: bool) -> Head:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # latin-1 decodes every byte; kept for clarity of intent
        raise BadMessage("undecodable head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or (request and len(parts) != 3):
        raise BadMessage(f"bad start line {lines[0][:80]!r}")
    start = (parts[0], parts[1], parts[2] if len(parts) > 2 else "")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadMessage(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = headers.get("content-length")
    if length is not None and not chunked:
        if not length.isdigit():
            raise BadMessage(f"bad Content-Length {length[:20]!r}")
        content_length: int | None = int(length)
    else:
        content_length = None
    return Head(raw, start, headers, content_length, chunked)


async def read_head(reader: asyncio.StreamReader, *, request: bool) -> Head | None:
    """The next head, or None when the peer closed cleanly before sending one."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise BadMessage("connection closed inside a head") from None
    except asyncio.LimitOverrunError:
        raise BadMessage(f"head longer than {MAX_HEAD_BYTES} bytes") from None
    return parse_head(raw, request=request)


class Tap:
    """A bounded copy of a body's payload: its first `limit` bytes whole, and past that only the
    last TAIL_BYTES (where a streamed answer's final event with its timings is)."""

    __slots__ = ("limit", "head", "tail", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * TAIL_BYTES:  # trim in batches: amortised, not per chunk
                del self.tail[:-TAIL_BYTES]

    @property
    def whole(self) -> bool:
        return self.total == len(self.head)

    def payload(self) -> bytes:
        """The whole body when it fit, else the head limit's worth is dropped for the tail."""
        return bytes(self.head) if self.whole else bytes(self.tail[-TAIL_BYTES:])


def bodiless(head: Head, request_method: str | None = None) -> bool:
    """A response that carries no body whatever its headers say (RFC 9112 §6.3)."""
    if request_method == "HEAD":
        return True
    return 100 <= head.status < 200 or head.status in (204, 304)


async def copy_body(src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, head: Head, tap: Tap | None,
                    *, until_close: bool) -> None:
    """Copy one body from src to dst as it arrives (raw framing unchanged), feeding the payload
    to `tap`. `until_close`: a body without length or chunking runs to the end of the
    connection (responses only; a request without either has no body)."""
    if head.chunked:
        await _copy_chunked(src, dst, tap)
    elif head.content_length is not None:
        left = head.content_length
        while left:
            data = await src.read(min(READ_SIZE, left))
            if not data:
                raise BadMessage("connection closed inside a body")
            left -= len(data)
            await _pass(dst, data, tap, data)
    elif until_close:
        while data := await src.read(READ_SIZE):
            await _pass(dst, data, tap, data)


async def _copy_chunked(src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, tap: Tap | None) -> None:
    """Pass raw reads on as they come (one read and one write per arrival, not per chunk: an SSE
    answer is a chunk per event), while a scanner finds where the body ends."""
    scanner = ChunkScanner(tap)
    while not scanner.done:
        data = await src.read(READ_SIZE)
        if not data:
            raise BadMessage("connection closed inside a chunked body")
        if scanner.feed(data) != len(data):
            raise BadMessage("bytes after the end of a chunked body")
        await _pass(dst, data, None, b"")


class ChunkScanner:
    """The chunked framing (RFC 9112 §7.1) of bytes fed in any pieces: where the body ends, and
    its payload to a Tap."""

    __slots__ = ("tap", "state", "left", "line", "done")

    def __init__(self, tap: Tap | None) -> None:
        self.tap = tap
        self.state = "size"  # size | data | crlf | trailer
        self.left = 0
        self.line = bytearray()
        self.done = False

    def feed(self, data: bytes) -> int:
        """Consume bytes of the body; returns how many were its own (fewer once it ended)."""
        at, n = 0, len(data)
        while at < n and not self.done:
            if self.state == "data":
                take = min(self.left, n - at)
                if self.tap is not None:
                    self.tap.feed(data[at:at + take])
                at, self.left = at + take, self.left - take
                if not self.left:
                    self.state, self.left = "crlf", 2
            elif self.state == "crlf":
                take = min(self.left, n - at)
                at, self.left = at + take, self.left - take
                if not self.left:
                    self.state = "size"
            else:
                at = self._line(data, at)
        return at

    def _line(self, data: bytes, at: int) -> int:
        nl = data.find(b"\n", at)
        if nl < 0:
            self.line += data[at:]
            if len(self.line) > MAX_HEAD_BYTES:
                raise BadMessage("chunk size or trailer line too long")
            return len(data)
        self.line += data[at:nl + 1]
        line, self.line = bytes(self.line), bytearray()
        if self.state == "trailer":
            self.done = line in (b"\r\n", b"\n")
            return nl + 1
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadMessage(f"bad chunk size line {line[:40]!r}") from None
        self.state, self.left = ("trailer", 0) if size == 0 else ("data", size)
        return nl + 1


async def _pass(dst: asyncio.StreamWriter | None, raw: bytes, tap: Tap | None, payload: bytes) -> None:
    if dst is not None:
        dst.write(raw)
        await dst.drain()  # the reader's pace: returns at once unless its buffer is full
    if tap is not None and payload:
        tap.feed(payload)


Exchange = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def listen(exchange: Exchange, host: str, port: int) -> asyncio.base_events.Server:
    """Serve connections, each one exchange after another while `exchange` says keep-alive."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await exchange(reader, writer):
                pass
        except (BadMessage, ConnectionError, asyncio.IncompleteReadError, OSError, asyncio.CancelledError):
            pass  # a broken connection, or the capture stopping: nothing more to forward
        finally:
            writer.close()

    return await asyncio.start_server(connection, host, port, limit=MAX_HEAD_BYTES, backlog=1024)
