"""Adapter for the reference engine, ``python -m shadowlab_engine`` (DESIGN.md §1).

The engine speaks llama-server's HTTP API and log lines, so everything but
preparation and the command line comes from :class:`EngineAdapterBase`.

Its "binary" is a Python package: the identity records the interpreter and a
sha256 over the package's source files (sorted by name), which changes whenever
the engine's code does. The model is generated deterministically from
``(preset, seed)`` into the cache directory when the matrix names no file.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shadowlab.engines import EngineAdapterBase, EngineIdentity, LogFamily, register, register_family, sha256_file
from shadowlab.engines.llama_server import TASK_ID, TURN_END

# The engine prints llama.cpp b11434's lines (DESIGN §1, slotlog.py) and streams its events.
FAMILY = LogFamily("reference", "reference", streams=True, turn_end=TURN_END, task_id=TASK_ID,
                   description="the reference engine: llama.cpp b11434's lines")
FAULTS_ENV = "SHADOWLAB_ENGINE_FAULTS"  # shadowlab_engine.faults.ENV_VAR (a test compares)

DEFAULT_COMMAND = (
    "{binary}", "-m", "shadowlab_engine",
    "-m", "{model}", "--host", "{host}", "--port", "{port}", "-t", "{threads}",
)


def package_sha256(package_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def presets() -> tuple[str, ...]:
    """The reference engine's model presets (a light import: no torch); () when not installed,
    and the adapter reports that when the run starts."""
    try:
        from shadowlab_engine.config import PRESETS
    except ImportError:
        return ()
    return tuple(PRESETS)


def _engine_version() -> str:
    try:
        from shadowlab_engine.server import engine_version
    except ImportError:
        return "unknown"
    return f"shadowlab-engine {engine_version()}"


class ReferenceAdapter(EngineAdapterBase):
    kind = "reference"
    log_family = "reference"
    verbosity_flags = ("-lv", "4")
    model_sources = ("preset", "path")
    model_hint = ("the reference engine takes {preset, seed} or a safetensors path; "
                  "llama-server takes {gguf: {preset, seed}} or a .gguf path")
    default_context = 8192  # shadowlab_engine.cli's -c default (a test compares)
    # Faults come only from a cell's --fault flags: an inherited variable would inject them too.
    controlled_env = (FAULTS_ENV,)
    split_control = "points"  # one request with the warm schedule as `split_points`
    starter_words = "the reference engine"  # try shadowlab with no build: a seeded model

    def starter_engine(self, binary: str | None, model: str | None) -> list[tuple[str, Any, str]]:
        return [("model", {"preset": "tiny", "seed": "0"}, "generated, seeded")]
    # What its processes import, in pyproject's `engine` extra: a matrix is refused without them.
    python_requirements = ("torch", "safetensors", "numpy")

    def presets(self) -> tuple[str, ...]:
        return presets()

    def fault_flags(self, faults: Sequence[str]) -> list[str]:
        return [arg for fault in faults for arg in ("--fault", fault)]

    def faults(self) -> tuple[str, ...]:
        try:
            from shadowlab_engine.faults import KNOWN
        except ImportError:  # engine not installed: its cells report that when they start
            return ()
        return tuple(KNOWN)

    def check_fault(self, text: str) -> None:
        from shadowlab_engine.faults import FaultError, parse_faults

        try:
            parse_faults([text])
        except FaultError as exc:
            raise ValueError(str(exc)) from None

    def split_request_fields(self, split_points: Sequence[int]) -> dict[str, Any]:
        # Computed from 0 through the warm turn's batch schedule: no cache.
        return {"split_points": list(split_points), "cache_prompt": False}

    def __init__(self) -> None:
        # Set by prepare(): the model file it located or generated for this engine.
        self._model_path: str | None = None

    def prepare(self, spec: Any, cache_dir: Path) -> EngineIdentity:
        import shadowlab_engine
        from shadowlab_engine import weights

        model = spec.model
        if model is not None and model.source == "path":
            model_path = Path(model.path)
        elif model is not None and model.source == "preset":
            model_path = Path(weights.ensure_model(model.preset, model.seed or 0, cache_dir))
        else:
            raise ValueError(f"engine {spec.name!r}: the reference engine needs a preset or a path model")
        self._model_path = str(model_path.resolve())
        self.log_family = getattr(spec, "log_family", None) or self.log_family
        package_dir = Path(shadowlab_engine.__file__).resolve().parent
        return EngineIdentity(
            kind=self.kind,
            binary_path=f"{sys.executable} -m shadowlab_engine",
            binary_sha256=package_sha256(package_dir),
            version=_engine_version(),
            model_path=self._model_path,
            model_sha256=sha256_file(model_path),
            extra={"package_dir": str(package_dir), "python": sys.version.split()[0]},
        )

    def command(
        self, spec: Any, cell_flags: Sequence[str], port: int, threads: int, log_file: Path
    ) -> list[str]:
        if self._model_path is None:
            raise RuntimeError("ReferenceAdapter.command() before prepare(): no model path")
        # The runner captures stdout + stderr into engine.log, which already holds every
        # log line; --log-file would only write them twice.
        template = list(spec.command or DEFAULT_COMMAND)
        values = {
            "binary": sys.executable, "model": self._model_path, "port": port,
            "threads": threads, "host": "127.0.0.1", "log_file": log_file,
        }
        argv = [part.format(**values) for part in template]
        return [*argv, *cell_flags]


register(ReferenceAdapter.kind, ReferenceAdapter)
register_family(FAMILY)
