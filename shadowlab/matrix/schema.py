"""The matrix schema: every key a matrix may hold, with its type, default and meaning.

`SCHEMA` is the single source of truth for the keys: validation (`validate.py`) rejects any key
it does not list, and docs/matrix.md's reference section is generated from it (`docs.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shadowlab.logparse import FAMILIES

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
    read wrong in YAML (gpu: `none`, not null)."""

    name: str
    type: str
    default: Any
    doc: str
    shown: str | None = None

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
    Key("endpoint", "completion | chat", Derived("completion (chat for kind chat)"),
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
            "`<cell>.r<k>` only when above 1): the repeats give `shadowlab compare` its noise band."),
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
        Key("threads", "int", Derived("isolation.cores_per_cell"), "Engine threads (at most the cell's cores)."),
        Key("ready_timeout_s", "number", 60, "Seconds to wait for `/health` 200 and a first answer."),
        Key("log_family", "|".join(LOG_FAMILIES), Derived("the kind's"),
            "Log format the checkpoint parser expects."),
        Key("log_patterns", "list of regex", (), "Extra parser patterns for another fork (must compile)."),
        Key("verbosity_flags", "list of str", Derived("the kind's"),
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
        Key("flags", "list of str", (), "Flags appended to the engine's."),
        Key("env", "map str → str", {}, "Environment merged over the engine's."),
        Key("description", "str", "", "Free text shown in the plan and report."),
        Key("pin_slots", "int", 0, "Send llama.cpp's `id_slot` on traffic turns: the k-th conversation "
            "gets slot k mod (N - 1), interlopers slot N - 1 (the engine needs N slots: -np N); 0: none."),
        Key("message_delimiters", "bool", False, "Send llama.cpp's `message_delimiters` (`<|im_start|>user`) "
            "on traffic turns: user-message checkpoints where a shape with `user_delimiter` opens each "
            "user message (llama-server only)."),
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
        Key("unrelated_to", "list of prompt ids", Derived("earlier random and unrelated prompts"),
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
            "Generated traffic: the keys of `shadowlab.traffic.TrafficShape` (conversations, turns, "
            "concurrent, system_tokens, turn_tokens, volatile_tokens (the re-rendered block), "
            "user_tokens, interloper_share, interloper_tokens, interloper_kinds (zero, system, "
            "near_duplicate → weight), near_duplicate_cut, interloper_placement (random | before_turns: "
            "a job in front of every turn that continues a conversation), arrival (round_robin | "
            "random | bursts), burst, output_tokens, gap_s, seed, preamble (header length → weight), user_delimiter (true: every "
            "user message opens with `<|im_start|>user`'s tokens, for a configuration's `message_delimiters`)); a size is `n`, `[low, high]` (uniform) or "
            "`{kind: lognormal, a: median, b: sigma, low, high}`. Not with `trace`."),
        Key("trace", "path", None, "Traffic from a file instead (relative to the matrix file): Mooncake "
            "JSON lines (`input_length`, `hash_ids`, optional `session_id`) or `shadowlab logs --trace`."),
        Key("format", "auto | mooncake | shadowlab-trace", "auto", "The trace's format (`auto`: by its first line)."),
        Key("limit", "int", None, "Replay at most this many requests of the trace (the first ones)."),
        Key("reference", "replay | cold", "replay", "Identity reference per turn: `replay` one fresh "
            "process sends every turn again with `cache_prompt: false`; `cold` a fresh process per request."),
        Key("in_flight", "int", 1, "Requests the warm cell keeps in flight at once (1 to 64): each is sent "
            "in the traffic's order once fewer are in flight and its conversation's previous request "
            "has been answered; 1 sends them one after another. Above 1 the log lines of requests "
            "interleave and each turn is tied to its task by the figures both sides state "
            "(docs/DESIGN.md §2). References stay one at a time."),
    ), "Either `shape` or `trace`. At most 4096 requests."),
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
        Key("n_predict", "int", 16, "Tokens generated per turn; with each prompt it must fit the context."),
        Key("temperature", "number", 0.0, "Must be ≤ 0 (greedy) unless `allow_sampling`."),
        Key("allow_sampling", "bool", False, "Accept temperature > 0 (identity checks become meaningless)."),
        Key("ignore_eos", "bool", False, "Keep generating past end-of-sequence."),
        Key("n_probs", "int", 0, "Top logprobs to record per generated token (llama.cpp's `n_probs`, "
            "at most 20; raw /completion turns): a mismatch's triage then shows them where the "
            "outputs part. 0: none asked."),
    )),
    "isolation": Section("isolation", (
        Key("cores_per_cell", "int", 1, "Dedicated CPU cores per running cell (at most the machine's)."),
        Key("gpu", "none | int | list of ints", None, "`none` hides every GPU; a device index, or a list "
            "of them, is the pool each cell leases its devices from (a device serves one cell at a time, "
            "machine-wide, shared with every shadowlab on the host).", shown="none"),
        Key("gpus_per_cell", "int", 1, "Devices each cell leases from `gpu` (at most the pool's size; "
            "unused with `gpu: none`)."),
        Key("keep_scratch", "bool", False, "Keep each cell's scratch directory after it ends."),
        Key("jobs", "int", 1, "Cells run at once (bounded by the free cores)."),
        Key("max_log_mib", "int", 1024, "Cap on each engine's engine.log (MiB): an engine whose log "
            "reaches it is stopped from writing more and its cell fails (infrastructure)."),
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
            "(the first one is `cold`), and `max_forced` counts over them."),
        Key("description", "str", "", "Why this is expected (shown in the report)."),
        Key("outcome", "outcome | list of outcomes", None, "Allowed outcomes: " + ", ".join(OUTCOMES) + "."),
        Key("min_reused", "int", None, "At least this many prompt tokens reused."),
        Key("min_saved_fraction", "number 0..1", None, "At least this fraction of the prompt reused."),
        Key("max_forced", "int", None, "At most this many forced full re-processings."),
        Key("checkpoints_created_at", "list of int", None,
            "`pos_max` values that must be among the checkpoints created on the turn."),
        Key("identity", "bool", None, "Require (true) or waive (false) byte identity with the cold run."),
        Key("min_recovered_share", "number 0..1", None,
            "Traffic: Σ reused / Σ ideal (the longest prefix each turn shares with any earlier "
            "request) over the selected turns must reach this."),
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
            "as measured (the median over repeats)."),
        Key("max_checkpoint_mib_per_turn", "number", None, "At most this many MiB of checkpoints "
            "created per turn, at `scale`."),
        Key("max_checkpoint_ms_per_turn", "number", None, "At most this many ms creating checkpoints "
            "per turn, at `scale`."),
        Key("min_net_benefit_ms", "number", None, "Per turn at `scale`: prefill ms saved (tokens "
            "reused beyond the baseline's × ms per token) minus checkpoint ms spent beyond the "
            "baseline's must reach this (0: the change must pay for itself)."),
    ), "At least one of the `max_*` / `min_*` keys is required."),
    "scale": Section("scale", (
        Key("name", "str", "production scale", "How the scale is named in the gate and report "
            "(e.g. `35B`)."),
        Key("checkpoint_mib", "number", None, "MiB of one checkpoint at scale (the case study: 62.9); "
            "not with `checkpoint_mib_factor`."),
        Key("checkpoint_ms", "number", None, "ms to create one checkpoint at scale (the case study: 63); "
            "not with `checkpoint_ms_factor`."),
        Key("checkpoint_mib_factor", "number", None, "Instead: the measured MiB of a checkpoint × this."),
        Key("checkpoint_ms_factor", "number", None, "Instead: the measured create ms of a checkpoint × this."),
        Key("prompt_length_factor", "number", 1, "Production prompt length ÷ this run's: tokens saved "
            "and the checkpoints a candidate creates beyond the baseline's (mid-prompt, one per batch) "
            "grow with it."),
        Key("prefill_ms_per_token", "number", None, "Prefill cost of a token at scale (2,100 tok/s: "
            "0.476); unset: the baseline's measured prefill ms ÷ tokens processed."),
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


def default(section: str, name: str) -> Any:
    """The default value of `section`'s key `name`, as the schema writes it (section `prompt`:
    the keys every prompt kind has)."""
    keys = _PROMPT_COMMON if section == "prompt" else SCHEMA[section].keys
    for key in keys:
        if key.name == name:
            if isinstance(key.default, (Derived, _Required)):
                raise KeyError(f"{section}.{name} has no single default ({key.default!r})")
            return key.default
    raise KeyError(f"{section}.{name}")
