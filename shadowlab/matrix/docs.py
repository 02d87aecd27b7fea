"""docs/matrix.md's reference section, generated from the schema (a test compares)."""

from __future__ import annotations

from pathlib import Path

from shadowlab.matrix.schema import SCHEMA, Key

DOC_BEGIN = "<!-- BEGIN GENERATED: matrix schema (python -m shadowlab.matrix docs/matrix.md) -->"
DOC_END = "<!-- END GENERATED -->"


def reference_markdown() -> str:
    """Markdown tables of every section and key of the schema."""
    parts = []
    for section in SCHEMA.values():
        parts.append(f"### `{section.title}`\n")
        if section.doc:
            parts.append(section.doc + "\n")
        parts.append("| key | type | default | meaning |\n|---|---|---|---|")
        for k in section.keys:
            cells = (f"`{k.name}`", k.type, _doc_default(k), k.doc)
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        parts.append("")
    return "\n".join(parts)


def _doc_default(key: Key) -> str:
    if key.required:
        return "**required**"
    if key.default is None:
        return "—"
    if isinstance(key.default, bool):
        return "`true`" if key.default else "`false`"
    if key.default == "":
        return '`""`'
    return f"`{key.default}`"


def write_reference(doc_path: str | Path) -> None:
    """Replace the generated section of a markdown file with `reference_markdown()`."""
    path = Path(doc_path)
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    path.write_text(f"{head}{DOC_BEGIN}\n{reference_markdown()}{DOC_END}{tail}", encoding="utf-8")
