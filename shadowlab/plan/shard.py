"""Shards of a plan: which machine runs which cells, and what a part says it is a part of.

    spec = ShardSpec.parse("2/3")                    # or ShardSpec.from_ci("k8s", os.environ, count)
    assignment = assign(plan, matrix, spec.count)    # pure: same matrix, same shards, anywhere
    assignment.part(plan, spec.index)                # the Plan of shard 2's cells
    print(assignment.describe(plan, mark=spec.index))

A *unit* is a set of cells that must run on one machine: a warm cell with the cold cells its
turns are compared to, a dependent chat cold cell with the warm cell whose replies it splices in,
a control with the cold cell it repeats. Units are balanced by expected cost (prompt tokens plus
a start-up constant per fresh process) with LPT: largest first, each to the least-loaded shard
(pytest-split's ``least_duration``). docs/DESIGN.md §8 is the contract.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shadowlab.results import records, versions
from shadowlab.errors import RunDirError, ShadowlabError
from shadowlab.matrix import ChatPrompt, Matrix
from shadowlab.plan import Cell, Plan

SHARD_VERSION = versions.SHARD.current
STARTUP_TOKENS = 512  # a fresh engine process's start-up, in prompt-token equivalents
CHARS_PER_TOKEN = 4  # a chat prompt's length is not known before its engine tokenizes it
TOKENS_PER_MESSAGE = 8  # ChatML's role markers and newlines
MAX_SHARDS = 10_000


class ShardUsageError(ShadowlabError):
    """A --shard value (or the CI variable it came from) that names no shard: exit 2."""


# ---------------------------------------------------------------- which shard am I


@dataclass(frozen=True)
class ShardSpec:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        index, sep, count = text.partition("/")
        if not sep:
            raise ShardUsageError(f"--shard {text!r}: expected I/N, e.g. 1/3")
        return cls.of(_integer(index, f"--shard {text!r}: shard index"),
                      _integer(count, f"--shard {text!r}: shard count"), f"--shard {text}")

    @classmethod
    def of(cls, index: int, count: int, source: str) -> ShardSpec:
        if not 1 <= count <= MAX_SHARDS:
            raise ShardUsageError(f"{source}: the shard count must be 1..{MAX_SHARDS}, got {count}")
        if not 1 <= index <= count:
            raise ShardUsageError(f"{source}: shard {index} of {count} does not exist "
                                  f"(shards are numbered 1..{count})")
        return cls(index, count)

    @classmethod
    def from_ci(cls, source: str, env: Mapping[str, str], count: int | None = None) -> ShardSpec:
        """The shard a CI job or pod is, from its own variables (DESIGN §8). ``count``: the
        --shard-count flag, for Kubernetes (a pod is told its index, not the completions)."""
        index_var, count_var, base = CI_SOURCES[source]
        index = _integer(_variable(env, index_var, source), f"{index_var}") + (1 - base)
        if count is None:
            count = _integer(_variable(env, count_var, source), f"{count_var}")
        return cls.of(index, count, f"--shard-from {source} ({index_var}={env[index_var]})")


# source -> (index variable, count variable, the index's base)
CI_SOURCES: Mapping[str, tuple[str, str, int]] = {
    "k8s": ("JOB_COMPLETION_INDEX", "SHADOWLAB_SHARD_COUNT", 0),
    "gitlab": ("CI_NODE_INDEX", "CI_NODE_TOTAL", 1),
    "github": ("SHADOWLAB_SHARD_INDEX", "SHADOWLAB_SHARD_COUNT", 0),
}


def _variable(env: Mapping[str, str], name: str, source: str) -> str:
    value = env.get(name)
    if value is None or not value.strip():
        hint = " (or pass --shard-count N)" if name == "SHADOWLAB_SHARD_COUNT" else ""
        raise ShardUsageError(f"--shard-from {source}: ${name} is not set{hint}")
    return value


def _integer(text: str, what: str) -> int:
    stripped = text.strip()
    if not stripped.isdigit() or not stripped.isascii():
        raise ShardUsageError(f"{what}: {text!r} is not a non-negative integer")
    return int(stripped)


# ---------------------------------------------------------------- the assignment


def cell_cost(cell: Cell, matrix: Matrix) -> int:
    """Expected cost of one cell: a process start plus the prompt tokens of its turns."""
    return STARTUP_TOKENS + sum(prompt_tokens(matrix, t.prompt_id) for t in cell.turns)


def prompt_tokens(matrix: Matrix, prompt_id: str) -> int:
    prompt = matrix.prompts[prompt_id]
    if prompt.length is not None:
        return prompt.length
    if isinstance(prompt, ChatPrompt):
        text = sum(len(m.content or "") for m in prompt.messages) // CHARS_PER_TOKEN
        replies = len(prompt.reply_turns()) * matrix.generation.n_predict
        return text + replies + TOKENS_PER_MESSAGE * len(prompt.messages)
    return STARTUP_TOKENS  # a kind without a known length: count it like a start-up


def units(plan: Plan) -> list[tuple[Cell, ...]]:
    """The plan's cells grouped into units that run on one machine, each in plan order, the
    units ordered by their first cell."""
    parent = {c.id: c.id for c in plan.cells}

    def root(cell_id: str) -> str:
        while parent[cell_id] != cell_id:
            parent[cell_id] = parent[parent[cell_id]]
            cell_id = parent[cell_id]
        return cell_id

    def join(a: str, b: str | None) -> None:
        if b is not None and b in parent:
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb, key=order.__getitem__)] = min(ra, rb, key=order.__getitem__)

    order = {c.id: i for i, c in enumerate(plan.cells)}
    for cell in plan.cells:
        for turn in cell.turns:
            join(cell.id, turn.cold_cell)
        join(cell.id, cell.depends_on)
        join(cell.id, cell.control_of)
    grouped: dict[str, list[Cell]] = {}
    for cell in plan.cells:
        grouped.setdefault(root(cell.id), []).append(cell)
    return [tuple(cells) for cells in grouped.values()]


@dataclass(frozen=True)
class Assignment:
    count: int
    owners: Mapping[str, int]  # cell id -> shard index (1-based), in plan order
    costs: tuple[int, ...]  # expected cost of each shard, shard 1 first

    def cells_of(self, index: int) -> tuple[str, ...]:
        return tuple(cell_id for cell_id, owner in self.owners.items() if owner == index)

    def part(self, plan: Plan, index: int) -> Plan:
        return Plan(tuple(c for c in plan.cells if self.owners[c.id] == index), plan.notes)

    def describe(self, plan: Plan, mark: int | None = None) -> str:
        """Which shard owns what, for `shadowlab run --dry-run --shard`."""
        lines = [f"{len(plan.cells)} cells in {self.count} shards (cost: expected prompt tokens "
                 f"+ {STARTUP_TOKENS} per engine start)"]
        for index in range(1, self.count + 1):
            owned = self.cells_of(index)
            here = "  <- this shard" if index == mark else ""
            empty = " (empty: fewer units than shards)" if not owned else ""
            lines.append(f"\nshard {index}/{self.count}: {len(owned)} cells, cost "
                         f"{self.costs[index - 1]}{empty}{here}")
            lines += [f"  {cell_id}" for cell_id in owned]
        return "\n".join(lines)


def assign(plan: Plan, matrix: Matrix, count: int) -> Assignment:
    """LPT over the units: the costliest first, each to the least-loaded shard (lowest index on
    ties); ties between units by plan order. Deterministic: no hash order, no clock."""
    grouped = units(plan)
    costs = [sum(cell_cost(c, matrix) for c in unit) for unit in grouped]
    load = [0] * count
    owner_of_unit: dict[int, int] = {}
    for u in sorted(range(len(grouped)), key=lambda i: (-costs[i], i)):
        shard = min(range(count), key=lambda s: (load[s], s))
        load[shard] += costs[u]
        owner_of_unit[u] = shard + 1
    by_cell = {c.id: owner_of_unit[u] for u, unit in enumerate(grouped) for c in unit}
    return Assignment(count, {c.id: by_cell[c.id] for c in plan.cells}, tuple(load))


# ---------------------------------------------------------------- what a part says it is


@dataclass(frozen=True)
class ShardRecord:
    """shard.json: a part's claim of what it is a part of (DESIGN §8)."""

    index: int
    count: int
    matrix_name: str
    matrix_sha256: str
    plan_sha256: str
    cells: tuple[str, ...]
    owners: Mapping[str, int]
    engines: Mapping[str, Mapping[str, str] | None]
    host: str
    shard_version: int = SHARD_VERSION

    @property
    def spec(self) -> ShardSpec:
        return ShardSpec(self.index, self.count)

    def to_dict(self) -> dict[str, Any]:
        return {"shard_version": self.shard_version, "index": self.index, "count": self.count,
                "matrix_name": self.matrix_name, "matrix_sha256": self.matrix_sha256,
                "plan_sha256": self.plan_sha256, "cells": list(self.cells), "owners": dict(self.owners),
                "engines": {k: (dict(v) if v is not None else None) for k, v in self.engines.items()},
                "host": self.host}

    @classmethod
    def from_dict(cls, data: Any, *, source: str) -> ShardRecord:
        """A shard.json from another machine: every field checked, a bad one named."""
        data = versions.SHARD.read(data, source=source)  # the run directory's one version chain
        version = data[versions.SHARD.key]
        ints = {k: _field(data, k, int, source) for k in ("index", "count")}
        texts = {k: _field(data, k, str, source) for k in ("matrix_name", "matrix_sha256", "plan_sha256", "host")}
        cells = _field(data, "cells", list, source)
        owners = _field(data, "owners", dict, source)
        engines = _field(data, "engines", dict, source)
        if not all(isinstance(c, str) for c in cells):
            raise RunDirError("cells: expected a list of cell ids", path=source)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in owners.values()):
            raise RunDirError("owners: expected {cell id: shard index}", path=source)
        if not all(v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))
                   for v in engines.values()):
            raise RunDirError("engines: expected {engine: {binary_sha256, model_sha256, version} or null}",
                              path=source)
        return cls(cells=tuple(cells), owners=owners, engines=engines, shard_version=version, **ints, **texts)


