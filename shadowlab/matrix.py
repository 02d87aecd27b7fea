"""The matrix file: what to run, loaded and validated before anything starts.

`load(path)` reads a YAML matrix and returns a frozen `Matrix`, or raises one `MatrixError`
naming the file, the line, the key path and, where it helps, a hint. The schema below
(`SCHEMA`) is the single source of truth for the keys: validation rejects any key it does not
list, and docs/matrix.md's reference section is generated from it (see `reference_markdown`).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import shutil
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import yaml

from shadowlab.errors import MatrixError
from shadowlab.records import FileRefused, read_regular_file

MATRIX_VERSION = 1

ENGINE_KINDS = ("reference", "llama-server", "openai")
LOG_FAMILIES = ("reference", "llama.cpp", "llama.cpp-legacy", "ik_llama.cpp", "none")
PROMPT_KINDS = ("random", "diverge", "unrelated", "append", "chat")
ENDPOINTS = ("completion", "chat")
OUTCOMES = ("cold", "extended", "restored", "forced", "silent_reset", "error")
CHAT_ROLES = ("system", "user", "assistant", "tool")
COMMAND_PLACEHOLDERS = ("binary", "model", "port", "threads", "host", "log_file")

_DEFAULT_LOG_FAMILY = {"reference": "reference", "llama-server": "llama.cpp", "openai": "none"}
_DEFAULT_VERBOSITY = {"reference": ("-lv", "4"), "llama-server": ("-lv", "4"), "openai": ()}
# Families that print their checkpoint lines at the default level. ik_llama.cpp has no `-lv`
# flag at all (it exits with `error: unknown argument: -lv`); older upstream builds print them
# at WRN/INF, where `-lv 4` would only add DBG noise to the log the parser reads.
_DEFAULT_LEVEL_FAMILIES = ("ik_llama.cpp", "llama.cpp-legacy")
# Names become parts of cell ids and directory names: no dots (the id separator), no slashes.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z")
# A cell id joins at most four names, four dots and `control` (`e.c.control.s.p`): names of 48
# characters make 203 bytes, well within the 255 a directory name may have.
MAX_NAME_CHARS = 48
# Caps that keep loading and running bounded whatever the file says. The matrix file is read
# whole before parsing (the shipped ones are a few KiB); a prompt is built in memory as text
# and token ids before it is sent; free text is copied into every report.
MAX_MATRIX_BYTES = 1 << 20
MAX_PROMPT_TOKENS = 1 << 20
MAX_TEXT_CHARS = 4096
_MAX_INT = (1 << 63) - 1  # every integer must fit an engine's int64
# The context an engine kind has without -c/--ctx-size (reference: shadowlab_engine.cli's
# default; llama-server's depends on the build and the model, so it is not known here).
DEFAULT_CONTEXT = {"reference": 8192}
_CTX_FLAGS = ("-c", "--ctx-size")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# --------------------------------------------------------------------------------------------
# Schema: every key a matrix may hold, with its type, default and meaning.


class _Required:
    def __repr__(self) -> str:
        return "required"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    default: Any
    doc: str

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Section:
    title: str  # where the keys live, as a key path pattern
    keys: tuple[Key, ...]
    doc: str = ""

    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)


_PROMPT_COMMON = (
    Key("kind", "random | diverge | unrelated | append | chat", REQUIRED, "How the prompt is built."),
    Key("endpoint", "completion | chat", "completion (chat for kind chat)",
        "`completion`: token ids to `/completion`; `chat`: messages to `/v1/chat/completions`."),
    Key("message_delimiters", "bool", False,
        "Send llama.cpp's `message_delimiters` with a `/completion` request (completion only)."),
    Key("description", "str", "", "Free text shown in the plan and report."),
)

SCHEMA: dict[str, Section] = {
    "matrix": Section("(top level)", (
        Key("version", "int", REQUIRED, f"Matrix format version; this shadowlab reads {MATRIX_VERSION}."),
        Key("name", "name", REQUIRED, "Short name of the experiment: the run directory is "
            "`reports/<name>-<UTC time>`, so letters, digits, `_`, `-`, at most 48 characters."),
        Key("description", "str", "", "Free text shown in the report (at most 4096 characters)."),
        Key("engines", "map name → engine", REQUIRED, "The engines under test (at least one)."),
        Key("configurations", "map name → configuration", "{default: {}}",
            "Named flag/env deltas applied on top of each engine's."),
        Key("prompts", "map id → prompt", REQUIRED, "Prompts, exact in tokens."),
        Key("sequences", "map name → list of prompt ids", REQUIRED,
            "Turns sent, in order, to one fresh engine process."),
        Key("cells", "cells", "all configurations × sequences", "Which combinations run."),
        Key("generation", "generation", "see below", "Decoding settings for every turn."),
        Key("isolation", "isolation", "see below", "Per-cell resources."),
        Key("identity", "identity", "see below", "Byte-identity checks against cold runs."),
        Key("expectations", "list of expectation", "[]", "Checks the gate enforces."),
    )),
    "engine": Section("engines.<name>", (
        Key("kind", "reference | llama-server | openai", REQUIRED, "Which adapter drives the engine."),
        Key("model", "model", "required unless kind openai", "The model the engine loads."),
        Key("binary", "path | auto", "auto",
            "The engine executable: `auto` lets the adapter find it; a path (relative to the matrix "
            "file) or a bare name on PATH must exist."),
        Key("command", "list of str", "the adapter's",
            "Command template; placeholders " + ", ".join("`{%s}`" % p for p in COMMAND_PLACEHOLDERS)
            + ". Must use `{port}`."),
        Key("flags", "list of str", "[]", "Flags every cell of this engine gets."),
        Key("env", "map str → str", "{}", "Environment every cell of this engine gets."),
        Key("threads", "int", "isolation.cores_per_cell", "Engine threads (at most the cell's cores)."),
        Key("ready_timeout_s", "number", 60, "Seconds to wait for `/health` 200 and a first answer."),
        Key("log_family", "|".join(LOG_FAMILIES), "by kind: reference, llama.cpp, none",
            "Log format the checkpoint parser expects."),
        Key("log_patterns", "list of regex", "[]", "Extra parser patterns for another fork (must compile)."),
        Key("verbosity_flags", "list of str", "by kind: [-lv, 4] or []",
            "Flags that make the engine print checkpoint lines. Default `[]` for log_family "
            "ik_llama.cpp (no `-lv` flag) and llama.cpp-legacy (lines at WRN/INF)."),
    )),
    "model": Section("engines.<name>.model", (
        Key("preset", "str", None, "Reference-engine preset (generated on demand), with `seed`."),
        Key("seed", "int", 0, "Seed of the generated weights."),
        Key("path", "path", None, "An existing regular model file (relative to the matrix file)."),
        Key("gguf", "{preset, seed}", None, "A generated GGUF model (for llama-server)."),
    ), "Exactly one of `preset`, `path`, `gguf`."),
    "gguf": Section("engines.<name>.model.gguf", (
        Key("preset", "str", REQUIRED, "GGUF generator preset."),
        Key("seed", "int", 0, "Seed of the generated weights."),
    )),
    "configuration": Section("configurations.<name>", (
        Key("flags", "list of str", "[]", "Flags appended to the engine's."),
        Key("env", "map str → str", "{}", "Environment merged over the engine's."),
        Key("description", "str", "", "Free text shown in the plan and report."),
    )),
    "prompt.random": Section("prompts.<id> (kind: random)", _PROMPT_COMMON + (
        Key("tokens", "int", REQUIRED, "Exact length in tokens (at most 2^20; with n_predict it must "
            "fit the engine's context)."),
        Key("seed", "int", REQUIRED, "Seed of the generated text."),
    )),
    "prompt.diverge": Section("prompts.<id> (kind: diverge)", _PROMPT_COMMON + (
        Key("from", "prompt id", REQUIRED, "Source prompt P."),
        Key("shared", "int", REQUIRED, "K: tokens shared with P; token K differs (1 ≤ K < len(P), K < tokens)."),
        Key("tokens", "int", REQUIRED, "Exact total length."),
        Key("seed", "int", REQUIRED, "Seed of the new text after the divergence point."),
    )),
    "prompt.unrelated": Section("prompts.<id> (kind: unrelated)", _PROMPT_COMMON + (
        Key("tokens", "int", REQUIRED, "Exact length in tokens."),
        Key("seed", "int", REQUIRED, "Seed of the generated text."),
        Key("unrelated_to", "list of prompt ids", "earlier random and unrelated prompts",
            "Prompts it must share no prefix with (its first token differs from each one's)."),
    )),
    "prompt.append": Section("prompts.<id> (kind: append)", _PROMPT_COMMON + (
        Key("from", "prompt id", REQUIRED, "Source prompt P; the result starts with all of P."),
        Key("extra", "int", REQUIRED, "Tokens appended after P (≥ 1)."),
        Key("seed", "int", REQUIRED, "Seed of the appended text."),
    )),
    "prompt.chat": Section("prompts.<id> (kind: chat)", _PROMPT_COMMON + (
        Key("messages", "list of message", REQUIRED, "The conversation sent on this turn."),
    )),
    "message": Section("prompts.<id>.messages[i]", (
        Key("role", "|".join(CHAT_ROLES), REQUIRED, "Message role."),
        Key("content", "str | {from_turn: i}", REQUIRED,
            "Text, or `{from_turn: i}` (assistant only): the warm cell's reply to turn i "
            "(0-based, an earlier turn of the same sequence)."),
    )),
    "cells": Section("cells", (
        Key("include", "list of selection", "[{}] (everything)", "Combinations to run."),
        Key("exclude", "list of selection", "[]", "Combinations removed from the included ones."),
    ), "Warm cells are engine × configuration × sequence combinations."),
    "selection": Section("cells.include[i], cells.exclude[i]", (
        Key("engine", "glob", "*", "Engine name or `*` pattern."),
        Key("configuration", "glob", "*", "Configuration name or `*` pattern."),
        Key("sequence", "glob", "*", "Sequence name or `*` pattern."),
    )),
    "generation": Section("generation", (
        Key("n_predict", "int", 16, "Tokens generated per turn; with each prompt it must fit the context."),
        Key("temperature", "number", 0.0, "Must be ≤ 0 (greedy) unless `allow_sampling`."),
        Key("allow_sampling", "bool", False, "Accept temperature > 0 (identity checks become meaningless)."),
        Key("ignore_eos", "bool", False, "Keep generating past end-of-sequence."),
    )),
    "isolation": Section("isolation", (
        Key("cores_per_cell", "int", 1, "Dedicated CPU cores per running cell (at most the machine's)."),
        Key("gpu", "none | int", "none", "`none` hides every GPU; an index gives that device."),
        Key("keep_scratch", "bool", False, "Keep each cell's scratch directory after it ends."),
        Key("jobs", "int", 1, "Cells run at once (bounded by the free cores)."),
        Key("max_log_mib", "int", 1024, "Cap on each engine's engine.log (MiB): an engine whose log "
            "reaches it is stopped from writing more and its cell fails (infrastructure)."),
    )),
    "identity": Section("identity", (
        Key("required", "bool", True, "A warm turn whose output differs from its cold run fails the gate."),
        Key("control", "bool", True, "Plan one cold-vs-cold control cell per engine × configuration."),
    )),
    "expectation": Section("expectations[i]", (
        Key("engine", "glob", "*", "Which cells: engine name or pattern."),
        Key("configuration", "glob", "*", "Which cells: configuration name or pattern."),
        Key("sequence", "glob", "*", "Which cells: sequence name or pattern."),
        Key("turn", "int | prompt id", "every turn",
            "The turn checked: 0-based index or the prompt id; omitted: every turn of the cell "
            "(the first one is `cold`), and `max_forced` counts over them."),
        Key("description", "str", "", "Why this is expected (shown in the report)."),
        Key("outcome", "outcome | list of outcomes", None, "Allowed outcomes: " + ", ".join(OUTCOMES) + "."),
        Key("min_reused", "int", None, "At least this many prompt tokens reused."),
        Key("min_saved_fraction", "number 0..1", None, "At least this fraction of the prompt reused."),
        Key("max_forced", "int", None, "At most this many forced full re-processings."),
        Key("checkpoints_created_at", "list of int", None,
            "`pos_max` values that must be among the checkpoints created on the turn."),
        Key("identity", "bool", None, "Require (true) or waive (false) byte identity with the cold run."),
        Key("cascade", "bool", None,
            "Require (true) or waive (false) the erase cascade: every checkpoint alive at the turn's "
            "start with `pos_max` above its re-entry point was erased (`erased invalidated`), none kept. "
            "Needs the engine's log (not log_family none)."),
    ), "At least one check (`outcome` … `cascade`) is required."),
}

_CHECK_KEYS = ("outcome", "min_reused", "min_saved_fraction", "max_forced", "checkpoints_created_at",
               "identity", "cascade")
_CASCADE_HINT = ("write `cascade: true` (every checkpoint above the re-entry point must be erased) or "
                 "`cascade: false` (waive the default cascade check on these turns)")


# --------------------------------------------------------------------------------------------
# The loaded matrix.


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
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class PromptSpec:
    """Common part of every prompt. `length` is the exact token count, None for chat."""

    id: str
    kind: str
    endpoint: str = "completion"
    message_delimiters: bool = False
    description: str = ""

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
    name: str
    prompts: tuple[str, ...]


@dataclass(frozen=True)
class Selection:
    """Engine × configuration × sequence names or `*` globs."""

    engine: str = "*"
    configuration: str = "*"
    sequence: str = "*"

    def matches(self, engine: str, configuration: str, sequence: str) -> bool:
        return (
            fnmatch.fnmatchcase(engine, self.engine)
            and fnmatch.fnmatchcase(configuration, self.configuration)
            and fnmatch.fnmatchcase(sequence, self.sequence)
        )


@dataclass(frozen=True)
class CellsSpec:
    include: tuple[Selection, ...] = (Selection(),)
    exclude: tuple[Selection, ...] = ()


@dataclass(frozen=True)
class Generation:
    n_predict: int = 16
    temperature: float = 0.0
    allow_sampling: bool = False
    ignore_eos: bool = False


@dataclass(frozen=True)
class Isolation:
    cores_per_cell: int = 1
    gpu: int | None = None  # None: every GPU hidden
    keep_scratch: bool = False
    jobs: int = 1
    max_log_mib: int = 1024  # an engine's log beyond this fails its cell (a flood, not a record)


@dataclass(frozen=True)
class Identity:
    required: bool = True
    control: bool = True


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
    description: str = ""
    line: int | None = field(default=None, compare=False)  # where it is written, for reports


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
        return _matrix_to_dict(self)


# --------------------------------------------------------------------------------------------
# YAML with line numbers.


class _LineMap(dict):
    """A YAML mapping that remembers the line of each key and value (1-based)."""

    line: int
    key_lines: dict[Any, int]
    value_lines: dict[Any, int]


class _LineList(list):
    line: int
    item_lines: list[int]


# libyaml's parser when available (10x faster); the constructors below are the same either way.
_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LineLoader(_SafeLoader):
    """SafeLoader whose mappings and sequences record where they start; duplicate keys fail."""

    def __init__(self, stream: str, file: str) -> None:
        super().__init__(stream)
        self.file = file
        self.path: list[str] = []  # key path of the value being constructed (for errors)

    def key_path(self, last: Any) -> str:
        return _join_path([*self.path, last])


def _join_path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) and not isinstance(part, bool) else (
            f".{part}" if text else str(part))
    return text


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> _LineMap:
    loader.flatten_mapping(node)
    result = _LineMap()
    result.line = node.start_mark.line + 1
    result.key_lines, result.value_lines = {}, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        key_line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise MatrixError("a mapping key must be a plain name", file=loader.file, line=key_line,
                              key_path=_join_path(loader.path))
        if key in result:
            raise MatrixError(
                f"duplicate key {key!r} (first at line {result.key_lines[key]})",
                file=loader.file, line=key_line, key_path=loader.key_path(key),
                hint="YAML would silently keep only the last one; rename or remove one of them",
            )
        loader.path.append(str(key))
        result[key] = loader.construct_object(value_node, deep=True)
        loader.path.pop()
        result.key_lines[key] = key_line
        result.value_lines[key] = value_node.start_mark.line + 1
    return result


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> _LineList:
    result = _LineList()
    for index, child in enumerate(node.value):
        loader.path.append(index)
        result.append(loader.construct_object(child, deep=True))
        loader.path.pop()
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


def _parse_yaml(text: str, file: str) -> Any:
    loader = _LineLoader(text, file)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise MatrixError(f"invalid YAML: {problem}", file=file, line=line,
                          hint="check indentation and quoting on or just above this line") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"invalid YAML: {exc}", file=file) from None
    finally:
        loader.dispose()


# --------------------------------------------------------------------------------------------
# Validation helpers: each value travels with where it was written.


@dataclass(frozen=True)
class _At:
    file: str
    path: str
    line: int | None

    def fail(self, message: str, hint: str | None = None, *, line: int | None = None) -> NoReturn:
        # `from None`: a MatrixError is the whole story, even when raised while handling another error.
        raise MatrixError(message, file=self.file, line=line or self.line, key_path=self.path, hint=hint) from None

    def key(self, name: Any, line: int | None) -> _At:
        return _At(self.file, f"{self.path}.{name}" if self.path else str(name), line or self.line)

    def item(self, index: int, line: int | None) -> _At:
        return _At(self.file, f"{self.path}[{index}]", line or self.line)


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _closest_hint(word: str, known: Iterable[str], what: str = "") -> str:
    known = [str(k) for k in known]
    same_case = [k for k in known if k.lower() == str(word).lower()]
    prefixed = [k for k in known if k.lower().startswith(str(word).lower())] if word else []
    close = same_case or difflib.get_close_matches(str(word), known, n=1, cutoff=0.6) or prefixed[:1]
    if close:
        return f"did you mean {close[0]!r}?"
    label = f"known {what}: " if what else "known: "
    return label + (", ".join(known) if known else "(none)")


def _fields(value: Any, at: _At, section: str) -> dict[str, tuple[Any, _At]]:
    """Check a mapping against a schema section; return key → (value, where)."""
    if not isinstance(value, _LineMap):
        at.fail(f"expected a mapping, got {_describe(value)}")
    sec = SCHEMA[section]
    known = sec.names()
    for key in value:
        if key not in known:
            at.key(key, value.key_lines[key]).fail(
                f"unknown key {key!r}", _closest_hint(str(key), known, "keys"))
    for k in sec.keys:
        if k.required and k.name not in value:
            at.fail(f"missing required key {k.name!r}", f"{sec.title} needs: "
                    + ", ".join(x.name for x in sec.keys if x.required), line=value.line)
    return {key: (v, at.key(key, value.value_lines[key])) for key, v in value.items()}


def _int(value: Any, at: _At, minimum: int | None = None, maximum: int = _MAX_INT,
         hint: str | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        at.fail(f"expected an integer, got {_describe(value)}")
    if minimum is not None and value < minimum:
        at.fail(f"expected an integer ≥ {minimum}, got {value}")
    if value > maximum:
        shown = str(value) if len(str(value)) <= 24 else f"a {len(str(value))}-digit number"
        at.fail(f"{shown} is too large (at most {maximum})", hint)
    return value


def _number(value: Any, at: _At) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        at.fail(f"expected a number, got {_describe(value)}")
    return float(value)


def _bool(value: Any, at: _At, hint: str | None = None) -> bool:
    if not isinstance(value, bool):
        at.fail(f"expected true or false, got {_describe(value)}", hint)
    return value


def _str(value: Any, at: _At, *, nonempty: bool = True) -> str:
    if not isinstance(value, str):
        at.fail(f"expected a string, got {_describe(value)}")
    if nonempty and not value.strip():
        at.fail("expected a non-empty string")
    return _no_nul(value, at)


def _no_nul(text: str, at: _At) -> str:
    # A NUL cannot be passed in an argv or environment entry, nor in a path: refuse it here,
    # where it was written, rather than as a ValueError when the engine is spawned.
    if "\0" in text:
        at.fail("contains a NUL character (\\0)", "remove it: no program argument, variable or path can hold one")
    return text


def _text(value: Any, at: _At) -> str:
    """Free text (descriptions): copied into the plan and every report, so bounded."""
    text = _str(value, at, nonempty=False)
    if len(text) > MAX_TEXT_CHARS:
        at.fail(f"{len(text)} characters of free text; at most {MAX_TEXT_CHARS}",
                "shorten it, or link to a longer note")
    return text


def _choice(value: Any, at: _At, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        at.fail(f"expected one of {', '.join(choices)}, got {_describe(value)}",
                _closest_hint(str(value), choices, "values") if isinstance(value, str) else None)
    return value


def _scalar_text(value: Any, at: _At) -> str:
    """Flags and env values: strings, with YAML numbers (8192, 0) taken as their text."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        at.fail(f"expected a string, got {_describe(value)}",
                "quote it ('true', '1') if the engine wants that text" if isinstance(value, bool) else None)
    return _no_nul(str(value), at)


