"""The matrix loader's reading of one value: every value travels with where it was written (`_At`),
so any check can point at it; the typed readers (`_int`, `_str`, `_list`, `_named_map`, ...); every
error of a matrix at once (`_Errors`, `MatrixErrors`); what later sections need from earlier ones
(`_Context`)."""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from shadowlab.bounds import Bounds
from shadowlab.errors import MatrixError
from shadowlab.matrix.schema import COUNT, MAX_NAME_CHARS, MAX_TEXT_CHARS, NAME_RE, SCHEMA, default, schema_key
from shadowlab.matrix.yamlpos import LineList, LineMap


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class _At:
    file: str
    path: str
    line: int | None

    def fail(self, message: str, hint: str | None = None, *, line: int | None = None) -> NoReturn:
        # `from None`: a MatrixError is the whole story, even when raised while handling another error.
        raise MatrixError(message, file=self.file, line=line or self.line, key_path=self.path, hint=hint) from None

    def key(self, name: Any, line: int | None) -> _At:
        return _At(self.file, f"{self.path}.{name}" if self.path else str(name), line or self.line)

    def item(self, index: int, line: int | None) -> _At:
        return _At(self.file, f"{self.path}[{index}]", line or self.line)


_SHOWN_CHARS = 60  # of a value echoed in an error: a matrix may hold a megabyte in one string


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _SHOWN_CHARS:
        shown = repr(text[:_SHOWN_CHARS]) if isinstance(value, str) else text[:_SHOWN_CHARS]
        return f"{shown}… ({len(text):,} characters)"
    return repr(value)


def _closest_hint(word: str, known: Iterable[str], what: str = "") -> str:
    known = [str(k) for k in known]
    same_case = [k for k in known if k.lower() == str(word).lower()]
    prefixed = [k for k in known if k.lower().startswith(str(word).lower())] if word else []
    close = same_case or difflib.get_close_matches(str(word), known, n=1, cutoff=0.6) or prefixed[:1]
    if close:
        return f"did you mean {close[0]!r}?"
    label = f"known {what}: " if what else "known: "
    return label + (", ".join(known) if known else "(none)")


def _fields(value: Any, at: _At, section: str, errors: _Errors | None = None) -> dict[str, tuple[Any, _At]]:
    """Check a mapping against a schema section; return key → (value, where). Every unknown
    and missing key of the mapping is reported at once; with `errors`, they are recorded there
    and the known keys returned (the top level: the other sections are still checked)."""
    if not isinstance(value, LineMap):
        at.fail(f"expected a mapping, got {_describe(value)}")
    sec = SCHEMA[section]
    known = sec.names()
    problems = _Errors()
    meant = set()  # required keys an unknown one is a typo of: its error says so already
    for key in value:
        if key not in known:
            meant.update(difflib.get_close_matches(str(key), known, n=1, cutoff=0.6))
            with problems.item():
                at.key(key, value.key_lines[key]).fail(f"unknown key {key!r}", _closest_hint(str(key), known, "keys"))
    for k in sec.keys:
        if k.required and k.name not in value and k.name not in meant:
            with problems.item():
                at.fail(f"missing required key {k.name!r}", f"{sec.title} needs: "
                        + ", ".join(x.name for x in sec.keys if x.required), line=value.line)
    if errors is not None:
        errors.extend(problems)
    else:
        problems.check()
    return {key: (v, at.key(key, value.value_lines[key])) for key, v in value.items() if key in known}


def _given(f: dict[str, tuple[Any, _At]], section: str, key: str, read: Callable[..., Any], *args: Any) -> Any:
    """`key` as written, through `read`; omitted: the schema's default (written only there)."""
    return read(*f[key], *args) if key in f else default(section, key)


def _bounded(value: Any, at: _At, bounds: Bounds) -> Any:
    """A number within `bounds` (finite; an integer where they say so: a YAML float is none)."""
    if isinstance(value, bool) or not isinstance(value, int if bounds.integer else (int, float)):
        at.fail(f"expected {bounds.what} {bounds.text()}, got {_describe(value)}")
    problem = bounds.problem(value)
    if problem is not None:
        at.fail(problem, bounds.hint)
    return value


def _num(f: dict[str, tuple[Any, _At]], section: str, key: str) -> Any:
    """A numeric key as written, within its schema bounds; omitted: the schema's default."""
    return _given(f, section, key, _bounded, schema_key(section, key).bounds)


def _int(value: Any, at: _At) -> int:
    """A whole number ≥ 0 that is no key of its own (a turn index inside a message)."""
    return _bounded(value, at, COUNT)


def _bool(value: Any, at: _At, hint: str | None = None) -> bool:
    if not isinstance(value, bool):
        at.fail(f"expected true or false, got {_describe(value)}", hint)
    return value


def _str(value: Any, at: _At, *, nonempty: bool = True) -> str:
    if not isinstance(value, str):
        at.fail(f"expected a string, got {_describe(value)}")
    if nonempty and not value.strip():
        at.fail("expected a non-empty string")
    return _no_nul(value, at)


def _no_nul(text: str, at: _At) -> str:
    # A NUL cannot be passed in an argv or environment entry, nor in a path: refuse it here,
    # where it was written, rather than as a ValueError when the engine is spawned.
    if "\0" in text:
        at.fail("contains a NUL character (\\0)", "remove it: no program argument, variable or path can hold one")
    return text