def _field(data: Mapping[str, Any], key: str, tp: type, source: str) -> Any:
    value = data.get(key)
    if not isinstance(value, tp) or isinstance(value, bool):
        raise RunDirError(f"{key}: expected {tp.__name__}, got {type(value).__name__}", path=source)
    return value


def engine_identities(engines: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, str] | None]:
    """{engine: its binary/model sha256 and version} for every engine of the matrix (``engines``:
    run.py's prepared engines; an engine missing there could not be prepared: None)."""
    out: dict[str, dict[str, str] | None] = {}
    for name in names:
        prepared = engines.get(name)
        identity = getattr(prepared, "identity", None)
        out[name] = None if identity is None else {
            "binary_sha256": identity.binary_sha256, "model_sha256": identity.model_sha256,
            "version": identity.version}
    return out


def record_for(spec: ShardSpec, assignment: Assignment, plan: Plan, matrix: Matrix,
               matrix_bytes: bytes, engines: Mapping[str, dict[str, str] | None]) -> ShardRecord:
    return ShardRecord(
        index=spec.index, count=spec.count, matrix_name=matrix.name,
        matrix_sha256=matrix_sha256(matrix_bytes),
        plan_sha256=records.sha256_json(plan.to_dict()), cells=assignment.cells_of(spec.index),
        owners=dict(assignment.owners), engines=engines, host=socket.gethostname())


