"""The trace files: JSON lines, rotated by size and by age, never a torn line.

Pieces are `trace-<UTC start, microseconds>Z.jsonl` in the output directory, so their names sort
in time order (`cat DIR/trace-*.jsonl` is the whole capture). Lines are written in batches of
whole lines, each batch with one write(2) on a file opened O_APPEND: a recorder killed between
writes leaves whole lines only. Should a piece still end without its newline (a kill inside a
write, a full disk), a recorder starting in that directory cuts the piece back to its last
newline before it opens a new one (`repair`), and readers skip a cut last line anyway.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

PREFIX = "trace-"


def pieces(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{PREFIX}*.jsonl"))


def repair(directory: Path) -> int:
    """Cut the newest piece back to its last newline; the number of bytes removed."""
    existing = pieces(directory)
    if not existing:
        return 0
    path = existing[-1]
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        at = size
        while at > 0:  # back to the last newline, 64 KiB at a time
            step = min(at, 65536)
            fh.seek(at - step)
            chunk = fh.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                at = at - step + nl + 1
                break
            at -= step
        fh.truncate(at)
        return size - at


class TraceWriter:
    def __init__(self, directory: Path, rotate_bytes: int, rotate_s: float) -> None:
        self.directory = directory
        self.rotate_bytes, self.rotate_s = rotate_bytes, rotate_s
        self._fd: int | None = None
        self._size = 0
        self._opened = 0.0
        self.path: Path | None = None
        self.lines = 0

    def write(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        if self._fd is None or self._size >= self.rotate_bytes or time.monotonic() - self._opened >= self.rotate_s:
            self._open()
        data = memoryview("".join(lines).encode("utf-8"))
        while data:  # a regular file writes short only on errors (a full disk): repair() mends it
            data = data[os.write(self._fd, data):]
        self._size += sum(len(line) for line in lines)
        self.lines += len(lines)

    def _open(self) -> None:
        self.close()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        path = self.directory / f"{PREFIX}{stamp}Z.jsonl"
        while path.exists():  # two pieces in one microsecond: never append to another's
            time.sleep(1e-6)
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
            path = self.directory / f"{PREFIX}{stamp}Z.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o640)
        self.path, self._size, self._opened = path, 0, time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
