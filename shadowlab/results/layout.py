"""Paths inside one run directory: the only place that spells them (DESIGN §4).

    layout = RunLayout(root)
    layout.plan, layout.meta(cell_id), layout.engine_log(cell_id), layout.verdicts, ...
    RunLayout.VERDICTS                 the bare name, for a message or a relative path

Every stage reaches a run directory's files through here: the runner writing them, the reader
(``rundir.load``), ``--resume``, split controls, merge, report, simulate. ``relative`` gives a
file's path inside the run as outputs name it (``cells/<id>/engine.log``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shadowlab.errors import RunDirError


@dataclass(frozen=True)
class RunLayout:
    """Paths inside one run directory; the only place that spells them."""

    root: Path

    # The file names, once. Inputs and records first, then what is derived from them.
    MATRIX = "matrix.yaml"
    PLAN = "plan.json"
    ENVIRONMENT = "environment.json"
    OPTIONS = "options.json"
    LOCK = ".shadowlab.lock"
    PROMPTS = "prompts"
    CELLS = "cells"
    META = "meta.json"
    ENGINE_LOG = "engine.log"
    SCRATCH = "scratch"
    RESPONSES = "responses"
    SHARD = "shard.json"  # a shard's part: what it is a part of (DESIGN §8)
    MERGE = "merge.json"  # a merged run: the parts it was merged from
    VERDICTS = "verdicts.json"
    REPORT_HTML = "report.html"
    REPORT_MD = "report.md"
    JUNIT = "junit.xml"

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def matrix(self) -> Path:
        return self.root / self.MATRIX

    @property
    def plan(self) -> Path:
        return self.root / self.PLAN

    @property
    def environment(self) -> Path:
        return self.root / self.ENVIRONMENT

    @property
    def options(self) -> Path:
        """The command-line options that change results (--fault, --request-timeout)."""
        return self.root / self.OPTIONS

    @property
    def lock(self) -> Path:
        """flock'd by the shadowlab running in this directory; holds its pid."""
        return self.root / self.LOCK

    @property
    def prompts_dir(self) -> Path:
        return self.root / self.PROMPTS

    def prompts(self, engine: str) -> Path:
        return self.prompts_dir / f"{engine}.json"

    @property
    def cells_dir(self) -> Path:
        return self.root / self.CELLS

    def cell_dir(self, cell_id: str) -> Path:
        return self.cells_dir / component(cell_id, where=self.cells_dir)

    def meta(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.META

    def engine_log(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.ENGINE_LOG

    def scratch(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.SCRATCH

    def response(self, cell_id: str, turn_index: int) -> Path:
        return self.cell_dir(cell_id) / self.RESPONSES / f"turn-{turn_index}.json"


    def prompts_log(self, engine: str) -> Path:
        """The log of the engine process that tokenized the prompts."""
        return self.prompts_dir / f"{engine}.{self.ENGINE_LOG}"

    @property
    def shard(self) -> Path:
        return self.root / self.SHARD

    @property
    def merge(self) -> Path:
        return self.root / self.MERGE

    @property
    def verdicts(self) -> Path:
        return self.root / self.VERDICTS

    @property
    def report_html(self) -> Path:
        return self.root / self.REPORT_HTML

    @property
    def report_md(self) -> Path:
        return self.root / self.REPORT_MD

    @property
    def junit(self) -> Path:
        return self.root / self.JUNIT

    def relative(self, path: Path) -> str:
        """``path`` inside the run directory as outputs name it (``cells/<id>/engine.log``)."""
        return Path(path).relative_to(self.root).as_posix()

    @classmethod
    def is_cell_dir(cls, path: Path) -> bool:
        """Whether ``path`` is a cell directory of a run (``RUN/cells/<id>`` with its meta.json)."""
        path = Path(path)
        return path.is_dir() and (path / cls.META).is_file() and path.parent.name == cls.CELLS


NAME_MAX_BYTES = 255  # a directory entry's name, on every file system shadowlab runs on


def component(name: str, *, where: Path) -> str:
    """``name`` if it is one path component (not empty, `.` or `..`; no `/` or NUL; at most 255
    bytes), else RunDirError. Cell ids and run names come from a validated matrix; this is the
    check at the place a path is made from one, so a hostile plan.json cannot lead outside."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name
            or len(os.fsencode(name)) > NAME_MAX_BYTES):
        raise RunDirError(f"{str(name)[:80]!r} is not a single directory name", path=str(where),
                          hint="names may hold letters, digits, '_', '-' and '.', at most 255 bytes")
    return name


def child_dir(parent: Path, name: str) -> Path:
    """``parent/name``, verified to lie inside ``parent`` (also when ``name`` is an existing
    link): where a new run directory goes (``reports/<matrix name>-<time>``)."""
    path = Path(parent) / component(name, where=Path(parent))
    if path.resolve().parent != Path(parent).resolve():
        raise RunDirError(f"{name!r} would lead outside {parent}", path=str(path),
                          hint="remove the link, or pass --out")
    return path

