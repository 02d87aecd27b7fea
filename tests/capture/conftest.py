"""Real parts for `shadowlab capture`'s tests: the capture command as its own process, Debian's
nginx mirroring to it, llama-server (tests/llama/conftest.py's fixtures), and a seeded client
that holds several chat conversations (streamed and not) and raw `/completion` jobs.

Processes run on leased loopback ports in their own process groups, are waited for under a
deadline (never a fixed sleep) and stopped at the end of each test.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from llama.conftest import BANNED, LlamaServer, llama, llama_binary, model_cache, tiny_gguf  # noqa: F401
from shadowlab.run import isolation
from shadowlab.capture import mirror

READY_S = 60.0


def wait_until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"{what} not within {timeout_s} s")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop_group(proc: subprocess.Popen | None) -> None:
    """SIGTERM to the process group (after SIGCONT: a test may have stopped it), SIGKILL after 30 s."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Capture:
    """`python -m shadowlab capture ...` as a process; `with` starts it and stops it (SIGTERM)."""

    def __init__(self, out: Path, *options: str) -> None:
        self.out, self.options = out, list(options)
        self.lease = isolation.lease_port()
        self.port = self.lease.port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Capture:
        argv = [sys.executable, "-m", "shadowlab", "capture", "--listen", f"127.0.0.1:{self.port}",
                "--out", str(self.out), *self.options]
        self.log = open(self.out.parent / f"{self.out.name}.log", "ab")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: listening(self.port) and self.recorder_ready(), READY_S, "capture listening")
        return self

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.out / "capture.json").read_text())
        except (OSError, ValueError):
            return {}

    def recorder(self) -> dict[str, Any]:
        try:
            return json.loads((self.out / "recorder.json").read_text())
        except (OSError, ValueError):
            return {}

    def recorder_ready(self) -> bool:
        pid = self.status().get("recorder_pid")
        return pid is not None and self.recorder().get("pid") == pid

    def __exit__(self, *exc: Any) -> None:
        stop_group(self.proc)
        self.log.close()
        self.lease.release()

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for piece in sorted(self.out.glob("trace-*.jsonl")):
            out += [json.loads(line) for line in piece.read_text().splitlines()]
        return out

    def trace(self, path: Path) -> Path:
        """The pieces concatenated in order (what `cat DIR/trace-*.jsonl` gives)."""
        path.write_bytes(b"".join(p.read_bytes() for p in sorted(self.out.glob("trace-*.jsonl"))))
        return path


