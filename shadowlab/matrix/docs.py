"""docs/matrix.md's reference section, generated from the schema and the engine registry
(a test compares)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shadowlab.engines import DEFAULT_LEVEL_FAMILIES, get_adapter, known_kinds
from shadowlab.matrix.schema import SCHEMA, Derived, Key

DOC_BEGIN = "<!-- BEGIN GENERATED: matrix schema (python -m shadowlab.matrix docs/matrix.md) -->"
DOC_END = "<!-- END GENERATED -->"


def reference_markdown() -> str:
    """Markdown tables of every section and key of the schema (a numeric key's type with its bounds)."""
    parts = []
    for section in SCHEMA.values():
        parts.append(f"### `{section.title}`\n")
        if section.doc:
            parts.append(section.doc + "\n")
        parts.append("| key | type | default | meaning |\n|---|---|---|---|")
        for k in section.keys:
            kind = f"{k.type} ({k.bounds.text()})" if k.bounds is not None else k.type
            cells = (f"`{k.name}`", kind, _doc_default(k), k.doc)
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        parts.append("")
    parts.append(engine_kinds_markdown())
    return "\n".join(parts)


def engine_kinds_markdown() -> str:
    """The registered engine kinds and the defaults each one gives (shadowlab/engines/)."""
    rows = ["### Engine kinds\n",
            "What `engines.<name>.kind` may be, and what each kind fills in when the matrix is "
            "silent. A kind is one adapter module in `shadowlab/engines/`.\n",
            "| kind | `log_family` | `verbosity_flags` | `model` | context without `-c` |",
            "|---|---|---|---|---|"]
    for kind in known_kinds():
        a = get_adapter(kind)
        flags = "[" + ", ".join(a.verbosity_flags) + "]"
        model = " or ".join(f"`{s}`" for s in a.model_sources) + ("" if a.model_required else " (optional)")
        context = "not known before start" if a.default_context is None else str(a.default_context)
        cells = (f"`{kind}`", f"`{a.log_family}`", f"`{flags}`", model, context)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    rows.append("\n`verbosity_flags` is `[]` for log_family " + ", ".join(DEFAULT_LEVEL_FAMILIES)
                + " (their builds print checkpoint lines at the default level).\n")
    return "\n".join(rows)


def _doc_default(key: Key) -> str:
    if key.shown is not None:
        return f"`{key.shown}`"
    if key.required:
        return "**required**"
    if isinstance(key.default, Derived):
        return f"`{key.default.text}`"
    if key.default is None:
        return "—"
    return f"`{yaml_text(key.default)}`"


def yaml_text(value: Any) -> str:
    """`value` as a matrix writes it: YAML flow style (a tuple is a list; `'*'` quoted)."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, allow_unicode=True, width=1 << 16)
    text = text.removesuffix("\n").removesuffix("\n...")
    # A quoted scalar in the double quotes the rest of the docs use (`""`, `"*"`).
    return f'"{text[1:-1]}"' if text[:1] == "'" and "'" not in text[1:-1] and '"' not in text else text


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def write_reference(doc_path: str | Path) -> None:
    """Replace the generated section of a markdown file with `reference_markdown()`."""
    path = Path(doc_path)
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    path.write_text(f"{head}{DOC_BEGIN}\n{reference_markdown()}{DOC_END}{tail}", encoding="utf-8")
