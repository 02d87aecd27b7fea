"""The one link between the request path and the recorder: bounded, never blocking, lossy.

The front (proxy or mirror sink) hands each finished exchange to `Channel.offer`, which
returns at once: the frame goes into the write buffer of a Unix socket to the recorder process
when the buffer has room for it whole, and is dropped and counted when it has not (the recorder
is behind) or when no recorder is connected (it died, or is being restarted). A frame is
written whole or not at all, so a recorder that is killed mid-frame loses at most what was in
flight to it, never the framing of the next connection.

`RecorderSupervisor` owns the recorder process: it starts it on a fresh socketpair, sends it the
capture's salt as the first frame (never on a command line or on disk), restarts it when it
exits (backing off to at most once every `MAX_BACKOFF_S`), and stops it at the end.

Frame: `u32 length` then the payload; a payload is `u32 meta length`, the meta JSON, then the
request body, then the response payload (their lengths are in the meta).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_BACKOFF_S = 5.0
_LEN = struct.Struct("<I")


def encode(meta: dict[str, Any], body: bytes = b"", response: bytes = b"") -> bytes:
    meta = dict(meta, body_bytes=len(body), response_bytes=len(response))
    head = json.dumps(meta, separators=(",", ":")).encode()
    payload_len = _LEN.size + len(head) + len(body) + len(response)
    return b"".join((_LEN.pack(payload_len), _LEN.pack(len(head)), head, body, response))


def decode(payload: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    (n,) = _LEN.unpack_from(payload)
    meta = json.loads(payload[_LEN.size:_LEN.size + n])
    at = _LEN.size + n
    body = payload[at:at + meta["body_bytes"]]
    response = payload[at + meta["body_bytes"]:at + meta["body_bytes"] + meta["response_bytes"]]
    return meta, body, response


def read_frame(sock: socket.socket) -> bytes | None:
    """The next payload from a blocking socket, or None at the end of the stream."""
    head = _read_exactly(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    return _read_exactly(sock, n)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


@dataclass
class Counts:
    """What happened to the frames the front offered (written to the status file)."""

    offered: int = 0
    sent: int = 0
    dropped_full: int = 0  # the recorder was behind: its buffer had no room
    dropped_down: int = 0  # no recorder connected
    recorder_starts: int = 0
    recorder_exits: list[int] = field(default_factory=list)  # exit codes, the last 20


class Channel:
    """The front's end of the socket to the recorder (see the module docstring)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.counts = Counts()
        self._transport: asyncio.WriteTransport | None = None

    def attach(self, transport: asyncio.WriteTransport | None) -> None:
        self._transport = transport

    def offer(self, frame: bytes, *, counted: bool = True) -> bool:
        """Queue a frame for the recorder, whole, or drop it; never blocks, never raises."""
        if counted:
            self.counts.offered += 1
        t = self._transport
        if t is None or t.is_closing():
            if counted:
                self.counts.dropped_down += 1
            return False
        if t.get_write_buffer_size() + len(frame) > self.limit:
            if counted:
                self.counts.dropped_full += 1
            return False
        try:
            t.write(frame)
        except Exception:  # noqa: BLE001 - the request path must not fail because the recorder did
            if counted:
                self.counts.dropped_down += 1
            return False
        if counted:
            self.counts.sent += 1
        return True


class _Link(asyncio.Protocol):
    """The socket's protocol: the recorder sends nothing; closing means it is gone."""

    def __init__(self, closed: asyncio.Future) -> None:
        self.closed = closed

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class RecorderSupervisor:
    """Starts, restarts and stops the recorder process (`python -m shadowlab.capture.recorder`)."""

    def __init__(self, channel: Channel, argv: Sequence[str], hello: dict[str, Any]) -> None:
        self.channel = channel
        self.argv = list(argv)
        self.hello = hello
        self.proc: subprocess.Popen | None = None
        self._stopping = False
        self._transport: asyncio.WriteTransport | None = None

    async def run(self) -> None:
        backoff = 0.2
        while not self._stopping:
            started = time.monotonic()
            await self._one_life()
            if self._stopping:
                return
            backoff = 0.2 if time.monotonic() - started > 10 else min(MAX_BACKOFF_S, backoff * 2)
            await asyncio.sleep(backoff)

    async def _one_life(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(OSError):  # room for bursts in the kernel too
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        try:
            self.proc = subprocess.Popen([*self.argv, "--channel-fd", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         start_new_session=True)  # its own group: signals to us stay ours
        finally:
            theirs.close()
        self.channel.counts.recorder_starts += 1
        loop = asyncio.get_running_loop()
        closed: asyncio.Future = loop.create_future()
        ours.setblocking(False)
        transport, _ = await loop.create_unix_connection(lambda: _Link(closed), sock=ours)
        transport.set_write_buffer_limits(high=self.channel.limit)
        self._transport = transport
        self.channel.attach(transport)  # then the salt, before any exchange (no await between)
        self.channel.offer(encode({"kind": "hello", **self.hello}), counted=False)
        waiter = loop.run_in_executor(None, self.proc.wait)
        await asyncio.wait({closed, waiter}, return_when=asyncio.FIRST_COMPLETED)
        self.channel.attach(None)
        self._transport = None
        if not self._stopping:
            transport.abort()
        code = await waiter
        exits = self.channel.counts.recorder_exits
        exits.append(code)
        del exits[:-20]

    async def stop(self, running: asyncio.Task, timeout_s: float = 30.0) -> None:
        """End the recorder: close the channel after what is queued (the recorder reads to its
        end, writes every line and exits), then SIGTERM, then SIGKILL, `timeout_s` apart."""
        self._stopping = True
        if self._transport is not None:
            self._transport.close()  # flushes the write buffer first
        for ending in (None, signal.SIGTERM, signal.SIGKILL):
            proc = self.proc
            if ending is not None and proc is not None and proc.poll() is None:
                proc.send_signal(ending)
            done, _ = await asyncio.wait({running}, timeout=timeout_s)
            if done:
                return

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


def recorder_argv(options: Sequence[str]) -> list[str]:
    """The recorder's command line: this interpreter, the recorder module, its options."""
    return [sys.executable, "-m", "shadowlab.capture.recorder", *options]

