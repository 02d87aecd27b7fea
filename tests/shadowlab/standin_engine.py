"""A minimal stand-in engine for isolation tests: /health, /tokenize, /props.

Used where a test is about processes and sockets, not about an engine's answers
(it starts in ~50 ms, so isolation tests stay fast on a 2-core machine).
Usage: python standin_engine.py --port N [--children K] [--ignore-term]
  --children K   fork K sleeping children into the same process group
  --ignore-term  ignore SIGTERM (forces the runner's KILL path)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/props":
            self._json(200, {"device": "cpu", "pid": os.getpid(),
                             "affinity": sorted(os.sched_getaffinity(0)),
                             "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}})
        else:
            self._json(404, {"error": {"code": 404, "message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize":
            self._json(200, {"tokens": list(body.get("content", "").encode())})
        else:
            self._json(404, {"error": {"code": 404, "message": "not found"}})

    def _json(self, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for _ in range(args.children):
        subprocess.Popen([sys.executable, "-c", "import signal,time\n"
                          + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if args.ignore_term else "")
                          + "time.sleep(600)"])
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"standin listening on {args.port} pid {os.getpid()}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
