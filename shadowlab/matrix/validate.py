"""Loading and validating a matrix: YAML in, a frozen `Matrix` or one `MatrixError` out.

`load(path)` names the file, the line, the key path and, where it helps, a hint. Every value
travels with where it was written (`_At`), so any check can point at it.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import hashlib
import importlib.util
import re
import shutil
import string
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from shadowlab.bounds import Bounds
from shadowlab.engines import EngineAdapter, get_adapter, known_families, known_kinds
from shadowlab.errors import MatrixError
from shadowlab.matrix.schema import (
    BUDGET_KEYS,
    CHAT_ROLES,
    CHECK_KEYS,
    COUNT,
    MAX_SIGMA,
    COMMAND_PLACEHOLDERS,
    ENDPOINTS,
    MATRIX_VERSION,
    MAX_MATRIX_BYTES,
    MAX_NAME_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_TEXT_CHARS,
    NAME_RE,
    OUTCOMES,
    PROMPT_KINDS,
    SCHEMA,
    SEQUENCE_KINDS,
    SHAPE_LENGTHS,
    TOKENS,
    default,
    default_endpoint,
    schema_key,
)
from shadowlab.matrix.specs import (
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
    traffic_prompt_id,
)
from shadowlab import traffic
from shadowlab.errors import TrafficError
from shadowlab.matrix import traffic_kind
from shadowlab.matrix.traffic_kind import TraceSource
from shadowlab.matrix.yamlpos import LineList, LineMap, parse_yaml
from shadowlab.results.records import FileRefused, read_regular_file

MAX_TRACE_BYTES = 64 << 20  # a trace file is read whole at load
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CASCADE_HINT = ("write `cascade: true` (every checkpoint above the re-entry point must be erased) or "
                 "`cascade: false` (waive the default cascade check on these turns)")


# --------------------------------------------------------------------------------------------
# Validation helpers: each value travels with where it was written.


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


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
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


# --------------------------------------------------------------------------------------------
# Every error at once.

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


# --------------------------------------------------------------------------------------------
# Sections.


@dataclass
class _Context:
    """What later sections need from earlier ones while loading."""

    file: str
    base_dir: Path
    check_files: bool
    cores_per_cell: int = 1


def load(path: str | Path, *, check_files: bool = True) -> Matrix:
    """Read and validate a matrix file. Raises `MatrixError`; never starts anything.

    `check_files=False` skips the checks that look at this machine (model files, binaries), for
    reading a matrix recorded elsewhere. `-` reads standard input (`shadowlab init - | shadowlab
    run -`); its relative paths resolve from the working directory.
    """
    if str(path) == "-":
        return _load_stdin(check_files)
    path = Path(path)
    file = str(path)
    try:
        text = read_regular_file(path, MAX_MATRIX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise MatrixError("no such matrix file", file=file, hint="check the path") from None
    except FileRefused as exc:
        raise MatrixError(f"cannot read the matrix file: {exc}", file=file,
                          hint="a matrix is a regular YAML file of at most "
                               f"{MAX_MATRIX_BYTES >> 20} MiB") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"cannot read the matrix file: {exc}", file=file) from None
    data = parse_yaml(text, file)
    ctx = _Context(file=file, base_dir=path.resolve().parent, check_files=check_files)
    return _matrix(data, ctx, path)


def _load_stdin(check_files: bool) -> Matrix:
    raw = sys.stdin.buffer.read(MAX_MATRIX_BYTES + 1)  # bounded: a pipe may never end
    if len(raw) > MAX_MATRIX_BYTES:
        raise MatrixError(f"more than {MAX_MATRIX_BYTES >> 20} MiB on standard input", file="<stdin>",
                          hint="a matrix is a YAML file of at most that size")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MatrixError(f"standard input is not UTF-8 text: {exc}", file="<stdin>") from None
    data = parse_yaml(text, "<stdin>")
    ctx = _Context(file="<stdin>", base_dir=Path.cwd(), check_files=check_files)
    return _matrix(data, ctx, Path("-"))


def loads(text: str, *, file: str = "<matrix>", base_dir: str | Path = ".", check_files: bool = True) -> Matrix:
    """Like `load`, from text (file names the source in errors; paths resolve under base_dir)."""
    if len(text) > MAX_MATRIX_BYTES:
        raise MatrixError(f"{len(text)} characters; a matrix may hold at most {MAX_MATRIX_BYTES >> 20} MiB",
                          file=file)
    data = parse_yaml(text, file)
    ctx = _Context(file=file, base_dir=Path(base_dir).resolve(), check_files=check_files)
    return _matrix(data, ctx, Path(file))


def _matrix(data: Any, ctx: _Context, path: Path) -> Matrix:
    root = _At(ctx.file, "", 1)
    if data is None:
        root.fail("the matrix file is empty", "start from `shadowlab init` or matrices/ckpt.yaml")
    errors = _Errors()
    # Phase 1: each section, and each entry of one, on its own: every error they hold at once.
    f = _fields(data, root, "matrix", errors)
    version = MATRIX_VERSION
    with errors.item():
        version = _num(f, "matrix", "version")
        if version != MATRIX_VERSION:
            f["version"][1].fail(f"matrix version {version} is not supported (this shadowlab reads "
                                 f"{MATRIX_VERSION})", "upgrade shadowlab" if version > MATRIX_VERSION else None)
    isolation = Isolation()
    if "isolation" in f:
        with errors.item():
            isolation = _isolation(*f["isolation"])
    ctx.cores_per_cell = isolation.cores_per_cell
    engines = errors.named(f, "engines", "engine", lambda n, b, a: _engine(n, b, a, ctx))
    if "configurations" in f:
        configurations = errors.named(f, "configurations", "configuration", _configuration)
    else:  # the schema's default: each named configuration with no delta
        configurations = {n: ConfigurationSpec(n) for n in default("matrix", "configurations")}
    prompts: dict[str, PromptSpec] = {}
    if "prompts" in f:
        with errors.item():
            prompts = _prompts(*f["prompts"], errors)
    sequences: dict[str, SequenceSpec] = {}
    if "sequences" in f:
        with errors.item():
            sequences = _sequences(*f["sequences"], prompts, ctx, errors)
    name, description, generation = "", "", Generation()
    with errors.item():
        name = _name(*f["name"], "matrix") if "name" in f else ""
    with errors.item():
        description = _given(f, "matrix", "description", _text)
    if "generation" in f:
        with errors.item():
            generation = _generation(*f["generation"])
    errors.check()  # what follows reads across sections: an error above would only echo here
    # Phase 2: what spans sections, each check on its own.
    cells, identity = CellsSpec(), Identity()
    if "cells" in f:
        with errors.item():
            cells = _cells(*f["cells"], engines, configurations, sequences)
    if "identity" in f:
        with errors.item():
            identity = _identity(*f["identity"], engines)
    errors.check()
    matrix = Matrix(
        path=path,
        version=version,
        name=name,
        description=description,
        engines=engines,
        configurations=configurations,
        prompts=prompts,
        sequences=sequences,
        cells=cells,
        generation=generation,
        isolation=isolation,
        identity=identity,
        expectations=default("matrix", "expectations"),
        lines={"isolation.cores_per_cell": _line_of(data, "isolation", "cores_per_cell")},
    )
    if not matrix.selected():
        (f["cells"][1] if "cells" in f else root).fail("the matrix selects no cells",
                                                        "check cells.include / cells.exclude")
    with errors.item():
        _check_chat_turns(matrix, f["sequences"][1], data["sequences"])
    if "prompts" in f:
        with errors.item():
            _check_context(matrix, f["prompts"][1], data["prompts"])
    with errors.item():
        _check_traffic_context(matrix, f["sequences"][1], data["sequences"])
    if "expectations" in f:
        selected = matrix.selected()
        expectations = []
        with errors.item():
            for v, a in _list(*f["expectations"]):
                with errors.item():
                    expectations.append(_expectation(v, a, matrix, selected))
        matrix = replace(matrix, expectations=tuple(expectations))
    with errors.item():
        matrix = _baseline_and_budgets(matrix, f, errors)
    errors.check()
    return matrix


def _line_of(data: LineMap, section: str, key: str) -> int | None:
    """Where `section.key` is written, else where `section` is, else None."""
    body = data.get(section)
    if isinstance(body, LineMap) and key in body:
        return body.value_lines[key]
    return data.key_lines.get(section)


def _engine(name: str, body: Any, at: _At, ctx: _Context) -> EngineSpec:
    f = _fields(body, at, "engine")
    kind = _choice(*f["kind"], tuple(known_kinds()))
    adapter = get_adapter(kind)  # the kind's own facts: defaults, model sources, presets
    if ctx.check_files:
        _check_requirements(adapter, f["kind"][1])
    if "model" in f:
        model = _model(*f["model"], ctx, adapter)
    elif not adapter.model_required:
        model = None
    else:
        at.fail("missing required key 'model'", "e.g. model: {preset: tiny, seed: 0}", line=body.line)
    binary = _given(f, "engine", "binary", _binary, ctx)
    command = _command(*f["command"]) if "command" in f else None
    threads = _num(f, "engine", "threads") if "threads" in f else ctx.cores_per_cell
    if threads > ctx.cores_per_cell:
        (f["threads"][1]).fail(
            f"threads {threads} exceeds isolation.cores_per_cell {ctx.cores_per_cell}",
            "a cell's threads run on its own cores; raise isolation.cores_per_cell or lower threads")
    timeout = float(_num(f, "engine", "ready_timeout_s"))
    family = _choice(*f["log_family"], tuple(known_families())) if "log_family" in f else adapter.log_family
    return EngineSpec(
        name=name,
        kind=kind,
        model=model,
        binary=binary,
        command=command,
        flags=_given(f, "engine", "flags", _str_list),
        env=dict(_given(f, "engine", "env", _env)),
        threads=threads,
        ready_timeout_s=timeout,
        log_family=family,
        log_patterns=_given(f, "engine", "log_patterns", _log_patterns),
        verbosity_flags=_str_list(*f["verbosity_flags"]) if "verbosity_flags" in f
        else adapter.default_verbosity(family),
    )


ENGINE_INSTALL = "pip install torch==2.13.0 && pip install -e '.[engine]'"


def _check_requirements(adapter: EngineAdapter, at: _At) -> None:
    """The Python modules an engine kind's processes import (the reference engine: pyproject's
    `engine` extra, which `pip install -e .` alone leaves out) must be installed here: else every
    cell would fail minutes later, one by one."""
    missing = [m for m in getattr(adapter, "python_requirements", ()) if not _importable(m)]
    if missing:
        at.fail(f"the {adapter.kind} engine needs {', '.join(missing)}, not installed in this Python "
                f"({sys.executable})",
                f"install the engine extra: {ENGINE_INSTALL} (from the repository root; torch first, "
                "so pip takes the CPU wheel), or use an engine of kind llama-server")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it (blocked)
        return False


def _model(value: Any, at: _At, ctx: _Context, adapter: EngineAdapter) -> ModelSpec:
    f = _fields(value, at, "model")
    sources = [k for k in ("preset", "path", "gguf") if k in f]
    if len(sources) != 1:
        at.fail("a model needs exactly one of preset, path, gguf"
                + (f" (got {', '.join(sources)})" if sources else ""),
                "e.g. model: {preset: tiny, seed: 0} or model: {path: models/x.gguf}", line=value.line)
    source = sources[0]
    if source not in adapter.model_sources:
        at.fail(f"a {adapter.kind} engine cannot load a {source} model",
                adapter.model_hint or f"kind {adapter.kind} loads: " + ", ".join(adapter.model_sources))
    if source == "path":
        if "seed" in f:
            f["seed"][1].fail("seed only applies to a generated model (preset or gguf)")
        return ModelSpec("path", path=_existing_path(*f["path"], ctx, "model file"))
    if source == "gguf":
        if "seed" in f:
            f["seed"][1].fail("put the seed inside gguf: {preset: ..., seed: ...}")
        g = _fields(*f["gguf"], "gguf")
        seed = _num(g, "gguf", "seed")
        return ModelSpec("gguf", preset=_str(*g["preset"]), seed=seed)
    seed = _num(f, "model", "seed")
    preset = _str(*f["preset"])
    known = adapter.presets()
    if known and preset not in known:
        f["preset"][1].fail(f"unknown {adapter.kind}-engine preset {preset!r}",
                            _closest_hint(preset, known, "presets"))
    return ModelSpec("preset", preset=preset, seed=seed)


def _existing_path(value: Any, at: _At, ctx: _Context, what: str) -> Path:
    text = _str(value, at)
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = ctx.base_dir / path
    if ctx.check_files and not path.exists():
        at.fail(f"{what} {text!r} does not exist (looked for {path})",
                "relative paths are resolved from the matrix file's directory")
    if ctx.check_files and not path.is_file():
        # A device (/dev/zero), a FIFO or a directory would be hashed or read forever.
        at.fail(f"{what} {text!r} is not a regular file (looked for {path})",
                f"name the {what} itself")
    return path


def _binary(value: Any, at: _At, ctx: _Context) -> str:
    text = _str(value, at)
    if text == "auto":
        return text
    if "/" in text:
        return str(_existing_path(value, at, ctx, "binary"))
    found = shutil.which(text)
    if found is None:
        if ctx.check_files:
            at.fail(f"binary {text!r} is not on PATH", "give a path, or `auto` to let the adapter find it")
        return text
    return found


def _command(value: Any, at: _At) -> tuple[str, ...]:
    items = _list(value, at)
    if not items:
        at.fail("the command template is empty")
    out, used = [], set()
    for v, a in items:
        text = _scalar_text(v, a)
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
        except ValueError as exc:
            a.fail(f"bad template {text!r}: {exc}", "write a literal brace as {{ or }}")
        for name in names:
            if name not in COMMAND_PLACEHOLDERS:
                a.fail(f"unknown placeholder {{{name}}}",
                       _closest_hint(name, COMMAND_PLACEHOLDERS, "placeholders"))
        used |= names
        out.append(text)
    if "port" not in used:
        at.fail("the command template never uses {port}", "each cell gets its own port; pass it with {port}")
    return tuple(out)


def _log_patterns(value: Any, at: _At) -> tuple[str, ...]:
    out = []
    for v, a in _list(value, at):
        text = _str(v, a)
        try:
            re.compile(text)
        except re.error as exc:
            a.fail(f"regex does not compile: {exc}", "YAML single quotes keep backslashes as written")
        out.append(text)
    return tuple(out)


def _configuration(name: str, body: Any, at: _At) -> ConfigurationSpec:
    if body is None:  # `plain:` with nothing under it: no delta
        return ConfigurationSpec(name)
    f = _fields(body, at, "configuration")
    # Only the keys written: the dataclass fills the others with the schema's defaults.
    read = {"flags": _str_list, "env": _env, "description": _text, "pin_slots": _pin_slots,
            "message_delimiters": _bool}
    return ConfigurationSpec(name, **{key: read[key](*f[key]) for key in f})


def _pin_slots(value: Any, at: _At) -> int:
    n = _bounded(value, at, schema_key("configuration", "pin_slots").bounds)
    if n == 1:
        at.fail("pin_slots 1 would put conversations and interlopers on the same slot",
                "use 0 (no id_slot) or at least 2 (with -np N)")
    return n


# -- prompts -----------------------------------------------------------------------------------


def _prompts(value: Any, at: _At, errors: _Errors | None = None) -> dict[str, PromptSpec]:
    """Every prompt, in order. With `errors`, a prompt that fails is recorded there and left out,
    and a prompt built from it is left out silently (its error would only repeat the source's)."""
    entries = _named_map(value, at, "prompt", nonempty=False)  # a traffic-only matrix needs none
    names = [n for n, _, _ in entries]
    raw: dict[str, tuple[Any, _At]] = {n: (b, a) for n, b, a in entries}
    kinds = {n: b.get("kind") if isinstance(b, dict) else None for n, b, _ in entries}
    prompts: dict[str, PromptSpec] = {}
    failed: set[str] = set()
    # Build in dependency order so lengths of sources are known; cycles are reported.
    visiting: list[str] = []

    def build(pid: str) -> PromptSpec:
        if pid in prompts:
            return prompts[pid]
        if pid in failed:
            raise _Skipped(pid)
        if pid in visiting:
            cycle = " → ".join(visiting[visiting.index(pid):] + [pid])
            raw[pid][1].fail(f"prompts depend on each other in a cycle: {cycle}")
        visiting.append(pid)
        try:
            prompts[pid] = _prompt(pid, *raw[pid], names, kinds, build)
        except MatrixError:
            failed.add(pid)
            raise
        finally:
            visiting.remove(pid)
        return prompts[pid]

    for pid in names:
        if errors is None:
            build(pid)
            continue
        with errors.item():
            build(pid)
    if errors is not None:  # sequences naming them are not judged again
        errors.failed_prompts |= {pid for pid in names if pid not in prompts}
    return {pid: prompts[pid] for pid in names if pid in prompts}


def _prompt(pid: str, body: Any, at: _At, names: list[str], kinds: Mapping[str, Any],
            build: Callable[[str], PromptSpec]) -> PromptSpec:
    if not isinstance(body, LineMap):
        at.fail(f"expected a prompt definition (a mapping with `kind`), got {_describe(body)}")
    if "kind" not in body:
        at.fail("missing required key 'kind'", "one of: " + ", ".join(PROMPT_KINDS), line=body.line)
    kind = _choice(body["kind"], at.key("kind", body.value_lines["kind"]), PROMPT_KINDS)
    f = _fields(body, at, f"prompt.{kind}")
    endpoint = _choice(*f["endpoint"], ENDPOINTS) if "endpoint" in f else default_endpoint(kind)
    if kind != "chat" and endpoint == "chat":
        f["endpoint"][1].fail("a token prompt cannot go to the chat endpoint",
                              "token prompts are sent as token ids to /completion; use kind: chat for messages")
    delimiters = _given(f, "prompt", "message_delimiters", _bool)
    if delimiters and endpoint != "completion":
        f["message_delimiters"][1].fail("message_delimiters only applies to the completion endpoint")
    common = dict(id=pid, kind=kind, endpoint=endpoint, message_delimiters=delimiters,
                  description=_given(f, "prompt", "description", _text))

    def source() -> PromptSpec:
        src_at = f["from"][1]
        src = _str(*f["from"])
        if src == pid:
            src_at.fail("a prompt cannot be built from itself")
        if src not in names:
            src_at.fail(f"unknown prompt {src!r}", _closest_hint(src, names, "prompts"))
        spec = build(src)
        if spec.length is None:
            src_at.fail(f"prompt {src!r} is a chat prompt; only token prompts can be a source")
        return spec

    def num(key: str) -> int:
        return _num(f, f"prompt.{kind}", key)

    if kind == "random":
        return RandomPrompt(**common, tokens=num("tokens"), seed=num("seed"))
    if kind == "diverge":
        src = source()
        tokens, shared = num("tokens"), num("shared")
        if shared >= src.length:
            f["shared"][1].fail(f"shared {shared} must be below the length of {src.id!r} ({src.length} tokens)",
                                "token `shared` is where the prompts differ; to continue all of it use kind: append")
        if shared >= tokens:
            f["shared"][1].fail(f"shared {shared} must be below tokens {tokens}",
                                "the prompt needs at least one token after the divergence point")
        return DivergePrompt(**common, source=src.id, shared=shared, tokens=tokens, seed=num("seed"))
    if kind == "append":
        src = source()
        extra = num("extra")
        if src.length + extra > MAX_PROMPT_TOKENS:
            f["extra"][1].fail(f"{src.id!r} ({src.length} tokens) + extra {extra} is longer than "
                               f"{MAX_PROMPT_TOKENS} tokens", TOKENS.hint)
        return AppendPrompt(**common, source=src.id, extra=extra, seed=num("seed"), source_length=src.length)
    if kind == "unrelated":
        return UnrelatedPrompt(**common, tokens=num("tokens"), seed=num("seed"),
                               unrelated_to=_unrelated_to(pid, f, names, kinds, build))
    return ChatPrompt(**common, messages=_messages(*f["messages"]))


def _unrelated_to(pid: str, f: dict[str, tuple[Any, _At]], names: list[str], kinds: Mapping[str, Any],
                  build: Callable[[str], PromptSpec]) -> tuple[str, ...]:
    if "unrelated_to" not in f:
        # Every random prompt and every earlier unrelated one: each other token prompt starts like
        # one of those (later unrelated prompts avoid this one in turn).
        earlier = names[: names.index(pid)]
        return tuple(n for n in names if n != pid and (
            kinds[n] == "random" or (kinds[n] == "unrelated" and n in earlier)))
    out = []
    for v, a in _list(*f["unrelated_to"]):
        other = _str(v, a)
        if other == pid:
            a.fail("a prompt cannot be unrelated to itself")
        if other not in names:
            a.fail(f"unknown prompt {other!r}", _closest_hint(other, names, "prompts"))
        if build(other).length is None:
            a.fail(f"prompt {other!r} is a chat prompt; unrelated_to names token prompts")
        out.append(other)
    return tuple(out)


def _messages(value: Any, at: _At) -> tuple[ChatMessage, ...]:
    items = _list(value, at)
    if not items:
        at.fail("a chat prompt needs at least one message")
    out = []
    for v, a in items:
        f = _fields(v, a, "message")
        role = _choice(*f["role"], CHAT_ROLES)
        content, c_at = f["content"]
        if isinstance(content, LineMap):
            if role != "assistant":
                c_at.fail("only an assistant message can take a reply from an earlier turn")
            if set(content) != {"from_turn"}:
                c_at.fail("expected {from_turn: <turn index>}",
                          _closest_hint(str(next(iter(content), "")), ("from_turn",), "keys"))
            turn = _int(content["from_turn"], c_at.key("from_turn", content.value_lines["from_turn"]))
            out.append(ChatMessage(role, from_turn=turn))
        else:
            out.append(ChatMessage(role, content=_str(content, c_at, nonempty=False)))
    if out[-1].role == "assistant":
        items[-1][1].fail("the last message is the assistant's; the turn would have nothing to answer",
                          "end the conversation with a user message")
    return tuple(out)


# -- sequences, cells, settings ----------------------------------------------------------------


def _sequences(value: Any, at: _At, prompts: Mapping[str, PromptSpec], ctx: _Context,
               errors: _Errors | None = None) -> dict[str, SequenceSpec]:
    """Every sequence; with `errors`, each one's error recorded there and the sequence left out."""
    mine = errors if errors is not None else _Errors()
    out: dict[str, SequenceSpec] = {}
    for name, body, s_at in _named_map(value, at, "sequence"):
        with mine.item():
            out[name] = _sequence(name, body, s_at, prompts, ctx, mine.failed_prompts)
    if errors is None:
        mine.check()
    return out


def _sequence(name: str, body: Any, s_at: _At, prompts: Mapping[str, PromptSpec], ctx: _Context,
              failed: set[str]) -> SequenceSpec:
    kind = default("sequence", "kind")  # a plain list
    if isinstance(body, LineMap) and body.get("kind") == "traffic":
        return _traffic(name, body, s_at, ctx)
    if isinstance(body, LineMap):  # the mapping form: {kind, prompts}
        f = _fields(body, s_at, "sequence")
        kind = _given(f, "sequence", "kind", _choice, SEQUENCE_KINDS)
        body, s_at = f["prompts"]
    items = _list(body, s_at)
    if not items:
        s_at.fail("a sequence needs at least one prompt")
    ids = []
    for v, a in items:
        pid = _str(v, a)
        if pid in failed:
            raise _Skipped(pid)
        if pid not in prompts:
            a.fail(f"unknown prompt {pid!r}", _closest_hint(pid, [*prompts, *sorted(failed)], "prompts"))
        ids.append(pid)
    return SequenceSpec(name, tuple(ids), kind)


def _traffic(name: str, body: LineMap, at: _At, ctx: _Context) -> TrafficSequence:
    f = _fields(body, at, "sequence.traffic")
    if "trace" in f:
        if "shape" in f:
            f["shape"][1].fail("a traffic sequence has a shape or a trace, not both",
                               "remove `shape` to replay the trace, or `trace` to generate the shape")
        source, requests = _trace_source(f, ctx)
    else:
        # `format: auto` (the default) says nothing; any other trace key needs a trace.
        stray = [k for k in ("format", "limit") if k in f and (k, f[k][0]) != ("format", "auto")]
        if stray:
            f[stray[0]][1].fail(f"{stray[0]!r} applies to a trace file only", "add `trace: path` or remove it")
        source = _shape(*f["shape"]) if "shape" in f else traffic.TrafficShape()
        shape_at = f["shape"][1] if "shape" in f else at
        planned = source.requests
        if planned > traffic_kind.MAX_TRAFFIC_REQUESTS:  # refused before generating them
            shape_at.fail(f"about {planned:,} requests; a traffic sequence may have at most "
                          f"{traffic_kind.MAX_TRAFFIC_REQUESTS}", "fewer conversations or turns")
        try:
            requests = tuple(traffic.generate(source))
        except TrafficError as exc:
            shape_at.fail(exc.headline().removeprefix("<shape>: "), exc.hint)
    if not requests:
        at.fail("the traffic has no request", line=body.line)
    if len(requests) > traffic_kind.MAX_TRAFFIC_REQUESTS:
        at.fail(f"{len(requests)} requests; a traffic sequence may have at most "
                f"{traffic_kind.MAX_TRAFFIC_REQUESTS}", "fewer conversations or turns, or a trace `limit`",
                line=body.line)
    reference = _given(f, "sequence.traffic", "reference", _choice, traffic_kind.REFERENCE_METHODS)
    ids = tuple(traffic_prompt_id(name, i) for i in range(len(requests)))
    in_flight = _num(f, "sequence.traffic", "in_flight")
    return TrafficSequence(name, ids, "traffic", source=source, requests=requests, reference=reference,
                           description=_given(f, "sequence.traffic", "description", _text),
                           in_flight=in_flight)


def _shape(value: Any, at: _At) -> traffic.TrafficShape:
    """traffic.shape_from_dict, each key's numbers held to its schema bounds and the key tried
    alone first, so an error names its own line. The request count, which several keys make, is
    _traffic's to judge, on the whole shape: with the matrix's own figures."""
    if not isinstance(value, LineMap):
        at.fail(f"expected a mapping of shape keys, got {_describe(value)}")
    known = sorted(traffic.SHAPE_KEYS)
    for key in value:
        k_at = at.key(key, value.key_lines[key])
        if key not in traffic.SHAPE_KEYS:
            k_at.fail(f"unknown key {key!r}", _closest_hint(str(key), known, "shape keys"))
        v_at = at.key(key, value.value_lines[key])
        _shape_numbers(value[key], v_at, schema_key("shape", key).bounds)
        try:
            traffic.shape_from_dict({key: _plain(value[key])}, "", count=False)
        except (TrafficError, TypeError, ValueError) as exc:
            v_at.fail(_traffic_message(exc), getattr(exc, "hint", None))
    try:
        return traffic.shape_from_dict(_plain(value), "", count=False)  # _traffic's bound is lower
    except (TrafficError, TypeError, ValueError) as exc:
        at.fail(_traffic_message(exc), getattr(exc, "hint", None), line=value.line)


def _shape_numbers(value: Any, at: _At, bounds: Bounds | None) -> None:
    """Every number a shape key holds — itself, a size's (`[low, high]`, `{a, b, low, high}`), a
    weight — within the key's bounds; a lognormal's sigma within MAX_SIGMA, a preamble's header
    lengths within SHAPE_LENGTHS. What is no number is left to traffic.shape_from_dict."""
    if bounds is None or isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        problem = bounds.problem(value)
        if problem is not None:
            at.fail(problem, bounds.hint)
    elif isinstance(value, LineList):
        for item, item_at in _list(value, at):
            _shape_numbers(item, item_at, bounds)
    elif isinstance(value, LineMap):
        sigma = Bounds(0, MAX_SIGMA) if value.get("kind") == "lognormal" else bounds
        for key, item in value.items():
            if isinstance(key, (int, float)):
                _shape_numbers(key, at.key(key, value.key_lines[key]), SHAPE_LENGTHS)
            _shape_numbers(item, at.key(key, value.value_lines[key]), sigma if key == "b" else bounds)


def _plain(value: Any) -> Any:
    """YAML with lines → plain dicts and lists (what traffic.py reads)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _traffic_message(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.removeprefix(": ").strip()


def _trace_source(f: dict[str, tuple[Any, _At]], ctx: _Context) -> tuple[TraceSource, tuple]:
    sec = "sequence.traffic"
    path_value, p_at = f["trace"]
    path = ctx.base_dir / _str(path_value, p_at)
    fmt = _given(f, sec, "format", _choice, traffic_kind.TRACE_FORMATS)
    limit = _num(f, sec, "limit")
    try:
        data = read_regular_file(path, MAX_TRACE_BYTES)
    except FileNotFoundError:
        p_at.fail(f"no such trace file: {path}", "the path is relative to the matrix file")
    except (FileRefused, OSError) as exc:
        p_at.fail(f"cannot read the trace file {path}: {exc}",
                  f"a trace is a regular file of at most {MAX_TRACE_BYTES >> 20} MiB")
    try:
        if fmt == "auto":
            fmt = "shadowlab-trace" if traffic.sniff(path) == "trace" else "mooncake"
        loaded = traffic.read_trace(path) if fmt == "shadowlab-trace" else traffic.read_mooncake(path)
    except TrafficError as exc:
        where = f"{path}:{exc.line}" if getattr(exc, "line", None) else str(path)
        p_at.fail(f"trace {where}: {exc.message}", exc.hint or f"the file must be {fmt} JSON lines")
    requests = loaded.requests[:limit] if limit else loaded.requests
    source = TraceSource(path=path.resolve(), format=fmt, limit=limit, sha256=hashlib.sha256(data).hexdigest())
    return source, tuple(requests)


def _check_chat_turns(matrix: Matrix, at: _At, raw: LineMap) -> None:
    """A chat turn may only splice the reply of an earlier turn of its sequence."""
    for name, seq in matrix.sequences.items():
        if isinstance(seq, TrafficSequence):
            continue
        for index, pid in enumerate(seq.prompts):
            prompt = matrix.prompts[pid]
            if not isinstance(prompt, ChatPrompt):
                continue
            for turn in prompt.reply_turns():
                if turn >= index:
                    item_at = _sequence_at(at, raw, name).item(index, _sequence_items(raw, name).item_lines[index])
                    item_at.fail(
                        f"chat prompt {pid!r} is turn {index} but uses the reply of turn {turn}",
                        "from_turn must name an earlier turn (0-based) of every sequence using the prompt")


def _sequence_items(raw: LineMap, name: str) -> LineList:
    body = raw[name]
    return body["prompts"] if isinstance(body, LineMap) else body


def _sequence_at(at: _At, raw: LineMap, name: str) -> _At:
    body, seq_at = raw[name], at.key(name, raw.value_lines[name])
    return seq_at.key("prompts", body.value_lines["prompts"]) if isinstance(body, LineMap) else seq_at


def context_size(engine: EngineSpec, configuration: ConfigurationSpec) -> tuple[int | None, str]:
    """The context (tokens) a cell of `engine` × `configuration` gets, and where that comes from,
    as the engine kind reads its command, the engine's flags and the configuration's (in the
    order the engine sees them; `EngineAdapter.context_size`). None when not known here."""
    args = [*(engine.command or ()), *engine.flags, *configuration.flags]
    return get_adapter(engine.kind).context_size(args)


def _check_context(matrix: Matrix, at: _At, raw: LineMap) -> None:
    """A token prompt (+ n_predict) longer than a cell's context would be refused by the engine
    (HTTP 400) only after minutes of building and tokenizing it: refuse it now."""
    n_predict = matrix.generation.n_predict
    for engine, configuration, sequence in matrix.selected():
        size, source = context_size(matrix.engines[engine], matrix.configurations[configuration])
        if size is None:
            continue
        seq = matrix.sequences[sequence]
        if isinstance(seq, TrafficSequence):
            continue  # _check_traffic_context
        for pid in seq.prompts:
            length = matrix.prompts[pid].length
            if length is not None and length + n_predict > size:
                at.key(pid, raw.key_lines[pid]).fail(
                    f"prompt {pid!r} needs {length + n_predict} tokens of context ({length} + n_predict "
                    f"{n_predict}), but engine {engine!r} with configuration {configuration!r} has "
                    f"{size} ({source})",
                    f"shorten the prompt, or give a larger -c/--ctx-size in engines.{engine}.flags "
                    f"or configurations.{configuration}.flags")


def _check_traffic_context(matrix: Matrix, at: _At, raw: LineMap) -> None:
    """The longest request of a traffic (+ n_predict) must fit every cell's context."""
    n_predict = matrix.generation.n_predict
    for engine, configuration, sequence in matrix.selected():
        seq = matrix.sequences[sequence]
        size, source = context_size(matrix.engines[engine], matrix.configurations[configuration])
        if not isinstance(seq, TrafficSequence) or size is None:
            continue
        index, longest = max(enumerate(seq.requests), key=lambda ir: ir[1].prompt_tokens)
        length = longest.prompt_tokens
        if length + n_predict > size:
            at.key(sequence, raw.key_lines[sequence]).fail(
                f"traffic {sequence!r} request {index} needs {length + n_predict} tokens "
                f"of context ({length} + n_predict {n_predict}), but engine {engine!r} with "
                f"configuration {configuration!r} has {size} ({source})",
                "shrink the traffic's sizes (or the trace's limit), or give a larger -c/--ctx-size")


def check_machine(matrix: Matrix, *, cores: int, warn: Callable[[str], None] | None = None) -> None:
    """What this machine must offer before anything starts: more cores per cell than the process
    may use can never be leased. MatrixError, or with `warn` (a dry run) a warning."""
    need = matrix.isolation.cores_per_cell
    if need <= cores:
        return
    error = MatrixError(
        f"{need} cores per cell, but this process may use only {cores}",
        file=str(matrix.path), line=matrix.lines.get("isolation.cores_per_cell"),
        key_path="isolation.cores_per_cell",
        hint=f"lower isolation.cores_per_cell (and engine threads) to at most {cores}, "
             "or run on a machine with more cores")
    if warn is None:
        raise error
    warn(f"shadowlab: warning: {error}")


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


def _expectation(value: Any, at: _At, matrix: Matrix, selected: list[tuple[str, str, str]]) -> Expectation:
    f = _fields(value, at, "expectation")
    names = {"engine": matrix.engines, "configuration": matrix.configurations, "sequence": matrix.sequences}
    selection = _selection(f, names)
    cells = [c for c in selected if selection.matches(*c)]
    if not cells:
        at.fail("this expectation selects no planned cell", "check its engine/configuration/sequence "
                "against cells.include / cells.exclude", line=value.line)
    checks = [k for k in CHECK_KEYS if k in f]
    if not checks:
        at.fail("an expectation needs at least one check", "add one of: " + ", ".join(CHECK_KEYS), line=value.line)
    turn = _turn(*f["turn"], matrix, cells) if "turn" in f else None
    outcome = None
    if "outcome" in f:
        raw, o_at = f["outcome"]
        items = _list(raw, o_at) if isinstance(raw, list) else [(raw, o_at)]
        if not items:
            o_at.fail("expected at least one outcome")
        outcome = tuple(_choice(v, a, OUTCOMES) for v, a in items)
    created = None
    if "checkpoints_created_at" in f:
        position = schema_key("expectation", "checkpoints_created_at").bounds
        created = tuple(_bounded(v, a, position) for v, a in _list(*f["checkpoints_created_at"]))
    cascade = None
    if "cascade" in f:
        cascade = _bool(*f["cascade"], hint=_CASCADE_HINT)
        blind = sorted({e for e, _, _ in cells if matrix.engines[e].log_family == "none"})
        if cascade and blind:
            f["cascade"][1].fail(
                f"engine {blind[0]!r} has log_family none: without its log the cascade cannot be seen",
                "narrow the selection to engines whose log is parsed, or set their log_family")
    return Expectation(
        selection=selection,
        turn=turn,
        outcome=outcome,
        min_reused=_num(f, "expectation", "min_reused"),
        min_saved_fraction=_num(f, "expectation", "min_saved_fraction"),
        max_forced=_num(f, "expectation", "max_forced"),
        checkpoints_created_at=created,
        identity=_bool(*f["identity"]) if "identity" in f else None,
        cascade=cascade,
        min_recovered_share=_num(f, "expectation", "min_recovered_share"),
        description=_given(f, "expectation", "description", _text),
        line=value.line,
    )


def _turn(value: Any, at: _At, matrix: Matrix, cells: list[tuple[str, str, str]]) -> int | str:
    sequences = [matrix.sequences[s] for s in dict.fromkeys(seq for _, _, seq in cells)]
    if isinstance(value, str) and any(isinstance(s, TrafficSequence) and s.request(value) for s in sequences):
        return value
    if isinstance(value, str):
        if value not in matrix.prompts:
            at.fail(f"unknown prompt {value!r}", _closest_hint(value, matrix.prompts, "prompts"))
        if not any(value in s.prompts for s in sequences):
            at.fail(f"prompt {value!r} is not a turn of the selected sequences ("
                    + ", ".join(s.name for s in sequences) + ")")
        return value
    index = _bounded(value, at, schema_key("expectation", "turn").bounds)
    short = [s.name for s in sequences if index >= len(s.prompts)]
    if short:
        at.fail(f"turn {index} is past the end of sequence {short[0]!r}",
                "turns are 0-based; narrow the selection or name the turn by prompt id")
    return index


# ---------------------------------------------------------------- baseline, budgets, scale

def _baseline_and_budgets(matrix: Matrix, f: dict[str, tuple[Any, _At]], errors: _Errors) -> Matrix:
    baseline = None
    if "baseline" in f:
        baseline = _str(*f["baseline"])
        if baseline not in matrix.configurations:
            f["baseline"][1].fail(f"unknown configuration {baseline!r}",
                                  _closest_hint(baseline, matrix.configurations, "configurations"))
    budgets: tuple[Budget, ...] = ()
    if "budgets" in f:
        if baseline is None:
            f["budgets"][1].fail("budgets are judged against a baseline configuration, and none is named",
                                 "add `baseline: <configuration>` (e.g. the production defaults)")
        found = []
        for v, a in _list(*f["budgets"]):
            with errors.item():
                found.append(_budget(v, a, matrix))
        budgets = tuple(found)
    scale = None
    if "scale" in f:
        with errors.item():
            scale = _scale(*f["scale"])
    repeat = _num(f, "matrix", "repeat")
    return replace(matrix, baseline=baseline, budgets=budgets, scale=scale, repeat=repeat)


def _budget(value: Any, at: _At, matrix: Matrix) -> Budget:
    f = _fields(value, at, "budget")
    names = {"engine": matrix.engines, "configuration": matrix.configurations, "sequence": matrix.sequences}
    selection = _selection(f, names)
    if not any(selection.matches(*c) for c in matrix.selected()):
        at.fail("this budget selects no planned cell", "check its engine/configuration/sequence "
                "against cells.include / cells.exclude", line=value.line)
    if not any(k in f for k in BUDGET_KEYS):
        at.fail("a budget needs at least one check", "add one of: " + ", ".join(BUDGET_KEYS), line=value.line)
    limits = {k: float(_num(f, "budget", k)) for k in BUDGET_KEYS if k in f}
    return Budget(selection=selection, description=_given(f, "budget", "description", _text),
                  line=value.line, **limits)


def _scale(value: Any, at: _At) -> Scale:
    f = _fields(value, at, "scale")
    for explicit in ("checkpoint_mib", "checkpoint_ms"):
        if explicit in f and f"{explicit}_factor" in f:
            f[f"{explicit}_factor"][1].fail(f"{explicit} and {explicit}_factor both given",
                                            f"give the figure at scale ({explicit}) or a factor on the measured one")
    numbers = {k: float(_num(f, "scale", k)) for k in f if k != "name"}
    return Scale(name=_given(f, "scale", "name", _text), **numbers)
