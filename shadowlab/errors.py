"""Every error shadowlab raises on purpose, one class per failure kind.

    ShadowlabError                 base: catch this to catch everything shadowlab means to raise
    ├── MatrixError                the matrix file is wrong: file, line, key path, hint
    ├── RunDirError                the output directory cannot be used (e.g. reused without --resume)
    ├── LogSourceError             what was given as an engine log cannot be read as one (path, type)
    ├── TrafficError               a traffic source (Mooncake, logs --trace, shape) is wrong: file, line
    ├── CompareRefused             two runs differ in more than the point of the comparison (compare)
    ├── EngineError                an engine process failed the cell (engine, cell, reason, log tail)
    │   ├── EngineStartError       it never became ready (died, timed out, bad flags)
    │   ├── EngineCrashError       it died while the cell was running
    │   ├── ProtocolError          it answered something shadowlab does not understand
    │   └── ImpossibleFigures      it reported figures no engine can truthfully report (compare, simulate)
    ├── InfrastructureError        the machine failed the run: no free port, disk full, read-only --out
    └── QualificationError         the run finished but a check failed

Every error renders as one readable message plus an optional `hint:` line saying what to do
next (pip's DiagnosticPipError habit), so the CLI prints `str(error)` and never a traceback.
Exit codes are decided in one place, the CLI/gate: matrix and run-directory errors are usage
errors (2), engine and infrastructure errors are infrastructure failures (3), a failed
qualification is 1.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ShadowlabError",
    "MatrixError",
    "RunDirError",
    "LogSourceError",
    "TrafficError",
    "CompareRefused",
    "EngineError",
    "EngineStartError",
    "EngineCrashError",
    "ProtocolError",
    "ImpossibleFigures",
    "InfrastructureError",
    "QualificationError",
]


class ShadowlabError(Exception):
    """Base class: a message for the user and an optional hint on how to fix it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def headline(self) -> str:
        """The first line of `str(self)`: what happened."""
        return self.message

    def __str__(self) -> str:
        text = self.headline()
        if self.hint:
            text += "\n  hint: " + self.hint
        return text


class MatrixError(ShadowlabError):
    """The matrix file is invalid; nothing has been started.

    Renders as `matrices/x.yaml:12: engines.reference.threads: expected an integer, got 'two'`
    followed by `  hint: ...` when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key_path: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.file = file
        self.line = line
        self.key_path = key_path

    def headline(self) -> str:
        where = self.file or "<matrix>"
        if self.line is not None:
            where += f":{self.line}"
        path = f" {self.key_path}:" if self.key_path else ""
        return f"{where}:{path} {self.message}"


class RunDirError(ShadowlabError):
    """The run directory cannot be used as asked (exists without --resume, unreadable, newer schema)."""

    def __init__(self, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path

    def headline(self) -> str:
        return f"{self.path}: {self.message}"


class LogSourceError(ShadowlabError):
    """`logparse.parse` / `iter_events` was given something that is not a readable log: a path
    that does not exist or is not a regular file, bytes, a text-mode file, another type. A usage
    error (2): nothing was read. (A log that breaks off while being read, e.g. a corrupt .gz, is
    not an error: `ParsedLog.source_error` says so and the events before it are kept.)"""

    def __init__(self, message: str, *, source: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.source = source

    def headline(self) -> str:
        return f"{self.source}: {self.message}"


class TrafficError(ShadowlabError):
    """A traffic source for `shadowlab simulate` / the traffic replay is wrong (out-of-order
    times, negative lengths, unknown fields, a line that is no JSON): usage error (2). Renders as
    `trace.jsonl:12: 'input_length' must be >= 1, got -5`."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.file = file
        self.line = line

    def headline(self) -> str:
        if self.file is None:
            return self.message
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.message}"


class CompareRefused(ShadowlabError):
    """`shadowlab compare` was given runs that differ in something not declared the point of the
    comparison (prompts, engine build) or cannot be shown alike: usage, exit 2, naming each."""

    def __init__(self, differences: Sequence[str], *, hint: str | None = None) -> None:
        self.differences = tuple(differences)
        super().__init__("runs not comparable: " + "; ".join(self.differences), hint=hint)


class EngineError(ShadowlabError):
    """An engine process failed a cell. Carries the engine, the cell and the end of its log."""

    def __init__(
        self,
        reason: str,
        *,
        engine: str,
        cell: str | None = None,
        log_tail: Sequence[str] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(reason, hint=hint)
        self.reason = reason
        self.engine = engine
        self.cell = cell
        self.log_tail = tuple(log_tail)

    def headline(self) -> str:
        where = f"engine {self.engine!r}"
        if self.cell:
            where += f" (cell {self.cell})"
        text = f"{where}: {self.reason}"
        if self.log_tail:
            text += "\n  last log lines:\n" + "\n".join("    " + line for line in self.log_tail)
        return text


class ImpossibleFigures(EngineError):
    """A command was asked to judge or show figures of cells whose engine reported figures no
    engine can truthfully report (shadowlab/judge/plausibility.py): exit 3, as the gate, naming each
    cell and its impossible figures. Nothing of such a cell is shown as a result."""

    def __init__(self, cells: Sequence[str], *, engine: str, hint: str | None = None) -> None:
        self.cells = tuple(cells)
        super().__init__("reported impossible figures, so they are no results: " + "; ".join(self.cells),
                         engine=engine, hint=hint)


class EngineStartError(EngineError):
    """The engine never became ready: it exited, never answered /health, or refused the flags."""


class EngineCrashError(EngineError):
    """The engine process died (or was killed) while the cell was running."""

    def __init__(self, reason: str, *, returncode: int | None = None, **kwargs) -> None:
        super().__init__(reason, **kwargs)
        self.returncode = returncode


class ProtocolError(EngineError):
    """The engine answered, but not in the shape shadowlab expects (status, JSON, fields)."""


class InfrastructureError(ShadowlabError):
    """The machine, not the engine or the input, stopped the run: no free loopback port, the run
    directory full, read-only or not a directory. Exit 3; the cells already recorded stand and
    ``--resume`` finishes the run once the cause is gone."""


class QualificationError(ShadowlabError):
    """The run completed and at least one check failed; `failures` names each one."""

    def __init__(self, failures: Sequence[str], *, hint: str | None = None) -> None:
        self.failures = tuple(failures)
        count = len(self.failures)
        message = f"not qualified: {count} check{'s' if count != 1 else ''} failed"
        super().__init__(message, hint=hint)

    def headline(self) -> str:
        return "\n".join([self.message, *("  - " + f for f in self.failures)])
