"""A hostile engine: speaks llama-server's API (byte tokens) and misbehaves on request.

Stdlib only, starts in ~50 ms. Used by test_hostile.py to prove that nothing an engine
does can crash shadowlab, hang it, corrupt a record, inject into the report or outlive
its cell.

Usage: python hostile_engine.py --port N [--mode NAME]... [--pidfile PATH]

Modes (repeatable):
  log-garbage      print <script>, </svg>, ANSI escapes, NUL, invalid UTF-8, a 10 MB line and
                   checkpoint lines with absurd numbers (negative, 10^30, NaN) into the log
  not-json         /completion answers an HTML page (with <script>)
  wrong-shape      /completion answers JSON of the wrong shape (strings for ints, negative
                   cache_n, a huge token array, timings a list)
  json-list        /completion answers a JSON array
  error-200        /completion answers HTTP 200 with an error body
  truncated        /completion promises more bytes than it sends, then closes
  slow-loris       /completion sends headers, then one byte every 50 ms, forever
  slow-headers     /completion trickles its status line and headers a byte at a time, forever
  close-mid        /completion closes the connection in the middle of the headers
  lie-timings      the API says most of the prompt was reused; the log says all was processed
  evil-content     a completion whose text holds <script>, control bytes, markdown/HTML and
                   lone surrogates (escaped invalid UTF-8)
  nan-timings      timings.prompt_ms NaN (every answer also has predicted_ms Infinity, 10^30)
  setsid-child     fork a child that forks a grandchild calling setsid() (escapes the group)
  double-fork      fork a grandchild calling setsid() whose parent exits (reparented)
  setsid-keeps-port  once listening, fork a grandchild that calls setsid(), ignores SIGTERM and
                   keeps the inherited listening socket open; its parent exits (reparented)
  setsid-on-term   the same grandchild, forked when SIGTERM arrives (after any scan shadowlab
                   made before signalling); then the engine exits 0
  rebind-on-term   on SIGTERM: close the listener, start a process in a session of its own with
                   an empty environment that listens on the same port (a new socket), exit 0 once
                   it listens: nothing ties that process to the engine
  scrub-environ    with setsid-keeps-port / setsid-on-term: the grandchild zeroes its environment
                   block (what /proc/<pid>/environ shows), so no marker can find it
  bind-all         listen on 0.0.0.0 instead of 127.0.0.1
  ignore-term      ignore SIGTERM
  exit-after-health  exit 0 right after the first /health answer
  other-port       listen on port+1, not on the port given
  bad-tokenize     /tokenize answers ids that are not byte tokens (negative, huge)
  slow-health      /health answers 200, then trickles its body forever
  slow-tokenize    /tokenize answers 200, then trickles its body forever
  no-tokenize      no /tokenize or /detokenize (like most OpenAI-compatible servers)
  lie-reuse        the API says it reused three times the prompt (900 of 300 tokens), also on
                   the first turn of the fresh process
  negative-timing  timings.prompt_ms is -5 ms
  reentry-above-divergence  after the first request: restore and re-enter 8 tokens past the
                   longest common prefix with the previous prompt + completion (log and API agree)
  bidi-content     bidirectional controls (U+202E, isolates, marks), markup and ANSI escapes in
                   the completion (which differs once the process is warm), the log, /props
                   and the error-200 message
  flood-line=N     every completion first writes N bytes of `z` to the log, no newline (in
                   1 MiB writes; a write the log refuses, full or capped, is ignored)
  bind-all-later   the first completion opens a listener on 0.0.0.0 (start-up was loopback only)
  child-binds-all-later  the first completion starts a child process that listens on [::] (IPv6,
                   any address), and answers once it listens: a descendant born after start-up
  exit-after-answer  exit 134 right after the first completion answer, before its
                   `prompt eval time` line (the runner waits for that line and sees the exit)
  sse-garbage      /completion streams (text/event-stream) a token event, then an event that
                   is no JSON (<script>), then a final event
  sse-endless      streams a token event, then a keep-alive ping every 50 ms, forever
  sse-flood        streams token events as fast as it can, forever (more than n_predict)
  sse-cut          streams two token events, then closes without the final event
  sse-extra-ids    streams five token ids, then a final event that says 4 were predicted
                   (fewer would be llama-server's way with a token inside a UTF-8 character)
  restore-differs  a checkpointing hybrid engine, llama.cpp's lines: each prompt of n tokens
                   creates a checkpoint at n - 4; a prompt extending the previous one restores
                   its checkpoint, and then answers "ab c (restored)" (a wrong restored state).
                   With `--ctx-checkpoints 0` such a prompt is plain reuse of the whole previous
                   prompt, no restore, and the answer is the cold one
  no-reuse-without-checkpoints  the same, but with `--ctx-checkpoints 0` it reuses nothing
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES: set[str] = set()
LOG = sys.stderr.buffer
TASK = [0]
FLOOD = [0]  # flood-line=N
LATE_LISTENERS: list = []  # bind-all-later's socket / child-binds-all-later's child: kept until the stop

SCRIPT = "<script>alert('engine')</script>"
# Reads "safe … txt.exe" in a browser or terminal that honours the override: Trojan Source.
BIDI = "safe\u202egnp.exe\u202c \u2066iso\u2069 \u202aemb\u202b\u202d\u200e\u200f\u061c " + SCRIPT + " \x1b[31mred"
CACHED: list[list[int]] = []  # the slot's tokens after the last request (prompt + completion)
CHECKPOINTS = [64]  # --ctx-checkpoints (restore-differs, no-reuse-without-checkpoints)
COMPLETION = [97, 98, 32, 99]


def log(line: bytes) -> None:
    # Like a C server's fprintf: a log the disk or the size cap refuses does not stop serving.
    try:
        LOG.write(line + b"\n")
        LOG.flush()
    except OSError:
        pass


def flood(size: int) -> None:
    chunk = b"z" * (1 << 20)
    for offset in range(0, size, len(chunk)):
        try:
            LOG.write(chunk[:size - offset])
            LOG.flush()
        except OSError:
            pass


def listen_beyond_loopback() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    LATE_LISTENERS.append(sock)


CHILD_LISTENER = """
import socket, sys, time
sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
sock.bind(("::", 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
time.sleep(3600)
"""


def child_listens_beyond_loopback() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD_LISTENER], stdout=subprocess.PIPE)
    child.stdout.readline()  # it listens now
    LATE_LISTENERS.append(child)  # kept (and so its socket) until the engine is stopped


def log_garbage() -> None:
    log(b"<script>alert('log')</script></svg><img src=x onerror=alert(1)>")
    log(b"\x1b[31mred\x1b[0m \x1b]0;title\x07 \x00NUL\x00 \xff\xfe\xc3 invalid utf-8 \xed\xa0\x80")
    log(b"A" * (10 * 1024 * 1024))
    for numbers in (b"pos_min = -5, pos_max = -1, n_tokens = -3",
                    b"pos_min = 1000000000000000000000000000000, pos_max = 1000000000000000000000000000000, "
                    b"n_tokens = 1000000000000000000000000000000",
                    b"pos_min = NaN, pos_max = nan, n_tokens = inf"):
        log(b"slot create_check: id  0 | task 0 | created context checkpoint 1 of 64 (" + numbers
            + b", size = NaN MiB)")
        log(b"slot operator(): id  0 | task 0 | restored context checkpoint (" + numbers
            + b", n_past = -7, size = 1e400 MiB)")
    log(b"slot print_timing: id  0 | task 0 | prompt eval time = nan ms / -4 tokens")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/health" and "slow-health" in MODES:
            self._trickle()
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
            if "exit-after-health" in MODES:
                os._exit(0)
        elif self.path == "/props":
            self._json(200, {"device": "cpu", "build_info": "hostile <script>x</script>"
                             + (BIDI if "bidi-content" in MODES else ""),
                             "total_slots": 1})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "hostile", "object": "model"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        if self.path in ("/tokenize", "/detokenize") and "no-tokenize" in MODES:
            self._json(404, {"error": {"code": 404, "message": "not found"}})
        elif self.path == "/tokenize":
            text = body.get("content") or body.get("prompt") or ""
            if "slow-tokenize" in MODES:
                self._trickle()
            elif "bad-tokenize" in MODES:
                self._json(200, {"tokens": [-1, 2**40, 3] * max(1, len(text) // 3)})
            else:
                self._json(200, {"tokens": list(text.encode())})
        elif self.path == "/detokenize":
            tokens = [t for t in body.get("tokens", []) if isinstance(t, int) and 0 <= t < 256]
            self._json(200, {"content": bytes(tokens).decode("utf-8", "replace")})
        else:
            self._complete(body)

    def _complete(self, body: dict) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            n = len(prompt.encode())
        elif isinstance(prompt, list):
            n = len(prompt)
        else:
            n = sum(len(str(m.get("content", "")).encode("utf-8", "surrogatepass")) for m in body.get("messages", []))
        TASK[0] += 1
        task = TASK[0]
        if FLOOD[0]:
            flood(FLOOD[0])
        if "bind-all-later" in MODES and not LATE_LISTENERS:
            listen_beyond_loopback()
        if "child-binds-all-later" in MODES and not LATE_LISTENERS:
            child_listens_beyond_loopback()
        log(b"slot launch_slot_: id  0 | task %d | processing task" % task)
        log(b"slot update_slots: id  0 | task %d | new prompt, n_ctx_slot = 4096, n_keep = 0, "
            b"task.n_tokens = %d" % (task, n))
        if "not-json" in MODES:
            return self._raw(200, ("<html><body>" + SCRIPT + "</body></html>").encode(), "text/html")
        if "json-list" in MODES:
            return self._json(200, [1, 2, SCRIPT])
        if "error-200" in MODES:
            return self._json(200, {"error": {"code": 500, "message": SCRIPT + " \x1b[31mboom"
                                              + (BIDI if "bidi-content" in MODES else "")}})
        if "truncated" in MODES:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "100000")
            self.end_headers()
            self.wfile.write(b'{"content": "<scr')
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if "close-mid" in MODES:
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: appl")
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if "slow-loris" in MODES:
            return self._trickle()
        if any(m.startswith("sse-") for m in MODES):
            return self._stream(n)
        if "slow-headers" in MODES:
            return self._trickle_headers()
        if "wrong-shape" in MODES:
            return self._json(200, {"content": 12, "tokens": list(range(300_000)),
                                    "stop_type": ["eos"], "timings": [1, 2],
                                    "choices": "none", "usage": {"prompt_tokens": "12",
                                                                 "prompt_tokens_details": {"cached_tokens": -5}}})
        if "bidi-content" in MODES:
            log(("slot update_slots: id  0 | task %d | " % task + BIDI).encode("utf-8"))
        cached = n - 1 if "lie-timings" in MODES else 0  # the API claims reuse ...
        if "lie-timings" not in MODES and "reentry-above-divergence" in MODES and CACHED and isinstance(prompt, list):
            cached = self._restore_past_divergence(task, prompt)
        checkpointing = MODES & {"restore-differs", "no-reuse-without-checkpoints"}
        if checkpointing and isinstance(prompt, list):
            cached = self._checkpointed(task, prompt)
        processed = n - cached
        if "lie-reuse" in MODES:
            cached, processed = 3 * n, n
        if "lie-timings" in MODES:
            # ... while the log says every token was processed (full re-processing)
            log(b"slot update_slots: id  0 | task %d | forcing full prompt re-processing due to lack of "
                b"cache data (likely due to SWA or hybrid/recurrent memory, see x)" % task)
        if "exit-after-answer" not in MODES:
            log(b"slot print_timing: id  0 | task %d | prompt eval time =       1.00 ms / %5d tokens "
                b"(    0.01 ms per token, 1000.00 tokens per second)" % (task, n if "lie-timings" in MODES else processed))
            log(b"slot      release: id  0 | task %d | stop processing: n_tokens = %d" % (task, n + 4))
        text = "ab c" if "evil-content" not in MODES else (
            SCRIPT + "\x00\x1b[2J</svg>]]></failure><!-- *[x](javascript:alert(1))* | | \ud800 \udcff")
        if "bidi-content" in MODES:
            text = BIDI + (" (warm)" if task > 1 else "")
        if checkpointing and cached and CHECKPOINTS[0]:
            text += " (restored)"
        CACHED[:] = [list(prompt) + COMPLETION if isinstance(prompt, list) else []]
        self._json(200, {
            "content": text, "tokens": COMPLETION, "stop_type": "limit",
            "timings": {"prompt_n": processed, "cache_n": cached, "predicted_n": 4,
                        "prompt_ms": float("nan") if "nan-timings" in MODES
                        else -5.0 if "negative-timing" in MODES else 1.0,
                        "predicted_ms": float("inf"), "huge": 10**30},
            "choices": [{"index": 0, "text": text, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": n, "completion_tokens": 4,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        })
        if "exit-after-answer" in MODES:
            self.wfile.flush()
            os._exit(134)  # like abort() once the answer went out
        return None

    @staticmethod
    def _checkpointed(task: int, prompt: list) -> int:
        """restore-differs / no-reuse-without-checkpoints: what this prompt reuses, with its lines."""
        previous = CACHED[0][:-len(COMPLETION)] if CACHED and CACHED[0] else []
        extends = bool(previous) and prompt[:len(previous)] == previous and len(prompt) > len(previous)
        if not CHECKPOINTS[0]:
            return len(previous) if extends and "restore-differs" in MODES else 0
        cached = 0
        if extends and len(previous) > 4:
            cached = len(previous) - 4
            log(b"slot operator(): id  0 | task %d | restored context checkpoint (pos_min = %d, pos_max = %d, "
                b"n_tokens = %d, n_past = %d, size = 0.032 MiB)" % (task, cached - 1, cached - 1, cached, cached))
        if len(prompt) - 4 > cached:
            log(b"slot create_check: id  0 | task %d | created context checkpoint 1 of 64 (pos_min = %d, "
                b"pos_max = %d, n_tokens = %d, size = 0.032 MiB)" % (task, len(prompt) - 5, len(prompt) - 5,
                                                                       len(prompt) - 4))
        return cached

    @staticmethod
    def _restore_past_divergence(task: int, prompt: list) -> int:
        """Log a restore that re-enters 8 tokens past the LCP with the cache; return the re-entry."""
        cache = CACHED[0]
        lcp = next((i for i, (a, b) in enumerate(zip(cache, prompt)) if a != b), min(len(cache), len(prompt)))
        r = min(lcp + 8, len(prompt) - 1)
        log(b"slot operator(): id  0 | task %d | restored context checkpoint (pos_min = %d, pos_max = %d, "
            b"n_tokens = %d, n_past = %d, size = 0.032 MiB, took 0.10 ms)" % (task, r - 1, r - 1, r, r))
        log(b"slot operator(): id  0 | task %d | cached n_tokens = %d, memory_seq_rm [%d, end)" % (task, r, r))
        return r

    def _stream(self, n_prompt: int) -> None:
        """A hostile streamed answer (the sse-* modes), whether or not one was asked for."""
        def event(obj: object) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def token(t: int) -> bytes:
            return event({"content": chr(t), "tokens": [t], "stop": False})

        final = event({"content": "", "tokens": [], "stop": True, "stop_type": "limit", "tokens_predicted": 4,
                       "timings": {"prompt_n": n_prompt, "cache_n": 0, "prompt_ms": 1.0}})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.close_connection = True
        if "sse-garbage" in MODES:
            parts = itertools.chain([token(97), ("data: " + SCRIPT + "\n\n").encode()], [final])
        elif "sse-endless" in MODES:
            parts = itertools.chain([token(97)], itertools.repeat(b":\n\n"))
        elif "sse-flood" in MODES:
            parts = itertools.repeat(token(97))
        elif "sse-cut" in MODES:
            parts = iter([token(97), token(98)])
        else:  # sse-extra-ids
            parts = iter([token(97), token(98), token(99), token(100), token(101), final])
        try:
            for part in parts:
                self.wfile.write(part)
                self.wfile.flush()
                if "sse-endless" in MODES:
                    time.sleep(0.05)
        except OSError:
            return

    def _trickle(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"{")
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return

    def _trickle_headers(self) -> None:
        # Each byte arrives well within any per-read timeout; the headers never end.
        try:
            for byte in itertools.cycle(b"HTTP/1.1 200 OK\r\nx-slow: "):
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            return

    def _json(self, status: int, obj: object) -> None:
        self._raw(status, json.dumps(obj).encode(), "application/json")

    def _raw(self, status: int, data: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def escape_with_socket(pidfile: str | None) -> None:
    """setsid-keeps-port / setsid-on-term: a double fork whose grandchild leaves the session and
    keeps every inherited descriptor, the listening socket with them, until it is killed."""
    # The engine writes the grandchild's pid (told by the intermediate through a pipe) before it
    # returns, so the test knows of every escape even when shadowlab kills the grandchild at once.
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        told = os.read(r, 32)  # EOF (b"") only if the intermediate died first
        os.close(r)
        if pidfile and told:
            with open(pidfile, "a") as fh:
                fh.write(f"{int(told)}\n")
        return  # the intermediate exits at once; its zombie stays the engine's until it exits
    os.close(r)
    os.setsid()
    grandchild = os.fork()
    if grandchild:
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "scrub-environ" in MODES:
        scrub_environment()
    while True:
        time.sleep(3600)


REBIND = """
import os, socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
if sys.argv[2]:
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
time.sleep(3600)
"""


def rebind_and_exit(server: ThreadingHTTPServer, port: int, pidfile: str | None) -> None:
    server.socket.close()
    subprocess.Popen([sys.executable, "-c", REBIND, str(port), pidfile or ""], env={},
                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.01)
    os._exit(0)


def scrub_environment() -> None:
    """Zero the block the kernel shows as /proc/self/environ (env_start, env_end: fields 50 and 51
    of /proc/self/stat, counted from 1; the command name before them may hold spaces)."""
    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rpartition(b")")[2].split()
    start, end = int(fields[47]), int(fields[48])
    ctypes.memset(start, 0, end - start)


def sleeper(pidfile: str | None, setsid: bool) -> subprocess.Popen:
    code = ("import os,signal,time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if "ignore-term" in MODES else "")
            + ("os.setsid()\n" if setsid else "")
            + (f"open({pidfile!r}, 'a').write(str(os.getpid()) + '\\n')\n" if pidfile else "")
            + "time.sleep(120)")
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", action="append", default=[])
    parser.add_argument("--pidfile", default=None)
    parser.add_argument("--intermediate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--exit-parent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ctx-checkpoints", type=int, default=64)  # the last one wins, as in llama.cpp
    args, _ = parser.parse_known_args()  # kind llama-server appends its own flags (-lv 4, ...)
    MODES.update(args.mode)
    CHECKPOINTS[0] = args.ctx_checkpoints
    for mode in args.mode:
        if mode.startswith("flood-line="):
            FLOOD[0] = int(mode.partition("=")[2])
    if args.intermediate:  # the child of setsid-child / double-fork: forks the grandchild
        grandchild = sleeper(args.pidfile, setsid=True)
        while not args.pidfile or not os.path.exists(args.pidfile):
            time.sleep(0.005)
        if args.exit_parent:
            os._exit(0)
        grandchild.wait()
        return
    if "ignore-term" in MODES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "log-garbage" in MODES:
        log_garbage()
    for mode, extra in (("setsid-child", []), ("double-fork", ["--exit-parent"])):
        if mode in MODES:
            child = subprocess.Popen([sys.executable, __file__, "--port", "0", "--intermediate",
                                      "--pidfile", args.pidfile or "", *extra,
                                      *(f"--mode={m}" for m in MODES)])
            if extra:
                child.wait()
            else:
                while not os.path.exists(args.pidfile or ""):
                    time.sleep(0.005)
    host = "0.0.0.0" if "bind-all" in MODES else "127.0.0.1"
    port = args.port + 1 if "other-port" in MODES else args.port
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    if "setsid-keeps-port" in MODES:
        escape_with_socket(args.pidfile)
    if "setsid-on-term" in MODES:
        def escape_and_exit(signum: int, frame: object) -> None:
            escape_with_socket(args.pidfile)
            os._exit(0)
        signal.signal(signal.SIGTERM, escape_and_exit)
    if "rebind-on-term" in MODES:
        signal.signal(signal.SIGTERM, lambda signum, frame: rebind_and_exit(server, port, args.pidfile))
    log(f"hostile engine listening on {host}:{port} pid {os.getpid()} modes {sorted(MODES)}".encode())
    server.serve_forever()


if __name__ == "__main__":
    main()
