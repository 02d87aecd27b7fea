"""The C accelerator's constants are generated from shadowlab/logs/accel.py: the header in the
tree must be what scripts/gen_logscan_constants.py writes, and --check must fail when it is not."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from shadowlab.logs import accel

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_logscan_constants.py"
HEADER = ROOT / "shadowlab" / "logs" / "_logscan_constants.h"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", *args], capture_output=True, text=True, timeout=60)


def _generator():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        return importlib.import_module("gen_logscan_constants")
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_the_header_in_the_tree_is_the_generated_one():
    p = _check()
    assert p.returncode == 0, p.stderr


def test_check_fails_on_a_header_that_disagrees_with_its_source(tmp_path):
    stale = tmp_path / "_logscan_constants.h"
    stale.write_text(HEADER.read_text().replace(f"#define LOGSCAN_ABI {accel.ABI} ", f"#define LOGSCAN_ABI {accel.ABI - 1} "))
    p = _check("--header", str(stale))
    assert p.returncode == 1 and "stale at line" in p.stderr and "LOGSCAN_ABI" in p.stderr, p.stderr
    assert _check("--header", str(tmp_path / "missing.h")).returncode == 1


def test_a_changed_fact_changes_the_header(monkeypatch):
    """Each kind of fact reaches the header: a kind moved, an outcome renamed, a field moved."""
    gen = _generator()
    base = gen.render()
    monkeypatch.setattr(accel, "OUTCOMES", accel.OUTCOMES[:-1] + ("reset",))
    assert "O_RESET" in gen.render() and gen.render() != base
    monkeypatch.undo()
    monkeypatch.setattr(accel, "MAX_SAVED", accel.MAX_SAVED + 1)
    assert f"#define MAX_SAVED {accel.MAX_SAVED}" in gen.render()
    monkeypatch.undo()
    monkeypatch.setattr(accel, "KINDS", accel.KINDS[1:] + accel.KINDS[:1])  # no longer parse's order
    with pytest.raises(AssertionError, match="disagree"):
        gen.render()


def test_the_built_module_speaks_the_generated_abi():
    try:
        from shadowlab.logs import _logscan
    except ImportError:
        pytest.skip("the C accelerator is not built here")
    assert _logscan.ABI == accel.ABI  # a build older than the header: rebuild (setup.py build_ext)
