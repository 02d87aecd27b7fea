"""Which build and which model: `shadowlab run --binary PATH --model PATH` and the environment,
over what the matrix says, so one matrix qualifies any build without editing its YAML.

    Overrides.gather(binary, model, environ)   the command line's, else the environment's
    Overrides.apply(matrix) -> Matrix          the matrix with them, each value checked as the
                                               matrix's own would be (a path that is no file: a
                                               MatrixError naming where the value came from)
    Overrides.applied_to(matrix)               what plan.json keeps: each key path, its value
                                               and where it came from

Sources, strongest first: `--binary` / `--model`; `$SHADOWLAB_BINARY` / `$SHADOWLAB_MODEL` (the
same, for CI jobs that set variables); a kind's own variable (`adapter.binary_env`: llama-server's
`$LLAMA_SERVER_BIN_PATH`, the name llama.cpp's own server tests use) for its engines whose matrix
says `binary: auto` only: an explicit `binary:` in the matrix wins over it, so a stray variable
never swaps the build of a matrix that names one.

A value applies to every engine whose kind runs a build of its own on a model file
(`adapter.build_override`), or to one engine with `NAME=VALUE`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shadowlab.engines import get_adapter, known_kinds
from shadowlab.errors import MatrixError
from shadowlab.matrix.specs import EngineSpec, Matrix, ModelSpec

BINARY_ENV = "SHADOWLAB_BINARY"
MODEL_ENV = "SHADOWLAB_MODEL"


def overridable_kinds() -> tuple[str, ...]:
    """The kinds `--binary/--model` apply to: a build of their own on a model file."""
    return tuple(k for k in known_kinds() if get_adapter(k).build_override)


def kind_binary_envs() -> dict[str, str]:
    """Each kind's own variable for its build (`adapter.binary_env`), by kind."""
    return {k: env for k in known_kinds() if (env := get_adapter(k).binary_env)}


def env_names() -> tuple[str, ...]:
    """Every variable an override may come from, strongest first."""
    return (BINARY_ENV, MODEL_ENV, *dict.fromkeys(kind_binary_envs().values()))


@dataclass(frozen=True)
class Override:
    key: str  # "binary" | "model"
    value: str  # PATH, or NAME=PATH for one engine
    source: str  # "--binary", "$SHADOWLAB_BINARY", ...
    only_auto: bool = False  # a kind's own variable: only where the matrix says `binary: auto`
    kind: str | None = None  # a kind's own variable: only that kind's engines

    def split(self) -> tuple[str | None, str]:
        """(engine name or None for every engine, path)."""
        name, sep, path = self.value.partition("=")
        if sep and name and "/" not in name:
            return name, path
        return None, self.value


@dataclass(frozen=True)
class Overrides:
    items: tuple[Override, ...] = ()

    @classmethod
    def gather(cls, binary: str | None = None, model: str | None = None,
               environ: Mapping[str, str] | None = None) -> Overrides:
        environ = os.environ if environ is None else environ
        items = []
        for key, given, flag, env in (("binary", binary, "--binary", BINARY_ENV),
                                      ("model", model, "--model", MODEL_ENV)):
            if given:
                items.append(Override(key, given, flag))
            elif environ.get(env):
                items.append(Override(key, environ[env], f"${env}"))
        if not binary and not environ.get(BINARY_ENV):
            for kind, env in kind_binary_envs().items():
                if environ.get(env):
                    items.append(Override("binary", environ[env], f"${env}", only_auto=True, kind=kind))
        return cls(tuple(items))

    def __bool__(self) -> bool:
        return bool(self.items)

    def apply(self, matrix: Matrix) -> Matrix:
        engines = dict(matrix.engines)
        for item in self.items:
            targets = _targets(item, matrix)
            if not targets and not item.only_auto:
                raise MatrixError(f"{item.source} {item.value!r}: the matrix has no engine to apply it to",
                                  file=str(matrix.path), key_path="engines",
                                  hint=f"{item.source} applies to engines of kind "
                                       + ", ".join(overridable_kinds()) + " (NAME=PATH: to one of them)")
            for name in targets:
                engines[name] = _applied(item, engines[name], matrix)
        return replace(matrix, engines=engines)

    def applied_to(self, matrix: Matrix) -> list[dict[str, Any]]:
        """plan.json's `overrides`: each key path set in `matrix` (as loaded, before `apply`),
        the value it gets, and where that came from."""
        out = []
        for item in self.items:
            for name in _targets(item, matrix):
                spec = _applied(item, matrix.engines[name], matrix)
                value = str(spec.model.path) if item.key == "model" and spec.model else spec.binary
                out.append({"key": f"engines.{name}.{item.key}", "value": value, "from": item.source})
        return out


def _targets(item: Override, matrix: Matrix) -> list[str]:
    name, _ = item.split()
    if name is not None:
        if name not in matrix.engines:
            raise MatrixError(f"{item.source} {item.value!r}: no engine {name!r} in the matrix",
                              file=str(matrix.path), key_path="engines",
                              hint="engines: " + ", ".join(matrix.engines))
        return [name]
    kinds = (item.kind,) if item.kind is not None else overridable_kinds()
    return [n for n, e in matrix.engines.items() if e.kind in kinds
            and not (item.only_auto and e.binary != "auto")]


def _applied(item: Override, spec: EngineSpec, matrix: Matrix) -> EngineSpec:
    _, text = item.split()
    key_path = f"engines.{spec.name}.{item.key}"

    def fail(message: str, hint: str) -> MatrixError:
        return MatrixError(f"{item.source} {text!r}: {message}", file=str(matrix.path), key_path=key_path,
                           hint=hint)

    if item.key == "binary":
        if "/" not in text:
            found = shutil.which(text)
            if found is None:
                raise fail("not on PATH", f"give the path of the {spec.kind} binary of the build to qualify")
            return replace(spec, binary=found)
        return replace(spec, binary=str(_regular_file(text, fail, "binary")))
    path = _regular_file(text, fail, "model file")
    return replace(spec, model=ModelSpec("path", path=path))


def _regular_file(text: str, fail: Any, what: str) -> Path:
    path = Path(text).expanduser().absolute()  # relative to where shadowlab runs: a command-line path
    if not path.exists():
        raise fail(f"no such {what} (looked for {path})", f"give the path of the {what}")
    if not path.is_file():
        raise fail(f"the {what} is not a regular file ({path})", f"name the {what} itself")
    return path
