"""Shared fixtures for shadowlab's tests.

Every test session gets its own lock directory, so core and port leases taken by
tests never wait on (or collide with) shadowlab runs of other users of the machine;
tests that check two shadowlab processes against each other share it explicitly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STANDIN_ENGINE = REPO / "tests" / "shadowlab" / "standin_engine.py"


@pytest.fixture(autouse=True, scope="session")
def _session_lock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("locks")
    previous = os.environ.get("SHADOWLAB_LOCK_DIR")
    os.environ["SHADOWLAB_LOCK_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("SHADOWLAB_LOCK_DIR", None)
    else:
        os.environ["SHADOWLAB_LOCK_DIR"] = previous


@pytest.fixture
def standin_argv() -> list[str]:
    """argv prefix of the stand-in engine (append --port N and options)."""
    return [sys.executable, str(STANDIN_ENGINE)]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
