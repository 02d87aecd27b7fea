"""The loaded matrix: frozen dataclasses, built by `validate.load` and read by every stage."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadowlab.matrix.dump import matrix_to_dict
from shadowlab.matrix.schema import default
from shadowlab.matrix.traffic_kind import TraceSource, traffic_prompt_id
from shadowlab.traffic import Request as TrafficRequest
from shadowlab.traffic import TrafficShape


@dataclass(frozen=True)
class ModelSpec:
    """Where an engine's model comes from: generated (`preset`, `gguf`) or an existing `path`."""

    source: str  # "preset" | "path" | "gguf"
    preset: str | None = None
    seed: int | None = None
    path: Path | None = None


@dataclass(frozen=True)
class EngineSpec:
    name: str
    kind: str
    model: ModelSpec | None
    binary: str  # "auto" or a resolved path
    command: tuple[str, ...] | None
    flags: tuple[str, ...]
    env: Mapping[str, str]
    threads: int
    ready_timeout_s: float
    log_family: str
    log_patterns: tuple[str, ...]
    verbosity_flags: tuple[str, ...]


@dataclass(frozen=True)
class ConfigurationSpec:
    name: str
    flags: tuple[str, ...] = default("configuration", "flags")
    env: Mapping[str, str] = field(default_factory=lambda: dict(default("configuration", "env")))
    description: str = default("configuration", "description")
    pin_slots: int = default("configuration", "pin_slots")  # traffic: id_slot per conversation
    message_delimiters: bool = default("configuration", "message_delimiters")  # traffic: chat checkpoints


@dataclass(frozen=True, kw_only=True)
class PromptSpec:
    """Common part of every prompt. `length` is the exact token count, None for chat."""

    id: str
    kind: str
    endpoint: str  # omitted in the matrix: schema.default_endpoint(kind)
    message_delimiters: bool = default("prompt", "message_delimiters")
    description: str = default("prompt", "description")

    @property
    def length(self) -> int | None:
        return None

    def depends_on(self) -> tuple[str, ...]:
        """Prompts that must be materialized before this one."""
        return ()


@dataclass(frozen=True, kw_only=True)
class RandomPrompt(PromptSpec):
    tokens: int
    seed: int

    @property
    def length(self) -> int:
        return self.tokens


@dataclass(frozen=True, kw_only=True)
class DivergePrompt(PromptSpec):
    """source[:shared] followed by new tokens; token `shared` differs from the source's."""

    source: str
    shared: int
    tokens: int
    seed: int

    @property
    def length(self) -> int:
        return self.tokens

    def depends_on(self) -> tuple[str, ...]:
        return (self.source,)


@dataclass(frozen=True, kw_only=True)
class UnrelatedPrompt(PromptSpec):
    """Fresh tokens whose first token differs from the first token of every `unrelated_to`."""

    tokens: int
    seed: int
    unrelated_to: tuple[str, ...]

    @property
    def length(self) -> int:
        return self.tokens

    def depends_on(self) -> tuple[str, ...]:
        return self.unrelated_to


@dataclass(frozen=True, kw_only=True)
class AppendPrompt(PromptSpec):
    """All of `source`, then `extra` new tokens."""

    source: str
    extra: int
    seed: int
    source_length: int

    @property
    def length(self) -> int:
        return self.source_length + self.extra

    def depends_on(self) -> tuple[str, ...]:
        return (self.source,)


@dataclass(frozen=True)
class ChatMessage:
    """One message; `from_turn` set means: the warm cell's reply to that turn (0-based)."""

    role: str
    content: str | None = None
    from_turn: int | None = None


@dataclass(frozen=True, kw_only=True)
class ChatPrompt(PromptSpec):
    messages: tuple[ChatMessage, ...]

    def reply_turns(self) -> tuple[int, ...]:
        return tuple(m.from_turn for m in self.messages if m.from_turn is not None)


TOKEN_PROMPTS = (RandomPrompt, DivergePrompt, UnrelatedPrompt, AppendPrompt)


@dataclass(frozen=True)
class SequenceSpec:
    """The turns of one warm cell and the conversation each belongs to.

    `ordered` (the only kind today): `prompts` in order, all in one conversation named like the
    sequence. A kind that interleaves conversations on one server (issue 12's `traffic`) gives
    other answers to `conversation`; cells, turns and records stay keyed by turn index.
    """

    name: str
    prompts: tuple[str, ...]
    kind: str = default("sequence", "kind")

    def conversation(self, index: int) -> str | None:
        """The conversation turn `index` belongs to (None: an interloper, no conversation)."""
        return self.name


@dataclass(frozen=True)
class TrafficSequence(SequenceSpec):
    """Conversations and interlopers interleaved on one server (kind `traffic`): the requests are
    generated at load (`traffic_kind`), turn i is prompt id `<name>-t<iiii>`, not a matrix prompt."""

    source: TrafficShape | TraceSource | None = None
    requests: tuple[TrafficRequest, ...] = ()  # shadowlab.traffic.Request, in arrival order
    reference: str = default("sequence.traffic", "reference")
    description: str = ""
    in_flight: int = default("sequence.traffic", "in_flight")

    def conversation(self, index: int) -> str | None:
        return self.requests[index].conversation

    def request(self, prompt_id: str) -> TrafficRequest | None:
        """The request a prompt id of this sequence names (None: not one of its turns)."""
        head, _, number = prompt_id.rpartition("-t")
        if head != self.name or not number.isdigit() or int(number) >= len(self.requests):
            return None
        return self.requests[int(number)]


