"""Engine adapters: what differs between the engines shadowlab can drive.

An adapter knows how to locate and hash an engine and its model, how to build its
command line and environment, how to phrase a turn as an HTTP request and read the
answer back. It never starts processes or keeps state between cells: the runner
(``shadowlab/run/__init__.py`` with ``shadowlab/run/isolation.py``) does that, identically for
every engine.

Adapters register by ``kind`` (the matrix's ``engines.<name>.kind``)::

    adapter = get_adapter("reference")

The built-in kinds live in sibling modules and are imported on first use, so a
broken or missing optional engine never stops the others from working.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from shadowlab.results.files import sha256_file  # re-exported: the adapters' one file hash

__all__ = [
    "DEFAULT_LEVEL_FAMILIES",
    "MODEL_SOURCES",
    "EngineAdapter",
    "EngineAdapterBase",
    "EngineIdentity",
    "TurnRequest",
    "TurnResult",
    "UnknownEngineKind",
    "get_adapter",
    "known_kinds",
    "register",
    "unregister",
    "sha256_file",
    "token_ids",
]


@dataclass(frozen=True)
class EngineIdentity:
    """What exactly ran: recorded in every cell's meta.json under ``engine``."""

    kind: str
    binary_path: str
    binary_sha256: str
    version: str
    model_path: str
    model_sha256: str
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnRequest:
    """One turn as the runner hands it to an adapter.

    Exactly one of ``prompt_tokens`` (raw ``/completion``) and ``messages`` (chat) is set.
    """

    index: int
    prompt_id: str
    prompt_tokens: tuple[int, ...] | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class TurnResult:
    """What an engine answered to one turn, in engine-neutral terms.

    ``reused_tokens`` / ``processed_tokens`` are the engine's own API report
    (``timings.cache_n`` / ``timings.prompt_n`` for llama.cpp); None when the engine
    does not report them.
    """

    text: str
    tokens: tuple[int, ...]
    stop_type: str | None
    reused_tokens: int | None
    processed_tokens: int | None
    prompt_ms: float | None
    timings: Mapping[str, Any] = field(default_factory=dict)
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None  # per token: (id, logprob)
    # What the answer says it ran as (llama.cpp's `id_slot`, the reference engine's `id_task`):
    # claims, checked against the log where requests sent concurrently are tied to their tasks.
    slot: int | None = None
    task: int | None = None


# Families whose builds print their checkpoint lines at the default level: ik_llama.cpp has no
# `-lv` flag at all (it exits with `error: unknown argument: -lv`); older upstream builds print
# them at WRN/INF, where `-lv 4` would only add DBG noise to the log the parser reads.
DEFAULT_LEVEL_FAMILIES = ("ik_llama.cpp", "llama.cpp-legacy")
MODEL_SOURCES = ("preset", "path", "gguf")
READY_PROBE_TEXT = "shadowlab ready probe"


@runtime_checkable
class EngineAdapter(Protocol):
    """Everything that differs between engine kinds (docs/DESIGN.md §3)."""

    kind: str
    # The kind's facts, read by matrix validation before anything starts.
    log_family: str  # default logparse family; after prepare(): the family this engine is read with
    verbosity_flags: tuple[str, ...]  # default engines.<name>.verbosity_flags
    model_sources: tuple[str, ...]  # the model keys it loads: "preset" | "path" | "gguf"
    model_required: bool
    model_hint: str  # what to write instead of a model it cannot load
    default_context: int | None  # tokens of context without -c/--ctx-size; None: not known here
    tokenize_hint: str  # added to the reason when its /tokenize fails

    def presets(self) -> tuple[str, ...]:
        """Names a `preset` model may take; () when they are not checked before the run."""

    def default_verbosity(self, family: str) -> tuple[str, ...]:
        """verbosity_flags when the matrix gives none, for an engine read as `family`."""

    def prepare(self, spec: Any, cache_dir: Path) -> EngineIdentity:
        """Build or locate the binary and model; hash them."""

    def command(
        self, spec: Any, cell_flags: Sequence[str], port: int, threads: int, log_file: Path
    ) -> list[str]:
        """The engine's argv for one cell."""

    def env(self, spec: Any, cell_env: Mapping[str, str]) -> dict[str, str]:
        """Environment additions for one cell (the runner adds GPU and thread vars)."""

    def fault_flags(self, faults: Sequence[str]) -> list[str]:
        """Flags that inject `shadowlab run --fault` faults; [] when the kind has none."""

    def ready_probe(self, client: httpx.Client) -> None:
        """After /health 200: one real answer, or an exception saying why not."""

    def props(self, client: httpx.Client) -> dict[str, Any]:
        """The running engine's self-description (recorded in meta.json), {} if none."""

    def reported_device(self, props: Mapping[str, Any]) -> str | None:
        """The device the engine says it computes on, from its props; None if unknown."""

    def completion_request(self, turn: TurnRequest, generation: Any) -> tuple[str, dict]:
        """(path, json body) for one turn; generation has n_predict and temperature."""

    def parse_response(self, body: Mapping[str, Any]) -> TurnResult:
        """Read an answer back; the body is untrusted engine output."""

    def tokenize(self, client: httpx.Client, text: str) -> list[int]:
        """Token ids of text, as the running engine tokenizes it (no specials added)."""


