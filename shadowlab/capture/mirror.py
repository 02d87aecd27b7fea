"""The mirror sink: the target of nginx's `mirror` (or Envoy's request mirroring). The primary
answers the client; a copy of each request comes here, is answered `204 No Content` as soon as
its body is read (before anything is tokenized), and goes to the recorder through the channel.

The mirror never sees the primary's answer, so a mirror trace records what the answer was as
unknown (`output_length`, `status`, `reported_reuse`: null; docs/trace.md says how the reader
fills the output length in from the next turn).

nginx finishes a client request only when its mirror subrequests have finished, so on a
keep-alive client connection the next request waits for the mirror (nginx mailing list, "Performance
issue of ngx_http_mirror_module", 2017). `nginx_config` therefore sets the mirror's connect, send
and read timeouts short, keeps connections to the sink alive (no connect per request), and the
sink answers at once: a slow recorder cannot slow it, and a sink that is down is refused at
connect (immediate). A sink that hangs (stopped, not dead) delays the next request on that
client connection by the mirror timeout, 50 ms here: the sink answers in well under a
millisecond, so a lower one only risks losing copies on a loaded machine (nginx logs each);
`benchmarks/bench_capture.py --mirror-faults` measures it.
"""

from __future__ import annotations

import asyncio

from shadowlab.capture import http1
from shadowlab.capture.front import Front
from shadowlab.capture.http1 import Tap

ANSWER = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
ANSWER_CLOSE = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class MirrorSink:
    def __init__(self, front: Front) -> None:
        self.front = front

    async def exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = await http1.read_head(reader, request=True)
        if request is None:
            return False
        seq, t = self.front.begin()
        body = Tap(self.front.options.max_body_bytes)
        try:
            await http1.copy_body(reader, None, request, body, until_close=False)
        except BaseException:
            self.front.abandon(seq)
            raise
        keep = request.keep_alive()
        writer.write(ANSWER if keep else ANSWER_CLOSE)
        self.front.finish(seq, t, request, body, None, None)
        return keep


async def serve(sink: MirrorSink, host: str, port: int) -> asyncio.base_events.Server:
    return await http1.listen(sink.exchange, host, port)


def nginx_config(listen: str, primary: str, capture: str, *, mirror_timeout_ms: int = 50,
                 extra_http: str = "") -> str:
    """An nginx.conf (the `http` block and what it needs) that serves `listen` from `primary`
    and mirrors every request to the capture sink at `capture` (host:port each). The documented
    setup (docs/trace.md); the tests run exactly this file."""
    t = f"{mirror_timeout_ms}ms"
    return f"""worker_processes 1;
error_log stderr warn;
pid nginx.pid;
daemon off;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path body; proxy_temp_path proxy;
    fastcgi_temp_path fastcgi; uwsgi_temp_path uwsgi; scgi_temp_path scgi;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    # No idle connections kept to llama-server: it closes the connection after a streamed
    # /completion answer although it said keep-alive, and nginx does not resend a POST that
    # failed on a reused connection (a 502). Keep them where the primary is no llama-server.
    upstream primary {{ server {primary}; }}
    upstream shadowlab_capture {{ server {capture}; keepalive 64; }}
    {extra_http}
    server {{
        listen {listen};
        location / {{
            mirror /_shadowlab_capture;
            mirror_request_body on;
            proxy_pass http://primary;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;          # SSE chunks reach the client as they are produced
            proxy_read_timeout 600s;
        }}
        location = /_shadowlab_capture {{
            internal;
            proxy_pass http://shadowlab_capture$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # nginx finishes the client's request only after this subrequest: keep it short.
            proxy_connect_timeout {t};
            proxy_send_timeout {t};
            proxy_read_timeout {t};
            proxy_next_upstream off;
            proxy_ignore_client_abort on;
        }}
    }}
}}
"""
