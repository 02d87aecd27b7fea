"""`shadowlab capture` on the request path: what the pass-through proxy adds to a request, and
what nginx's mirror to the capture sink adds to the primary's, under a real load generator.

    python benchmarks/bench_capture.py [--seconds 15] [--rounds 3] [--connections 32] [--out DIR]
                                       [--think-ms MS] [--pin SERVER_CPUS:CAPTURE_CPUS]
    python benchmarks/bench_capture.py --mirror-faults
    python benchmarks/bench_capture.py --loop-cpu [--seconds 10] [--rounds 3]

Starts a real llama-server (the seeded tiny GGUF, `-np 32`: every connection has a slot, so a
request's latency is its own prefill and decode, not a queue), the capture proxy in front of it
(its recorder tokenizing on the same server, as in production), Debian's nginx in front of it
twice (with and without the mirror to a capture sink), and runs Debian's `wrk` with a Lua
script that POSTs streamed `/v1/chat/completions` requests, each with a prompt of its own, over
`--connections` keep-alive connections. The setups run interleaved (direct, proxy, nginx,
nginx+mirror, repeated `--rounds` times) so a drift of the machine's load falls on all of them.

Each capture runs twice: recording (the recorder tokenizes each exchange on the same server and
writes the trace) and "unrecorded" (a channel too small for any frame: every exchange dropped and
counted, so only the forwarding path, or nginx's mirror and the sink, run); the difference
separates what the request path costs from what the recording's CPU costs a saturated machine.

Two loads. Closed loop (the default): every connection sends its next request as soon as its
answer ends, so the server is always saturated and a request's latency is mostly its queue.
`--think-ms MS`: each connection waits an exponentially distributed pause (mean MS, wrk's
`delay()`) before its next request, as a user reading an answer does; 32 streams then offer a
load below saturation and a request's latency is its own service time, in which a hop's cost
can be resolved. `--pin 0:1`: llama-server and wrk run on the first CPU list, the capture fronts
(their recorders) and nginx on the second (inherited at exec, every thread included), so the
hop's CPU is not taken from the server it measures, as on a production machine whose server
has cores of its own. "direct (again)" runs the direct setup a second time in every round: the
difference of the two direct runs is the noise floor, the smallest difference the run resolves.
"tokenizer apart": the capture's recorder tokenizes on a second llama-server with the same GGUF
(`capture --tokenizer`, on the capture's CPUs), not on the production server it measures.

Per run: wrk's latency percentiles (50, 75, 90, 99), requests per second, errors; the proxy's
CPU time per request (psutil, front process only). Reported: per setup the median over rounds
of each percentile, and the differences proxy - direct and mirror - nginx with their spread over
rounds (min..max of the per-round differences). Targets (issue 23): proxy adds < 1 ms at the
median and < 5 ms at p99; the mirror adds nothing measurable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shadowlab.engines.llama_server import gguf_model  # noqa: E402
from shadowlab.run import isolation  # noqa: E402
from shadowlab.capture import mirror  # noqa: E402
from shadowlab.engines import llama_server  # noqa: E402

LUA = """
local banned = '%(banned)s'
local words = {"cache", "slot", "turn", "prefix", "state", "token", "model", "batch", "queue", "reuse"}
local n = 0
setup = function(thread) thread:set("seed", math.random(1, 1000000)) end
init = function(args) math.randomseed(seed) end
%(delay)s
request = function()
  n = n + 1
  local text = {}
  for i = 1, %(words)d do text[i] = words[math.random(1, #words)] end
  local body = '{"messages":[{"role":"user","content":"' .. n .. ' ' .. table.concat(text, " ") ..
               '"}],"max_tokens":%(max_tokens)d,"temperature":0,"stream":true,"logit_bias":' .. banned .. '}'
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"%(close)s}, body)
end
"""


def wait_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} not listening")


def start(argv: list[str], log: Path, env: dict | None = None, cpus: set[int] | None = None) -> subprocess.Popen:
    """`argv` in a session of its own; `cpus`: its CPU affinity, set before exec (so every thread
    and child it starts has it)."""
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    return subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env,  # noqa: SIM115
                            start_new_session=True, preexec_fn=pin)


def cpu_list(text: str) -> set[int]:
    """'0', '0-3', '0,2': a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wrk(port: int, script: Path, seconds: int, connections: int, cpus: set[int] | None = None) -> dict:
    threads = "2" if cpus is None else str(min(2, len(cpus)))
    out = subprocess.run(["wrk", "-t", threads, "-c", str(connections), "-d", f"{seconds}s", "--latency",
                          "--timeout", "30s", "-s", str(script), f"http://127.0.0.1:{port}"],
                         capture_output=True, text=True, timeout=seconds + 120, check=True,
                         preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))).stdout
    pct = {p: _ms(v, u) for p, v, u in re.findall(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock_errors = re.search(r"Socket errors: (.*)", out)
    return {"p50": pct["50"], "p75": pct["75"], "p90": pct["90"], "p99": pct["99"], "rps": rps,
            "requests": requests, "non_2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": sock_errors.group(1) if sock_errors else None}


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per answer (streamed: one event each)")
    p.add_argument("--words", type=int, default=12, help="words per prompt")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--think-ms", type=float, default=0.0,
                   help="mean pause before a connection's next request (exponential; 0: closed loop, saturated)")
    p.add_argument("--connection-close", action="store_true",
                   help="every request says Connection: close, so every setup opens a connection per request "
                        "(llama-server closes after each streamed answer anyway; the proxy keeps its client's)")
    p.add_argument("--no-nginx", action="store_true", help="direct and proxy setups only")
    p.add_argument("--pin", default=None, metavar="SERVER_CPUS:CAPTURE_CPUS",
                   help="CPU lists, e.g. 0:1 -- llama-server and wrk on the first, capture and nginx on the second")
    p.add_argument("--loop-cpu", action="store_true",
                   help="instead: the proxy front's CPU per request on uvloop and on asyncio's loop, against nginx")
    p.add_argument("--mirror-faults", action="store_true",
                   help="instead: a hung and a dead capture sink behind nginx's mirror, one keep-alive client")
    args = p.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"bench_capture: needs Debian's {tool} (apt-get install {tool})")
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-capture-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.loop_cpu:
        loop_cpu(work, args)
        return 0
    binary, _ = llama_server.locate_binary("auto")
    model = gguf_model.ensure_gguf("tiny", 0, work / "models")
    banned = json.dumps([[t, False] for t in gguf_model.invalid_utf8_token_ids()]).replace(" ", "")
    if args.mirror_faults:
        mirror_faults(work, binary, model, banned)
        return 0
    server_cpus = capture_cpus = None
    if args.pin:
        server_cpus, capture_cpus = (cpu_list(part) for part in args.pin.split(":"))
    delay = ("" if not args.think_ms else
             "delay = function() return math.floor(-math.log(1 - math.random()) * %g) end" % args.think_ms)
    script = work / "chat.lua"
    close = ', ["Connection"] = "close"' if args.connection_close else ""
    script.write_text(LUA % {"banned": banned, "max_tokens": args.max_tokens, "words": args.words, "delay": delay,
                             "close": close})
    leases = [isolation.lease_port() for _ in range(12)]
    (llama_p, proxy_p, proxy_u, sink_p, sink_u, nginx_p, nginx_u, plain_p, tok_p, proxy_t, sink_t,
     nginx_t) = (lease.port for lease in leases)
    procs = []
    try:
        env = dict(os.environ, LD_LIBRARY_PATH=str(binary.parent))
        procs.append(start([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(llama_p), "-t", "1",
                            "-np", str(args.connections), "-c", str(512 * args.connections), "--kv-unified",
                            "-cram", "0"], work / "llama.log", env, server_cpus))
        # "tokenizer apart": a second llama-server with the same GGUF, on the capture's CPUs, that
        # only tokenizes (capture --tokenizer): the recording's load off the production server
        procs.append(start([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(tok_p), "-t", "1",
                            "-np", "1", "-c", "512", "-cram", "0"], work / "tokenizer.log", env, capture_cpus))
        wait_port(llama_p)
        wait_port(tok_p)
        upstream = f"http://127.0.0.1:{llama_p}"
        apart = ["--tokenizer", f"http://127.0.0.1:{tok_p}"]
        cap = [sys.executable, "-m", "shadowlab", "capture"]
        # "unrecorded": the same front with a channel too small for any frame, so every exchange
        # is dropped (counted) and the recorder never tokenizes: the forwarding path alone.
        quiet = ["--queue-mib", "0.0001"]
        fronts = {}
        for name, port, argv in (("proxy", proxy_p, ["--upstream", upstream]),
                                 ("proxy-unrecorded", proxy_u, ["--upstream", upstream, *quiet]),
                                 ("mirror", sink_p, ["--mirror", "--tokenizer", upstream]),
                                 ("mirror-unrecorded", sink_u, ["--mirror", "--tokenizer", upstream, *quiet]),
                                 ("proxy-apart", proxy_t, ["--upstream", upstream, *apart]),
                                 ("mirror-apart", sink_t, ["--mirror", *apart])):
            fronts[name] = start([*cap, *argv, "--listen", f"127.0.0.1:{port}", "--out", str(work / name)],
                                 work / f"{name}.log", cpus=capture_cpus)
            procs.append(fronts[name])
        for port, sink, name in ((nginx_p, sink_p, "nginx-mirror"), (nginx_u, sink_u, "nginx-mirror-unrecorded"),
                                 (nginx_t, sink_t, "nginx-mirror-apart"), (plain_p, None, "nginx-plain")):
            prefix = work / name
            prefix.mkdir(exist_ok=True)
            conf = mirror.nginx_config(f"127.0.0.1:{port}", f"127.0.0.1:{llama_p}", f"127.0.0.1:{sink or sink_p}")
            if sink is None:
                conf = conf.replace("mirror /_shadowlab_capture;", "").replace("mirror_request_body on;", "")
            (prefix / "nginx.conf").write_text(conf)
            procs.append(start([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(prefix), "-c", "nginx.conf"],
                               prefix / "nginx.log", cpus=capture_cpus))
        for port in (proxy_p, proxy_u, sink_p, sink_u, proxy_t, sink_t, nginx_p, nginx_u, nginx_t, plain_p):
            wait_port(port)
        proxy = fronts["proxy"]
        setups = {"direct": llama_p, "proxy": proxy_p, "direct (again)": llama_p, "proxy-unrecorded": proxy_u,
                  "proxy, tokenizer apart": proxy_t, "nginx": plain_p, "nginx+mirror": nginx_p,
                  "nginx+mirror-unrecorded": nginx_u, "nginx+mirror, tokenizer apart": nginx_t}
        if args.no_nginx:
            setups = {k: v for k, v in setups.items() if not k.startswith("nginx")}
        wrk(llama_p, script, 3, args.connections, server_cpus)  # warm-up
        front = psutil.Process(proxy.pid)
        runs: dict[str, list[dict]] = {name: [] for name in setups}
        for r in range(args.rounds):
            for name, port in setups.items():
                cpu0 = sum(front.cpu_times()[:2])
                result = wrk(port, script, args.seconds, args.connections, server_cpus)
                if name == "proxy":
                    result["proxy_cpu_ms_per_request"] = (sum(front.cpu_times()[:2]) - cpu0) * 1e3 / result["requests"]
                result["load"] = os.getloadavg()[0]
                runs[name].append(result)
                print(f"round {r + 1} {name:30s} " + json.dumps(result), flush=True)
        report(runs, work, args)
    finally:
        for proc in reversed(procs):
            stop(proc)
        for lease in leases:
            lease.release()
    return 0


