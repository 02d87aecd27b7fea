"""The proxy's reuse of upstream connections, against a stand-in upstream that does what
llama-server b11434 does after a streamed answer: it said keep-alive, then closes the connection
(tests/capture/test_capture_llama.py sees it on the real server; here it is made to happen at the
worst moment, when the next request arrives, so the test does not depend on timing)."""

from __future__ import annotations

import asyncio

import pytest

from shadowlab import capture
from shadowlab.capture import channel, http1, proxy
from shadowlab.capture.front import Front, FrontOptions


@pytest.fixture(params=["uvloop", "asyncio"])
def run(request, monkeypatch):
    """Run a coroutine on the loop the capture front runs on (uvloop), and on asyncio's own
    (SHADOWLAB_CAPTURE_LOOP=asyncio, or where uvloop is not installed)."""
    if request.param == "asyncio":
        monkeypatch.setenv("SHADOWLAB_CAPTURE_LOOP", "asyncio")
    factory = capture.event_loop_factory()
    assert (factory is None) == (request.param == "asyncio")

    async def on_the_loop(coro):
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop") == (request.param == "uvloop")
        return await coro

    def go(coro):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(on_the_loop(coro))

    return go

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


async def _upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers the first request of a connection; closes it when a second one comes."""
    head = await http1.read_head(reader, request=True)
    await reader.readexactly(head.content_length or 0)
    await asyncio.sleep(0.05)  # the answers of concurrent requests overlap: each needs its own connection
    writer.write(ANSWER)
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


async def _request(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"prompt": "x"}'
    writer.write(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    head = await http1.read_head(reader, request=False)
    data = await reader.readexactly(head.content_length or 0)
    writer.close()
    return head.raw.split(b"\r\n", 1)[0] + b" " + data


def test_a_request_that_meets_closed_keep_alive_connections_is_sent_on_a_new_one(run):
    async def go() -> list[bytes]:
        up = await asyncio.start_server(_upstream, "127.0.0.1", 0)
        up_port = up.sockets[0].getsockname()[1]
        front = Front(FrontOptions("proxy", None, 1 << 20), channel.Channel(1 << 20))
        server = await proxy.serve(proxy.Proxy(front, proxy.UpstreamPool("127.0.0.1", up_port)), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        first = await asyncio.gather(*(_request(port) for _ in range(3)))  # three connections kept idle
        then = [await _request(port) for _ in range(3)]  # each reused one is closed when used
        server.close()
        up.close()
        return [*first, *then]

    answers = run(go())
    assert answers == [b'HTTP/1.1 200 OK {"ok":true}'] * 6


def test_a_client_that_waits_for_100_continue_gets_it_and_its_answer(run):
    """curl sends `Expect: 100-continue` with a large body and waits (1 s) before sending it:
    the proxy, which reads the body before forwarding, answers the 100 itself."""
    async def go() -> bytes:
        up = await asyncio.start_server(_upstream, "127.0.0.1", 0)
        front = Front(FrontOptions("proxy", None, 1 << 20), channel.Channel(1 << 20))
        pool = proxy.UpstreamPool("127.0.0.1", up.sockets[0].getsockname()[1])
        server = await proxy.serve(proxy.Proxy(front, pool), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        body = b'{"prompt": "x"}'
        writer.write(b"POST /completion HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        interim = await asyncio.wait_for(http1.read_head(reader, request=False), 5)
        writer.write(body)
        final = await http1.read_head(reader, request=False)
        data = await reader.readexactly(final.content_length or 0)
        writer.close()
        server.close()
        up.close()
        return interim.raw.split(b"\r\n")[0] + b" / " + final.raw.split(b"\r\n")[0] + b" " + data

    assert run(go()) == b'HTTP/1.1 100 Continue / HTTP/1.1 200 OK {"ok":true}'
