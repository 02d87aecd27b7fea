"""Engine adapters: what differs between the engines shadowlab can drive.

An adapter knows how to locate and hash an engine and its model, how to build its
command line and environment, how to phrase a turn as an HTTP request and read the
answer back. It never starts processes or keeps state between cells: the runner
(the ``shadowlab/run/`` package, with ``shadowlab/run/isolation.py`` and ``process_group.py``) does that, identically for
every engine.

Adapters register by ``kind`` (the matrix's ``engines.<name>.kind``)::

    adapter = get_adapter("reference")

The built-in kinds live in sibling packages (``engines/<kind>/``) and are imported on first
use, so a broken or missing optional engine never stops the others from working. Everything
kind-specific is asked of the adapter (docs/DESIGN.md §3): its flag grammar (`context_size`,
`batch_sizes`), how a split control is sent (`split_control`, `split_request_fields`,
`split_control_flags`), how a turn is asked and its answer read (`completion_request`,
`read_streamed`, `parse_response`), the variables its engine reads (`controlled_env`), its
faults (`faults`, `check_fault`) and the log family its engine writes (`LogFamily`: the
family's patterns and facts; the parsers themselves are `shadowlab.logs.parse`'s). Nothing
outside `engines/` names a kind, a family or a kind's flag (tests/shadowlab/test_layout_guards.py).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from shadowlab.results.files import sha256_file  # re-exported: the adapters' one file hash

__all__ = [
    "DEFAULT_LEVEL_FAMILIES",
    "MODEL_SOURCES",
    "NO_LOG",
    "EngineAdapter",
    "EngineAdapterBase",
    "EngineIdentity",
    "LogFamily",
    "MalformedAnswer",
    "TurnRequest",
    "TurnResult",
    "UnknownEngineKind",
    "UnknownLogFamily",
    "check_fault",
    "fault_names",
    "get_adapter",
    "known_families",
    "known_kinds",
    "log_family",
    "register",
    "register_family",
    "unregister",
    "unregister_family",
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

    Exactly one of ``prompt_tokens`` (raw ``/completion``) and ``messages`` (chat) is set. The
    rest is said in engine-neutral terms; the adapter phrases it in its kind's request fields
    (`request_fields`), ``extra_body`` last (a split control's fields, the adapter's own).
    """

    index: int
    prompt_id: str
    prompt_tokens: tuple[int, ...] | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    conversation: str | None = None  # the engines' affinity key (a traffic turn's conversation)
    slot: int | None = None  # the slot to pin the request to
    cache_prompt: bool = True  # False: no reuse (a replayed identity reference)
    # User-message delimiters (role, delimiter text) the engine places checkpoints at.
    message_delimiters: tuple[Mapping[str, str], ...] = ()

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


MODEL_SOURCES = ("preset", "path", "gguf")
READY_PROBE_TEXT = "shadowlab ready probe"


@dataclass(frozen=True)
class LogFamily:
    """A log format an engine writes (`engines.<name>.log_family`): its facts and the patterns
    the runner needs while a cell runs. Reading the log is the parser's (`shadowlab.logs.parse`,
    the family named by ``parser``); a family registers here with the kind that writes it.

    ``turn_end`` matches the line that closes a turn's log span (llama.cpp's `prompt eval time =`),
    ``task_id`` a line's task id (one group of digits); both bounded patterns over bytes, as the
    runner scans engine.log in chunks. None: the family has no such line (its spans are the bytes
    between requests) or its log is not read at all (``parser`` None)."""

    name: str
    parser: str | None  # the shadowlab.logs.parse family that reads it; None: the log is not read
    default_level: bool = False  # prints its checkpoint lines without a verbosity flag
    streams: bool = False  # its `/completion` streams llama-server's events (engines/streamed.py)
    turn_end: re.Pattern[bytes] | None = None
    task_id: re.Pattern[bytes] | None = None
    description: str = ""

    @property
    def read(self) -> bool:
        """Whether shadowlab reads this family's log at all (the cascade is seen only then)."""
        return self.parser is not None

    def parse(self, source: Any, extra_patterns: Sequence[Any] = ()) -> Any:
        """The whole log, parsed by the family's parser (shadowlab.logs.parse.parse)."""
        from shadowlab.logs import parse as logparse  # the C scanner loads only when a log is read

        if self.parser is None:
            raise ValueError(f"log family {self.name!r} is not read")
        return logparse.parse(source, self.parser, extra_patterns)


NO_LOG = LogFamily("none", None, default_level=True, description="the log is not read; the API is the only witness")


