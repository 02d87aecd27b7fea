"""simulate.html says which policy wins and why (shadowlab/templates/simulate.html.j2).

The winner is the policy with the largest net benefit per turn against the first one listed
(prefill saved minus checkpoint time spent); when none beats the first, the first wins and the
page says that the policy reusing most does not pay for its checkpoints. Shown both ways on the
case study's traffic shape: POLICY=0 at the measured checkpoint cost wins; the same placement
with checkpoints made absurdly expensive loses.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path


def _page(tmp_path: Path, *policies: str) -> str:
    out = tmp_path / "sim"
    args = [sys.executable, "-m", "shadowlab", "simulate", "shape:case-study:1", "--out", str(out)]
    for p in policies:
        args += ["--policy", p]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (out / "simulate.html").read_text(encoding="utf-8")
    answer = page[page.index('id="winner"'):page.index("</div>", page.index('id="winner"'))]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", answer)).split())


def test_the_page_names_the_winner_and_why(tmp_path):
    text = _page(tmp_path, "baseline", "policy0", "prompt-end")
    assert text.startswith('id="winner"> Winner: policy0 — net +'), text
    assert "of the ideal (against 0.0 %)" in text and "ms of prefill per turn" in text


def test_a_policy_whose_checkpoints_cost_more_than_they_save_does_not_win(tmp_path):
    text = _page(tmp_path, "baseline", "policy0:create_ms=100000")
    assert text.startswith('id="winner"> Winner: baseline, the first policy listed'), text
    assert "no other policy saves more prefill than its checkpoints cost" in text
    assert "policy0:create_ms=100000 reuses the most" in text
