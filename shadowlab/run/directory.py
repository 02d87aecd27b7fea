"""The run directory: made new or resumed, locked for the whole run, its run-wide records
(matrix.yaml, options.json, plan.json, environment.json) written once and compared on --resume.

One shadowlab at a time per run directory: ``RUN_DIR/.shadowlab.lock`` is flock'd for the
whole run, and ``options.json`` keeps the options that change results, which a resume must
repeat. The machine failing a write here is an InfrastructureError (exit 3), never a traceback.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from typing import Any

import yaml

from shadowlab.errors import InfrastructureError, RunDirError
from shadowlab.matrix import Matrix
from shadowlab.plan import Plan
from shadowlab.results import records
from shadowlab.results.records import RunLayout
from shadowlab.run import environment
from shadowlab.run.context import RunOptions, request_timeout

RESUME_HINT = "free space or choose a writable --out, then rerun with --resume"


def open_run_dir(options: RunOptions, matrix: Matrix) -> RunLayout:
    """The run directory: new, or an existing one with --resume; anything else is refused."""
    if options.out is not None:
        root = options.out
    else:
        if options.resume:
            raise RunDirError("--resume needs --out (the run directory to resume)", path=".")
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        root = records.child_dir(options.reports_dir, f"{matrix.name}-{stamp}")
        suffix = 1
        while root.exists():  # two runs started within the same second
            suffix += 1
            root = records.child_dir(options.reports_dir, f"{matrix.name}-{stamp}-{suffix}")
    layout = RunLayout(root)
    if root.exists() and not root.is_dir():
        raise InfrastructureError(f"{root}: the run directory is not a directory",
                                  hint="choose another --out")
    check_run_dir(layout, resume=options.resume)
    root.mkdir(parents=True, exist_ok=True)
    return layout


def check_run_dir(layout: RunLayout, *, resume: bool, locked: bool = False) -> None:
    """A new run needs an empty directory, a resume one with a plan.json; neither one that
    another shadowlab is running in (``locked``: this process holds the lock)."""
    root = layout.root
    holder = None if locked else _lock_holder(layout)
    if holder is not None:
        raise _in_use(layout, holder)
    exists = root.is_dir() and any(p.name != layout.lock.name for p in root.iterdir())
    if exists and not resume:
        raise RunDirError(
            "the run directory already exists and is not empty",
            path=str(root),
            hint="pass --resume to finish that run, or choose another --out",
        )
    if resume and not layout.plan.exists():
        raise RunDirError("nothing to resume: no plan.json", path=str(root),
                          hint="start the run without --resume")


@contextlib.contextmanager
def lock_run_dir(layout: RunLayout, *, resume: bool) -> Iterator[None]:
    """Hold an exclusive flock on RUN_DIR/.shadowlab.lock for the whole run.

    Two shadowlab in one directory would run the same cells and overwrite each other's
    records; the second is refused at once, naming the first's pid. The kernel drops the
    lock when its holder dies (kill -9 included), so it is never stale. The file is left in
    place: unlinking it would let a third process lock a fresh file while the second still
    holds the old one.
    """
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(layout, os.pread(fd, 32, 0)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        check_run_dir(layout, resume=resume, locked=True)  # again, now that no other run can
        yield
    finally:
        os.close(fd)  # drops the flock


def _lock_holder(layout: RunLayout) -> bytes | None:
    """What the lock file says when another process holds it (its pid), else None."""
    try:
        fd = os.open(layout.lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None  # free (closing the fd below releases it)
    except BlockingIOError:
        return os.pread(fd, 32, 0)
    finally:
        os.close(fd)


def _in_use(layout: RunLayout, holder: bytes) -> RunDirError:
    pid = holder.decode("ascii", "replace").strip()
    return RunDirError(f"another shadowlab (pid {pid if pid.isdigit() else 'unknown'}) is running in "
                       "this run directory", path=str(layout.root),
                       hint="wait for it to end (or stop it), then --resume")


def storage_errors() -> contextlib.AbstractContextManager[None]:
    """The run directory (or the disk under it) failing a write is the machine's failure:
    one line naming the file and the cause, exit 3, never a traceback."""
    return records.storage_errors(RESUME_HINT)


def storage_failure(exc: OSError) -> InfrastructureError:
    return records.storage_failure(exc, RESUME_HINT)


def result_options(options: RunOptions) -> dict[str, Any]:
    """The options that change what a run measures, as they take effect: a resume must repeat them."""
    shard = {"shard": str(options.shard)} if options.shard else {}  # a whole run's file stays as it was
    only = {"only": list(options.only)} if options.only else {}  # likewise
    return {"faults": list(options.faults), "request_timeout_s": request_timeout(options.request_timeout_s),
            **shard, **only}


def write_run_records(layout: RunLayout, matrix: Matrix, plan: Plan, options: RunOptions) -> None:
    resolved = yaml.safe_dump(matrix.to_dict(), sort_keys=False, allow_unicode=True)
    if options.resume:
        if layout.matrix.read_text(encoding="utf-8") != resolved:
            raise RunDirError(
                "the matrix changed since this run started; its cells would not be comparable",
                path=str(layout.root),
                hint="resume with the same matrix, or start a new run",
            )
        check_resumed_options(layout, result_options(options))
        return
    records.write_bytes_atomic(layout.matrix, resolved.encode("utf-8"))
    records.write_json_atomic(layout.options, result_options(options))  # before plan.json:
    records.write_json_atomic(layout.plan, plan.to_dict())  # a resumable run always has both
    records.write_json_atomic(layout.environment, environment.capture())


def check_resumed_options(layout: RunLayout, now: dict[str, Any]) -> None:
    """--resume with other --fault or --request-timeout would mix two experiments: refuse."""
    try:
        then = records.read_json(layout.options)
    except (RunDirError, OSError, ValueError):
        then = None
    if not isinstance(then, dict):
        raise RunDirError("no readable options.json: the --fault and --request-timeout this run "
                          "started with are unknown", path=str(layout.root),
                          hint="start a new run")
    if then.get("request_timeout_s") is None:  # written before options.json held the timeout in effect
        then = {**then, "request_timeout_s": request_timeout(None)}
    flags = {"faults": "--fault", "request_timeout_s": "--request-timeout", "shard": "--shard", "only": "-k"}
    changed = [f"{flag} {_shown(then.get(key))} then, {_shown(now.get(key))} now"
               for key, flag in flags.items() if then.get(key) != now.get(key)]
    if changed:
        raise RunDirError(f"options changed since this run started ({'; '.join(changed)}); its "
                          "cells would not be comparable", path=str(layout.root),
                          hint="resume with the options it started with, or start a new run")


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "not given"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)