NGINX_SSE = """worker_processes 1;
error_log %(prefix)s/error.log;
pid %(prefix)s/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %(prefix)s/body;
  server {
    listen 127.0.0.1:%(port)d;
    keepalive_timeout %(keepalive)s;
    location / { default_type text/event-stream;
                 return 200 "data: {\\"choices\\":[{\\"delta\\":{\\"content\\":\\"x\\"}}]}\\n\\ndata: [DONE]\\n\\n"; }
  }
}
"""


def loop_cpu(work: Path, args: argparse.Namespace) -> None:
    """`--loop-cpu`: the forwarding path's CPU per request, uvloop against asyncio's loop. The
    upstream is nginx answering a two-event SSE body at once (so the front, not a model, is what
    is measured), with keep-alive, and closing after each answer as llama-server b11434 does
    after a streamed one. The front runs unrecorded on CPU 1, nginx and wrk (32 connections,
    closed loop) on CPU 0; CPU from /proc over a 10 s run after a 3 s warm-up."""
    script = work / "post.lua"
    script.write_text('wrk.method = "POST"\nwrk.body = \'{"messages":[{"role":"user","content":"hello"}],'
                      '"max_tokens":4,"stream":true}\'\nwrk.headers["Content-Type"] = "application/json"\n')
    leases = [isolation.lease_port() for _ in range(3)]
    up_p, up_close_p, front_p = (lease.port for lease in leases)
    procs = []
    try:
        for port, keepalive in ((up_p, "75s"), (up_close_p, "0")):
            prefix = work / f"nginx-sse-{port}"
            (prefix / "body").mkdir(parents=True, exist_ok=True)
            (prefix / "nginx.conf").write_text(NGINX_SSE % {"prefix": prefix, "port": port, "keepalive": keepalive})
            procs.append(start([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(prefix), "-c", "nginx.conf",
                                "-g", "daemon off;"], prefix / "nginx.log", cpus={0}))
            wait_port(port)
        results: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for upstream, port in (("keep-alive", up_p), ("closes", up_close_p)):
                for loop in ("uvloop", "asyncio"):
                    env = dict(os.environ, SHADOWLAB_CAPTURE_LOOP=loop)
                    front = start([sys.executable, "-m", "shadowlab", "capture", "--upstream", f"http://127.0.0.1:{port}",
                                   "--queue-mib", "0.0001", "--listen", f"127.0.0.1:{front_p}",
                                   "--out", str(work / f"front-{loop}")], work / f"front-{loop}.log", env, {1})
                    try:
                        wait_port(front_p)
                        wrk(front_p, script, 3, 32, {0})
                        proc = psutil.Process(front.pid)
                        cpu0 = sum(proc.cpu_times()[:2])
                        result = wrk(front_p, script, args.seconds, 32, {0})
                        per = (sum(proc.cpu_times()[:2]) - cpu0) * 1e3 / result["requests"]
                    finally:
                        stop(front)
                    results.setdefault(f"{upstream} {loop}", []).append(per)
                    print(f"round {r + 1} upstream {upstream:10s} {loop:8s} {result['rps']:8.0f} req/s, "
                          f"p50 {result['p50']:.2f} ms, front CPU {per:.3f} ms/request", flush=True)
        for upstream in ("keep-alive", "closes"):
            uv, plain = (statistics.median(results[f"{upstream} {loop}"]) for loop in ("uvloop", "asyncio"))
            print(f"  upstream {upstream}: front CPU per request, median over rounds: uvloop {uv:.3f} ms, "
                  f"asyncio {plain:.3f} ms ({uv / plain:.2f}x)")
    finally:
        for proc in reversed(procs):
            stop(proc)
        for lease in leases:
            lease.release()


