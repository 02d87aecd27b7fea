"""The matrix schema: every key a matrix may hold, with its type, default and meaning.

`SCHEMA` is the single source of truth for the keys: validation (`values._fields`) rejects any key
it does not list, and docs/matrix.md's reference section is generated from it (`docs.py`). A
numeric key declares its `Bounds` here too: validation refuses NaN, an infinity and any value
outside them, naming the bound; the docs show them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shadowlab import traffic
from shadowlab.bounds import MAX_INT, Bounds
from shadowlab.logs.parse import FAMILIES
from shadowlab.matrix.traffic_kind import MAX_IN_FLIGHT, MAX_TRAFFIC_REQUESTS

MATRIX_VERSION = 1

LOG_FAMILIES = FAMILIES  # what engines.<name>.log_family may be: the parser's families
PROMPT_KINDS = ("random", "diverge", "unrelated", "append", "chat")
# How a sequence's turns reach the engine; `ordered` (a plain list in YAML) is the default.
SEQUENCE_KINDS = ("ordered", "traffic")
ENDPOINTS = ("completion", "chat")
OUTCOMES = ("cold", "extended", "restored", "forced", "silent_reset", "error")
CHAT_ROLES = ("system", "user", "assistant", "tool")
COMMAND_PLACEHOLDERS = ("binary", "model", "port", "threads", "host", "log_file")
# Names become parts of cell ids and directory names: no dots (the id separator), no slashes.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z")
# A cell id joins at most four names, four dots and `control` (`e.c.control.s.p`): names of 48
# characters make 203 bytes, well within the 255 a directory name may have.
MAX_NAME_CHARS = 48
# Caps that keep loading and running bounded whatever the file says. The matrix file is read
# whole before parsing (the shipped ones are a few KiB); a prompt is built in memory as text
# and token ids before it is sent; free text is copied into every report.
MAX_MATRIX_BYTES = 1 << 20
MAX_PROMPT_TOKENS = 1 << 20
MAX_TEXT_CHARS = 4096
# Bounds of the numbers: each is as wide as any real use and no wider, so a typo (or NaN, or
# .inf) is refused before anything runs rather than turning a deadline or a count into none.
MAX_CORES = 4096  # cores, threads, jobs: more than any machine has
MAX_DEVICES = 1024  # GPU device indices
MAX_SECONDS = 86400.0  # a day: a wait beyond it is a mistake (and overflows threading's waits)
MAX_N_PROBS = 20  # llama-server's own bound on top logprobs per token is larger; 20 is plenty for triage
MAX_REPEAT = 100  # a fresh process per repeat of every warm cell: more is a typo, not a plan
MAX_FIGURE = 1e9  # MiB, ms, checkpoints per turn: beyond any engine at any scale
MAX_FACTOR = 1e6  # a scale factor
MAX_SIGMA = 20.0  # a lognormal size's sigma: exp(20 sigma-draws) is far beyond any size
TOKENS = Bounds(1, MAX_PROMPT_TOKENS, integer=True,
                hint="a prompt is built in memory and must fit the engine's context (-c/--ctx-size)")
SEED = Bounds(0, MAX_INT, integer=True)
COUNT = Bounds(0, MAX_INT, integer=True)
FRACTION = Bounds(0, 1, hint="41.4% is written 0.414")


# --------------------------------------------------------------------------------------------
# Schema: every key a matrix may hold, with its type, default and meaning.


class _Required:
    def __repr__(self) -> str:
        return "required"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Derived:
    """A default that is no single value: it depends on other keys or on the engine kind (the
    loader computes it); `text` is what docs/matrix.md shows for it."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Key:
    """One key. `default` is the value a matrix that omits the key gets, as the loaded spec holds
    it (a YAML list is a tuple) — written here only: the loader and the spec dataclasses read it
    (`default()`), docs/matrix.md shows it in YAML. None: unset (no value, docs show —); a
    `Derived`: computed from other keys. `shown`: how a matrix spells a default whose value would
    read wrong in YAML (gpu: `none`, not null). `bounds`: the values a numeric key may take."""

    name: str
    type: str
    default: Any
    doc: str
    shown: str | None = None
    bounds: Bounds | None = None  # a numeric key's (every number it holds, for a list or size)

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


