"""The pass-through proxy: forwards every request to the upstream server and streams its answer
back unchanged (the head and body bytes as they came; an SSE chunk is written to the client as
soon as it is read), then hands a bounded copy of the exchange to the recorder.

Fail-open by construction: the forwarding path touches the recorder only through
`Channel.offer`, which never blocks and never raises; tokenizing, hashing and writing run in
another process. Upstream connections are kept alive in a small pool (llama-server closes an
idle one after 5 s, so one idle for longer is not reused), and a request that fails on a reused
connection before any answer byte came is sent once more on a fresh one (it was buffered whole).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from shadowlab.capture import http1
from shadowlab.capture.front import Front
from shadowlab.capture.http1 import BadMessage, Head, Tap

IDLE_REUSE_S = 4.0  # below llama-server's keep-alive timeout of 5 s
ANSWER_HEAD_BYTES = 1 << 20  # of an answer the recorder gets this much whole, past it the last 64 KiB
POOL_MAX = 64
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
BAD_GATEWAY = (b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 28\r\n"
               b"Connection: close\r\n\r\nshadowlab capture: upstream\n")


@dataclass
class _Upstream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = field(default_factory=time.monotonic)


class UpstreamPool:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[_Upstream] = []

    async def get(self, fresh: bool = False) -> tuple[_Upstream, bool]:
        """A connection, and whether it was reused (a reused one may have been closed by the
        peer); `fresh`: a new one whatever is idle."""
        now = time.monotonic()
        while self._idle and not fresh:
            up = self._idle.pop()
            if now - up.idle_since < IDLE_REUSE_S and not up.reader.at_eof():
                return up, True
            up.writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=http1.MAX_HEAD_BYTES)
        return _Upstream(reader, writer), False

    def put(self, up: _Upstream) -> None:
        if len(self._idle) >= POOL_MAX:
            up.writer.close()
            return
        up.idle_since = time.monotonic()
        self._idle.append(up)

    def close(self) -> None:
        for up in self._idle:
            up.writer.close()
        self._idle.clear()


class Proxy:
    def __init__(self, front: Front, pool: UpstreamPool) -> None:
        self.front = front
        self.pool = pool

    async def exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = await http1.read_head(reader, request=True)
        if request is None:
            return False
        seq, t = self.front.begin()
        try:
            body = Tap(self.front.options.max_body_bytes)
            raw = await self._read_request_body(reader, writer, request, body)
            up, response, answer = await self._forward(request, raw, reader, body, writer)
        except BaseException:
            self.front.abandon(seq)
            raise
        if response is None:
            self.front.abandon(seq)
            return False
        self.front.finish(seq, t, request, body, response, answer)
        keep = request.keep_alive() and response.keep_alive() and not _runs_to_close(request, response)
        if keep and up is not None:
            self.pool.put(up)
        elif up is not None:
            up.writer.close()
        return keep

    async def _read_request_body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Head,
                                 body: Tap) -> bytes | None:
        """The body read whole when it is small enough to buffer (then it can be resent); None
        when it must be streamed (chunked, or larger than the recording limit)."""
        n = request.content_length
        if n is None and not request.chunked:
            return b""
        if _continued(request):
            writer.write(CONTINUE)  # the client waits for it before it sends the body we read here
        if n is not None and n <= body.limit:
            raw = await reader.readexactly(n)
            body.feed(raw)
            return raw
        return None

    async def _forward(self, request: Head, raw: bytes | None, reader: asyncio.StreamReader, body: Tap,
                       writer: asyncio.StreamWriter) -> tuple[_Upstream | None, Head | None, Tap | None]:
        for attempt in (0, 1):
            up, reused = await self._connect(writer, fresh=attempt > 0)
            if up is None:
                return None, None, None
            try:
                up.writer.write(request.raw if raw is None else request.raw + raw)
                if raw is None:
                    await http1.copy_body(reader, up.writer, request, body, until_close=False)
                response = await self._response_head(up, writer, _continued(request))
            except (ConnectionError, OSError, BadMessage, asyncio.IncompleteReadError):
                up.writer.close()
                if reused and raw is not None and attempt == 0:
                    continue  # a stale keep-alive connection: nothing reached the client yet; resend on a new one
                writer.write(BAD_GATEWAY)
                return None, None, None
            answer = Tap(ANSWER_HEAD_BYTES)
            if not http1.bodiless(response, request.start[0]):
                await http1.copy_body(up.reader, writer, response, answer, until_close=True)
            return up, response, answer
        return None, None, None

    async def _connect(self, writer: asyncio.StreamWriter, fresh: bool) -> tuple[_Upstream | None, bool]:
        try:
            return await self.pool.get(fresh)
        except OSError:
            writer.write(BAD_GATEWAY)
            return None, False

    async def _response_head(self, up: _Upstream, writer: asyncio.StreamWriter, continued: bool) -> Head:
        """The final response head, interim (1xx) heads passed on to the client before it."""
        while True:
            head = await http1.read_head(up.reader, request=False)
            if head is None:
                raise BadMessage("upstream closed before answering")
            if head.status == 100 and continued:
                continue  # the client had its 100 Continue from us
            writer.write(head.raw)
            if not 100 <= head.status < 200 or head.status == 101:
                return head


def _continued(request: Head) -> bool:
    """A request whose client waits for `100 Continue` before its body: the proxy sends it."""
    return request.headers.get("expect", "").lower() == "100-continue" and (
        request.chunked or bool(request.content_length))


def _runs_to_close(request: Head, response: Head) -> bool:
    """A response delimited by the connection's end cannot leave the connection reusable."""
    return (response.content_length is None and not response.chunked
            and not http1.bodiless(response, request.start[0]))


async def serve(proxy: Proxy, host: str, port: int) -> asyncio.base_events.Server:
    return await http1.listen(proxy.exchange, host, port)