__all__ = ["traffic_prompt_id"]  # re-exported for the loader


@dataclass(frozen=True)
class Selection:
    """Engine × configuration × sequence names or `*` globs."""

    engine: str = default("selection", "engine")
    configuration: str = default("selection", "configuration")
    sequence: str = default("selection", "sequence")

    def matches(self, engine: str, configuration: str, sequence: str) -> bool:
        return (
            fnmatch.fnmatchcase(engine, self.engine)
            and fnmatch.fnmatchcase(configuration, self.configuration)
            and fnmatch.fnmatchcase(sequence, self.sequence)
        )


@dataclass(frozen=True)
class CellsSpec:
    include: tuple[Selection, ...] = tuple(Selection(**s) for s in default("cells", "include"))
    exclude: tuple[Selection, ...] = tuple(Selection(**s) for s in default("cells", "exclude"))


@dataclass(frozen=True)
class Generation:
    n_predict: int = default("generation", "n_predict")
    temperature: float = default("generation", "temperature")
    allow_sampling: bool = default("generation", "allow_sampling")
    ignore_eos: bool = default("generation", "ignore_eos")
    n_probs: int = default("generation", "n_probs")


@dataclass(frozen=True)
class Isolation:
    cores_per_cell: int = default("isolation", "cores_per_cell")
    gpu: int | tuple[int, ...] | None = default("isolation", "gpu")  # None: every GPU hidden
    gpus_per_cell: int = default("isolation", "gpus_per_cell")
    keep_scratch: bool = default("isolation", "keep_scratch")
    jobs: int = default("isolation", "jobs")
    max_log_mib: int = default("isolation", "max_log_mib")  # a log beyond it fails its cell (a flood)

    @property
    def devices(self) -> tuple[int, ...] | None:
        """The device pool cells lease from (None: no GPU): `gpu` as a tuple."""
        return (self.gpu,) if isinstance(self.gpu, int) else self.gpu


@dataclass(frozen=True)
class Identity:
    required: bool = default("identity", "required")
    control: bool = default("identity", "control")
    split_controls: str = default("identity", "split_controls")
    split_sensitivity: str | tuple[str, ...] = default("identity", "split_sensitivity")

    def allows_split_sensitivity(self, engine: str) -> bool:
        allowed = self.split_sensitivity
        return allowed == "allow" or (isinstance(allowed, tuple) and engine in allowed)


@dataclass(frozen=True)
class Expectation:
    """Checks on one turn (or every turn) of the selected warm cells. Unset checks are None."""

    selection: Selection
    turn: int | str | None = None
    outcome: tuple[str, ...] | None = None
    min_reused: int | None = None
    min_saved_fraction: float | None = None
    max_forced: int | None = None
    checkpoints_created_at: tuple[int, ...] | None = None
    identity: bool | None = None
    cascade: bool | None = None
    min_recovered_share: float | None = None
    description: str = default("expectation", "description")
    line: int | None = field(default=None, compare=False)  # where it is written, for reports


@dataclass(frozen=True)
class Budget:
    """Costs the selected configurations may have against the matrix's `baseline`, and the net
    benefit they must bring, per sequence (gate checks: shadowlab/judge/budgets.py). Unset: no check."""

    selection: Selection
    max_created_per_turn: float | None = None
    max_checkpoint_mib_per_turn: float | None = None
    max_checkpoint_ms_per_turn: float | None = None
    min_net_benefit_ms: float | None = None
    description: str = default("budget", "description")
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Scale:
    """The production scale a tiny-model run's costs are extrapolated to (shadowlab/judge/budgets.py).
    An explicit per-checkpoint figure wins over a factor on the measured one; unset: measured."""

    name: str = default("scale", "name")
    checkpoint_mib: float | None = None
    checkpoint_ms: float | None = None
    checkpoint_mib_factor: float | None = None
    checkpoint_ms_factor: float | None = None
    prompt_length_factor: float = default("scale", "prompt_length_factor")
    prefill_ms_per_token: float | None = None


@dataclass(frozen=True)
class Matrix:
    path: Path
    version: int
    name: str
    description: str
    engines: Mapping[str, EngineSpec]
    configurations: Mapping[str, ConfigurationSpec]
    prompts: Mapping[str, PromptSpec]
    sequences: Mapping[str, SequenceSpec]
    cells: CellsSpec
    generation: Generation
    isolation: Isolation
    identity: Identity
    expectations: tuple[Expectation, ...]
    baseline: str | None = None  # the configuration the others are candidates against
    budgets: tuple[Budget, ...] = ()
    scale: Scale | None = None
    repeat: int = default("matrix", "repeat")  # warm cells run this many times, in fresh processes
    # Lines of the keys that checks made after loading point at (`check_machine`).
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def selected(self) -> list[tuple[str, str, str]]:
        """(engine, configuration, sequence) of every warm cell, in matrix order."""
        return [
            combo
            for combo in self._all_combinations()
            if any(s.matches(*combo) for s in self.cells.include)
            and not any(s.matches(*combo) for s in self.cells.exclude)
        ]

    def _all_combinations(self) -> Iterator[tuple[str, str, str]]:
        for engine in self.engines:
            for configuration in self.configurations:
                for sequence in self.sequences:
                    yield engine, configuration, sequence

    def to_dict(self) -> dict[str, Any]:
        """The matrix as YAML-ready data with every default filled in; `load` reads it back."""
        return matrix_to_dict(self)
