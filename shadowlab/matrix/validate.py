"""Loading and validating a matrix: YAML in, a frozen `Matrix` or one `MatrixError` out.

`load(path)` names the file, the line, the key path and, where it helps, a hint. Every value
travels with where it was written (`_At`), so any check can point at it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from shadowlab.engines import get_adapter
from shadowlab.errors import MatrixError
from shadowlab.matrix.read_cells import _cells, _generation, _identity, _isolation
from shadowlab.matrix.read_engines import ENGINE_INSTALL, _configuration, _engine, missing_requirements
from shadowlab.matrix.read_expectations import _baseline_and_budgets, _expectation
from shadowlab.matrix.read_prompts import _prompts, _sequences
from shadowlab.matrix.read_traffic import MAX_TRACE_BYTES
from shadowlab.matrix.schema import MATRIX_VERSION, MAX_MATRIX_BYTES, default
from shadowlab.matrix.specs import (CellsSpec, ChatPrompt, ConfigurationSpec, EngineSpec, Generation, Identity,
                                    Isolation, Matrix, PromptSpec, SequenceSpec, TrafficSequence)
from shadowlab.matrix.values import (MAX_ERRORS_SHOWN, MatrixErrors, _At, _Context, _Errors, _Skipped, _fields,
                                     _given, _list, _name, _num, _text)
from shadowlab.matrix.yamlpos import LineList, LineMap, parse_yaml
from shadowlab.results.records import FileRefused, read_regular_file

__all__ = [
    "load", "loads", "context_size", "check_machine", "MatrixErrors", "MAX_ERRORS_SHOWN", "ENGINE_INSTALL",
    "MAX_TRACE_BYTES",
]


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
        if "version" not in f:  # required: _fields said so (the other keys are still checked)
            raise _Skipped("version")
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
        lines={"isolation.cores_per_cell": _line_of(data, "isolation", "cores_per_cell"),
               **{f"engines.{name}.kind": _line_of(data["engines"], name, "kind")
                  for name in engines if isinstance(data.get("engines"), LineMap)}},
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
    may use can never be leased, and an engine of the selected cells whose Python modules are
    missing here (the reference engine's torch) fails every cell. MatrixError (MatrixErrors for
    more than one), or with `warn` (a dry run: the plan is still printed) a warning each."""
    problems = []
    need = matrix.isolation.cores_per_cell
    if need > cores:
        problems.append(MatrixError(
            f"{need} cores per cell, but this process may use only {cores}",
            file=str(matrix.path), line=matrix.lines.get("isolation.cores_per_cell"),
            key_path="isolation.cores_per_cell",
            hint=f"lower isolation.cores_per_cell (and engine threads) to at most {cores}, "
                 "or run on a machine with more cores"))
    for name in dict.fromkeys(engine for engine, _, _ in matrix.selected()):
        spec = matrix.engines[name]
        missing = missing_requirements(get_adapter(spec.kind))
        if missing:
            problems.append(MatrixError(
                f"the {spec.kind} engine needs {', '.join(missing)}, not installed in this Python ({sys.executable})",
                file=str(matrix.path), line=matrix.lines.get(f"engines.{name}.kind"), key_path=f"engines.{name}.kind",
                hint=f"install the engine extra: {ENGINE_INSTALL} (from the repository root; torch first, so pip "
                     "takes the CPU wheel), or use an engine of kind llama-server"))
    if warn is not None:
        for problem in problems:
            warn(f"shadowlab: warning: {problem}")
    elif len(problems) == 1:
        raise problems[0]
    elif problems:
        raise MatrixErrors(problems)
