"""One engine process: spawned pinned on its leased cores, hidden from GPUs, on a leased
loopback port; ready once /health answers 200, the engine itself listens on its port and the
kind's ready probe answered (``start_engine``); stopped as a whole process group and verified
gone (``LiveEngine.close``). Its HTTP client bounds each answer in time (``DeadlineTransport``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shadowlab.errors import EngineStartError, InfrastructureError
from shadowlab.plan import Plan
from shadowlab.results import records
from shadowlab.run import isolation
from shadowlab.run.context import PreparedEngine, RunContext
from shadowlab.run.directory import storage_failure
from shadowlab.run.process_group import EngineProcess, ProcessSurvived, StopReport

PORT_ATTEMPTS = 3
# Errors of the machine, not of shadowlab, when it writes the run directory (records.py: the
# one mapping of a failed write, shared with every writer of derived files).
STORAGE_ERRNOS = records.STORAGE_ERRNOS


@dataclass
class LiveEngine:
    """A started, ready engine: its process, port lease, HTTP client and what it reported."""

    ctx: RunContext
    engine: PreparedEngine
    proc: EngineProcess
    port: isolation.PortLease
    client: httpx.Client
    command: list[str]
    env_delta: dict[str, str]
    attempts: int
    started_at: str
    health_ms: float
    startup_ms: float
    props: dict[str, Any] = field(default_factory=dict)
    stop_report: StopReport | None = None

    def tokenize(self, text: str) -> list[int]:
        return self.engine.adapter.tokenize(self.client, text)

    def close(self) -> StopReport | None:
        """Stop the group and verify it is gone; idempotent."""
        if self.stop_report is None:
            self.client.close()
            try:
                self.stop_report = self.proc.stop()
            except ProcessSurvived:
                self.stop_report = self.proc.stop_report
                raise
            finally:
                self.ctx.untrack(self.proc)
                self.port.release()
        return self.stop_report


def controlled_env_names(plan: Plan, engines: Mapping[str, PreparedEngine]) -> set[str]:
    """Variables some cell of the plan sets, or some engine kind reads (its faults variable): a
    cell gets them only from its own delta, never inherited from shadowlab's environment."""
    names = {*isolation.GPU_VISIBILITY_VARS, *isolation.THREAD_COUNT_VARS}
    for cell in plan.cells:
        names.update(cell.engine_env)
        names.update(cell.env)
    for engine in engines.values():
        names.update(engine.adapter.controlled_env)
    return names