MAX_TOP_LOGPROBS = 64  # candidates kept per token: more than any matrix asks (n_probs <= 20)


def top_logprobs(value: Any) -> tuple[tuple[tuple[int, float], ...], ...] | None:
    """llama.cpp's `completion_probabilities` (one entry per generated token, each with its
    `top_logprobs` list of {id, logprob}) as (id, logprob) pairs per token. Evidence only: an
    answer without it, or in another shape (older builds' `probs`), gives None, never an error;
    a candidate that is no id or no finite number is left out."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for entry in value:
        top = entry.get("top_logprobs") if isinstance(entry, dict) else None
        if not isinstance(top, list):
            return None
        pairs = []
        for c in top[:MAX_TOP_LOGPROBS]:
            tok, lp = (c.get("id"), c.get("logprob")) if isinstance(c, dict) else (None, None)
            if (isinstance(tok, int) and not isinstance(tok, bool) and tok >= 0 and isinstance(lp, (int, float))
                    and not isinstance(lp, bool) and math.isfinite(lp)):
                pairs.append((tok, float(lp)))
        out.append(tuple(pairs))
    return tuple(out)


class EngineAdapterBase:
    """Defaults for llama.cpp-shaped HTTP servers (the reference engine speaks the same API).

    Subclasses set ``kind`` and the kind's facts below, and implement ``prepare``, ``command``
    and usually ``env``.
    """

    kind: str = ""
    log_family: str = "none"
    verbosity_flags: tuple[str, ...] = ()
    model_sources: tuple[str, ...] = MODEL_SOURCES
    model_required: bool = True
    model_hint: str = ""
    default_context: int | None = None
    tokenize_hint: str = ""

    def presets(self) -> tuple[str, ...]:
        return ()

    def default_verbosity(self, family: str) -> tuple[str, ...]:
        return () if family in DEFAULT_LEVEL_FAMILIES else self.verbosity_flags

    def prepare(self, spec: Any, cache_dir: Path) -> EngineIdentity:
        raise NotImplementedError

    def command(
        self, spec: Any, cell_flags: Sequence[str], port: int, threads: int, log_file: Path
    ) -> list[str]:
        raise NotImplementedError

    def env(self, spec: Any, cell_env: Mapping[str, str]) -> dict[str, str]:
        return dict(getattr(spec, "env", None) or {}) | dict(cell_env)

    def fault_flags(self, faults: Sequence[str]) -> list[str]:
        return []

    def ready_probe(self, client: httpx.Client) -> None:
        if not self.tokenize(client, READY_PROBE_TEXT):
            raise ValueError("/tokenize returned no tokens")

    def completion_request(self, turn: TurnRequest, generation: Any) -> tuple[str, dict]:
        if turn.is_chat:
            body: dict[str, Any] = {
                "messages": [dict(m) for m in turn.messages or ()],
                "max_tokens": generation.n_predict,
                "temperature": generation.temperature,
            }
            path = "/v1/chat/completions"
        else:
            body = {
                "prompt": list(turn.prompt_tokens or ()),
                "n_predict": generation.n_predict,
                "temperature": generation.temperature,
                "cache_prompt": True,
                "return_tokens": True,
                # Streamed: the time to first token is then measured as such (run.py reads the
                # events back into this answer's usual body; shadowlab/run/streamed.py).
                "stream": True,
            }
            if getattr(generation, "n_probs", 0):  # top logprobs per token: a mismatch's evidence
                body["n_probs"] = generation.n_probs
            path = "/completion"
        body.update(turn.extra_body)
        return path, body

    def parse_response(self, body: Mapping[str, Any]) -> TurnResult:
        if "choices" in body:
            return _parse_chat(body)
        if not isinstance(body.get("content"), str):
            raise ValueError("no `content` text in the answer")
        timings = _mapping(body.get("timings"))
        return TurnResult(
            text=_text(body.get("content")),
            tokens=_int_tuple(body.get("tokens")),
            stop_type=_opt_str(body.get("stop_type")),
            reused_tokens=_opt_int(timings.get("cache_n")),
            processed_tokens=_opt_int(timings.get("prompt_n")),
            prompt_ms=_opt_float(timings.get("prompt_ms")),
            timings=timings,
            top_logprobs=top_logprobs(body.get("completion_probabilities")),
            slot=_opt_int(body.get("id_slot")),
            task=_opt_int(body.get("id_task")),
        )

    def tokenize(self, client: httpx.Client, text: str) -> list[int]:
        response = client.post("/tokenize", json={"content": text, "add_special": False})
        response.raise_for_status()
        body = response.json()
        return token_ids(body.get("tokens") if isinstance(body, dict) else None)

    def props(self, client: httpx.Client) -> dict[str, Any]:
        """The engine's self-description (``/props``), or {} when it has none."""
        response = client.get("/props")
        if response.status_code != 200:
            return {}
        body = response.json()
        return body if isinstance(body, dict) else {}

    def reported_device(self, props: Mapping[str, Any]) -> str | None:
        """The device the engine says it computes on, from its props; None if unknown."""
        device = props.get("device")
        return device if isinstance(device, str) else None


