"""The registry of engine kinds and log families: `register` / `get_adapter` / `known_kinds`,
`register_family` / `log_family` / `known_families`, and the faults the kinds take. The built-in
kinds and families are listed once here (`_BUILTIN_MODULES`, `_BUILTIN_FAMILIES`: the one registry
line a new kind adds) and imported on first use."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

from shadowlab.engines.protocol import NO_LOG, EngineAdapter, LogFamily


class UnknownEngineKind(LookupError):
    pass


_BUILTIN_MODULES = {
    "reference": "shadowlab.engines.reference",
    "llama-server": "shadowlab.engines.llama_server",
    "openai": "shadowlab.engines.openai",
}


# The families the built-in kinds write, and the package that registers each.
_BUILTIN_FAMILIES = {
    "llama.cpp": "shadowlab.engines.llama_server",
    "llama.cpp-legacy": "shadowlab.engines.llama_server",
    "ik_llama.cpp": "shadowlab.engines.llama_server",
    "reference": "shadowlab.engines.reference",
}


class _Registry:
    def __init__(self) -> None:
        self.factories: dict[str, Callable[[], EngineAdapter]] = {}
        self.families: dict[str, LogFamily] = {NO_LOG.name: NO_LOG}


_registry = _Registry()


def register(kind: str, factory: Callable[[], EngineAdapter]) -> None:
    """Make ``kind`` available to matrices; a module calls this at import time."""
    _registry.factories[kind] = factory


def unregister(kind: str) -> None:
    """Forget a kind registered with `register` (a test's own kind, once the test is done)."""
    _registry.factories.pop(kind, None)


def known_kinds() -> list[str]:
    """The built-in kinds in their documented order, then the registered ones as registered."""
    return list(dict.fromkeys([*_BUILTIN_MODULES, *_registry.factories]))


def get_adapter(kind: str) -> EngineAdapter:
    if kind not in _registry.factories and kind in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[kind])
    try:
        factory = _registry.factories[kind]
    except KeyError:
        raise UnknownEngineKind(
            f"unknown engine kind {kind!r}; known: {', '.join(known_kinds())}"
        ) from None
    return factory()


class UnknownLogFamily(LookupError):
    pass


def register_family(family: LogFamily) -> None:
    """Make a log family available to matrices (`engines.<name>.log_family`); the package of
    the kind that writes it calls this at import time."""
    _registry.families[family.name] = family


def unregister_family(name: str) -> None:
    """Forget a family registered with `register_family` (a test's own, once the test is done)."""
    if name != NO_LOG.name:
        _registry.families.pop(name, None)


def known_families() -> list[str]:
    """The built-in families in their documented order, `none`, then the registered ones."""
    return list(dict.fromkeys([*_BUILTIN_FAMILIES, NO_LOG.name, *_registry.families]))


def log_family(name: str) -> LogFamily:
    if name not in _registry.families and name in _BUILTIN_FAMILIES:
        importlib.import_module(_BUILTIN_FAMILIES[name])
    try:
        return _registry.families[name]
    except KeyError:
        raise UnknownLogFamily(f"unknown log family {name!r}; known: {', '.join(known_families())}") from None


def fault_names() -> tuple[str, ...]:
    """Every fault some engine kind takes (`shadowlab run --fault`), in kind order."""
    names: list[str] = []
    for kind in known_kinds():
        with contextlib.suppress(ImportError):  # a broken kind offers no faults
            names += get_adapter(kind).faults()
    return tuple(dict.fromkeys(names))


def check_fault(text: str) -> None:
    """ValueError unless some engine kind takes the fault `text`; its kinds' own reasons when none does."""
    reasons = []
    for kind in known_kinds():
        with contextlib.suppress(ImportError):  # a broken kind offers no faults
            adapter = get_adapter(kind)
            if not adapter.faults():
                continue
            try:
                adapter.check_fault(text)
                return
            except ValueError as exc:
                reasons.append(str(exc))
    if reasons:
        raise ValueError("; ".join(reasons))
    # No kind with faults is installed: its cells report that when they start.