_SHAPE = traffic.TrafficShape()
_SIZE_TOKENS = Bounds(0, MAX_PROMPT_TOKENS)
_WEIGHT = Bounds(0, MAX_FACTOR)
SHAPE_LENGTHS = Bounds(1, MAX_PROMPT_TOKENS, integer=True)  # the header lengths a preamble maps


def _shape_key(name: str, type: str, doc: str, bounds: Bounds | None = None) -> Key:
    """A key of a traffic shape; its default is TrafficShape's (written there only), as a matrix
    writes it."""
    value = getattr(_SHAPE, name)
    if isinstance(value, traffic.Dist):
        default: Any = Derived(_size_text(value))
    elif isinstance(value, tuple):
        default = Derived("{" + ", ".join(f"{k}: {w}" for k, w in value) + "}")
    else:
        default = value
    return Key(name, type, default, doc, bounds=bounds)


def _size_text(size: traffic.Dist) -> str:
    if size.kind == "fixed":
        return f"{size.a:g}"
    if size.kind == "uniform" and (size.low, size.high) == (0, 1 << 20):
        return f"[{size.a:g}, {size.b:g}]"
    return f"{{kind: {size.kind}, a: {size.a:g}, b: {size.b:g}, low: {size.low}, high: {size.high}}}"


_PROMPT_COMMON = (
    Key("kind", "random | diverge | unrelated | append | chat", REQUIRED, "How the prompt is built."),
    Key("endpoint", "completion | chat", Derived("completion (chat for kind chat)"),
        "`completion`: token ids to `/completion`; `chat`: messages to `/v1/chat/completions`."),
    Key("message_delimiters", "bool", False,
        "Send llama.cpp's `message_delimiters` with a `/completion` request (completion only)."),
    Key("description", "str", "", "Free text shown in the plan and report."),
)

