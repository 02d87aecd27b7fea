"""YAML with positions: mappings and lists that remember the line of each key and item.

Errors name the line they are about; a duplicate key (which YAML would silently collapse) is
an error too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from shadowlab.errors import MatrixError


class LineMap(dict):
    """A YAML mapping that remembers the line of each key and value (1-based)."""

    line: int
    key_lines: dict[Any, int]
    value_lines: dict[Any, int]


class LineList(list):
    line: int
    item_lines: list[int]


# libyaml's parser when available (10x faster); the constructors below are the same either way.
_SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class LineLoader(_SafeLoader):
    """SafeLoader whose mappings and sequences record where they start; duplicate keys fail."""

    def __init__(self, stream: str, file: str) -> None:
        super().__init__(stream)
        self.file = file
        self.path: list[str] = []  # key path of the value being constructed (for errors)

    def key_path(self, last: Any) -> str:
        return join_path([*self.path, last])


def join_path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) and not isinstance(part, bool) else (
            f".{part}" if text else str(part))
    return text


def _construct_map(loader: LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    result = LineMap()
    result.line = node.start_mark.line + 1
    result.key_lines, result.value_lines = {}, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        key_line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise MatrixError("a mapping key must be a plain name", file=loader.file, line=key_line,
                              key_path=join_path(loader.path))
        if key in result:
            raise MatrixError(
                f"duplicate key {key!r} (first at line {result.key_lines[key]})",
                file=loader.file, line=key_line, key_path=loader.key_path(key),
                hint="YAML would silently keep only the last one; rename or remove one of them",
            )
        loader.path.append(str(key))
        result[key] = loader.construct_object(value_node, deep=True)
        loader.path.pop()
        result.key_lines[key] = key_line
        result.value_lines[key] = value_node.start_mark.line + 1
    return result


def _construct_seq(loader: LineLoader, node: yaml.SequenceNode) -> LineList:
    result = LineList()
    for index, child in enumerate(node.value):
        loader.path.append(index)
        result.append(loader.construct_object(child, deep=True))
        loader.path.pop()
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


def parse_yaml(text: str, file: str) -> Any:
    loader = LineLoader(text, file)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise MatrixError(f"invalid YAML: {problem}", file=file, line=line,
                          hint="check indentation and quoting on or just above this line") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"invalid YAML: {exc}", file=file) from None
    finally:
        loader.dispose()
