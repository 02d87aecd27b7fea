"""report.html in a real browser: what a reader sees.

Headless Chromium (Debian's `chromium`) renders the report of a run whose engine's text holds
bidirectional overrides, markup and control bytes; the test checks the DOM after parsing
(`--dump-dom`) and the pixels (`--screenshot`):

- the hostile text is shown literally: no element the engine wrote exists, no bidirectional
  control is left in the text (the escaped form `\\u202e` is), no script ran;
- the verdict banner says what verdicts.json and the gate say;
- every timeline is drawn: each turn's bar is an SVG rect of non-zero width, and the
  screenshot is not blank.

Without Chromium the test skips with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import dataclasses
import html.parser
import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from shadowlab.judge import gate
from shadowlab.report import render_run

from synthetic_runs import ckpt_verdict, with_turn, write_run

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
HOSTILE_TEXT = ("safe\u202egnp.exe\u202c \u2066iso\u2069 <script>document.title='pwned'</script>"
                "<img src=x onerror=alert(1)><b id=engine-bold>bold</b>\x1b[31m\x00")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but no chromium on PATH: .ci/run must install Debian's chromium")
    pytest.skip("no chromium on PATH (apt-get install -y chromium); CI requires it")


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args]
    done = subprocess.run(cmd, capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    """The case study's run, with a warm turn whose output (hostile text) differs from cold."""
    tmp = tmp_path_factory.mktemp("browser")
    verdict = ckpt_verdict(stale_restore=True)
    cell = "reference.policy0.A-C"
    turn = verdict.cell(cell).turns[1]
    ident = dataclasses.replace(turn.identity, text=HOSTILE_TEXT, detail=HOSTILE_TEXT)
    verdict = with_turn(verdict, cell, 1, identity=ident, notes=(HOSTILE_TEXT,))
    run = write_run(tmp / "run", verdict)
    render_run(run)
    return run


@pytest.fixture(scope="module")
def dom(hostile_run, tmp_path_factory) -> "Dom":
    done = run_chromium(tmp_path_factory.mktemp("dom"), "--dump-dom", (hostile_run / "report.html").as_uri())
    parsed = Dom()
    parsed.feed(done.stdout.decode("utf-8"))
    return parsed


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Dom(html.parser.HTMLParser):
    """The DOM Chromium built: its elements (tag, attributes, ancestry) and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.stack: list[str] = []
        self.text: list[str] = []
        self.banner_text: list[str] = []
        self._banner_depth: int | None = None

    def handle_starttag(self, tag, attrs):
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes, tuple(self.stack)))
        if tag in VOID:  # no end tag (Chromium's dump closes every SVG element explicitly)
            return
        self.stack.append(tag)
        if self._banner_depth is None and "banner" in attributes.get("class", "").split():
            self._banner_depth = len(self.stack)

    def handle_endtag(self, tag):
        while self.stack:
            if self._banner_depth is not None and len(self.stack) == self._banner_depth:
                self._banner_depth = -1  # the first banner ends here
            if self.stack.pop() == tag:
                break

    def handle_data(self, data):
        self.text.append(data)
        if self._banner_depth is not None and self._banner_depth > 0:
            self.banner_text.append(data)


def test_hostile_engine_text_is_shown_literally(dom):
    text = "".join(dom.text)
    assert not [c for c in text if c in BIDI_CONTROLS], "a bidirectional control reached the page"
    assert "safe\\u202egnp.exe\\u202c \\u2066iso\\u2069" in text  # shown, escaped
    assert "<script>document.title='pwned'</script>" in text  # as text, not as an element
    scripts = [e for e in dom.elements if e[0] == "script"]
    assert scripts == [], scripts
    assert not [e for e in dom.elements if e[0] == "img"], "the engine's <img> became an element"
    assert not [e for e in dom.elements if e[1].get("id") == "engine-bold"]
    assert not any(k.startswith("on") for _, attrs, _ in dom.elements for k in attrs)
    assert "\x1b" not in text and "\x00" not in text


def test_the_banner_says_what_verdicts_and_the_gate_say(dom, hostile_run):
    result = gate.evaluate(hostile_run)
    saved = json.loads((hostile_run / "verdicts.json").read_text())
    mismatches = sum(1 for c in saved["cells"] for t in c["turns"]
                     if (t.get("identity") or {}).get("status") == "mismatch")
    assert result.exit_code == 1 and mismatches > 0
    banner = " ".join("".join(dom.banner_text).split())
    assert "NOT QUALIFIED" in banner
    assert result.verdict_text in banner and f"gate exit code {result.exit_code}" in banner
    assert f"{sum(1 for c in result.checks if c.status.value == 'fail')} failed" in banner


def test_every_timeline_is_drawn_with_a_non_empty_box(dom, hostile_run):
    saved = json.loads((hostile_run / "verdicts.json").read_text())
    warm_turns = sum(len(c["turns"]) for c in saved["cells"] if c["kind"] == "warm" and c["turns"])
    svgs = [e for e in dom.elements if e[0] == "svg" and e[1].get("role") == "img"]
    assert len(svgs) == sum(1 for c in saved["cells"] if c["kind"] == "warm" and c["turns"])
    # the processed bar of each turn: the first rect of each row group, inside a timeline svg
    bars = [e for e in dom.elements if e[0] == "rect" and "svg" in e[2] and e[1].get("fill") == "#f5b971"
            and "g" in e[2]]
    assert len(bars) == warm_turns
    assert all(float(e[1]["width"]) > 0 and float(e[1]["height"]) > 0 for e in bars), bars


def test_the_rendered_page_is_not_blank(hostile_run, tmp_path):
    png = tmp_path / "report.png"
    run_chromium(tmp_path, f"--screenshot={png}", "--window-size=1200,1400", (hostile_run / "report.html").as_uri())
    width, height, rows = decode_png(png.read_bytes())
    assert (width, height) == (1200, 1400)
    colours = {row[i:i + 3] for row in rows[::40] for i in range(0, len(row), 3 * 37)}
    assert len(colours) > 8, f"only {len(colours)} colours sampled: a blank page"
    # the banner (pink: not qualified) is drawn near the top
    pink = {c for row in rows[60:200] for c in (row[i:i + 3] for i in range(0, len(row), 3 * 11))
            if c[0] > 240 and 220 < c[1] < 245 and 220 < c[2] < 245}
    assert pink, "no not-qualified banner colour near the top of the page"


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """An 8-bit RGB/RGBA PNG as (width, height, rows of RGB bytes) — what Chromium writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, *_ = header
    assert depth == 8 and colour in (2, 6), header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        previous = line
        rows.append(bytes(line) if channels == 3 else bytes(b for j in range(0, stride, 4) for b in line[j:j + 3]))
    return width, height, rows