SCHEMA: dict[str, Section] = {
    "matrix": Section("(top level)", (
        Key("version", "int", REQUIRED, f"Matrix format version; this shadowlab reads {MATRIX_VERSION}.",
            bounds=Bounds(1, MAX_INT, integer=True)),
        Key("name", "name", REQUIRED, "Short name of the experiment: the run directory is "
            "`reports/<name>-<UTC time>`, so letters, digits, `_`, `-`, at most 48 characters."),
        Key("description", "str", "", "Free text shown in the report (at most 4096 characters)."),
        Key("engines", "map name → engine", REQUIRED, "The engines under test (at least one)."),
        Key("configurations", "map name → configuration", {"default": {}},
            "Named flag/env deltas applied on top of each engine's."),
        Key("prompts", "map id → prompt", Derived("none: a matrix of traffic sequences alone needs none"),
            "Prompts, exact in tokens."),
        Key("sequences", "map name → list of prompt ids | sequence", REQUIRED,
            "Turns sent to one fresh engine process; a plain list is a sequence of kind `ordered`."),
        Key("cells", "cells", Derived("all configurations × sequences"), "Which combinations run."),
        Key("generation", "generation", Derived("see below"), "Decoding settings for every turn."),
        Key("isolation", "isolation", Derived("see below"), "Per-cell resources."),
        Key("identity", "identity", Derived("see below"), "Byte-identity checks against cold runs."),
        Key("expectations", "list of expectation", (), "Checks the gate enforces."),
        Key("baseline", "configuration name", None, "The configuration the others are candidates "
            "against (`shadowlab compare`, `budgets`, the report's decision section)."),
        Key("budgets", "list of budget", (), "Costs a candidate configuration may have, and the benefit "
            "it must bring, against `baseline` (gate checks; needs `baseline`)."),
        Key("scale", "scale", None, "The production scale the budgets are judged at (extrapolated "
            "from this run's figures); unset: as measured."),
        Key("repeat", "int", 1, "Each warm cell runs this many times, each in a fresh process (ids "
            "`<cell>.r<k>` only when above 1): the repeats give `shadowlab compare` its noise band.",
            bounds=Bounds(1, MAX_REPEAT, integer=True)),
    )),
    "engine": Section("engines.<name>", (
        Key("kind", "engine kind", REQUIRED,
            "Which adapter drives the engine: a registered kind (see *Engine kinds* below)."),
        Key("model", "model", Derived("by kind"), "The model the engine loads; the "
            "kind decides which sources it loads (*Engine kinds*)."),
        Key("binary", "path | auto", "auto",
            "The engine executable: `auto` lets the adapter find it; a path (relative to the matrix "
            "file) or a bare name on PATH must exist."),
        Key("command", "list of str", Derived("the adapter's"),
            "Command template; placeholders " + ", ".join("`{%s}`" % p for p in COMMAND_PLACEHOLDERS)
            + ". Must use `{port}`."),
        Key("flags", "list of str", (), "Flags every cell of this engine gets."),
        Key("env", "map str → str", {}, "Environment every cell of this engine gets."),
        Key("threads", "int", Derived("isolation.cores_per_cell"), "Engine threads (at most the cell's cores).",
            bounds=Bounds(1, MAX_CORES, integer=True)),
        Key("ready_timeout_s", "number", 60, "Seconds to wait for `/health` 200 and a first answer.",
            bounds=Bounds(0, MAX_SECONDS, low_open=True, unit="seconds")),
        Key("log_family", "|".join(LOG_FAMILIES), Derived("the kind's"),
            "Log format the checkpoint parser expects."),
        Key("log_patterns", "list of regex", (), "Extra parser patterns for another fork (must compile)."),
        Key("verbosity_flags", "list of str", Derived("the kind's"),
            "Flags that make the engine print checkpoint lines. Default `[]` for log_family "
            "ik_llama.cpp (no `-lv` flag) and llama.cpp-legacy (lines at WRN/INF)."),
    )),
    "model": Section("engines.<name>.model", (
        Key("preset", "str", None, "Reference-engine preset (generated on demand), with `seed`."),
        Key("seed", "int", 0, "Seed of the generated weights.", bounds=SEED),
        Key("path", "path", None, "An existing regular model file (relative to the matrix file)."),
        Key("gguf", "{preset, seed}", None, "A generated GGUF model (for llama-server)."),
    ), "Exactly one of `preset`, `path`, `gguf`."),
    "gguf": Section("engines.<name>.model.gguf", (
        Key("preset", "str", REQUIRED, "GGUF generator preset."),
        Key("seed", "int", 0, "Seed of the generated weights.", bounds=SEED),
    )),
    "configuration": Section("configurations.<name>", (
        Key("flags", "list of str", (), "Flags appended to the engine's."),
        Key("env", "map str → str", {}, "Environment merged over the engine's."),
        Key("description", "str", "", "Free text shown in the plan and report."),
        Key("pin_slots", "int", 0, "Send llama.cpp's `id_slot` on traffic turns: the k-th conversation "
            "gets slot k mod (N - 1), interlopers slot N - 1 (the engine needs N slots: -np N); 0: none.",
            bounds=Bounds(0, 4096, integer=True)),
        Key("message_delimiters", "bool", False, "Send llama.cpp's `message_delimiters` (`<|im_start|>user`) "
            "on traffic turns: user-message checkpoints where a shape with `user_delimiter` opens each "
            "user message (llama-server only)."),
    )),
    "prompt.random": Section("prompts.<id> (kind: random)", _PROMPT_COMMON + (
        Key("tokens", "int", REQUIRED, "Exact length in tokens (with n_predict it must fit the engine's "
            "context).", bounds=TOKENS),
        Key("seed", "int", REQUIRED, "Seed of the generated text.", bounds=SEED),
    )),
    "prompt.diverge": Section("prompts.<id> (kind: diverge)", _PROMPT_COMMON + (
        Key("from", "prompt id", REQUIRED, "Source prompt P."),
        Key("shared", "int", REQUIRED, "K: tokens shared with P; token K differs (1 ≤ K < len(P), K < tokens).",
            bounds=TOKENS),
        Key("tokens", "int", REQUIRED, "Exact total length.", bounds=Bounds(2, MAX_PROMPT_TOKENS, integer=True,
                                                                            hint=TOKENS.hint)),
        Key("seed", "int", REQUIRED, "Seed of the new text after the divergence point.", bounds=SEED),
    )),
    "prompt.unrelated": Section("prompts.<id> (kind: unrelated)", _PROMPT_COMMON + (
        Key("tokens", "int", REQUIRED, "Exact length in tokens.", bounds=TOKENS),
        Key("seed", "int", REQUIRED, "Seed of the generated text.", bounds=SEED),
        Key("unrelated_to", "list of prompt ids", Derived("earlier random and unrelated prompts"),
            "Prompts it must share no prefix with (its first token differs from each one's)."),
    )),
    "prompt.append": Section("prompts.<id> (kind: append)", _PROMPT_COMMON + (
        Key("from", "prompt id", REQUIRED, "Source prompt P; the result starts with all of P."),
        Key("extra", "int", REQUIRED, "Tokens appended after P.", bounds=TOKENS),
        Key("seed", "int", REQUIRED, "Seed of the appended text.", bounds=SEED),
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
    "sequence": Section("sequences.<name> (mapping form)", (
        Key("kind", " | ".join(SEQUENCE_KINDS), "ordered",
            "`ordered`: the prompts in order, one conversation (named like the sequence)."),
        Key("prompts", "list of prompt ids", REQUIRED, "The turns, in order."),
    ), "`A-C: [A, C]` is short for `A-C: {kind: ordered, prompts: [A, C]}`."),
    "sequence.traffic": Section("sequences.<name> (kind: traffic)", (
        Key("kind", "traffic", REQUIRED, "Conversations and interlopers interleaved on one server "
            "(docs/DESIGN.md §2 *Traffic sequences*); turn i is prompt id `<name>-t<iiii>`."),
        Key("description", "str", "", "Free text shown in the plan and report."),
        Key("shape", "traffic shape", Derived("shadowlab.traffic.TrafficShape's defaults"),
            "Generated traffic: the keys of `shadowlab.traffic.TrafficShape` (*sequences.<name>.shape* "
            "below). Not with `trace`."),
        Key("trace", "path", None, "Traffic from a file instead (relative to the matrix file): Mooncake "
            "JSON lines (`input_length`, `hash_ids`, optional `session_id`) or `shadowlab logs --trace`."),
        Key("format", "auto | mooncake | shadowlab-trace", "auto", "The trace's format (`auto`: by its first line)."),
        Key("limit", "int", None, "Replay at most this many requests of the trace (the first ones).",
            bounds=Bounds(1, MAX_TRAFFIC_REQUESTS, integer=True)),
        Key("reference", "replay | cold", "replay", "Identity reference per turn: `replay` one fresh "
            "process sends every turn again with `cache_prompt: false`; `cold` a fresh process per request."),
        Key("in_flight", "int", 1, "Requests the warm cell keeps in flight at once (1 to 64): each is sent "
            "in the traffic's order once fewer are in flight and its conversation's previous request "
            "has been answered; 1 sends them one after another. Above 1 the log lines of requests "
            "interleave and each turn is tied to its task by the figures both sides state "
            "(docs/DESIGN.md §2). References stay one at a time.",
            bounds=Bounds(1, MAX_IN_FLIGHT, integer=True)),
    ), "Either `shape` or `trace`. At most 4096 requests."),
    "shape": Section("sequences.<name>.shape", (
        _shape_key("conversations", "int", "Conversations in the traffic.", Bounds(1, MAX_TRAFFIC_REQUESTS, integer=True)),
        _shape_key("turns", "int", "Turns of each conversation.", Bounds(1, MAX_TRAFFIC_REQUESTS, integer=True)),
        _shape_key("concurrent", "int", "Conversations live at a time (a new one starts when one ends).",
                   Bounds(1, MAX_TRAFFIC_REQUESTS, integer=True)),
        _shape_key("system_tokens", "size", "Each conversation's system block.", _SIZE_TOKENS),
        _shape_key("turn_tokens", "size", "Each turn's history block.", _SIZE_TOKENS),
        _shape_key("volatile_tokens", "size", "The block re-rendered before the new user message (new content "
                   "every turn: turn t+1 diverges at the end of turn t's history).", _SIZE_TOKENS),
        _shape_key("user_tokens", "size", "The new user message of a turn.", _SIZE_TOKENS),
        _shape_key("interloper_share", "number", "Share of all requests that are interlopers.",
                   Bounds(0, 1, high_open=True)),
        _shape_key("interloper_tokens", "size", "An interloper's new text.", _SIZE_TOKENS),
        _shape_key("interloper_kinds", "map kind → weight", "Interloper kinds (zero: no overlap; system: "
                   "a live conversation's system block, then new text; near_duplicate: a live conversation's "
                   "last prompt cut at `near_duplicate_cut`, then new text) and their weights.", _WEIGHT),
        _shape_key("near_duplicate_cut", "size", "Where a near-duplicate cuts its prompt, a fraction of it.",
                   Bounds(0, 1)),
        _shape_key("arrival", "round_robin | random | bursts", "The order conversations send their turns in."),
        _shape_key("burst", "int", "Turns a conversation sends in a row (`arrival: bursts`).",
                   Bounds(1, MAX_TRAFFIC_REQUESTS, integer=True)),
        _shape_key("interloper_placement", "random | before_turns", "`before_turns`: a job in front of every "
                   "turn that continues a conversation."),
        _shape_key("output_tokens", "int", "Tokens each request generates.",
                   Bounds(1, MAX_PROMPT_TOKENS, integer=True)),
        _shape_key("gap_s", "number", "Seconds between two requests' arrivals.",
                   Bounds(0, MAX_SECONDS, unit="seconds")),
        _shape_key("seed", "int", "Seed of the generated traffic.", SEED),
        _shape_key("preamble", "map header length → weight", "Every prompt starts with the first n tokens "
                   "(1 to 2^20) of one header block all requests share, n drawn per conversation and "
                   "interloper by these weights.", _WEIGHT),
        _shape_key("user_delimiter", "bool", "Every user message opens with `<|im_start|>user`'s tokens (for "
                   "a configuration's `message_delimiters`)."),
    ), "A size is `n`, `[low, high]` (uniform) or `{kind: fixed | uniform | lognormal, a, b, low, high}` "
       "(lognormal: median a, sigma b, at most 20): each of its numbers within the key's bounds."),
    "cells": Section("cells", (
        Key("include", "list of selection", ({},), "Combinations to run (`[{}]`: everything)."),
        Key("exclude", "list of selection", (), "Combinations removed from the included ones."),
    ), "Warm cells are engine × configuration × sequence combinations."),
    "selection": Section("cells.include[i], cells.exclude[i]", (
        Key("engine", "glob", "*", "Engine name or `*` pattern."),
        Key("configuration", "glob", "*", "Configuration name or `*` pattern."),
        Key("sequence", "glob", "*", "Sequence name or `*` pattern."),
    )),
    "generation": Section("generation", (
        Key("n_predict", "int", 16, "Tokens generated per turn; with each prompt it must fit the context.",
            bounds=TOKENS),
        Key("temperature", "number", 0.0, "Must be ≤ 0 (greedy) unless `allow_sampling`.",
            bounds=Bounds(-10, 10)),
        Key("allow_sampling", "bool", False, "Accept temperature > 0 (identity checks become meaningless)."),
        Key("ignore_eos", "bool", False, "Keep generating past end-of-sequence."),
        Key("n_probs", "int", 0, "Top logprobs to record per generated token (llama.cpp's `n_probs`, "
            "raw /completion turns): a mismatch's triage then shows them where the "
            "outputs part. 0: none asked.", bounds=Bounds(0, MAX_N_PROBS, integer=True)),
    )),
    "isolation": Section("isolation", (
        Key("cores_per_cell", "int", 1, "Dedicated CPU cores per running cell (at most the machine's).",
            bounds=Bounds(1, MAX_CORES, integer=True)),
        Key("gpu", "none | int | list of ints", None, "`none` hides every GPU; a device index, or a list "
            "of them, is the pool each cell leases its devices from (a device serves one cell at a time, "
            "machine-wide, shared with every shadowlab on the host).", shown="none",
            bounds=Bounds(0, MAX_DEVICES - 1, integer=True)),
        Key("gpus_per_cell", "int", 1, "Devices each cell leases from `gpu` (at most the pool's size; "
            "unused with `gpu: none`).", bounds=Bounds(1, MAX_DEVICES, integer=True)),
        Key("keep_scratch", "bool", False, "Keep each cell's scratch directory after it ends."),
        Key("jobs", "int", 1, "Cells run at once (bounded by the free cores).",
            bounds=Bounds(1, MAX_CORES, integer=True)),
        Key("max_log_mib", "int", 1024, "Cap on each engine's engine.log (MiB): an engine whose log "
            "reaches it is stopped from writing more and its cell fails (infrastructure).",
            bounds=Bounds(1, 1 << 20, integer=True)),
    )),
    "identity": Section("identity", (
        Key("required", "bool", True, "A warm turn whose output differs from its cold run fails the gate."),
        Key("control", "bool", True, "Plan one cold-vs-cold control cell per engine × configuration."),
        Key("split_controls", "mismatch | all", "mismatch",
            "Which restored warm turns get a split control (a fresh process computing the turn's "
            "prompt through its batch schedule, DESIGN §5): those whose output differs from cold, "
            "or every one."),
        Key("split_sensitivity", "fail | allow | list of engine names", "fail",
            "A mismatch triaged as split sensitivity (warm equals its split control) fails the gate, "
            "or is accepted (and still reported) for every engine or for the engines listed."),
    )),
    "expectation": Section("expectations[i]", (
        Key("engine", "glob", "*", "Which cells: engine name or pattern."),
        Key("configuration", "glob", "*", "Which cells: configuration name or pattern."),
        Key("sequence", "glob", "*", "Which cells: sequence name or pattern."),
        Key("turn", "int | prompt id", Derived("every turn"),
            "The turn checked: 0-based index or the prompt id; omitted: every turn of the cell "
            "(the first one is `cold`; `identity` leaves it out, it is the reference), and `max_forced` "
            "counts over them.",
            bounds=Bounds(0, MAX_TRAFFIC_REQUESTS - 1, integer=True)),
        Key("description", "str", "", "Why this is expected (shown in the report)."),
        Key("outcome", "outcome | list of outcomes", None, "Allowed outcomes: " + ", ".join(OUTCOMES) + "."),
        Key("min_reused", "int", None, "At least this many prompt tokens reused.",
            bounds=Bounds(0, MAX_PROMPT_TOKENS, integer=True)),
        Key("min_saved_fraction", "number", None, "At least this fraction of the prompt reused.",
            bounds=FRACTION),
        Key("max_forced", "int", None, "At most this many forced full re-processings.",
            bounds=Bounds(0, MAX_TRAFFIC_REQUESTS, integer=True)),
        Key("checkpoints_created_at", "list of int", None,
            "`pos_max` values that must be among the checkpoints created on the turn.",
            bounds=Bounds(0, MAX_PROMPT_TOKENS, integer=True)),
        Key("identity", "bool", None, "Require (true) or waive (false) byte identity with the cold run."),
        Key("min_recovered_share", "number", None,
            "Traffic: Σ reused / Σ ideal (the longest prefix each turn shares with any earlier "
            "request) over the selected turns must reach this.", bounds=Bounds(0, 1, hint="70% is written 0.7")),
        Key("cascade", "bool", None,
            "Require (true) or waive (false) the erase cascade: every checkpoint alive at the turn's "
            "start with `pos_max` above its re-entry point was erased (`erased invalidated`), none kept. "
            "Needs the engine's log (not log_family none)."),
    ), "At least one check (`outcome` … `cascade`) is required."),
    "budget": Section("budgets[i]", (
        Key("engine", "glob", "*", "Which cells: engine name or pattern."),
        Key("configuration", "glob", "*", "Which configurations: name or pattern (the baseline itself "
            "is judged against itself: no benefit, its own costs)."),
        Key("sequence", "glob", "*", "Which sequences: name or pattern (each judged on its own)."),
        Key("description", "str", "", "Why this budget (shown in the report)."),
        Key("max_created_per_turn", "number", None, "At most this many checkpoints created per turn, "
            "as measured (the median over repeats).", bounds=Bounds(0, MAX_FIGURE)),
        Key("max_checkpoint_mib_per_turn", "number", None, "At most this many MiB of checkpoints "
            "created per turn, at `scale`.", bounds=Bounds(0, MAX_FIGURE)),
        Key("max_checkpoint_ms_per_turn", "number", None, "At most this many ms creating checkpoints "
            "per turn, at `scale`.", bounds=Bounds(0, MAX_FIGURE)),
        Key("min_net_benefit_ms", "number", None, "Per turn at `scale`: prefill ms saved (tokens "
            "reused beyond the baseline's × ms per token) minus checkpoint ms spent beyond the "
            "baseline's must reach this (0: the change must pay for itself).",
            bounds=Bounds(-MAX_FIGURE, MAX_FIGURE)),
    ), "At least one of the `max_*` / `min_*` keys is required."),
    "scale": Section("scale", (
        Key("name", "str", "production scale", "How the scale is named in the gate and report "
            "(e.g. `35B`)."),
        Key("checkpoint_mib", "number", None, "MiB of one checkpoint at scale (the case study: 62.9); "
            "not with `checkpoint_mib_factor`.", bounds=Bounds(0, MAX_FIGURE)),
        Key("checkpoint_ms", "number", None, "ms to create one checkpoint at scale (the case study: 63); "
            "not with `checkpoint_ms_factor`.", bounds=Bounds(0, MAX_FIGURE)),
        Key("checkpoint_mib_factor", "number", None, "Instead: the measured MiB of a checkpoint × this.",
            bounds=Bounds(0, MAX_FACTOR)),
        Key("checkpoint_ms_factor", "number", None, "Instead: the measured create ms of a checkpoint × this.",
            bounds=Bounds(0, MAX_FACTOR)),
        Key("prompt_length_factor", "number", 1, "Production prompt length ÷ this run's: tokens saved "
            "and the checkpoints a candidate creates beyond the baseline's (mid-prompt, one per batch) "
            "grow with it.", bounds=Bounds(0, MAX_FACTOR, low_open=True)),
        Key("prefill_ms_per_token", "number", None, "Prefill cost of a token at scale (2,100 tok/s: "
            "0.476); unset: the baseline's measured prefill ms ÷ tokens processed.",
            bounds=Bounds(0, MAX_FIGURE)),
    ), "Unset keys are taken as measured (factor 1)."),
}

# The keys of a budget that are checks (the rest select cells and describe).
BUDGET_KEYS = ("max_created_per_turn", "max_checkpoint_mib_per_turn", "max_checkpoint_ms_per_turn",
               "min_net_benefit_ms")

# The keys of an expectation that are checks (the rest select cells and describe).
CHECK_KEYS = ("outcome", "min_reused", "min_saved_fraction", "max_forced", "checkpoints_created_at",
              "identity", "cascade", "min_recovered_share")


def default_endpoint(kind: str) -> str:
    """A prompt's endpoint when the matrix writes none (the `endpoint` key's Derived default)."""
    return "chat" if kind == "chat" else "completion"


def schema_key(section: str, name: str) -> Key:
    """`section`'s key `name` (section `prompt`: the keys every prompt kind has)."""
    keys = _PROMPT_COMMON if section == "prompt" else SCHEMA[section].keys
    for key in keys:
        if key.name == name:
            return key
    raise KeyError(f"{section}.{name}")


def default(section: str, name: str) -> Any:
    """The default value of `section`'s key `name`, as the schema writes it."""
    key = schema_key(section, name)
    if isinstance(key.default, (Derived, _Required)):
        raise KeyError(f"{section}.{name} has no single default ({key.default!r})")
    return key.default