def _list(value: Any, at: _At) -> list[tuple[Any, _At]]:
    if not isinstance(value, _LineList):
        at.fail(f"expected a list, got {_describe(value)}")
    return [(v, at.item(i, value.item_lines[i])) for i, v in enumerate(value)]


def _str_list(value: Any, at: _At) -> tuple[str, ...]:
    return tuple(_scalar_text(v, a) for v, a in _list(value, at))


def _env(value: Any, at: _At) -> dict[str, str]:
    if not isinstance(value, _LineMap):
        at.fail(f"expected a mapping of variable → value, got {_describe(value)}")
    env = {}
    for key, v in value.items():
        key_at = at.key(key, value.key_lines[key])
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            key_at.fail(f"{key!r} is not an environment variable name")
        env[key] = _scalar_text(v, at.key(key, value.value_lines[key]))
    return env


def _name(value: Any, at: _At, what: str) -> str:
    """A name that becomes part of a directory name: one safe path component, never `..`."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        shown = _describe(value if not isinstance(value, str) else value[:MAX_NAME_CHARS + 8])
        at.fail(f"{what} name {shown} cannot be used in a cell id or directory name",
                "use letters, digits, '_' and '-' (first not '-'; no dots, slashes or spaces)")
    if len(value) > MAX_NAME_CHARS:
        at.fail(f"{what} name is {len(value)} characters long; at most {MAX_NAME_CHARS}",
                "a cell id joins up to four names into one directory name, which may have 255 bytes")
    return value


def _named_map(value: Any, at: _At, what: str, *, nonempty: bool = True) -> list[tuple[str, Any, _At]]:
    """A `name → body` mapping (engines, prompts, ...): names checked, order kept."""
    if not isinstance(value, _LineMap):
        at.fail(f"expected a mapping of {what} name → definition, got {_describe(value)}")
    if nonempty and not value:
        at.fail(f"no {what}s defined", line=value.line)
    out = []
    for key, body in value.items():
        name = _name(key, at.key(key, value.key_lines[key]), what)
        out.append((name, body, at.key(key, value.value_lines[key])))
    return out


# --------------------------------------------------------------------------------------------
# Sections.


@dataclass
class _Context:
    """What later sections need from earlier ones while loading."""

    file: str
    base_dir: Path
    check_files: bool
    cores_per_cell: int = 1


def load(path: str | Path, *, check_files: bool = True) -> Matrix:
    """Read and validate a matrix file. Raises `MatrixError`; never starts anything.

    `check_files=False` skips the checks that look at this machine (model files, binaries), for
    reading a matrix recorded elsewhere.
    """
    path = Path(path)
    file = str(path)
    try:
        text = read_regular_file(path, MAX_MATRIX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise MatrixError("no such matrix file", file=file, hint="check the path") from None
    except FileRefused as exc:
        raise MatrixError(f"cannot read the matrix file: {exc}", file=file,
                          hint="a matrix is a regular YAML file of at most "
                               f"{MAX_MATRIX_BYTES >> 20} MiB") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"cannot read the matrix file: {exc}", file=file) from None
    data = _parse_yaml(text, file)
    ctx = _Context(file=file, base_dir=path.resolve().parent, check_files=check_files)
    return _matrix(data, ctx, path)


def loads(text: str, *, file: str = "<matrix>", base_dir: str | Path = ".", check_files: bool = True) -> Matrix:
    """Like `load`, from text (file names the source in errors; paths resolve under base_dir)."""
    if len(text) > MAX_MATRIX_BYTES:
        raise MatrixError(f"{len(text)} characters; a matrix may hold at most {MAX_MATRIX_BYTES >> 20} MiB",
                          file=file)
    data = _parse_yaml(text, file)
    ctx = _Context(file=file, base_dir=Path(base_dir).resolve(), check_files=check_files)
    return _matrix(data, ctx, Path(file))


def _matrix(data: Any, ctx: _Context, path: Path) -> Matrix:
    root = _At(ctx.file, "", 1)
    if data is None:
        root.fail("the matrix file is empty", "start from matrices/ckpt.yaml")
    f = _fields(data, root, "matrix")
    version = _int(*f["version"])
    if version != MATRIX_VERSION:
        f["version"][1].fail(f"matrix version {version} is not supported (this shadowlab reads {MATRIX_VERSION})",
                             "upgrade shadowlab" if version > MATRIX_VERSION else None)
    isolation = _isolation(*f["isolation"]) if "isolation" in f else Isolation()
    ctx.cores_per_cell = isolation.cores_per_cell
    engines = {n: _engine(n, b, a, ctx) for n, b, a in _named_map(*f["engines"], "engine")}
    if "configurations" in f:
        configurations = {n: _configuration(n, b, a) for n, b, a in _named_map(*f["configurations"], "configuration")}
    else:
        configurations = {"default": ConfigurationSpec("default")}
    prompts = _prompts(*f["prompts"])
    sequences = _sequences(*f["sequences"], prompts)
    cells = _cells(*f["cells"], engines, configurations, sequences) if "cells" in f else CellsSpec()
    matrix = Matrix(
        path=path,
        version=version,
        name=_name(*f["name"], "matrix"),
        description=_text(*f["description"]) if "description" in f else "",
        engines=engines,
        configurations=configurations,
        prompts=prompts,
        sequences=sequences,
        cells=cells,
        generation=_generation(*f["generation"]) if "generation" in f else Generation(),
        isolation=isolation,
        identity=_identity(*f["identity"]) if "identity" in f else Identity(),
        expectations=(),
        lines={"isolation.cores_per_cell": _line_of(data, "isolation", "cores_per_cell")},
    )
    if not matrix.selected():
        (f["cells"][1] if "cells" in f else root).fail("the matrix selects no cells",
                                                        "check cells.include / cells.exclude")
    _check_chat_turns(matrix, f["sequences"][1], data["sequences"])
    _check_context(matrix, f["prompts"][1], data["prompts"])
    if "expectations" in f:
        selected = matrix.selected()
        expectations = tuple(_expectation(v, a, matrix, selected) for v, a in _list(*f["expectations"]))
        matrix = replace(matrix, expectations=expectations)
    return matrix


def _line_of(data: _LineMap, section: str, key: str) -> int | None:
    """Where `section.key` is written, else where `section` is, else None."""
    body = data.get(section)
    if isinstance(body, _LineMap) and key in body:
        return body.value_lines[key]
    return data.key_lines.get(section)


def _engine(name: str, body: Any, at: _At, ctx: _Context) -> EngineSpec:
    f = _fields(body, at, "engine")
    kind = _choice(*f["kind"], ENGINE_KINDS)
    if "model" in f:
        model = _model(*f["model"], ctx)
        wrong = {"reference": "gguf", "llama-server": "preset"}.get(kind)
        if model.source == wrong:
            f["model"][1].fail(f"a {kind} engine cannot load a {wrong} model",
                               "the reference engine takes {preset, seed} or a safetensors path; "
                               "llama-server takes {gguf: {preset, seed}} or a .gguf path")
    elif kind == "openai":
        model = None
    else:
        at.fail("missing required key 'model'", "e.g. model: {preset: tiny, seed: 0}", line=body.line)
    binary = _binary(*f["binary"], ctx) if "binary" in f else "auto"
    command = _command(*f["command"]) if "command" in f else None
    threads = _int(*f["threads"], minimum=1) if "threads" in f else ctx.cores_per_cell
    if threads > ctx.cores_per_cell:
        (f["threads"][1]).fail(
            f"threads {threads} exceeds isolation.cores_per_cell {ctx.cores_per_cell}",
            "a cell's threads run on its own cores; raise isolation.cores_per_cell or lower threads")
    timeout = _number(*f["ready_timeout_s"]) if "ready_timeout_s" in f else 60.0
    if timeout <= 0:
        f["ready_timeout_s"][1].fail(f"expected a positive number of seconds, got {timeout:g}")
    family = _choice(*f["log_family"], LOG_FAMILIES) if "log_family" in f else _DEFAULT_LOG_FAMILY[kind]
    return EngineSpec(
        name=name,
        kind=kind,
        model=model,
        binary=binary,
        command=command,
        flags=_str_list(*f["flags"]) if "flags" in f else (),
        env=_env(*f["env"]) if "env" in f else {},
        threads=threads,
        ready_timeout_s=timeout,
        log_family=family,
        log_patterns=_log_patterns(*f["log_patterns"]) if "log_patterns" in f else (),
        verbosity_flags=_str_list(*f["verbosity_flags"]) if "verbosity_flags" in f
        else () if family in _DEFAULT_LEVEL_FAMILIES else _DEFAULT_VERBOSITY[kind],
    )


def _model(value: Any, at: _At, ctx: _Context) -> ModelSpec:
    f = _fields(value, at, "model")
    sources = [k for k in ("preset", "path", "gguf") if k in f]
    if len(sources) != 1:
        at.fail("a model needs exactly one of preset, path, gguf"
                + (f" (got {', '.join(sources)})" if sources else ""),
                "e.g. model: {preset: tiny, seed: 0} or model: {path: models/x.gguf}", line=value.line)
    source = sources[0]
    if source == "path":
        if "seed" in f:
            f["seed"][1].fail("seed only applies to a generated model (preset or gguf)")
        return ModelSpec("path", path=_existing_path(*f["path"], ctx, "model file"))
    if source == "gguf":
        if "seed" in f:
            f["seed"][1].fail("put the seed inside gguf: {preset: ..., seed: ...}")
        g = _fields(*f["gguf"], "gguf")
        seed = _int(*g["seed"], minimum=0) if "seed" in g else 0
        return ModelSpec("gguf", preset=_str(*g["preset"]), seed=seed)
    seed = _int(*f["seed"], minimum=0) if "seed" in f else 0
    preset = _str(*f["preset"])
    known = _reference_presets()
    if known and preset not in known:
        f["preset"][1].fail(f"unknown reference-engine preset {preset!r}", _closest_hint(preset, known, "presets"))
    return ModelSpec("preset", preset=preset, seed=seed)


def _reference_presets() -> tuple[str, ...]:
    """The reference engine's model presets (a light import: no torch)."""
    try:
        from shadowlab_engine.config import PRESETS
    except ImportError:  # engine not installed: the adapter reports it when the run starts
        return ()
    return tuple(PRESETS)