class MalformedAnswer(ValueError):
    """An answer the adapter cannot read in the kind's own format (a turn's record error)."""


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
        """The engine's argv for one cell; `cell_flags` are every flag the plan gives it (the
        engine's own, then the configuration's), to which the kind may add its own."""

    def env(self, spec: Any, cell_env: Mapping[str, str]) -> dict[str, str]:
        """Environment additions for one cell: `cell_env` is the plan's (the engine's env, then
        the configuration's), plus what the kind needs (the runner adds GPU and thread vars)."""

    def fault_flags(self, faults: Sequence[str]) -> list[str]:
        """Flags that inject `shadowlab run --fault` faults; [] when the kind has none."""

    def faults(self) -> tuple[str, ...]:
        """The fault names `--fault` may give this kind's engine; () when it has none."""

    def check_fault(self, text: str) -> None:
        """ValueError unless `text` is a fault (NAME[=VALUE]) this kind's engine takes."""

    controlled_env: tuple[str, ...]  # variables its engine reads: a cell sets them only in its delta
    split_control: str  # "points" | "requests" | "none": how a split control is sent (DESIGN §5)

    def context_size(self, args: Sequence[str]) -> tuple[int | None, str]:
        """(context tokens, where that comes from) for an engine started with `args`."""

    def batch_sizes(self, command: Sequence[str]) -> tuple[int, int]:
        """(batch, micro-batch) as the engine was started with `command`."""

    def split_request_fields(self, split_points: Sequence[int]) -> dict[str, Any]:
        """Body fields of a split control's (last) request."""

    def split_control_flags(self) -> tuple[str, ...]:
        """Flags appended to a split control cell's (none: ())."""

    def read_streamed(self, content_type: str | None, chunks: Iterable[bytes], body: Mapping[str, Any], *,
                      max_bytes: int, deadline: float) -> Any:
        """A streamed answer read back into its unstreamed body (engines/streamed.StreamedAnswer),
        or None when the answer is not a stream of the kind's; MalformedAnswer when unreadable."""

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
    controlled_env: tuple[str, ...] = ()
    split_control: str = "none"
    # llama.cpp's flag grammar (the reference engine takes the same): context, batch, micro-batch.
    context_flags: tuple[str, ...] = ("-c", "--ctx-size")
    batch_flags: tuple[tuple[str, str], ...] = (("-b", "b"), ("--batch-size", "b"), ("-ub", "ub"),
                                                ("--ubatch-size", "ub"))
    default_batch: tuple[int, int] = (2048, 512)  # -b / -ub when the command gives none

    def presets(self) -> tuple[str, ...]:
        return ()

    def default_verbosity(self, family: str) -> tuple[str, ...]:
        return () if log_family(family).default_level else self.verbosity_flags

    def family(self) -> LogFamily:
        """The log family this adapter's engine is read with (after prepare(): the matrix's)."""
        return log_family(self.log_family)

    def context_size(self, args: Sequence[str]) -> tuple[int | None, str]:
        """The last -c/--ctx-size of `args` (the command, the engine's flags and the
        configuration's, in the order the engine sees them), else the kind's default."""
        value = None
        long_form = next((f for f in self.context_flags if f.startswith("--")), None)
        for index, arg in enumerate(args):
            if arg in self.context_flags and index + 1 < len(args):
                value = f"{arg} {args[index + 1]}"
            elif long_form and arg.startswith(f"{long_form}="):
                value = arg.replace("=", " ", 1)
        if value is None:
            return self.default_context, f"the {self.kind} engine's default {self.default_context}"
        try:
            size = int(value.split(" ", 1)[1])
        except ValueError:
            return None, value  # not a number: the engine itself will refuse it
        return (size if size > 0 else None), value  # llama.cpp's -c 0: the model's own, unknown here

    def batch_sizes(self, command: Sequence[str]) -> tuple[int, int]:
        """(-b, -ub) as the engine was started (the last occurrence wins, as in llama-server)."""
        found, names = dict(zip(("b", "ub"), self.default_batch)), dict(self.batch_flags)
        for flag, value in zip(command, command[1:]):
            if flag in names and value.isdigit():
                found[names[flag]] = int(value)
        return found["b"], found["ub"]

    def split_request_fields(self, split_points: Sequence[int]) -> dict[str, Any]:
        return {}

    def split_control_flags(self) -> tuple[str, ...]:
        return ()

    def faults(self) -> tuple[str, ...]:
        return ()

    def check_fault(self, text: str) -> None:
        raise ValueError(f"engine kind {self.kind!r} takes no faults")

    def read_streamed(self, content_type: str | None, chunks: Iterable[bytes], body: Mapping[str, Any], *,
                      max_bytes: int, deadline: float) -> Any:
        from shadowlab.engines import streamed

        if not (self.family().streams and streamed.is_event_stream(content_type)):
            return None
        n_predict = body.get("n_predict", body.get("max_tokens"))
        try:
            return streamed.read(chunks, n_predict=n_predict if isinstance(n_predict, int) else None,
                                 max_bytes=max_bytes, deadline=deadline)
        except streamed.MalformedStream as exc:
            raise MalformedAnswer(str(exc)) from None

    def prepare(self, spec: Any, cache_dir: Path) -> EngineIdentity:
        raise NotImplementedError

    def command(
        self, spec: Any, cell_flags: Sequence[str], port: int, threads: int, log_file: Path
    ) -> list[str]:
        raise NotImplementedError

    def env(self, spec: Any, cell_env: Mapping[str, str]) -> dict[str, str]:
        return dict(cell_env)

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
            }
            if self.family().streams:
                # Streamed: the time to first token is then measured as such (read_streamed
                # reads the events back into this answer's usual body; engines/streamed.py).
                body["stream"] = True
            if getattr(generation, "n_probs", 0):  # top logprobs per token: a mismatch's evidence
                body["n_probs"] = generation.n_probs
            path = "/completion"
        body.update(request_fields(turn))
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