def cell_environment(ctx: RunContext, engine: PreparedEngine, cell_env: Mapping[str, str],
                     threads: int, devices: Sequence[int] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(full env, delta): shadowlab's env minus the controlled names, plus the cell's delta (the
    engine's env and the configuration's as the plan gives them, what the kind adds, the GPU
    devices its lease holds visible, no other)."""
    delta = engine.adapter.env(engine.spec, cell_env)
    delta |= isolation.gpu_env(devices) | isolation.thread_env(threads)
    base = {k: v for k, v in os.environ.items() if k not in controlled_env_names(ctx.plan, ctx.engines)}
    return base | delta, delta


def start_engine(ctx: RunContext, engine: PreparedEngine, cores: isolation.CoreLease, *,
                 flags: Sequence[str], env: Mapping[str, str],
                 log_path: Path, scratch: Path) -> LiveEngine:
    """Spawn pinned on ``cores`` and wait until ready; a port taken under us is retried.
    ``flags``/``env``: what the plan gives the engine (a cell's `engine_flags` + `flags`,
    `engine_env` | `env`); the kind's fault flags are added for `--fault`."""
    threads = min(engine.spec.threads, len(cores.cores))
    flags = [*flags, *engine.adapter.fault_flags(ctx.options.faults)]
    env, delta = cell_environment(ctx, engine, env, threads, cores.devices)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            port = isolation.lease_port()
        except isolation.LeaseUnavailable as exc:
            raise InfrastructureError(f"no loopback port for an engine: {exc}",
                                      hint="free some ports (or stop what holds them), then rerun "
                                           "with --resume") from None
        argv = engine.adapter.command(engine.spec, flags, port.port, threads, log_path)
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        try:
            proc = EngineProcess(argv, env=env, cwd=scratch, log_path=log_path, cores=cores.cores,
                                 port=port.port, max_log_bytes=ctx.max_log_bytes)
        except OSError as exc:
            port.release()
            if exc.errno in STORAGE_ERRNOS and exc.filename != argv[0]:
                raise storage_failure(exc) from None  # its log or scratch, not its binary
            raise EngineStartError(f"cannot start {argv[0]!r}: {exc}", engine=engine.spec.name) from None
        ctx.track(proc)
        cores.claim(proc.pid)
        # verify=False: plain HTTP on loopback, no TLS; the default loads the CA bundle (~39 ms a
        # cell, counted in the engine's start-up since the first /health poll waits for it).
        client = httpx.Client(base_url=f"http://127.0.0.1:{port.port}", timeout=10.0,
                              transport=DeadlineTransport(verify=False))
        live = LiveEngine(ctx, engine, proc, port, client, argv, delta, attempt, started_at, 0.0, 0.0)
        try:
            wait_ready(live, engine.spec.ready_timeout_s)
            return live
        except EngineStartError as exc:
            retry = attempt < PORT_ATTEMPTS and isolation.log_says_address_in_use(proc.log_tail())
            with contextlib.suppress(ProcessSurvived):
                live.close()
            if not retry:
                exc.failed_start = live  # type: ignore[attr-defined] - for the cell's record
                raise exc from None
        except BaseException:
            with contextlib.suppress(ProcessSurvived):
                live.close()
            raise
    raise AssertionError("unreachable")


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's read timeout bounds each read: an answer trickled a byte at a time never trips
    it. Here the read timeout bounds the status line and headers, and then the whole body
    (an engine's answer is untrusted; it may never end)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        if timeout is None:
            return super().handle_request(request)
        deadline = time.monotonic() + float(timeout)
        response = _within(float(timeout), lambda: super(DeadlineTransport, self).handle_request(request))
        response.stream = _DeadlineStream(response.stream, deadline)
        return response


def _within(seconds: float, call: Callable[[], httpx.Response]) -> httpx.Response:
    """call() in a daemon thread, given up after `seconds`. A blocked socket read cannot be
    interrupted from here; the abandoned thread ends when the cell stops its engine (the
    socket closes), which every timed-out request leads to."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["response"] = call()
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="engine-request", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise httpx.ReadTimeout("the engine's status line and headers did not arrive in time")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["response"]


class _DeadlineStream(httpx.SyncByteStream):
    def __init__(self, stream: Any, deadline: float) -> None:
        self._stream, self._deadline = stream, deadline

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            if time.monotonic() > self._deadline:
                raise httpx.ReadTimeout("the answer did not end in time")
            yield chunk

    def close(self) -> None:
        self._stream.close()


@contextlib.contextmanager
def serving(ctx: RunContext, engine: PreparedEngine, cores: isolation.CoreLease, *,
            flags: Sequence[str], env: Mapping[str, str], log_path: Path,
            scratch: Path | None = None) -> Iterator[LiveEngine]:
    """A started engine for the length of a `with` block (the prompts' tokenizer), then stopped."""
    live = start_engine(ctx, engine, cores, flags=flags, env=env, log_path=log_path,
                        scratch=scratch or log_path.parent / records.RunLayout.SCRATCH)
    try:
        yield live
    finally:
        live.close()


def wait_ready(live: LiveEngine, timeout_s: float) -> None:
    """Ready = /health 200, the engine itself listening on its port, and the kind's own ready
    probe answered (`adapter.ready_probe`: one /tokenize by default, GET /v1/models for openai)."""
    proc, name = live.proc, live.engine.spec.name
    deadline = proc.started_at + timeout_s
    # Each /health poll costs the engine CPU on its pinned core while it loads: start
    # fast (a quick engine is ready in ms) and back off to 25 ms (at most ~12 ms late).
    interval = 0.002
    while True:
        if live.ctx.stop.is_set():
            raise EngineStartError("run interrupted during start-up", engine=name)
        code = proc.poll()
        if code is not None:
            raise EngineStartError(f"engine exited with code {code} during start-up", engine=name,
                                   log_tail=_tail_lines(proc))
        with contextlib.suppress(httpx.TransportError):
            if live.client.get("/health", timeout=2.0).status_code == 200:
                break
        if time.monotonic() >= deadline:
            raise EngineStartError(f"not ready after {timeout_s:g} s (/health never answered 200)",
                                   engine=name, log_tail=_tail_lines(proc))
        time.sleep(interval)
        interval = min(interval * 1.5, 0.025)
    live.health_ms = (time.monotonic() - proc.started_at) * 1000.0
    code = proc.poll()
    if code is not None:
        raise EngineStartError(f"engine exited with code {code} right after /health answered",
                               engine=name, log_tail=_tail_lines(proc))
    exposed = proc.exposed_listeners()
    if exposed:
        raise EngineStartError(f"engine listens beyond loopback on {', '.join(exposed)}; engines must "
                               "bind to 127.0.0.1 only (refused)", engine=name, log_tail=_tail_lines(proc))
    if not proc.listens_on_port():
        raise EngineStartError(f"port {live.port.port} answers, but not from the engine's process",
                               engine=name, log_tail=_tail_lines(proc))
    try:  # the kind's own probe (default: one /tokenize; openai: GET /v1/models)
        live.engine.adapter.ready_probe(live.client)
    except (httpx.HTTPError, ValueError) as exc:
        raise EngineStartError(f"ready probe failed: {exc}", engine=name,
                               log_tail=_tail_lines(proc)) from None
    live.startup_ms = (time.monotonic() - proc.started_at) * 1000.0
    with contextlib.suppress(httpx.HTTPError, ValueError):
        live.props = live.engine.adapter.props(live.client)


def _tail_lines(proc: EngineProcess, count: int = 20) -> list[str]:
    return proc.log_tail().splitlines()[-count:]


def gpu_record(devices: int | Sequence[int] | None, live: LiveEngine) -> records.Gpu:
    """`requested` is the first leased device (the record's field is one index); `env` names all."""
    requested = devices[0] if isinstance(devices, Sequence) else devices
    reported = live.engine.adapter.reported_device(live.props)
    if reported is None:
        verified = None
    elif requested is None:
        verified = reported == "cpu"
    else:
        verified = reported != "cpu"
    return records.Gpu(requested, isolation.gpu_env(devices), reported, verified)
