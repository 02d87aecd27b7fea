"""The plan: every cell a matrix asks for, in a fixed order with stable ids.

`build_plan(matrix)` expands the selected engine × configuration × sequence combinations into
warm cells and adds what the identity check needs:

- one `cold` cell per (engine, configuration, prompt) that a warm cell sends after its first
  turn: that prompt alone in a fresh process, the reference a warm turn's output must equal.
  A chat prompt that splices earlier replies (`{from_turn: i}`) gets a cold cell per warm cell,
  which `depends_on` it: the cold run needs the warm run's replies to build its messages.
- one `control` cell per (engine, configuration) with `identity.control`: the first cold
  prompt again, in another fresh process (cold vs cold separates engine noise from cache
  effects).

Cell ids are `<engine>.<configuration>.<sequence>` (warm), `<engine>.<configuration>.cold.<prompt>`
(`...cold.<sequence>.<prompt>` for a dependent chat prompt) and `...control.<prompt>`; every
part is a validated name (letters, digits, `_`, `-`; at most `matrix.MAX_NAME_CHARS` = 48
characters), so an id is one safe directory name of at most 203 bytes, never `..`.

Every cell carries what running it needs (docs/DESIGN.md §3, §4): the engine's own flags and
env beside the configuration's delta, the requests it keeps in flight, the generation settings,
and per turn whether it sends message delimiters. The runner reads nothing else of the matrix
for a cell. A plan.json written before these fields reads with their defaults (none of the
stored runs' readers needs them: they were only ever read by the runner that wrote them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any

from shadowlab.matrix import ChatPrompt, EngineSpec, Generation, Matrix, TrafficSequence

PLAN_VERSION = 1


class CellKind(str, Enum):
    WARM = "warm"  # a sequence in one process: the cache under test
    COLD = "cold"  # one prompt in a fresh process: the identity reference
    CONTROL = "control"  # a cold prompt again in another fresh process
    # A restored warm turn's prompt in a fresh process through the warm turn's batch schedule
    # (issue 16, DESIGN §5): planned by the run stage after the warm cells, never by build_plan.
    SPLIT_CONTROL = "split_control"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Turn:
    index: int  # 0-based position in the cell
    prompt_id: str
    endpoint: str  # "completion" | "chat"
    cold_cell: str | None = None  # warm turns after the first: the cell holding this prompt's cold run
    # Warm turns: the conversation the turn belongs to (SequenceSpec.conversation; an ordered
    # sequence's name). Cold and control turns: None, a prompt alone in a fresh process.
    conversation: str | None = None
    # Traffic (DESIGN §2): which turn of `cold_cell` is the reference, and how it was made
    # ("cold": a fresh process for the prompt alone; "replay": a fresh process replaying the
    # traffic's turns with cache_prompt false). A reference turn itself is sent without cache.
    cold_turn: int = 0
    reference: str = "cold"
    cache_prompt: bool = True
    slot: int | None = None  # id_slot to send (a configuration's pin_slots); None: none
    split_points: tuple[int, ...] | None = None  # split controls: the batch schedule to send
    # llama.cpp's `message_delimiters` sent with the turn: a token prompt's own
    # (`prompts.<id>.message_delimiters`), a traffic turn's configuration's.
    message_delimiters: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {"index": self.index, "prompt_id": self.prompt_id, "endpoint": self.endpoint,
               "cold_cell": self.cold_cell, "conversation": self.conversation}
        # Written only when not the default: plan.json of an ordered matrix stays as it was.
        for key, plain in (("cold_turn", 0), ("reference", "cold"), ("cache_prompt", True), ("slot", None),
                           ("message_delimiters", False)):
            if getattr(self, key) != plain:
                out[key] = getattr(self, key)
        if self.split_points is not None:
            out["split_points"] = list(self.split_points)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], conversation: str | None = None) -> Turn:
        """`conversation`: what a plan.json written before turns had one means (see Cell)."""
        return cls(data["index"], data["prompt_id"], data["endpoint"], data.get("cold_cell"),
                   data.get("conversation", conversation), data.get("cold_turn", 0),
                   data.get("reference", "cold"), data.get("cache_prompt", True), data.get("slot"),
                   tuple(data["split_points"]) if data.get("split_points") is not None else None,
                   data.get("message_delimiters", False))


def generation_dict(generation: Generation) -> dict[str, Any]:
    return asdict(generation)


def generation_from(data: Mapping[str, Any] | None) -> Generation | None:
    """plan.json's `generation` (None in a plan written before cells carried it); a key this
    shadowlab does not know is left out, one it knows but the file lacks takes its default."""
    if data is None:
        return None
    known = {f.name for f in fields(Generation)}
    return Generation(**{k: v for k, v in data.items() if k in known})


def engine_flags(spec: EngineSpec) -> tuple[str, ...]:
    """The engine's own flags in the order it gets them: its verbosity flags, then its flags
    (a cell adds the configuration's delta after them)."""
    return (*spec.verbosity_flags, *spec.flags)


@dataclass(frozen=True)
class Cell:
    """One fresh engine process. `flags`/`env` are the configuration's delta over the engine's,
    `engine_flags`/`engine_env` the engine's own: the engine gets [*engine_flags, *flags]."""

    id: str
    kind: CellKind
    engine: str
    configuration: str
    sequence: str | None  # warm cells (and dependent chat cold cells): the sequence
    turns: tuple[Turn, ...]
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    depends_on: str | None = None  # a warm cell whose replies this cell's chat messages splice in
    control_of: str | None = None  # control cells: the cold cell they repeat
    engine_flags: tuple[str, ...] = ()
    engine_env: Mapping[str, str] = field(default_factory=dict)
    in_flight: int = 1  # requests kept in flight (a traffic's warm cell: its `in_flight`)
    generation: Generation | None = None  # None only in a plan.json written before cells carried it

    def to_dict(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "kind": self.kind.value,
            "engine": self.engine,
            "configuration": self.configuration,
            "sequence": self.sequence,
            "turns": [t.to_dict() for t in self.turns],
            "flags": list(self.flags),
            "env": dict(self.env),
            "depends_on": self.depends_on,
            "control_of": self.control_of,
            "engine_flags": list(self.engine_flags),
            "engine_env": dict(self.engine_env),
        }
        if self.in_flight != 1:
            out["in_flight"] = self.in_flight
        if self.generation is not None:
            out["generation"] = generation_dict(self.generation)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cell:
        # Before sequences had kinds every warm cell was one ordered conversation: its sequence.
        implied = data.get("sequence") if data["kind"] == CellKind.WARM.value else None
        return cls(
            id=data["id"],
            kind=CellKind(data["kind"]),
            engine=data["engine"],
            configuration=data["configuration"],
            sequence=data.get("sequence"),
            turns=tuple(Turn.from_dict(t, implied) for t in data["turns"]),
            flags=tuple(data.get("flags", ())),
            env=dict(data.get("env", {})),
            depends_on=data.get("depends_on"),
            control_of=data.get("control_of"),
            engine_flags=tuple(data.get("engine_flags", ())),
            engine_env=dict(data.get("engine_env", {})),
            in_flight=data.get("in_flight", 1),
            generation=generation_from(data.get("generation")),
        )


@dataclass(frozen=True)
class Plan:
    cells: tuple[Cell, ...]
    # `run -k` (plan/select.py: `selection`) and --binary/--model (matrix/overrides.py:
    # `overrides`); written only when given, so an ordinary plan.json reads as before.
    notes: Mapping[str, Any] = field(default_factory=dict)

    def cell(self, cell_id: str) -> Cell:
        for c in self.cells:
            if c.id == cell_id:
                return c
        raise KeyError(cell_id)

    def of_kind(self, kind: CellKind) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if c.kind is kind)

    def to_dict(self) -> dict[str, Any]:
        return {"plan_version": PLAN_VERSION, "cells": [c.to_dict() for c in self.cells], **self.notes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        version = data.get("plan_version", PLAN_VERSION)
        if version > PLAN_VERSION:
            raise ValueError(f"plan version {version} is newer than this shadowlab understands ({PLAN_VERSION})")
        return cls(tuple(Cell.from_dict(c) for c in data["cells"]),
                   {k: data[k] for k in ("selection", "overrides") if k in data})

    def describe(self) -> str:
        """A readable table of the cells, for `shadowlab run --dry-run`."""
        return describe(self)


def build_plan(matrix: Matrix) -> Plan:
    """Every cell of the matrix, grouped by engine then configuration: warm, cold, control."""
    selected = matrix.selected()
    cells: list[Cell] = []
    for engine in matrix.engines:
        for configuration in matrix.configurations:
            sequences = [s for e, c, s in selected if e == engine and c == configuration]
            if sequences:
                cells.extend(_group(matrix, engine, configuration, sequences))
    return Plan(tuple(_repeated(cells, matrix.repeat)))


def _repeated(cells: list[Cell], repeat: int) -> list[Cell]:
    """Each warm cell `repeat` times, `<id>.r1` … (ids unchanged for 1, so a plan without repeats
    reads as before); the cold references and controls stay one: they are what every repeat is
    compared with. A cell depending on a warm cell's replies takes them from its first repeat."""
    if repeat == 1:
        return cells
    first = {c.id: f"{c.id}.r1" for c in cells if c.kind is CellKind.WARM}
    out: list[Cell] = []
    for c in cells:
        if c.kind is CellKind.WARM:
            out += [replace(c, id=f"{c.id}.r{k}") for k in range(1, repeat + 1)]
        else:
            out.append(replace(c, depends_on=first.get(c.depends_on, c.depends_on)))
    return out


def _group(matrix: Matrix, engine: str, configuration: str, sequences: list[str]) -> list[Cell]:
    conf, spec = matrix.configurations[configuration], matrix.engines[engine]
    common = dict(engine=engine, configuration=configuration, flags=conf.flags, env=dict(conf.env),
                  engine_flags=engine_flags(spec), engine_env=dict(spec.env), generation=matrix.generation)
    prefix = f"{engine}.{configuration}"
    warm: list[Cell] = []
    cold: dict[str, Cell] = {}  # id → cell, in order of first use
    for name in sequences:
        warm_id = f"{prefix}.{name}"
        turns = []
        sequence = matrix.sequences[name]
        if isinstance(sequence, TrafficSequence):
            warm_cell, refs = _traffic_cells(sequence, warm_id, prefix, conf.pin_slots, conf.message_delimiters,
                                             common)
            warm.append(warm_cell)
            cold.update((c.id, c) for c in refs if c.id not in cold)
            continue
        for index, pid in enumerate(sequence.prompts):
            prompt = matrix.prompts[pid]
            cold_id = None
            if index > 0:
                dependent = isinstance(prompt, ChatPrompt) and bool(prompt.reply_turns())
                cold_id = f"{prefix}.cold.{name}.{pid}" if dependent else f"{prefix}.cold.{pid}"
                if cold_id not in cold:
                    cold[cold_id] = Cell(
                        id=cold_id, kind=CellKind.COLD, sequence=name if dependent else None,
                        turns=(Turn(0, pid, prompt.endpoint, message_delimiters=prompt.message_delimiters),),
                        depends_on=warm_id if dependent else None, **common)
            turns.append(Turn(index, pid, prompt.endpoint, cold_id, sequence.conversation(index),
                              message_delimiters=prompt.message_delimiters))
        warm.append(Cell(id=warm_id, kind=CellKind.WARM, sequence=name, turns=tuple(turns), **common))
    cells = warm + list(cold.values())
    if matrix.identity.control and cold:
        # Prefer a cold cell that needs no warm replies, so the control can run at any time.
        source = next((c for c in cold.values() if c.depends_on is None), next(iter(cold.values())))
        control_id = source.id.replace(".cold.", ".control.", 1)
        cells.append(Cell(
            id=control_id, kind=CellKind.CONTROL, sequence=source.sequence,
            turns=source.turns[:1],  # only the first is compared (a traffic replay has many)
            depends_on=source.depends_on, control_of=source.id, **common))
    return cells


def _traffic_cells(seq: TrafficSequence, warm_id: str, prefix: str, pin_slots: int, delimiters: bool,
                   common: Mapping[str, Any]) -> tuple[Cell, list[Cell]]:
    """A traffic's warm cell (every request in arrival order) and its identity references. A
    configuration's `message_delimiters` go with every turn, its references' included (they
    differ from the warm turn only in `cache_prompt`)."""
    slots = _pinned_slots(seq, pin_slots)
    warm_turns, refs = [], []
    replay_id = f"{prefix}.cold.{seq.name}"
    replayed: list[Turn] = []
    for index, pid in enumerate(seq.prompts):
        cold_id, cold_turn = None, 0
        # Sent concurrently, any request may be the one the fresh process serves first, and the
        # first request sent may find cache: every turn gets its reference.
        checked = index > 0 or seq.in_flight > 1
        if checked and seq.reference == "replay":
            cold_id, cold_turn = replay_id, len(replayed)
            replayed.append(Turn(len(replayed), pid, "completion", reference="replay", cache_prompt=False,
                                 message_delimiters=delimiters))
        elif checked:
            cold_id = f"{prefix}.cold.{pid}"
            refs.append(Cell(id=cold_id, kind=CellKind.COLD, sequence=None,
                             turns=(Turn(0, pid, "completion", message_delimiters=delimiters),), **common))
        warm_turns.append(Turn(index, pid, "completion", cold_id, seq.conversation(index), cold_turn,
                               seq.reference, True, slots[index], message_delimiters=delimiters))
    if replayed:
        refs.insert(0, Cell(id=replay_id, kind=CellKind.COLD, sequence=seq.name, turns=tuple(replayed), **common))
    warm = Cell(id=warm_id, kind=CellKind.WARM, sequence=seq.name, turns=tuple(warm_turns), in_flight=seq.in_flight,
                **common)
    return warm, refs


def _pinned_slots(seq: TrafficSequence, pin_slots: int) -> list[int | None]:
    """id_slot per turn: the k-th conversation (by first request) on slot k mod (N - 1),
    interlopers on slot N - 1; all None without pin_slots."""
    if not pin_slots:
        return [None] * len(seq.prompts)
    order: dict[str, int] = {}
    out: list[int | None] = []
    for index in range(len(seq.prompts)):
        conversation = seq.conversation(index)
        if conversation is None:
            out.append(pin_slots - 1)
        else:
            out.append(order.setdefault(conversation, len(order)) % (pin_slots - 1))
    return out


def describe(plan: Plan) -> str:
    counts = {k: len(plan.of_kind(k)) for k in CellKind}
    header = (f"{len(plan.cells)} cells: " + ", ".join(f"{n} {k.value}" for k, n in counts.items()
                                                      if n or k is not CellKind.SPLIT_CONTROL))
    rows = [("cell", "kind", "engine", "configuration", "turns", "delta")]
    for c in plan.cells:
        turns = " → ".join(t.prompt_id for t in c.turns)
        if c.depends_on:
            turns += f"  (replies from {c.depends_on})"
        delta = " ".join([*c.flags, *(f"{k}={v}" for k, v in c.env.items())]) or "-"
        rows.append((c.id, c.kind.value, c.engine, c.configuration, turns, delta))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [header, ""]
    if "selection" in plan.notes:  # a partial run says so before its cells
        from shadowlab.plan.select import Partial

        lines[1:1] = [Partial.from_dict(plan.notes["selection"]).describe()]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r[:-1], widths)) + "  " + r[-1])
    return "\n".join(lines)
