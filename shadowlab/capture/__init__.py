"""`shadowlab capture`: production traffic in, a trace of numbers out (never the text).

    shadowlab capture --upstream http://127.0.0.1:8080 --listen 127.0.0.1:8090 --out DIR
    shadowlab capture --mirror --tokenizer http://127.0.0.1:8080 --listen 127.0.0.1:8091 --out DIR

Two setups (docs/trace.md "Capture"):

- pass-through proxy (default): clients talk to --listen, which forwards to --upstream and
  streams the answer back unchanged (proxy.py). Fails open: the forwarding process never waits
  for the recording.
- mirror target (`--mirror`): nginx's `mirror` (or Envoy's request mirroring) sends a copy of
  each request; the sink answers 204 at once (mirror.py). `--nginx-config LISTEN` prints the
  nginx.conf for it and exits.

Parts, one job each:

    front.py      numbers exchanges, hands each finished one to the channel
    http1.py      HTTP/1.1 framing: heads whole, bodies streamed, bounded copies (Tap)
    proxy.py      the pass-through proxy            mirror.py   the mirror sink, nginx.conf
    channel.py    the bounded lossy link to the recorder process, and its supervisor
    recorder.py   the recorder process: tokenize, hash, order, write
    tokenizer.py  the engine's tokenizer over HTTP  blocks.py   salted chained block ids
    conversation.py the conversation key            answers.py  what an answer reported
    writer.py     trace pieces, rotated, never a torn line

The front's event loop is uvloop's (libuv) where it is installed, a dependency on Linux and
macOS. Measured against a local nginx upstream (`bench_capture.py --loop-cpu`), the front spends
~30% less CPU per forwarded request than on asyncio's own loop where the upstream closes the
connection after each answer, as llama-server does after a streamed one, and ~15% less with a
kept-alive upstream.
`SHADOWLAB_CAPTURE_LOOP=asyncio` keeps asyncio's loop.

The salt is made at start (32 random bytes; `--salt-file` keeps one across restarts), handed to
the recorder over the channel, and never written: lines carry `salt_id` only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from shadowlab.exitcodes import EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE
from shadowlab.results.records import write_json_atomic

if TYPE_CHECKING:
    from shadowlab.capture.channel import RecorderSupervisor
    from shadowlab.capture.front import Front

STATUS_S = 1.0


class CaptureUsageError(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    from shadowlab.capture import mirror

    try:
        listen = _host_port(args.listen, "--listen")
        upstream = _url(args.upstream, "--upstream") if args.upstream else None
        if args.nginx_config is not None:
            if not args.mirror or upstream is None:
                raise CaptureUsageError("--nginx-config goes with --mirror and --upstream (the primary)")
            _host_port(args.nginx_config, "--nginx-config")
            sys.stdout.write(mirror.nginx_config(args.nginx_config, f"{upstream[0]}:{upstream[1]}", args.listen))
            return EXIT_QUALIFIED
        options = _options(args, listen, upstream)
    except CaptureUsageError as exc:
        print(f"shadowlab capture: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(_serve(options))
    except OSError as exc:
        print(f"shadowlab capture: cannot listen on {args.listen}: {exc.strerror}", file=sys.stderr)
        return EXIT_INFRASTRUCTURE


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed and not refused (SHADOWLAB_CAPTURE_LOOP=asyncio);
    None: asyncio's own."""
    if os.environ.get("SHADOWLAB_CAPTURE_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _options(args: argparse.Namespace, listen: tuple[str, int], upstream: tuple[str, int] | None) -> dict:
    if not args.mirror and upstream is None:
        raise CaptureUsageError("the proxy needs --upstream URL (or give --mirror)")
    tokenizer = args.tokenizer or args.upstream
    if tokenizer is None:
        raise CaptureUsageError("--mirror needs --tokenizer URL (a llama-server with the production model)")
    _url(tokenizer, "--tokenizer")
    if not 1 <= args.block_tokens <= 512:
        raise CaptureUsageError(f"--block-tokens must be 1..512, got {args.block_tokens}")
    for name in ("rotate_mib", "rotate_minutes", "queue_mib", "max_body_mib"):
        if not 0 < getattr(args, name) < 1 << 20:
            raise CaptureUsageError(f"--{name.replace('_', '-')} must be a positive number")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        probe = args.out / ".capture-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CaptureUsageError(f"--out {args.out}: {exc.strerror}") from None
    return {"args": args, "listen": listen, "upstream": upstream, "tokenizer": tokenizer, "salt": _salt(args.salt_file)}


def _salt(path: Path | None) -> bytes:
    if path is None:
        return os.urandom(32)
    try:
        if path.exists():
            salt = bytes.fromhex(path.read_text().strip())
            if len(salt) != 32:
                raise ValueError
            return salt
        salt = os.urandom(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(salt.hex() + "\n")
        return salt
    except (OSError, ValueError):
        raise CaptureUsageError(f"--salt-file {path}: not a readable file of 64 hex digits") from None


def _host_port(text: str, option: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CaptureUsageError(f"{option} must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _url(text: str, option: str) -> tuple[str, int]:
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme != "http" or not parts.hostname:
        raise CaptureUsageError(f"{option} must be an http:// URL, got {text!r}")
    return parts.hostname, parts.port or 80


async def _serve(o: dict) -> int:
    from shadowlab.capture import blocks, channel, mirror, proxy
    from shadowlab.capture.front import Front, FrontOptions

    args = o["args"]
    link = channel.Channel(int(args.queue_mib * (1 << 20)))
    front = Front(FrontOptions("mirror" if args.mirror else "proxy",
                               args.conversation_header.lower() if args.conversation_header else None,
                               int(args.max_body_mib * (1 << 20))), link)
    recorder = channel.RecorderSupervisor(link, channel.recorder_argv(_recorder_options(args, o["tokenizer"])),
                                          {"salt": o["salt"].hex()})
    host, port = o["listen"]
    if args.mirror:
        server = await mirror.serve(mirror.MirrorSink(front), host, port)
    else:
        pool = proxy.UpstreamPool(*o["upstream"])
        server = await proxy.serve(proxy.Proxy(front, pool), host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop_name = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"  # the one running
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tasks = [asyncio.create_task(recorder.run()), asyncio.create_task(front.tick()),
             asyncio.create_task(_status(args.out, front, recorder, blocks.salt_id(o["salt"]), args, loop_name))]
    print(f"shadowlab capture: {front.options.mode} on {args.listen}, trace in {args.out}", file=sys.stderr)
    await stop.wait()
    server.close()
    await recorder.stop(tasks[0])
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)
    _write_status(args.out, front, recorder, blocks.salt_id(o["salt"]), args, loop_name)
    return EXIT_QUALIFIED


def _recorder_options(args: argparse.Namespace, tokenizer: str) -> list[str]:
    out = ["--out", str(args.out), "--tokenizer", tokenizer if "://" in tokenizer else f"http://{tokenizer}",
           "--block-tokens", str(args.block_tokens), "--rotate-bytes", str(int(args.rotate_mib * (1 << 20))),
           "--rotate-s", str(args.rotate_minutes * 60)]
    if args.user_delimiter is not None:
        out += ["--user-delimiter", args.user_delimiter]
    return out


async def _status(out: Path, front: Front, recorder: RecorderSupervisor, salt_id: str,
                  args: argparse.Namespace, loop_name: str) -> None:
    while True:
        # Off the event loop: the status file's fsync must never hold a proxied request.
        await asyncio.to_thread(_write_status, out, front, recorder, salt_id, args, loop_name)
        await asyncio.sleep(STATUS_S)


def _write_status(out: Path, front: Front, recorder: RecorderSupervisor, salt_id: str,
                  args: argparse.Namespace, loop_name: str) -> None:
    doc = {"mode": front.options.mode, "listen": args.listen, "upstream": args.upstream, "salt_id": salt_id,
           "block_tokens": args.block_tokens, "recorder_pid": recorder.pid, "front_pid": os.getpid(),
           "event_loop": loop_name,
           "channel": dict(vars(front.link.counts))}
    with contextlib.suppress(OSError):
        write_json_atomic(out / "capture.json", doc)
