"""Start a real `shadowlab-engine` process on 127.0.0.1 for integration tests.

Every process is started in its own session and killed as a group in `finally`; readiness is
polled with a deadline, never slept for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 60.0


def tiny_model() -> Path:
    from shadowlab_engine.weights import ensure_model

    return ensure_model("tiny", 0, REPO / "models")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineProcess:
    def __init__(self, proc: subprocess.Popen, port: int, log_file: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_file = log_file
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120.0)

    def stderr(self) -> str:
        return self.log_file.with_suffix(".stderr").read_text(encoding="utf-8", errors="replace")

    def log(self) -> str:
        return self.log_file.read_text(encoding="utf-8") if self.log_file.exists() else ""

    def lines(self, needle: str) -> list[str]:
        return [line for line in self.log().splitlines() if needle in line]

    def mark(self) -> int:
        """Current end of the log, for `lines_since`."""
        return len(self.log())

    def lines_since(self, mark: int, needle: str) -> list[str]:
        return [line for line in self.log()[mark:].splitlines() if needle in line]

    def task_lines(self, task: int, needle: str = "") -> list[str]:
        return [line for line in self.lines(f"| task {task} |") if needle in line]

    def post(self, path: str, body: object, **kw) -> httpx.Response:
        return self.client.post(path, json=body, **kw)

    def complete(self, prompt: list[int] | str, n_predict: int = 8, **extra) -> dict:
        r = self.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        return r.json()

    def wait_health(self, deadline_s: float = START_DEADLINE_S) -> list[int]:
        """Poll /health until 200; return every status seen (503s first)."""
        seen: list[int] = []
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                status = self.client.get("/health", timeout=2.0).status_code
                seen.append(status)
                if status == 200:
                    return seen
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"/health not 200 within {deadline_s} s:\n{self.log()[-3000:]}")

    def wait_exit(self, deadline_s: float = 30.0) -> int:
        return self.proc.wait(timeout=deadline_s)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def spawn(model: Path, flags: list[str], log_dir: Path, env: dict[str, str] | None = None,
          name: str = "engine") -> EngineProcess:
    port = free_port()
    log_file = log_dir / f"{name}-{port}.log"
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith("PXA_CKPT_") and k != "SHADOWLAB_ENGINE_FAULTS"}
    child_env.update(env or {})
    cmd = [sys.executable, "-m", "shadowlab_engine", "-m", str(model), "--port", str(port),
           "-t", "1", "--log-file", str(log_file), *flags]
    with open(log_dir / f"{name}-{port}.stderr", "wb") as stderr:
        proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    return EngineProcess(proc, port, log_file)


@contextlib.contextmanager
def running(model: Path, flags: list[str], log_dir: Path, env: dict[str, str] | None = None,
            name: str = "engine", wait: bool = True) -> Iterator[EngineProcess]:
    engine = spawn(model, flags, log_dir, env, name)
    try:
        if wait:
            engine.wait_health()
        yield engine
    finally:
        engine.stop()


FIELD_RE = re.compile(r"(\w+) = (-?\d+)")


def fields(line: str) -> dict[str, int]:
    """Integer `name = value` fields of a log line."""
    return {k: int(v) for k, v in FIELD_RE.findall(line)}


@functools.lru_cache(maxsize=2)
def _load(path: str):
    import torch

    from shadowlab_engine.model import HybridModel

    torch.set_num_threads(1)
    return HybridModel.load(path)


def greedy_reference(model_path: Path, prompt: list[int], n_predict: int) -> list[int]:
    """Cold greedy completion computed with the model directly (one forward() for the whole
    prompt, no server, no checkpoints): an oracle independent of the engine's cache code."""
    import torch

    from shadowlab_engine.tokenizer import STOP_TOKENS

    model = _load(str(model_path))
    state = model.new_state(len(prompt) + n_predict)
    logits = model.forward(state, prompt, 0)
    out: list[int] = []
    while len(out) < n_predict:
        token = int(torch.argmax(logits).item())
        if token in STOP_TOKENS:
            break
        out.append(token)
        if len(out) < n_predict:
            logits = model.forward(state, [token], state.n_past)
    return out