def _existing_path(value: Any, at: _At, ctx: _Context, what: str) -> Path:
    text = _str(value, at)
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = ctx.base_dir / path
    if ctx.check_files and not path.exists():
        at.fail(f"{what} {text!r} does not exist (looked for {path})",
                "relative paths are resolved from the matrix file's directory")
    if ctx.check_files and not path.is_file():
        # A device (/dev/zero), a FIFO or a directory would be hashed or read forever.
        at.fail(f"{what} {text!r} is not a regular file (looked for {path})",
                f"name the {what} itself")
    return path


def _binary(value: Any, at: _At, ctx: _Context) -> str:
    text = _str(value, at)
    if text == "auto":
        return text
    if "/" in text:
        return str(_existing_path(value, at, ctx, "binary"))
    found = shutil.which(text)
    if found is None:
        if ctx.check_files:
            at.fail(f"binary {text!r} is not on PATH", "give a path, or `auto` to let the adapter find it")
        return text
    return found


def _command(value: Any, at: _At) -> tuple[str, ...]:
    items = _list(value, at)
    if not items:
        at.fail("the command template is empty")
    out, used = [], set()
    for v, a in items:
        text = _scalar_text(v, a)
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
        except ValueError as exc:
            a.fail(f"bad template {text!r}: {exc}", "write a literal brace as {{ or }}")
        for name in names:
            if name not in COMMAND_PLACEHOLDERS:
                a.fail(f"unknown placeholder {{{name}}}",
                       _closest_hint(name, COMMAND_PLACEHOLDERS, "placeholders"))
        used |= names
        out.append(text)
    if "port" not in used:
        at.fail("the command template never uses {port}", "each cell gets its own port; pass it with {port}")
    return tuple(out)


