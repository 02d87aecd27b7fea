"""The matrix file: what to run, loaded and validated before anything starts.

`load(path)` reads a YAML matrix and returns a frozen `Matrix`, or raises one `MatrixError`
naming the file, the line, the key path and, where it helps, a hint. One module per job:

- `yamlpos`: YAML whose mappings and lists remember the line of each key and item;
- `schema`: every key a matrix may hold (`SCHEMA`), the single source of truth for the keys;
- `specs`: the frozen dataclasses of a loaded matrix;
- `validate`: `load` / `loads`, the checks across sections, `context_size`, `check_machine`;
- `values`: one value read with where it was written (`_At`), the typed readers, every error
  at once (`MatrixErrors`);
- `read_engines`, `read_prompts`, `read_traffic`, `read_cells`, `read_expectations`: one
  section (or a few related ones) of the YAML each;
- `dump`: back to YAML-ready data (`Matrix.to_dict`, the run directory's matrix.yaml);
- `docs`: docs/matrix.md's reference section, generated from the schema
  (`python -m shadowlab.matrix docs/matrix.md`).

This package re-exports the public names, so `from shadowlab.matrix import load, Matrix` works.
"""

from shadowlab.matrix.docs import DOC_BEGIN, DOC_END, reference_markdown, write_reference
from shadowlab.matrix.schema import (
    CHAT_ROLES,
    CHECK_KEYS,
    COMMAND_PLACEHOLDERS,
    ENDPOINTS,
    LOG_FAMILIES,
    MATRIX_VERSION,
    MAX_MATRIX_BYTES,
    MAX_NAME_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_TEXT_CHARS,
    OUTCOMES,
    PROMPT_KINDS,
    SEQUENCE_KINDS,
    REQUIRED,
    SCHEMA,
    Key,
    Section,
)
from shadowlab.matrix.specs import (
    TOKEN_PROMPTS,
    AppendPrompt,
    Budget,
    CellsSpec,
    ChatMessage,
    ChatPrompt,
    ConfigurationSpec,
    DivergePrompt,
    EngineSpec,
    Expectation,
    Generation,
    Identity,
    Isolation,
    Matrix,
    ModelSpec,
    PromptSpec,
    RandomPrompt,
    Scale,
    Selection,
    SequenceSpec,
    TrafficSequence,
    UnrelatedPrompt,
)
from shadowlab.matrix.validate import check_machine, context_size, load, loads

__all__ = [
    "AppendPrompt", "Budget", "CHAT_ROLES", "CHECK_KEYS", "COMMAND_PLACEHOLDERS", "CellsSpec", "ChatMessage",
    "ChatPrompt", "ConfigurationSpec", "DOC_BEGIN", "DOC_END", "DivergePrompt",
    "ENDPOINTS", "EngineSpec", "Expectation", "Generation", "Identity", "Isolation",
    "Key", "LOG_FAMILIES", "MATRIX_VERSION", "MAX_MATRIX_BYTES", "MAX_NAME_CHARS", "MAX_PROMPT_TOKENS",
    "MAX_TEXT_CHARS", "Matrix", "ModelSpec", "OUTCOMES", "PROMPT_KINDS", "PromptSpec", "REQUIRED", "SEQUENCE_KINDS",
    "RandomPrompt", "SCHEMA", "Scale", "Section", "Selection", "SequenceSpec", "TOKEN_PROMPTS", "TrafficSequence",
    "UnrelatedPrompt", "check_machine", "context_size", "load", "loads", "reference_markdown",
    "write_reference",
]
