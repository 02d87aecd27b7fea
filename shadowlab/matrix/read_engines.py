"""The matrix's `engines` and `configurations` sections: each engine's kind (asked of the engine
registry), model, binary, command and requirements; each configuration's flags and environment."""

from __future__ import annotations

import importlib.util
import re
import shutil
import string
from pathlib import Path
from typing import Any

from shadowlab.engines import EngineAdapter, get_adapter, known_families, known_kinds
from shadowlab.matrix.schema import COMMAND_PLACEHOLDERS, schema_key
from shadowlab.matrix.specs import ConfigurationSpec, EngineSpec, ModelSpec
from shadowlab.matrix.values import (_At, _Context, _bool, _bounded, _choice, _closest_hint, _env, _fields, _given,
                                     _list, _num, _scalar_text, _str, _str_list, _text)


def _engine(name: str, body: Any, at: _At, ctx: _Context) -> EngineSpec:
    f = _fields(body, at, "engine")
    kind = _choice(*f["kind"], tuple(known_kinds()))
    adapter = get_adapter(kind)  # the kind's own facts: defaults, model sources, presets
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


def missing_requirements(adapter: EngineAdapter) -> list[str]:
    """The Python modules an engine kind's processes import (the reference engine: pyproject's
    `engine` extra, which `pip install -e .` alone leaves out) that this Python lacks.
    validate.check_machine refuses a run on them (else every cell would fail minutes later, one
    by one) and warns in a dry run."""
    return [m for m in getattr(adapter, "python_requirements", ()) if not _importable(m)]


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