def _log_patterns(value: Any, at: _At) -> tuple[str, ...]:
    out = []
    for v, a in _list(value, at):
        text = _str(v, a)
        try:
            re.compile(text)
        except re.error as exc:
            a.fail(f"regex does not compile: {exc}", "YAML single quotes keep backslashes as written")
        out.append(text)
    return tuple(out)


def _configuration(name: str, body: Any, at: _At) -> ConfigurationSpec:
    if body is None:  # `plain:` with nothing under it: no delta
        return ConfigurationSpec(name)
    f = _fields(body, at, "configuration")
    return ConfigurationSpec(
        name=name,
        flags=_str_list(*f["flags"]) if "flags" in f else (),
        env=_env(*f["env"]) if "env" in f else {},
        description=_text(*f["description"]) if "description" in f else "",
    )


# -- prompts -----------------------------------------------------------------------------------


def _prompts(value: Any, at: _At) -> dict[str, PromptSpec]:
    entries = _named_map(value, at, "prompt")
    names = [n for n, _, _ in entries]
    raw: dict[str, tuple[Any, _At]] = {n: (b, a) for n, b, a in entries}
    kinds = {n: b.get("kind") if isinstance(b, dict) else None for n, b, _ in entries}
    prompts: dict[str, PromptSpec] = {}
    # Build in dependency order so lengths of sources are known; cycles are reported.
    visiting: list[str] = []

    def build(pid: str) -> PromptSpec:
        if pid in prompts:
            return prompts[pid]
        if pid in visiting:
            cycle = " → ".join(visiting[visiting.index(pid):] + [pid])
            raw[pid][1].fail(f"prompts depend on each other in a cycle: {cycle}")
        visiting.append(pid)
        prompts[pid] = _prompt(pid, *raw[pid], names, kinds, build)
        visiting.pop()
        return prompts[pid]

    for pid in names:
        build(pid)
    return {pid: prompts[pid] for pid in names}


