"""The pages at 1280 and 1920 px in headless Chromium: nothing sticks out sideways, no label is
clipped, and the traffic report is short (layout_probe.py measures element boxes, not pixels).

The probe is shown failing first, on a page made to overflow (a fixed 1,340 px SVG whose label
runs under its bar, the report's old timeline); then it must pass on report.html (the case
study's run with a mismatch expanded, the stored ckpt and traffic runs), simulate.html and
logs.html (whose shared-prefix histogram put its tallest count above the SVG before).
Without Chromium the tests skip with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from layout_probe import chromium, probe
from shadowlab import present
from shadowlab.report import render_run

from synthetic_runs import ckpt_verdict, with_turn, write_run

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "tests" / "fixtures" / "runs" / "docs"
WIDTHS = (1280, 1920)
# The traffic report of matrices/traffic.yaml before issue 24 (main at 146019b), measured the
# same way at 1280 px: body.scrollHeight 25,761 px. It must now be at least 3× shorter.
TRAFFIC_HEIGHT_BEFORE = 25761


@pytest.fixture(autouse=True)
def _need_chromium():
    if chromium() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no chromium on PATH: .ci/run must install Debian's chromium")
        pytest.skip("no chromium on PATH (apt-get install -y chromium); CI requires it")


BROKEN = present.environment().from_string("""<!DOCTYPE html><html><head><meta charset="utf-8">
<style>body { margin: 0; padding: 18px 24px; font: 13px system-ui, "DejaVu Sans", sans-serif; }
svg text { font-size: 11px; } .cut { width: 120px; overflow: hidden; white-space: nowrap; }</style></head><body>
<svg xmlns="http://www.w3.org/2000/svg" width="1340" height="60" viewBox="0 0 1340 60">
  <text x="4" y="30"><tspan font-weight="600">{{ label }}</tspan> {{ tokens | num }} tokens</text>
  <rect x="150" y="20" width="1020" height="12" fill="#f5b971"/>
</svg>
<div class="cut">{{ label }}: {{ tokens | num }} prompt tokens, all of them re-processed</div>
</body></html>""")


def test_the_probe_fails_on_a_page_made_to_overflow(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(BROKEN.render(label="t12 conversation-2", tokens=3075), encoding="utf-8")
    narrow = probe(page, 1280, tmp_path)
    assert narrow.width == 1280
    assert narrow.scroll_width > 1280 and any(o.startswith("svg") for o in narrow.overflow), narrow
    assert any("runs under a bar" in c and "3,075" in c for c in narrow.clipped), narrow
    assert any(c.startswith("div.cut") for c in narrow.clipped), narrow
    wide = probe(page, 1920, tmp_path)
    assert wide.width == 1920 and not wide.overflow  # 1,340 px fit in 1,920 ...
    assert any("runs under a bar" in c for c in wide.clipped)  # ... the label is still cut


def _fits(page: Path, scratch: Path) -> dict[int, object]:
    found = {}
    for width in WIDTHS:
        layout = probe(page, width, scratch)
        assert layout.width == width
        assert layout.scroll_width <= width and not layout.overflow, (width, layout.overflow[:10])
        assert not layout.clipped, (width, layout.clipped[:10])
        found[width] = layout
    return found


@pytest.fixture(scope="module")
def ckpt_run(tmp_path_factory) -> Path:
    """The case study's run with a stale restore: failures in the banner, a mismatch expanded."""
    verdict = ckpt_verdict(stale_restore=True)
    turn = verdict.cell("reference.policy0.A-C").turns[1]
    long_text = "a fairly long completion that wraps " * 12 + "x" * 300  # an unbroken run of bytes too
    verdict = with_turn(verdict, "reference.policy0.A-C", 1,
                        identity=dataclasses.replace(turn.identity, text=long_text, detail=long_text))
    run = write_run(tmp_path_factory.mktemp("layout") / "ckpt", verdict)
    render_run(run)
    return run


def stored_run(name: str, into: Path) -> Path:
    """A stored run of tests/fixtures/runs/docs unpacked into `into` (no cells/: UNVERIFIED)."""
    run = into / name
    run.mkdir(parents=True)
    for piece in (STORED / name).iterdir():
        if piece.suffix == ".gz":
            (run / piece.stem).write_bytes(gzip.decompress(piece.read_bytes()))
        else:
            shutil.copy(piece, run / piece.name)
    return run


def test_ckpt_report_fits_at_1280_and_1920(ckpt_run, tmp_path):
    _fits(ckpt_run / "report.html", tmp_path)
    stored = stored_run("ckpt", tmp_path)  # the real run of matrices/ckpt.yaml
    render_run(stored)
    _fits(stored / "report.html", tmp_path)


def test_traffic_report_fits_and_is_three_times_shorter(tmp_path):
    run = stored_run("traffic", tmp_path)
    render_run(run)
    layouts = _fits(run / "report.html", tmp_path)
    height = layouts[1280].folded_height
    assert height * 3 <= TRAFFIC_HEIGHT_BEFORE, f"{height} px at 1280 (before: {TRAFFIC_HEIGHT_BEFORE})"
    # the same information is reachable: every table is there, folded
    assert layouts[1280].open_height > 2 * height


def test_simulate_page_fits(tmp_path):
    out = tmp_path / "sim"
    done = subprocess.run([sys.executable, "-m", "shadowlab", "simulate", "shape:case-study:1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    _fits(out / "simulate.html", tmp_path)


def test_logs_page_fits(tmp_path):
    logs = sorted((ROOT / "tests" / "fixtures" / "logs" / "llama.cpp-b11434").glob("*.log"))
    logs += sorted((ROOT / "tests" / "fixtures" / "logs" / "llama-server").glob("*.log"))
    out = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "shadowlab", "logs", *map(str, logs), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    _fits(out / "logs.html", tmp_path)