def mirror_faults(work: Path, binary: Path, model: Path, banned: str, requests: int = 15) -> None:
    """`--mirror-faults`: one client, one keep-alive connection through nginx + mirror, requests
    one after another, with the capture sink running, hung (SIGSTOP: connections queue in its
    backlog, nothing answers) and down (killed: connect refused); each at the mirror timeouts
    200 ms (the generated config's) and 50 ms. nginx reads the next request of a connection only
    when the previous request's mirror subrequest has finished: a hung sink costs up to the
    timeout per request, a dead one nothing."""
    import httpx

    leases = [isolation.lease_port() for _ in range(4)]
    llama_p, sink_p, n200, n50 = (lease.port for lease in leases)
    procs = []
    body = {"messages": [{"role": "user", "content": "cache slot turn"}], "max_tokens": 2, "temperature": 0,
            "logit_bias": json.loads(banned)}
    try:
        env = dict(os.environ, LD_LIBRARY_PATH=str(binary.parent))
        procs.append(start([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(llama_p), "-t", "1",
                            "-np", "1", "-cram", "0"], work / "faults-llama.log", env))
        sink = start([sys.executable, "-m", "shadowlab", "capture", "--mirror", "--tokenizer",
                      f"http://127.0.0.1:{llama_p}", "--listen", f"127.0.0.1:{sink_p}", "--out", str(work / "faults")],
                     work / "faults-sink.log")
        procs.append(sink)
        for port, timeout_ms in ((n200, 200), (n50, 50)):
            prefix = work / f"faults-nginx-{timeout_ms}"
            prefix.mkdir(exist_ok=True)
            (prefix / "nginx.conf").write_text(mirror.nginx_config(f"127.0.0.1:{port}", f"127.0.0.1:{llama_p}",
                                                                   f"127.0.0.1:{sink_p}", mirror_timeout_ms=timeout_ms))
            procs.append(start([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(prefix), "-c", "nginx.conf"],
                               prefix / "nginx.log"))
        for port in (llama_p, sink_p, n200, n50):
            wait_port(port)
        recorder_pid = None
        while recorder_pid is None:  # the sink's status names its recorder once it is started
            time.sleep(0.1)
            with contextlib.suppress(OSError, ValueError):
                recorder_pid = json.loads((work / "faults" / "capture.json").read_text())["recorder_pid"]
        for state in ("running", "recorder stopped", "hung", "down"):
            if state == "recorder stopped":
                os.kill(recorder_pid, signal.SIGSTOP)  # tokenizing and writing stall; the channel fills
            if state == "hung":
                os.kill(recorder_pid, signal.SIGCONT)
                os.killpg(sink.pid, signal.SIGSTOP)
            if state == "down":
                os.killpg(sink.pid, signal.SIGKILL)
            for port, timeout_ms in ((n200, 200), (n50, 50)):
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                    times = []
                    for _ in range(requests):
                        t0 = time.perf_counter()
                        assert client.post("/v1/chat/completions", json=body).status_code == 200
                        times.append((time.perf_counter() - t0) * 1e3)
                print(f"  sink {state:16s} mirror timeout {timeout_ms:3d} ms: request after request on one "
                      f"keep-alive connection, median {statistics.median(times[1:]):7.1f} ms "
                      f"(min {min(times[1:]):.1f}, max {max(times[1:]):.1f})", flush=True)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
            stop(proc)
        for lease in leases:
            lease.release()