def _prompt(pid: str, body: Any, at: _At, names: list[str], kinds: Mapping[str, Any],
            build: Callable[[str], PromptSpec]) -> PromptSpec:
    if not isinstance(body, _LineMap):
        at.fail(f"expected a prompt definition (a mapping with `kind`), got {_describe(body)}")
    if "kind" not in body:
        at.fail("missing required key 'kind'", "one of: " + ", ".join(PROMPT_KINDS), line=body.line)
    kind = _choice(body["kind"], at.key("kind", body.value_lines["kind"]), PROMPT_KINDS)
    f = _fields(body, at, f"prompt.{kind}")
    default_endpoint = "chat" if kind == "chat" else "completion"
    endpoint = _choice(*f["endpoint"], ENDPOINTS) if "endpoint" in f else default_endpoint
    if kind != "chat" and endpoint == "chat":
        f["endpoint"][1].fail("a token prompt cannot go to the chat endpoint",
                              "token prompts are sent as token ids to /completion; use kind: chat for messages")
    delimiters = _bool(*f["message_delimiters"]) if "message_delimiters" in f else False
    if delimiters and endpoint != "completion":
        f["message_delimiters"][1].fail("message_delimiters only applies to the completion endpoint")
    common = dict(id=pid, kind=kind, endpoint=endpoint, message_delimiters=delimiters,
                  description=_text(*f["description"]) if "description" in f else "")

    def source() -> PromptSpec:
        src_at = f["from"][1]
        src = _str(*f["from"])
        if src == pid:
            src_at.fail("a prompt cannot be built from itself")
        if src not in names:
            src_at.fail(f"unknown prompt {src!r}", _closest_hint(src, names, "prompts"))
        spec = build(src)
        if spec.length is None:
            src_at.fail(f"prompt {src!r} is a chat prompt; only token prompts can be a source")
        return spec

    if kind == "random":
        return RandomPrompt(**common, tokens=_tokens(*f["tokens"]), seed=_int(*f["seed"], minimum=0))
    if kind == "diverge":
        src = source()
        tokens = _tokens(*f["tokens"], minimum=2)
        shared = _int(*f["shared"], minimum=1)
        if shared >= src.length:
            f["shared"][1].fail(f"shared {shared} must be below the length of {src.id!r} ({src.length} tokens)",
                                "token `shared` is where the prompts differ; to continue all of it use kind: append")
        if shared >= tokens:
            f["shared"][1].fail(f"shared {shared} must be below tokens {tokens}",
                                "the prompt needs at least one token after the divergence point")
        return DivergePrompt(**common, source=src.id, shared=shared, tokens=tokens, seed=_int(*f["seed"], minimum=0))
    if kind == "append":
        src = source()
        extra = _tokens(*f["extra"])
        if src.length + extra > MAX_PROMPT_TOKENS:
            f["extra"][1].fail(f"{src.id!r} ({src.length} tokens) + extra {extra} is longer than "
                               f"{MAX_PROMPT_TOKENS} tokens", _TOKENS_HINT)
        return AppendPrompt(**common, source=src.id, extra=extra,
                            seed=_int(*f["seed"], minimum=0), source_length=src.length)
    if kind == "unrelated":
        return UnrelatedPrompt(**common, tokens=_tokens(*f["tokens"]), seed=_int(*f["seed"], minimum=0),
                               unrelated_to=_unrelated_to(pid, f, names, kinds, build))
    return ChatPrompt(**common, messages=_messages(*f["messages"]))