@pytest.fixture(scope="session")
def nginx_binary() -> Path:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is required in CI (.ci/run installs Debian's package)")
        pytest.skip("nginx not installed (apt-get install nginx)")
    return Path(found)


class Nginx:
    """Debian's nginx with shadowlab's mirror configuration (mirror.nginx_config), in `prefix`."""

    def __init__(self, binary: Path, prefix: Path, primary: int, capture: int) -> None:
        self.binary, self.prefix = binary, prefix
        self.lease = isolation.lease_port()
        self.port = self.lease.port
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "nginx.conf").write_text(mirror.nginx_config(f"127.0.0.1:{self.port}", f"127.0.0.1:{primary}",
                                                               f"127.0.0.1:{capture}"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Nginx:
        self.log = open(self.prefix / "nginx.log", "ab")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([str(self.binary), "-p", str(self.prefix), "-c", "nginx.conf"],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: listening(self.port) or self.proc.poll() is not None, READY_S, "nginx listening")
        if self.proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(self.prefix / 'nginx.log').read_text()[-2000:]}")
        return self

    def __exit__(self, *exc: Any) -> None:
        stop_group(self.proc)
        self.log.close()
        self.lease.release()


# --------------------------------------------------------------------------- the seeded client

WORDS = ("cache", "slot", "turn", "prefix", "state", "token", "model", "batch", "queue", "reuse", "layer",
         "delta", "window", "entry", "budget", "trace", "shadow", "engine", "answer", "prompt")
KEYS = ("user", "prompt_cache_key", "header")
HEADER = "X-Conversation"


@dataclass
class Sent:
    """One request as the client sent it, and what came back."""

    conversation: str | None
    endpoint: str  # "chat" | "completion"
    body: dict[str, Any]
    headers: dict[str, str]
    status: int = 0
    answer: str = ""
    reported_reuse: int | None = None
    prompt_tokens: int | None = None
    events: int = 0  # streamed answers: how many data events
    raw: bytes = b""


@dataclass
class Conversation:
    name: str
    key_kind: str
    messages: list[dict[str, str]] = field(default_factory=list)
    turns_left: int = 0


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class SeededChat:
    """Seeded traffic: `conversations` chat conversations of `turns` turns each, live two or three
    at a time, each turn the conversation's messages so far (answers as they came back) plus a new
    user message; a few raw `/completion` jobs in between (no conversation key). Every other
    request streams. Each conversation names itself by one of `user`, `prompt_cache_key` or the
    X-Conversation header."""

    def __init__(self, seed: int, conversations: int = 4, turns: int = 4, jobs: int = 3, max_tokens: int = 8) -> None:
        rng = random.Random(f"capture-client:{seed}")
        self.rng, self.max_tokens = rng, max_tokens
        shared_system = _words(rng, 60)
        self.pending = [Conversation(f"conv-{seed}-{i}", KEYS[i % len(KEYS)], turns_left=turns)
                        for i in range(conversations)]
        for i, c in enumerate(self.pending):  # two conversations share their system prompt
            c.messages = [{"role": "system", "content": shared_system if i < 2 else _words(rng, 40 + 10 * i)}]
        self.live: list[Conversation] = []
        self.jobs_left = jobs
        self.count = 0

    def requests(self) -> Iterator[Sent]:
        while self.pending or self.live:
            while self.pending and len(self.live) < 2 + self.count % 2:
                self.live.append(self.pending.pop(0))
            if self.jobs_left and self.rng.random() < 0.15:
                self.jobs_left -= 1
                yield self._job()
                continue
            conv = self.rng.choice(self.live)
            sent = self._turn(conv)
            yield sent
            conv.messages.append({"role": "assistant", "content": sent.answer})
            conv.turns_left -= 1
            if not conv.turns_left:
                self.live.remove(conv)

    def _turn(self, conv: Conversation) -> Sent:
        self.count += 1
        conv.messages.append({"role": "user", "content": _words(self.rng, self.rng.randint(15, 40))})
        body: dict[str, Any] = {"messages": list(conv.messages), "max_tokens": self.max_tokens, "temperature": 0,
                                "logit_bias": BANNED, "stream": self.count % 2 == 0}
        headers = {}
        if conv.key_kind == "header":
            headers[HEADER] = conv.name
        else:
            body[conv.key_kind] = conv.name
        return Sent(conv.name, "chat", body, headers)

    def _job(self) -> Sent:
        self.count += 1
        body = {"prompt": _words(self.rng, self.rng.randint(30, 80)), "n_predict": 4, "temperature": 0,
                "logit_bias": BANNED, "stream": self.count % 2 == 0}
        return Sent(None, "completion", body, {})


def send(client: httpx.Client, sent: Sent) -> Sent:
    """Send one request, streamed or not, and fill in what came back."""
    path = "/v1/chat/completions" if sent.endpoint == "chat" else "/completion"
    if sent.body.get("stream"):
        with client.stream("POST", path, json=sent.body, headers=sent.headers) as response:
            sent.status = response.status_code
            sent.raw = b"".join(response.iter_raw())
        events = [json.loads(line[5:]) for line in sent.raw.split(b"\n") if line.startswith(b"data: {")]
        sent.events = len(events)
        sent.answer = "".join(_piece(e) for e in events)
        last = next((e for e in reversed(events) if "timings" in e), {})
    else:
        response = client.post(path, json=sent.body, headers=sent.headers)
        sent.status, sent.raw = response.status_code, response.content
        last = response.json()
        sent.answer = last["choices"][0]["message"]["content"] if sent.endpoint == "chat" else last["content"]
    timings = last.get("timings", {})
    sent.reported_reuse = timings.get("cache_n")
    sent.prompt_tokens = (timings["cache_n"] + timings["prompt_n"]) if "prompt_n" in timings else None
    return sent


def _piece(event: dict[str, Any]) -> str:
    if "choices" in event:
        return "".join((c.get("delta") or {}).get("content") or "" for c in event["choices"])
    return event.get("content", "")
