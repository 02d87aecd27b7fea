"""What the runner, the matrix and the judges ask of an engine kind (`EngineAdapter`, a Protocol)
and the data it answers in: `EngineIdentity`, `TurnRequest`, `TurnResult`, `LogFamily` (a log
family's patterns and facts; `NO_LOG`), `MalformedAnswer`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from shadowlab.errors import ShadowlabError


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


class StarterRefused(ShadowlabError):
    """`shadowlab init` cannot write a starter matrix for this kind with what it was given (exit 2)."""


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
    # `run --binary/--model` (and $SHADOWLAB_BINARY/$SHADOWLAB_MODEL) apply to its engines: a
    # build of its own (`binary:`) on a model file (`model: {path}`).
    build_override: bool
    binary_env: str | None  # the variable its own project's tests name the build with (where `binary: auto`)

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