_TOKENS_HINT = "a prompt is built in memory and must fit the engine's context (-c/--ctx-size)"


def _tokens(value: Any, at: _At, minimum: int = 1) -> int:
    return _int(value, at, minimum=minimum, maximum=MAX_PROMPT_TOKENS, hint=_TOKENS_HINT)


def _unrelated_to(pid: str, f: dict[str, tuple[Any, _At]], names: list[str], kinds: Mapping[str, Any],
                  build: Callable[[str], PromptSpec]) -> tuple[str, ...]:
    if "unrelated_to" not in f:
        # Every random prompt and every earlier unrelated one: each other token prompt starts like
        # one of those (later unrelated prompts avoid this one in turn).
        earlier = names[: names.index(pid)]
        return tuple(n for n in names if n != pid and (
            kinds[n] == "random" or (kinds[n] == "unrelated" and n in earlier)))
    out = []
    for v, a in _list(*f["unrelated_to"]):
        other = _str(v, a)
        if other == pid:
            a.fail("a prompt cannot be unrelated to itself")
        if other not in names:
            a.fail(f"unknown prompt {other!r}", _closest_hint(other, names, "prompts"))
        if build(other).length is None:
            a.fail(f"prompt {other!r} is a chat prompt; unrelated_to names token prompts")
        out.append(other)
    return tuple(out)


def _messages(value: Any, at: _At) -> tuple[ChatMessage, ...]:
    items = _list(value, at)
    if not items:
        at.fail("a chat prompt needs at least one message")
    out = []
    for v, a in items:
        f = _fields(v, a, "message")
        role = _choice(*f["role"], CHAT_ROLES)
        content, c_at = f["content"]
        if isinstance(content, _LineMap):
            if role != "assistant":
                c_at.fail("only an assistant message can take a reply from an earlier turn")
            if set(content) != {"from_turn"}:
                c_at.fail("expected {from_turn: <turn index>}",
                          _closest_hint(str(next(iter(content), "")), ("from_turn",), "keys"))
            turn = _int(content["from_turn"], c_at.key("from_turn", content.value_lines["from_turn"]), minimum=0)
            out.append(ChatMessage(role, from_turn=turn))
        else:
            out.append(ChatMessage(role, content=_str(content, c_at, nonempty=False)))
    if out[-1].role == "assistant":
        items[-1][1].fail("the last message is the assistant's; the turn would have nothing to answer",
                          "end the conversation with a user message")
    return tuple(out)


# -- sequences, cells, settings ----------------------------------------------------------------


def _sequences(value: Any, at: _At, prompts: Mapping[str, PromptSpec]) -> dict[str, SequenceSpec]:
    out = {}
    for name, body, s_at in _named_map(value, at, "sequence"):
        items = _list(body, s_at)
        if not items:
            s_at.fail("a sequence needs at least one prompt")
        ids = []
        for v, a in items:
            pid = _str(v, a)
            if pid not in prompts:
                a.fail(f"unknown prompt {pid!r}", _closest_hint(pid, prompts, "prompts"))
            ids.append(pid)
        out[name] = SequenceSpec(name, tuple(ids))
    return out


def _check_chat_turns(matrix: Matrix, at: _At, raw: _LineMap) -> None:
    """A chat turn may only splice the reply of an earlier turn of its sequence."""
    for name, seq in matrix.sequences.items():
        for index, pid in enumerate(seq.prompts):
            prompt = matrix.prompts[pid]
            if not isinstance(prompt, ChatPrompt):
                continue
            for turn in prompt.reply_turns():
                if turn >= index:
                    item_at = at.key(name, raw.value_lines[name]).item(index, raw[name].item_lines[index])
                    item_at.fail(
                        f"chat prompt {pid!r} is turn {index} but uses the reply of turn {turn}",
                        "from_turn must name an earlier turn (0-based) of every sequence using the prompt")


