"""Sequence kinds: one registry, so a new kind is a module of its own plus one `register` call.

    register(SequenceKind(name, read, dump, section))   a kind's reader, its dump, its keys
    get(name) -> SequenceKind | None
    known() -> tuple[str, ...]                            the registered names, sorted

A sequence in the matrix is a plain list of prompt ids (`ordered`) or a mapping whose `kind`
names a registered kind; that kind's `read` turns the mapping into a `SequenceSpec` (or a
subclass) and `dump` turns it back into what matrix.yaml holds (a resume compares it as text).
A kind with keys of its own gives their `Section`: it becomes `SCHEMA["sequence.<name>"]`, so
unknown and missing keys are reported like every other section's, and docs/matrix.md lists it.
The plan, the runner and the judge take any `SequenceSpec` as an ordered list of turns; only a
kind that interleaves conversations (`traffic`) needs more of them. Built in: `ordered`
(matrix/read_prompts.py), `traffic` (matrix/read_traffic.py); tests/shadowlab/test_sequence_extension.py
adds one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shadowlab.matrix.schema import SCHEMA, Section
from shadowlab.matrix.values import _At, _Context, _Skipped, _closest_hint, _str

__all__ = ["SequenceInput", "SequenceKind", "get", "known", "prompt_ids", "register", "unregister"]


@dataclass(frozen=True)
class SequenceInput:
    """What a kind's reader is given: the sequence's name, its mapping and where it is, the
    matrix's prompts, the load's context (the matrix's directory, its engines) and the prompts
    that failed to load (a sequence naming one is left out, its prompt's error said once)."""

    name: str
    body: Any  # the mapping (yamlpos.LineMap)
    at: _At
    prompts: Mapping[str, Any]  # prompt id -> specs.PromptSpec
    ctx: _Context
    failed: frozenset[str]


@dataclass(frozen=True)
class SequenceKind:
    name: str
    read: Callable[[SequenceInput], Any]  # -> specs.SequenceSpec (specs imports dump, which asks here)
    dump: Callable[[Any], Any]  # specs.SequenceSpec -> what matrix.yaml holds
    section: Section | None = None  # its mapping form's keys; None: the shared `sequence` section


_KINDS: dict[str, SequenceKind] = {}


def register(kind: SequenceKind) -> None:
    if kind.name in _KINDS:
        raise ValueError(f"sequence kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    if kind.section is not None:
        SCHEMA[f"sequence.{kind.name}"] = kind.section


def unregister(name: str) -> None:
    """Take a kind off the registry (a test's kind, when the test ends)."""
    kind = _KINDS.pop(name)
    if kind.section is not None:
        SCHEMA.pop(f"sequence.{name}", None)


def get(name: object) -> SequenceKind | None:
    return _KINDS.get(name) if isinstance(name, str) else None


def known() -> tuple[str, ...]:
    return tuple(sorted(_KINDS))


def prompt_ids(items: Iterable[tuple[Any, _At]], given: SequenceInput) -> tuple[str, ...]:
    """Prompt ids from (value, where) items, each a prompt of the matrix: an unknown one fails
    naming the closest; one whose prompt failed to load leaves the sequence out."""
    ids = []
    for v, a in items:
        pid = _str(v, a)
        if pid in given.failed:
            raise _Skipped(pid)
        if pid not in given.prompts:
            a.fail(f"unknown prompt {pid!r}", _closest_hint(pid, [*given.prompts, *sorted(given.failed)], "prompts"))
        ids.append(pid)
    return tuple(ids)
