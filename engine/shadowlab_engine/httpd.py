"""The HTTP server of the reference engine: the llama-server-compatible subset (docs/DESIGN.md
§1 "HTTP"), answering `/health` 503 while the model loads (server.Engine does the work)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from . import slotlog
from .requests import RequestError, _bool_field
from .server import Engine, ServerOptions
from .slotlog import ERROR, INFO, EngineLog


# --- HTTP ------------------------------------------------------------------------------------


class EngineHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        super().__init__(address, Handler)
        self.engine = engine

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (reset, broken pipe) is no server error: socketserver would
        print a traceback into the log, which llama-server never does and which moves every
        later line of the log the harness reads."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            self.engine.log.server(slotlog.DEBUG, "handle_error",
                                   f"client {client_address[0]}:{client_address[1]} hung up ({type(exc).__name__})")
            return
        super().handle_error(request, client_address)


_LOADING = (503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
_MAX_BODY = 64 * 1024 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Keep-alive responses go out as header + body writes; with Nagle on, the body waits for
    # the client's delayed ACK (~40 ms per request on Linux loopback).
    disable_nagle_algorithm = True
    server: EngineHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        self.server.engine.log.server(slotlog.DEBUG, "log_server_r", format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        is_completion = method == "POST" and path in ("/completion", "/completions", "/v1/chat/completions", "/chat/completions")
        if is_completion and engine.ready.is_set():
            n = engine.completion_arrived()
            if engine.faults.hang_on_request == n:
                engine.log.server(ERROR, "handle_compl", f"fault hang-on-request: request {n} never answers")
                threading.Event().wait()
        stream: EventStream | None = None
        try:
            body = self._read_body(parse=method in ("POST", "PUT"))
            if path == "/health" and method == "GET":
                status, payload = (200, {"status": "ok"}) if engine.ready.is_set() else _LOADING
            elif not engine.ready.is_set() and path in _ROUTES:
                status, payload = _LOADING
            elif path in _STREAMED and method == "POST" and isinstance(body, dict) \
                    and _bool_field(body, "stream", False):
                stream = EventStream(self)
                status, payload = 200, engine.complete(body, emit=stream.event)
            else:
                status, payload = self._route(engine, method, path, body)
        except RequestError as err:
            status, payload = err.code, {"error": {"code": err.code, "message": err.message, "type": err.type}}
        except Exception as err:  # a bug, not bad input: answer 500 and keep serving
            engine.log.server(ERROR, "handle_reque", f"internal error: {err!r}")
            status, payload = 500, {"error": {"code": 500, "message": f"internal error: {err}", "type": "server_error"}}
        if stream is not None and (stream.started or status == 200):
            # Like llama-server: an error before the first event is a JSON answer; one after it,
            # an error event ending the stream.
            stream.end(payload if status == 200 else {"error": payload["error"]})
        else:
            self._send(status, payload)
        if is_completion and engine.ready.is_set():
            self._after_completion(engine)

    def _route(self, engine: Engine, method: str, path: str, body: Any) -> tuple[int, Any]:
        route = _ROUTES.get(path)
        if route is None:
            raise RequestError(404, f"File Not Found: {path}", type="not_found_error")
        want_method, action = route
        if method != want_method:
            raise RequestError(405, f"{path} expects {want_method}, got {method}")
        if want_method == "POST" and not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return 200, action(engine, body)

    def _after_completion(self, engine: Engine) -> None:
        n = engine.completion_answered()
        limit = engine.faults.crash_after_requests
        if limit is not None and n >= limit:
            engine.log.server(ERROR, "handle_compl", f"fault crash-after-requests: exiting after {n} completion requests")
            os._exit(134)

    def _read_body(self, parse: bool) -> Any:
        """The JSON body. A body is always consumed (or the connection closed), so that a
        kept-alive connection never reads leftover bytes as the next request."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(411, "chunked request bodies are not supported: send Content-Length")
        length = self.headers.get("Content-Length")
        try:
            n = int(length) if length is not None else 0
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length") from None
        if n < 0 or n > _MAX_BODY:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise RequestError(413, "request body too large")
        raw = self.rfile.read(n) if n else b""
        if not raw or not parse:
            return {}
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise RequestError(400, f"malformed JSON: {err!s:.200}") from None

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer


class EventStream:
    """llama-server's streamed answer: `data: <json>` events (server-sent events) in a chunked
    body. The headers go out with the first event: llama-server, too, waits for the first result
    before it answers. A client that went away ends the writing, not the task."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self.handler, self.started, self.gone = handler, False, False

    def event(self, payload: dict) -> None:
        self._chunk(b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n")

    def end(self, payload: dict) -> None:
        self.event(payload)
        self._chunk(b"")  # the last chunk: the answer is complete

    def _chunk(self, data: bytes) -> None:
        if self.gone:
            return
        h = self.handler
        try:
            if not self.started:
                self.started = True
                h.send_response(200)
                h.send_header("Content-Type", "text/event-stream")
                h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            h.close_connection = True


_STREAMED = ("/completion", "/completions")
_ROUTES: dict[str, tuple[str, Callable[[Engine, Any], Any]]] = {
    "/props": ("GET", lambda e, b: e.props()),
    "/slots": ("GET", lambda e, b: e.slots()),
    "/tokenize": ("POST", lambda e, b: e.tokenize(b)),
    "/detokenize": ("POST", lambda e, b: e.detokenize(b)),
    "/completion": ("POST", lambda e, b: e.complete(b)),
    "/completions": ("POST", lambda e, b: e.complete(b)),
    "/v1/chat/completions": ("POST", lambda e, b: e.chat(b)),
    "/chat/completions": ("POST", lambda e, b: e.chat(b)),
}


def serve(options: ServerOptions, log: EngineLog) -> int:
    """Bind, start loading in the background, serve until killed. Returns an exit code."""
    engine = Engine(options, log)
    try:
        httpd = EngineHTTPServer((options.host, options.port), engine)
    except OSError as err:
        log.main(ERROR, f"error: cannot listen on {options.host}:{options.port}: {err}")
        return 1
    port = httpd.server_address[1]
    engine.options = dataclasses.replace(options, port=port)
    log.server(INFO, "init", f"HTTP server is listening, hostname: {options.host}, port: {port}")

    def load() -> None:
        try:
            engine.load()
        except BaseException as err:
            log.main(ERROR, f"error: failed to load model '{options.model_path}': {err}")
            os._exit(1)

    threading.Thread(target=load, name="load-model", daemon=True).start()
    try:
        httpd.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0