def request_fields(turn: TurnRequest) -> dict[str, Any]:
    """A turn's engine-neutral asks as llama.cpp's request fields (the reference engine and the
    OpenAI-compatible servers it is sent to read the same): only those the turn sets."""
    out: dict[str, Any] = {}
    if turn.conversation is not None:
        out["prompt_cache_key"] = turn.conversation  # the engines' affinity field
    if turn.slot is not None:
        out["id_slot"] = turn.slot
    if not turn.cache_prompt:
        out["cache_prompt"] = False
    if turn.message_delimiters:
        out["message_delimiters"] = [dict(d) for d in turn.message_delimiters]
    return out


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


# The families the built-in kinds write, and the package that registers each.
_BUILTIN_FAMILIES = {
    "llama.cpp": "shadowlab.engines.llama_server",
    "llama.cpp-legacy": "shadowlab.engines.llama_server",
    "ik_llama.cpp": "shadowlab.engines.llama_server",
    "reference": "shadowlab.engines.reference",
}


class _Registry:
    def __init__(self) -> None:
        self.factories: dict[str, Callable[[], EngineAdapter]] = {}
        self.families: dict[str, LogFamily] = {NO_LOG.name: NO_LOG}


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


class UnknownLogFamily(LookupError):
    pass


def register_family(family: LogFamily) -> None:
    """Make a log family available to matrices (`engines.<name>.log_family`); the package of
    the kind that writes it calls this at import time."""
    _registry.families[family.name] = family


def unregister_family(name: str) -> None:
    """Forget a family registered with `register_family` (a test's own, once the test is done)."""
    if name != NO_LOG.name:
        _registry.families.pop(name, None)


def known_families() -> list[str]:
    """The built-in families in their documented order, `none`, then the registered ones."""
    return list(dict.fromkeys([*_BUILTIN_FAMILIES, NO_LOG.name, *_registry.families]))


def log_family(name: str) -> LogFamily:
    if name not in _registry.families and name in _BUILTIN_FAMILIES:
        importlib.import_module(_BUILTIN_FAMILIES[name])
    try:
        return _registry.families[name]
    except KeyError:
        raise UnknownLogFamily(f"unknown log family {name!r}; known: {', '.join(known_families())}") from None


def fault_names() -> tuple[str, ...]:
    """Every fault some engine kind takes (`shadowlab run --fault`), in kind order."""
    names: list[str] = []
    for kind in known_kinds():
        with contextlib.suppress(ImportError):  # a broken kind offers no faults
            names += get_adapter(kind).faults()
    return tuple(dict.fromkeys(names))


def check_fault(text: str) -> None:
    """ValueError unless some engine kind takes the fault `text`; its kinds' own reasons when none does."""
    reasons = []
    for kind in known_kinds():
        with contextlib.suppress(ImportError):  # a broken kind offers no faults
            adapter = get_adapter(kind)
            if not adapter.faults():
                continue
            try:
                adapter.check_fault(text)
                return
            except ValueError as exc:
                reasons.append(str(exc))
    if reasons:
        raise ValueError("; ".join(reasons))
    # No kind with faults is installed: its cells report that when they start.


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_LEVEL_FAMILIES":
        # The built-in families printing at the default level, by name (docs/matrix.md names them).
        return tuple(sorted(f for f in _BUILTIN_FAMILIES if log_family(f).default_level))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
