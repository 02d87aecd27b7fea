"""What the proxy and the mirror sink share: numbering exchanges as they arrive, and handing each
finished one to the recorder through the channel (mitmproxy's addon shape: a hook at the
request, a hook at the end of the response; here the hooks only copy bounded bytes).

Each exchange gets a sequence number at arrival. The recorder writes trace lines in that order
(arrival order, the order a server launches tasks in), but it learns of an exchange only when
it ends, so every frame also carries `oldest`: the sequence number of the oldest exchange still
in flight. Lines below it can be written; an exchange whose frame never comes (dropped) is then
never waited for. A tick carries `oldest` alone when nothing else is sent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from shadowlab.capture import channel
from shadowlab.capture.http1 import Head, Tap

TICK_S = 1.0


@dataclass(frozen=True)
class FrontOptions:
    mode: str  # "proxy" | "mirror"
    conversation_header: str | None  # lower-cased header name the operator named, if any
    max_body_bytes: int  # a request body above this is forwarded but not recorded


class Front:
    def __init__(self, options: FrontOptions, link: channel.Channel) -> None:
        self.options = options
        self.link = link
        self._next = 0
        self._in_flight: dict[int, None] = {}  # insertion-ordered: the first key is the oldest
        self._last_t = 0.0

    def begin(self) -> tuple[int, float]:
        seq, self._next = self._next, self._next + 1
        self._in_flight[seq] = None
        # time.time() can step back (clock adjustments); trace times must not.
        self._last_t = t = max(time.time(), self._last_t)
        return seq, t

    def oldest(self) -> int | None:
        return next(iter(self._in_flight), None)

    def abandon(self, seq: int) -> None:
        """The exchange ended without anything worth recording (a broken connection)."""
        self._in_flight.pop(seq, None)

    def finish(self, seq: int, t: float, request: Head, body: Tap, response: Head | None,
               answer: Tap | None) -> None:
        """Offer the exchange to the recorder: never blocks, never raises into the request path."""
        self._in_flight.pop(seq, None)
        try:
            frame = channel.encode(self._meta(seq, t, request, body, response, answer),
                                   body.payload() if body.whole else b"",
                                   answer.payload() if answer is not None else b"")
        except Exception:  # noqa: BLE001 - a recording bug must never fail the request
            self.link.counts.offered += 1
            self.link.counts.dropped_down += 1
            return
        self.link.offer(frame)

    def _meta(self, seq: int, t: float, request: Head, body: Tap, response: Head | None,
              answer: Tap | None) -> dict[str, Any]:
        name = self.options.conversation_header
        return {
            "kind": "exchange", "mode": self.options.mode, "seq": seq, "t": t, "oldest": self.oldest(),
            "next": self._next,
            "method": request.start[0], "path": request.start[1],
            "conversation_header": request.headers.get(name) if name else None,
            "body_whole": body.whole, "body_total": body.total,
            "status": response.status if response is not None else None,
            "event_stream": response is not None
            and response.headers.get("content-type", "").startswith("text/event-stream"),
            "response_whole": answer.whole if answer is not None else None,
        }

    async def tick(self) -> None:
        """Tell the recorder the oldest exchange in flight now and then (lines it holds back for
        an exchange that ended without a frame are then released)."""
        while True:
            await asyncio.sleep(TICK_S)
            self.link.offer(channel.encode({"kind": "tick", "oldest": self.oldest(), "next": self._next}),
                            counted=False)