def context_size(engine: EngineSpec, configuration: ConfigurationSpec) -> tuple[int | None, str]:
    """The context (tokens) a cell of `engine` × `configuration` gets, and where that comes from:
    the last -c/--ctx-size of the command, the engine's flags and the configuration's (in the
    order the engine sees them), else the engine kind's default. None when not known here."""
    args = [*(engine.command or ()), *engine.flags, *configuration.flags]
    value = None
    for index, arg in enumerate(args):
        if arg in _CTX_FLAGS and index + 1 < len(args):
            value = f"{arg} {args[index + 1]}"
        elif arg.startswith("--ctx-size="):
            value = arg.replace("=", " ", 1)
    if value is None:
        default = DEFAULT_CONTEXT.get(engine.kind)
        return default, f"the {engine.kind} engine's default {default}"
    try:
        size = int(value.split(" ", 1)[1])
    except ValueError:
        return None, value  # not a number: the engine itself will refuse it
    return (size if size > 0 else None), value  # llama.cpp's -c 0: the model's own, unknown here


def _check_context(matrix: Matrix, at: _At, raw: _LineMap) -> None:
    """A token prompt (+ n_predict) longer than a cell's context would be refused by the engine
    (HTTP 400) only after minutes of building and tokenizing it: refuse it now."""
    n_predict = matrix.generation.n_predict
    for engine, configuration, sequence in matrix.selected():
        size, source = context_size(matrix.engines[engine], matrix.configurations[configuration])
        if size is None:
            continue
        for pid in matrix.sequences[sequence].prompts:
            length = matrix.prompts[pid].length
            if length is not None and length + n_predict > size:
                at.key(pid, raw.key_lines[pid]).fail(
                    f"prompt {pid!r} needs {length + n_predict} tokens of context ({length} + n_predict "
                    f"{n_predict}), but engine {engine!r} with configuration {configuration!r} has "
                    f"{size} ({source})",
                    f"shorten the prompt, or give a larger -c/--ctx-size in engines.{engine}.flags "
                    f"or configurations.{configuration}.flags")


def check_machine(matrix: Matrix, *, cores: int, warn: Callable[[str], None] | None = None) -> None:
    """What this machine must offer before anything starts: more cores per cell than the process
    may use can never be leased. MatrixError, or with `warn` (a dry run) a warning."""
    need = matrix.isolation.cores_per_cell
    if need <= cores:
        return
    error = MatrixError(
        f"{need} cores per cell, but this process may use only {cores}",
        file=str(matrix.path), line=matrix.lines.get("isolation.cores_per_cell"),
        key_path="isolation.cores_per_cell",
        hint=f"lower isolation.cores_per_cell (and engine threads) to at most {cores}, "
             "or run on a machine with more cores")
    if warn is None:
        raise error
    warn(f"shadowlab: warning: {error}")


def _selection(f: dict[str, tuple[Any, _At]], names: Mapping[str, Iterable[str]]) -> Selection:
    """The engine/configuration/sequence patterns among checked fields; each must match a name."""
    patterns = {}
    for key, known in names.items():
        if key not in f:
            continue
        pattern = _str(*f[key])
        known = list(known)
        if not any(fnmatch.fnmatchcase(n, pattern) for n in known):
            f[key][1].fail(f"{pattern!r} matches no {key}", _closest_hint(pattern, known, f"{key}s"))
        patterns[key] = pattern
    return Selection(**patterns)


def _cells(value: Any, at: _At, engines: Mapping, configurations: Mapping, sequences: Mapping) -> CellsSpec:
    f = _fields(value, at, "cells")
    names = {"engine": engines, "configuration": configurations, "sequence": sequences}

    def selections(key: str) -> tuple[Selection, ...]:
        return tuple(_selection(_fields(v, a, "selection"), names) for v, a in _list(*f[key]))

    include = selections("include") if "include" in f else (Selection(),)
    exclude = selections("exclude") if "exclude" in f else ()
    return CellsSpec(include, exclude)


def _generation(value: Any, at: _At) -> Generation:
    f = _fields(value, at, "generation")
    g = Generation(
        n_predict=_tokens(*f["n_predict"]) if "n_predict" in f else 16,
        temperature=_number(*f["temperature"]) if "temperature" in f else 0.0,
        allow_sampling=_bool(*f["allow_sampling"]) if "allow_sampling" in f else False,
        ignore_eos=_bool(*f["ignore_eos"]) if "ignore_eos" in f else False,
    )
    if g.temperature > 0 and not g.allow_sampling:
        f["temperature"][1].fail(
            f"temperature {g.temperature:g} is not greedy; warm-vs-cold identity needs greedy decoding",
            "use temperature: 0, or set allow_sampling: true to accept non-greedy decoding")
    return g


def _isolation(value: Any, at: _At) -> Isolation:
    f = _fields(value, at, "isolation")
    gpu = None
    if "gpu" in f:
        raw, g_at = f["gpu"]
        if raw != "none":
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
                g_at.fail(f"expected none or a device index (0, 1, ...), got {_describe(raw)}")
            gpu = raw
    return Isolation(
        cores_per_cell=_int(*f["cores_per_cell"], minimum=1) if "cores_per_cell" in f else 1,
        gpu=gpu,
        keep_scratch=_bool(*f["keep_scratch"]) if "keep_scratch" in f else False,
        jobs=_int(*f["jobs"], minimum=1) if "jobs" in f else 1,
        max_log_mib=_int(*f["max_log_mib"], minimum=1) if "max_log_mib" in f else 1024,
    )


def _identity(value: Any, at: _At) -> Identity:
    f = _fields(value, at, "identity")
    return Identity(
        required=_bool(*f["required"]) if "required" in f else True,
        control=_bool(*f["control"]) if "control" in f else True,
    )


