"""Back to YAML-ready data: the run directory's resolved matrix.yaml, which `load` reads back.

Imports no spec class, not even for type hints (specs.py imports this module for
`Matrix.to_dict`, and the import graph is one way, tests/test_import_cycles.py): each spec is
read by its attributes (a prompt by its `kind`), whichever class it is.
"""

from __future__ import annotations

from typing import Any

from shadowlab.matrix import sequences
from shadowlab.matrix.schema import BUDGET_KEYS, CHECK_KEYS


def matrix_to_dict(m: Any) -> dict[str, Any]:  # a specs.Matrix
    return {
        "version": m.version,
        "name": m.name,
        "description": m.description,
        "engines": {n: _engine_to_dict(e) for n, e in m.engines.items()},
        "configurations": {n: _configuration_to_dict(c) for n, c in m.configurations.items()},
        "prompts": {n: _prompt_to_dict(p) for n, p in m.prompts.items()},
        "sequences": {n: _sequence_to_dict(s) for n, s in m.sequences.items()},
        "cells": {
            "include": [_selection_to_dict(s) for s in m.cells.include],
            "exclude": [_selection_to_dict(s) for s in m.cells.exclude],
        },
        "generation": vars(m.generation).copy(),
        "isolation": {**vars(m.isolation), "gpu": _gpu_to_yaml(m.isolation.gpu)},
        "identity": _identity_to_dict(m.identity),
        "expectations": [_expectation_to_dict(x) for x in m.expectations],
        **_comparison_to_dict(m),
    }


def _identity_to_dict(identity: Any) -> dict[str, Any]:
    """The split-control keys (issue 16) only when set: a matrix without them dumps as before
    (a resume compares matrix.yaml as text)."""
    out = {"required": identity.required, "control": identity.control}
    if identity.split_controls != "mismatch":
        out["split_controls"] = identity.split_controls
    if identity.split_sensitivity != "fail":
        allowed = identity.split_sensitivity
        out["split_sensitivity"] = list(allowed) if isinstance(allowed, tuple) else allowed
    return out


def _comparison_to_dict(m: Any) -> dict[str, Any]:  # a specs.Matrix
    """baseline, budgets, scale: written only when set (a resume compares matrix.yaml
    as text, so a matrix without them dumps as before)."""
    out: dict[str, Any] = {}
    if m.baseline is not None:
        out["baseline"] = m.baseline
    if m.budgets:
        out["budgets"] = [{**_selection_to_dict(b.selection), "description": b.description,
                           **{k: getattr(b, k) for k in BUDGET_KEYS if getattr(b, k) is not None}}
                          for b in m.budgets]
    if m.scale is not None:
        out["scale"] = {k: v for k, v in vars(m.scale).items() if v is not None}
    if m.repeat != 1:
        out["repeat"] = m.repeat
    return out


def _configuration_to_dict(c: Any) -> dict[str, Any]:
    out = {"flags": list(c.flags), "env": dict(c.env), "description": c.description}
    if c.pin_slots:  # written only when set: a resume compares matrix.yaml as text
        out["pin_slots"] = c.pin_slots
    if c.message_delimiters:
        out["message_delimiters"] = True
    return out


def _engine_to_dict(e: Any) -> dict[str, Any]:  # a specs.EngineSpec
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


def _gpu_to_yaml(gpu: int | tuple[int, ...] | None) -> Any:
    return "none" if gpu is None else list(gpu) if isinstance(gpu, tuple) else gpu


def _prompt_to_dict(p: Any) -> dict[str, Any]:  # a PromptSpec subclass, by its kind
    out: dict[str, Any] = {"kind": p.kind, "endpoint": p.endpoint, "message_delimiters": p.message_delimiters,
                           "description": p.description}
    if p.kind == "random":
        out.update(tokens=p.tokens, seed=p.seed)
    elif p.kind == "diverge":
        out.update({"from": p.source, "shared": p.shared, "tokens": p.tokens, "seed": p.seed})
    elif p.kind == "unrelated":
        out.update(tokens=p.tokens, seed=p.seed, unrelated_to=list(p.unrelated_to))
    elif p.kind == "append":
        out.update({"from": p.source, "extra": p.extra, "seed": p.seed})
    elif p.kind == "chat":
        out["messages"] = [
            {"role": m.role, "content": m.content if m.from_turn is None else {"from_turn": m.from_turn}}
            for m in p.messages
        ]
    return out


def _sequence_to_dict(s: Any) -> list[str] | dict[str, Any]:
    # An ordered sequence stays a plain list: a resume compares matrix.yaml as text.
    kind = sequences.get(s.kind)  # each kind writes its own (matrix/sequences.py)
    return kind.dump(s) if kind is not None else {"kind": s.kind, "prompts": list(s.prompts)}


def _traffic_to_dict(s: Any) -> dict[str, Any]:
    import dataclasses

    out: dict[str, Any] = {"kind": "traffic", "description": s.description, "reference": s.reference}
    if s.in_flight != 1:  # written only when set: resumes compare matrix.yaml as text
        out["in_flight"] = s.in_flight
    src = s.source
    if hasattr(src, "sha256"):  # a trace file: its resolved path
        out.update(trace=str(src.path), format=src.format)
        if src.limit is not None:
            out["limit"] = src.limit
        return out
    shape = {}
    for name, value in dataclasses.asdict(src).items():
        if name in ("interloper_kinds", "preamble"):  # (key, weight) pairs: a mapping in YAML
            value = {k: w for k, w in value}
        elif isinstance(value, dict):  # a Dist
            value = dict(value)
        elif name == "user_delimiter" and not value:  # written only when set: resumes compare text
            continue
        shape[name] = value
    out["shape"] = shape
    return out


def _selection_to_dict(s: Any) -> dict[str, str]:  # a specs.Selection
    return {"engine": s.engine, "configuration": s.configuration, "sequence": s.sequence}


def _expectation_to_dict(x: Any) -> dict[str, Any]:  # a specs.Expectation
    out: dict[str, Any] = _selection_to_dict(x.selection)
    if x.turn is not None:
        out["turn"] = x.turn
    if x.description:
        out["description"] = x.description
    for key in CHECK_KEYS:
        value = getattr(x, key)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out

