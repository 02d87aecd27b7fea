"""Engine adapters: what differs between the engines shadowlab can drive.

An adapter knows how to locate and hash an engine and its model, how to build its
command line and environment, how to phrase a turn as an HTTP request and read the
answer back. It never starts processes or keeps state between cells: the runner (the
``shadowlab/run/`` package, with ``shadowlab/run/isolation.py`` and ``process_group.py``) does
that, identically for every engine.

Adapters register by ``kind`` (the matrix's ``engines.<name>.kind``)::

    adapter = get_adapter("reference")

The built-in kinds live in sibling packages (``engines/<kind>/``) and are imported on first
use, so a broken or missing optional engine never stops the others from working. Everything
kind-specific is asked of the adapter (docs/DESIGN.md §3): its flag grammar (`context_size`,
`batch_sizes`), how a split control is sent (`split_control`, `split_request_fields`,
`split_control_flags`), how a turn is asked and its answer read (`completion_request`,
`read_streamed`, `parse_response`), the variables its engine reads (`controlled_env`), its
faults (`faults`, `check_fault`) and the log family its engine writes (`LogFamily`: the
family's patterns and facts; the parsers themselves are `shadowlab.logs.parse`'s). Nothing
outside `engines/` names a kind, a family or a kind's flag (tests/shadowlab/test_layout_guards.py).

One module per job, their names re-exported here: `protocol` (`EngineAdapter` and the data it
answers in), `base` (`EngineAdapterBase`, the llama.cpp-shaped defaults, the defensive readers of
engine output), `registry` (kinds, log families, faults), `streamed` (server-sent events).
"""

from __future__ import annotations

from typing import Any

from shadowlab.engines.base import (MAX_TOKEN_ID, MAX_TOP_LOGPROBS, EngineAdapterBase, request_fields, token_ids,
                                    top_logprobs)
from shadowlab.engines.protocol import (MODEL_SOURCES, NO_LOG, READY_PROBE_TEXT, EngineAdapter, EngineIdentity, StarterRefused,
                                        LogFamily, MalformedAnswer, TurnRequest, TurnResult)
from shadowlab.engines.registry import (_BUILTIN_FAMILIES, UnknownEngineKind, UnknownLogFamily, check_fault,
                                        fault_names, get_adapter, known_families, known_kinds, log_family, register,
                                        register_family, unregister, unregister_family)
from shadowlab.results.files import sha256_file  # re-exported: the adapters' one file hash

__all__ = [
    "DEFAULT_LEVEL_FAMILIES",
    "MODEL_SOURCES",
    "NO_LOG",
    "EngineAdapter",
    "EngineAdapterBase",
    "EngineIdentity",
    "LogFamily",
    "MalformedAnswer",
    "StarterRefused",
    "TurnRequest",
    "TurnResult",
    "UnknownEngineKind",
    "UnknownLogFamily",
    "check_fault",
    "fault_names",
    "get_adapter",
    "known_families",
    "known_kinds",
    "log_family",
    "register",
    "register_family",
    "unregister",
    "unregister_family",
    "sha256_file",
    "token_ids",
    # also these, which the kinds' packages and the tests import from here
    "MAX_TOKEN_ID",
    "MAX_TOP_LOGPROBS",
    "READY_PROBE_TEXT",
    "request_fields",
    "top_logprobs",
]


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_LEVEL_FAMILIES":
        # The built-in families printing at the default level, by name (docs/matrix.md names them).
        return tuple(sorted(f for f in _BUILTIN_FAMILIES if log_family(f).default_level))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