def _parse_chat(body: Mapping[str, Any]) -> TurnResult:
    choices = body.get("choices") or [{}]
    choice = _mapping(choices[0] if isinstance(choices, list) and choices else {})
    message = _mapping(choice.get("message"))
    usage = _mapping(body.get("usage"))
    details = _mapping(usage.get("prompt_tokens_details"))
    timings = _mapping(body.get("timings"))
    cached = _opt_int(details.get("cached_tokens"))
    prompt_tokens = _opt_int(usage.get("prompt_tokens"))
    processed = _opt_int(timings.get("prompt_n"))
    if processed is None and cached is not None and prompt_tokens is not None:
        processed = prompt_tokens - cached
    reused = _opt_int(timings.get("cache_n"))
    return TurnResult(
        text=_text(message.get("content")),
        tokens=_int_tuple(body.get("tokens") or choice.get("tokens")),
        stop_type=_opt_str(choice.get("finish_reason")),
        reused_tokens=reused if reused is not None else cached,
        processed_tokens=processed,
        prompt_ms=_opt_float(timings.get("prompt_ms")),
        timings=timings,
    )


# -- defensive readers: engine output is data, and may be malformed ----------------


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


MAX_TOKEN_ID = 2**31 - 1  # token ids are stored as int32 (prompts.tokens_sha256)


def _opt_int(value: Any) -> int | None:
    """A count the engine reported: a non-negative int, else None (engine output is untrusted)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _int_tuple(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKEN_ID)


def token_ids(value: Any) -> list[int]:
    """A /tokenize answer's ids; ValueError unless every one is a token id (0 .. 2^31-1)."""
    if not isinstance(value, list):
        raise ValueError("/tokenize answered without a token list")
    bad = [v for v in value if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKEN_ID)]
    if bad:
        raise ValueError(f"/tokenize answered {len(bad)} value(s) that are not token ids, e.g. {bad[0]!r:.40}")
    return list(value)


# -- registry -------------------------------------------------------------------------


class UnknownEngineKind(LookupError):
    pass


_BUILTIN_MODULES = {
    "reference": "shadowlab.engines.reference",
    "llama-server": "shadowlab.engines.llama_server",
    "openai": "shadowlab.engines.openai",
}


class _Registry:
    def __init__(self) -> None:
        self.factories: dict[str, Callable[[], EngineAdapter]] = {}


_registry = _Registry()


def register(kind: str, factory: Callable[[], EngineAdapter]) -> None:
    """Make ``kind`` available to matrices; a module calls this at import time."""
    _registry.factories[kind] = factory


def unregister(kind: str) -> None:
    """Forget a kind registered with `register` (a test's own kind, once the test is done)."""
    _registry.factories.pop(kind, None)


def known_kinds() -> list[str]:
    """The built-in kinds in their documented order, then the registered ones as registered."""
    return list(dict.fromkeys([*_BUILTIN_MODULES, *_registry.factories]))


def get_adapter(kind: str) -> EngineAdapter:
    if kind not in _registry.factories and kind in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[kind])
    try:
        factory = _registry.factories[kind]
    except KeyError:
        raise UnknownEngineKind(
            f"unknown engine kind {kind!r}; known: {', '.join(known_kinds())}"
        ) from None
    return factory()