def _expectation(value: Any, at: _At, matrix: Matrix, selected: list[tuple[str, str, str]]) -> Expectation:
    f = _fields(value, at, "expectation")
    names = {"engine": matrix.engines, "configuration": matrix.configurations, "sequence": matrix.sequences}
    selection = _selection(f, names)
    cells = [c for c in selected if selection.matches(*c)]
    if not cells:
        at.fail("this expectation selects no planned cell", "check its engine/configuration/sequence "
                "against cells.include / cells.exclude", line=value.line)
    checks = [k for k in _CHECK_KEYS if k in f]
    if not checks:
        at.fail("an expectation needs at least one check", "add one of: " + ", ".join(_CHECK_KEYS), line=value.line)
    turn = _turn(*f["turn"], matrix, cells) if "turn" in f else None
    outcome = None
    if "outcome" in f:
        raw, o_at = f["outcome"]
        items = _list(raw, o_at) if isinstance(raw, list) else [(raw, o_at)]
        if not items:
            o_at.fail("expected at least one outcome")
        outcome = tuple(_choice(v, a, OUTCOMES) for v, a in items)
    fraction = None
    if "min_saved_fraction" in f:
        fraction = _number(*f["min_saved_fraction"])
        if not 0 <= fraction <= 1:
            f["min_saved_fraction"][1].fail(f"expected a fraction between 0 and 1, got {fraction:g}",
                                            "41.4% is written 0.414")
    created = None
    if "checkpoints_created_at" in f:
        created = tuple(_int(v, a, minimum=0) for v, a in _list(*f["checkpoints_created_at"]))
    cascade = None
    if "cascade" in f:
        cascade = _bool(*f["cascade"], hint=_CASCADE_HINT)
        blind = sorted({e for e, _, _ in cells if matrix.engines[e].log_family == "none"})
        if cascade and blind:
            f["cascade"][1].fail(
                f"engine {blind[0]!r} has log_family none: without its log the cascade cannot be seen",
                "narrow the selection to engines whose log is parsed, or set their log_family")
    return Expectation(
        selection=selection,
        turn=turn,
        outcome=outcome,
        min_reused=_int(*f["min_reused"], minimum=0) if "min_reused" in f else None,
        min_saved_fraction=fraction,
        max_forced=_int(*f["max_forced"], minimum=0) if "max_forced" in f else None,
        checkpoints_created_at=created,
        identity=_bool(*f["identity"]) if "identity" in f else None,
        cascade=cascade,
        description=_text(*f["description"]) if "description" in f else "",
        line=value.line,
    )


def _turn(value: Any, at: _At, matrix: Matrix, cells: list[tuple[str, str, str]]) -> int | str:
    sequences = [matrix.sequences[s] for s in dict.fromkeys(seq for _, _, seq in cells)]
    if isinstance(value, str):
        if value not in matrix.prompts:
            at.fail(f"unknown prompt {value!r}", _closest_hint(value, matrix.prompts, "prompts"))
        if not any(value in s.prompts for s in sequences):
            at.fail(f"prompt {value!r} is not a turn of the selected sequences ("
                    + ", ".join(s.name for s in sequences) + ")")
        return value
    index = _int(value, at, minimum=0)
    short = [s.name for s in sequences if index >= len(s.prompts)]
    if short:
        at.fail(f"turn {index} is past the end of sequence {short[0]!r}",
                "turns are 0-based; narrow the selection or name the turn by prompt id")
    return index


# --------------------------------------------------------------------------------------------
# Back to YAML-ready data (the run directory's resolved matrix.yaml).


def _matrix_to_dict(m: Matrix) -> dict[str, Any]:
    return {
        "version": m.version,
        "name": m.name,
        "description": m.description,
        "engines": {n: _engine_to_dict(e) for n, e in m.engines.items()},
        "configurations": {
            n: {"flags": list(c.flags), "env": dict(c.env), "description": c.description}
            for n, c in m.configurations.items()
        },
        "prompts": {n: _prompt_to_dict(p) for n, p in m.prompts.items()},
        "sequences": {n: list(s.prompts) for n, s in m.sequences.items()},
        "cells": {
            "include": [_selection_to_dict(s) for s in m.cells.include],
            "exclude": [_selection_to_dict(s) for s in m.cells.exclude],
        },
        "generation": vars(m.generation).copy(),
        "isolation": {**vars(m.isolation), "gpu": "none" if m.isolation.gpu is None else m.isolation.gpu},
        "identity": vars(m.identity).copy(),
        "expectations": [_expectation_to_dict(x) for x in m.expectations],
    }


def _engine_to_dict(e: EngineSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": e.kind}
    if e.model is not None:
        if e.model.source == "path":
            out["model"] = {"path": str(e.model.path)}
        elif e.model.source == "gguf":
            out["model"] = {"gguf": {"preset": e.model.preset, "seed": e.model.seed}}
        else:
            out["model"] = {"preset": e.model.preset, "seed": e.model.seed}
    out["binary"] = e.binary
    if e.command is not None:
        out["command"] = list(e.command)
    out.update(flags=list(e.flags), env=dict(e.env), threads=e.threads, ready_timeout_s=e.ready_timeout_s,
               log_family=e.log_family, log_patterns=list(e.log_patterns),
               verbosity_flags=list(e.verbosity_flags))
    return out


def _prompt_to_dict(p: PromptSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": p.kind, "endpoint": p.endpoint, "message_delimiters": p.message_delimiters,
                           "description": p.description}
    if isinstance(p, RandomPrompt):
        out.update(tokens=p.tokens, seed=p.seed)
    elif isinstance(p, DivergePrompt):
        out.update({"from": p.source, "shared": p.shared, "tokens": p.tokens, "seed": p.seed})
    elif isinstance(p, UnrelatedPrompt):
        out.update(tokens=p.tokens, seed=p.seed, unrelated_to=list(p.unrelated_to))
    elif isinstance(p, AppendPrompt):
        out.update({"from": p.source, "extra": p.extra, "seed": p.seed})
    elif isinstance(p, ChatPrompt):
        out["messages"] = [
            {"role": m.role, "content": m.content if m.from_turn is None else {"from_turn": m.from_turn}}
            for m in p.messages
        ]
    return out


def _selection_to_dict(s: Selection) -> dict[str, str]:
    return {"engine": s.engine, "configuration": s.configuration, "sequence": s.sequence}


def _expectation_to_dict(x: Expectation) -> dict[str, Any]:
    out: dict[str, Any] = _selection_to_dict(x.selection)
    if x.turn is not None:
        out["turn"] = x.turn
    if x.description:
        out["description"] = x.description
    for key in _CHECK_KEYS:
        value = getattr(x, key)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


# --------------------------------------------------------------------------------------------
# Reference documentation, generated from SCHEMA (docs/matrix.md embeds it; a test compares).

DOC_BEGIN = "<!-- BEGIN GENERATED: matrix schema (python -m shadowlab.matrix docs/matrix.md) -->"
DOC_END = "<!-- END GENERATED -->"


def reference_markdown() -> str:
    """Markdown tables of every section and key of the schema."""
    parts = []
    for section in SCHEMA.values():
        parts.append(f"### `{section.title}`\n")
        if section.doc:
            parts.append(section.doc + "\n")
        parts.append("| key | type | default | meaning |\n|---|---|---|---|")
        for k in section.keys:
            cells = (f"`{k.name}`", k.type, _doc_default(k), k.doc)
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        parts.append("")
    return "\n".join(parts)


def _doc_default(key: Key) -> str:
    if key.required:
        return "**required**"
    if key.default is None:
        return "—"
    if isinstance(key.default, bool):
        return "`true`" if key.default else "`false`"
    if key.default == "":
        return '`""`'
    return f"`{key.default}`"


def write_reference(doc_path: str | Path) -> None:
    """Replace the generated section of a markdown file with `reference_markdown()`."""
    path = Path(doc_path)
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    path.write_text(f"{head}{DOC_BEGIN}\n{reference_markdown()}{DOC_END}{tail}", encoding="utf-8")


if __name__ == "__main__":  # python -m shadowlab.matrix docs/matrix.md
    import sys

    write_reference(sys.argv[1] if len(sys.argv) > 1 else "docs/matrix.md")
