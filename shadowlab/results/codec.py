"""The one JSON dataclass codec of the run directory's records (meta.json, verdicts.json).

    to_jsonable(obj)              a dataclass tree as JSON-ready data (enums by value, paths as str)
    from_jsonable(tp, value)      lenient: shadowlab's own derived files (unknown keys ignored,
                                  a missing key takes the field's default)
    checked(tp, value)            strict: every field's type checked (cell records), a wrong one
                                  is a FieldError naming its field path (`turns[2].prompt_tokens`)
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


class FieldError(ValueError):
    """A record value of the wrong type; `where` is its field path (`turns[2].prompt_tokens`)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or '(top level)'}: {message}")


def json_type_name(value: Any) -> str:
    """How an error message names a JSON value (`null`, `the string 'x'`, `a list`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def from_jsonable(tp: Any, value: Any) -> Any:
    """The JSON dataclass codec's reader for shadowlab's own derived files (verdicts.json):
    unknown keys are ignored and a missing key takes the field's default (files of older
    schemas), scalars are kept as stored; a value of the wrong shape is a ValueError naming its
    field path. (Cell records go through ``meta_from_dict``: every field checked.)"""
    return _from_jsonable(tp, value, lenient=True)


def _from_jsonable(tp: Any, value: Any, where: str = "", *, lenient: bool = False) -> Any:
    """`value` (parsed JSON) as type `tp`, checked all the way down: a record is engine-made
    and disk-made data, so a wrong type is reported with its field path, never met later."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(inner) != 1:
            raise TypeError(f"unsupported record type {tp}")  # a schema bug, not a bad record
        return _from_jsonable(inner[0], value, where, lenient=lenient)
    if value is None:
        if lenient:
            return None
        raise FieldError(where, f"missing or null; expected {type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise FieldError(where, f"expected an object, got {json_type_name(value)}")
        hints = typing.get_type_hints(tp)
        prefix = f"{where}." if where else ""
        fields = dataclasses.fields(tp)
        if lenient:  # missing: the field's default
            fields = [f for f in fields if f.name in value or not _has_default(f)]
        return tp(**{f.name: _from_jsonable(hints[f.name], value.get(f.name), prefix + f.name, lenient=lenient)
                     for f in fields})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        known = [m.value for m in tp]
        if value not in known:
            raise FieldError(where, f"{json_type_name(value)} is not one of "
                              + ", ".join(map(str, known)))
        return tp(value)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise FieldError(where, f"expected a list, got {json_type_name(value)}")
        return [_from_jsonable(item, v, f"{where}[{i}]", lenient=lenient) for i, v in enumerate(value)]
    if origin is tuple:  # tuple[X, ...]
        item = (typing.get_args(tp) or (Any,))[0]
        if not isinstance(value, list):
            raise FieldError(where, f"expected a list, got {json_type_name(value)}")
        return tuple(_from_jsonable(item, v, f"{where}[{i}]", lenient=lenient) for i, v in enumerate(value))
    if origin is dict:
        _, item = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise FieldError(where, f"expected an object, got {json_type_name(value)}")
        return {k: _from_jsonable(item, v, f"{where}.{k}", lenient=lenient) for k, v in value.items()}
    return value if lenient else _scalar(tp, value, where)


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _scalar(tp: Any, value: Any, where: str) -> Any:
    if tp is float:  # JSON has one number type: 3 is a valid float
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _wrong(where, "a number", value)
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _wrong(where, "an integer", value)
    if tp in (str, bool):
        return value if isinstance(value, tp) else _wrong(where, {str: "a string", bool: "true or false"}[tp], value)
    raise TypeError(f"unsupported record type {tp}")


def _wrong(where: str, expected: str, value: Any) -> typing.NoReturn:
    raise FieldError(where, f"expected {expected}, got {json_type_name(value)}")


def checked(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp``, every field checked (FieldError naming the field path)."""
    return _from_jsonable(tp, value)


def type_name(tp: Any) -> str:
    """A type as the documentation spells it (module prefixes dropped)."""
    text = str(tp) if not isinstance(tp, type) else tp.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", text)