def report(runs: dict[str, list[dict]], work: Path, args: argparse.Namespace) -> None:
    doc = {"connections": args.connections, "seconds": args.seconds, "rounds": args.rounds, "runs": runs,
           "think_ms": args.think_ms, "pin": args.pin, "nproc": os.cpu_count(),
           "trace_lines": {k: _lines(work / k) for k in ("proxy", "mirror", "proxy-unrecorded", "mirror-unrecorded",
                                                         "proxy-apart", "mirror-apart")}}
    print(f"\n  {'median over rounds (ms)':30s}" + "".join(f"{k:>9s}" for k in ("p50", "p75", "p90", "p99", "req/s")))
    for name, rs in runs.items():
        print(f"  {name:30s}" + "".join(f"{statistics.median(r[k] for r in rs):9.2f}"
                                        for k in ("p50", "p75", "p90", "p99"))
              + f"{statistics.median(r['rps'] for r in rs):9.1f}")
    for a, b in (("direct (again)", "direct"), ("proxy", "direct"), ("proxy-unrecorded", "direct"),
                 ("proxy, tokenizer apart", "direct"), ("nginx+mirror", "nginx"), ("nginx+mirror-unrecorded", "nginx"),
                 ("nginx+mirror, tokenizer apart", "nginx")):
        if a not in runs:
            continue
        for k in ("p50", "p99"):
            d = [x[k] - y[k] for x, y in zip(runs[a], runs[b])]
            doc[f"{a} - {b} {k}"] = d
            print(f"  {a} - {b} {k}: median {statistics.median(d):+.2f} ms (rounds {min(d):+.2f} .. {max(d):+.2f})")
    cpu = [r["proxy_cpu_ms_per_request"] for r in runs["proxy"]]
    print(f"  proxy front CPU per request: {statistics.median(cpu):.3f} ms; trace lines: {doc['trace_lines']}")
    (work / "bench_capture.json").write_text(json.dumps(doc, indent=1))
    print(f"  (details in {work / 'bench_capture.json'})")


def _lines(directory: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in directory.glob("trace-*.jsonl"))


if __name__ == "__main__":
    sys.exit(main())