def _text(value: Any, at: _At) -> str:
    """Free text (descriptions): copied into the plan and every report, so bounded."""
    text = _str(value, at, nonempty=False)
    if len(text) > MAX_TEXT_CHARS:
        at.fail(f"{len(text)} characters of free text; at most {MAX_TEXT_CHARS}",
                "shorten it, or link to a longer note")
    return text


def _choice(value: Any, at: _At, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        at.fail(f"expected one of {', '.join(choices)}, got {_describe(value)}",
                _closest_hint(str(value), choices, "values") if isinstance(value, str) else None)
    return value


def _scalar_text(value: Any, at: _At) -> str:
    """Flags and env values: strings, with YAML numbers (8192, 0) taken as their text."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        at.fail(f"expected a string, got {_describe(value)}",
                "quote it ('true', '1') if the engine wants that text" if isinstance(value, bool) else None)
    return _no_nul(str(value), at)


def _list(value: Any, at: _At) -> list[tuple[Any, _At]]:
    if not isinstance(value, LineList):
        at.fail(f"expected a list, got {_describe(value)}")
    return [(v, at.item(i, value.item_lines[i])) for i, v in enumerate(value)]


def _str_list(value: Any, at: _At) -> tuple[str, ...]:
    return tuple(_scalar_text(v, a) for v, a in _list(value, at))


def _env(value: Any, at: _At) -> dict[str, str]:
    if not isinstance(value, LineMap):
        at.fail(f"expected a mapping of variable → value, got {_describe(value)}")
    env = {}
    for key, v in value.items():
        key_at = at.key(key, value.key_lines[key])
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            key_at.fail(f"{key!r} is not an environment variable name")
        env[key] = _scalar_text(v, at.key(key, value.value_lines[key]))
    return env


def _name(value: Any, at: _At, what: str) -> str:
    """A name that becomes part of a directory name: one safe path component, never `..`."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        shown = _describe(value if not isinstance(value, str) else value[:MAX_NAME_CHARS + 8])
        at.fail(f"{what} name {shown} cannot be used in a cell id or directory name",
                "use letters, digits, '_' and '-' (first not '-'; no dots, slashes or spaces)")
    if len(value) > MAX_NAME_CHARS:
        at.fail(f"{what} name is {len(value)} characters long; at most {MAX_NAME_CHARS}",
                "a cell id joins up to four names into one directory name, which may have 255 bytes")
    return value


def _named_map(value: Any, at: _At, what: str, *, nonempty: bool = True) -> list[tuple[str, Any, _At]]:
    """A `name → body` mapping (engines, prompts, ...): names checked, order kept."""
    if not isinstance(value, LineMap):
        at.fail(f"expected a mapping of {what} name → definition, got {_describe(value)}")
    if nonempty and not value:
        at.fail(f"no {what}s defined", line=value.line)
    out = []
    for key, body in value.items():
        name = _name(key, at.key(key, value.key_lines[key]), what)
        out.append((name, body, at.key(key, value.value_lines[key])))
    return out


MAX_ERRORS_SHOWN = 20


class MatrixErrors(MatrixError):
    """Several independent errors of one matrix, shown together (the first MAX_ERRORS_SHOWN by
    line, then how many more). A MatrixError itself: its file, line and key path are the
    first error's, so a caller that reads one error still gets the first."""

    def __init__(self, errors: list[MatrixError]) -> None:
        self.errors = sorted(errors, key=lambda e: (e.line is None, e.line or 0))
        first = self.errors[0]
        super().__init__(first.message, file=first.file, line=first.line, key_path=first.key_path,
                         hint=first.hint)

    def __str__(self) -> str:
        shown = self.errors[:MAX_ERRORS_SHOWN]
        lines = [f"{self.errors[0].file or '<matrix>'}: {len(self.errors)} errors"]
        for error in shown:
            lines += ["  " + line for line in str(error).splitlines()]
        if len(self.errors) > len(shown):
            lines.append(f"  ... and {len(self.errors) - len(shown)} more (fix these and load again)")
        return "\n".join(lines)


class _Skipped(Exception):
    """An entry that names one that already failed: its error would only echo that one."""


class _Errors:
    """Collects MatrixErrors so that independent entries are all checked (`with errors.item():`)."""

    def __init__(self) -> None:
        self.errors: list[MatrixError] = []
        self.failed_prompts: set[str] = set()  # prompts that failed: a sequence naming one is skipped

    @contextlib.contextmanager
    def item(self) -> Iterator[None]:
        try:
            yield
        except _Skipped:
            pass
        except MatrixErrors as exc:
            self.errors.extend(exc.errors)
        except MatrixError as exc:
            self.errors.append(exc)

    def extend(self, other: _Errors) -> None:
        self.errors.extend(other.errors)

    def __bool__(self) -> bool:
        return bool(self.errors)

    def check(self) -> None:
        """Raise what was collected: the one error as it is, several as MatrixErrors."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise MatrixErrors(self.errors)

    def named(self, f: dict[str, tuple[Any, _At]], key: str, what: str,
              read: Callable[[str, Any, _At], Any]) -> dict[str, Any]:
        """A `name → body` section read entry by entry; a failed entry is left out."""
        out: dict[str, Any] = {}
        if key not in f:
            return out
        with self.item():
            for name, body, at in _named_map(*f[key], what):
                with self.item():
                    out[name] = read(name, body, at)
        return out


@dataclass
class _Context:
    """What later sections need from earlier ones while loading."""

    file: str
    base_dir: Path
    check_files: bool
    cores_per_cell: int = 1