def matrix_sha256(matrix_yaml: bytes) -> str:
    """What identifies a matrix across machines: the bytes of a run's resolved matrix.yaml."""
    return records.sha256_bytes(matrix_yaml)


def check_resumed(then: ShardRecord, now: ShardRecord, path: str) -> None:
    """--resume of a part must be the same shard of the same plan and engines."""
    for what, a, b in (("shard", str(then.spec), str(now.spec)),
                       ("plan (sha256)", then.plan_sha256[:12], now.plan_sha256[:12]),
                       ("cells", ", ".join(then.cells), ", ".join(now.cells))):
        if a != b:
            raise RunDirError(f"shard.json: the {what} changed since this part started "
                              f"({a} then, {b} now)", path=path,
                              hint="resume with the --shard it started with, or start a new part")
    for name in sorted(set(then.engines) | set(now.engines)):
        if then.engines.get(name) != now.engines.get(name):
            raise RunDirError(f"shard.json: engine {name!r} changed since this part started "
                              f"({describe_identity(then.engines.get(name))} then, "
                              f"{describe_identity(now.engines.get(name))} now)", path=path,
                              hint="resume with the same engine build and model, or start a new part")


def describe_identity(identity: Mapping[str, str] | None) -> str:
    build = records.EngineBuild.of(dict(identity) if identity is not None else None)
    return "not prepared" if build is None else build.describe()


__all__ = ["Assignment", "CI_SOURCES", "SHARD_VERSION", "ShardRecord", "ShardSpec", "ShardUsageError",
           "assign", "cell_cost", "check_resumed", "describe_identity", "engine_identities", "matrix_sha256", "record_for",
           "units"]
