"""The matrix's `cells`, `generation`, `isolation` and `identity` sections: which cells run (selections
of engine, configuration and sequence names), how they generate, isolate and are judged for identity."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from shadowlab.matrix.schema import schema_key
from shadowlab.matrix.specs import CellsSpec, Generation, Identity, Isolation, Selection
from shadowlab.matrix.values import _At, _bool, _bounded, _choice, _closest_hint, _describe, _fields, _list, _num, _str


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

    # Only the keys written: the dataclass fills the others with the schema's defaults.
    return CellsSpec(**{key: selections(key) for key in f})


def _generation(value: Any, at: _At) -> Generation:
    f = _fields(value, at, "generation")
    # Only the keys written: the dataclass fills the others with the schema's defaults.
    g = Generation(**{key: _bool(*f[key]) if key in ("allow_sampling", "ignore_eos")
                      else _num(f, "generation", key) for key in f})
    if g.temperature > 0 and not g.allow_sampling:
        f["temperature"][1].fail(
            f"temperature {g.temperature:g} is not greedy; warm-vs-cold identity needs greedy decoding",
            "use temperature: 0, or set allow_sampling: true to accept non-greedy decoding")
    return g


def _isolation(value: Any, at: _At) -> Isolation:
    f = _fields(value, at, "isolation")
    read = {"gpu": _gpu, "keep_scratch": _bool}
    isolation = Isolation(**{key: read[key](*f[key]) if key in read else _num(f, "isolation", key) for key in f})
    pool = isolation.devices
    if pool is not None and isolation.gpus_per_cell > len(pool):
        f["gpus_per_cell"][1].fail(f"{isolation.gpus_per_cell} devices per cell, but isolation.gpu names "
                                   f"{len(pool)}", "name more devices in isolation.gpu, or lower gpus_per_cell")
    return isolation


def _gpu(raw: Any, at: _At) -> int | tuple[int, ...] | None:
    if raw == "none":
        return None
    index = schema_key("isolation", "gpu").bounds
    if isinstance(raw, list):
        if not raw or any(isinstance(d, bool) or not isinstance(d, int) for d in raw) \
                or len(set(raw)) != len(raw):
            at.fail(f"expected a list of distinct device indices (0, 1, ...), got {_describe(raw)}")
        return tuple(_bounded(d, a, index) for d, a in _list(raw, at))
    if isinstance(raw, bool) or not isinstance(raw, int):
        at.fail(f"expected none or a device index ({index.text()}) or a list of them, got {_describe(raw)}")
    return _bounded(raw, at, index)


def _identity(value: Any, at: _At, engines: Any = None) -> Identity:
    f = _fields(value, at, "identity")
    out: dict[str, Any] = {key: _bool(*f[key]) for key in ("required", "control") if key in f}
    if "split_controls" in f:
        out["split_controls"] = _choice(*f["split_controls"], ("mismatch", "all"))
    if "split_sensitivity" in f:
        raw, s_at = f["split_sensitivity"]
        if isinstance(raw, list):
            names = tuple(_str(v, a) for v, a in _list(raw, s_at))
            unknown = [n for n in names if engines is not None and n not in engines]
            if unknown:
                s_at.fail(f"split_sensitivity names no engine of this matrix: {', '.join(unknown)}")
            out["split_sensitivity"] = names
        else:
            out["split_sensitivity"] = _choice(raw, s_at, ("fail", "allow"))
    return Identity(**out)
