"""Measure a page's layout in headless Chromium: element boxes, not pixels.

    probe(html_path, width, scratch) -> Layout

A copy of the page gets a script (the pages' own Content-Security-Policy forbids scripts, so
the copy drops that one meta tag) that opens every <details>, lets the browser lay the page out
at `width` CSS px, and writes what it measured into the DOM; `chromium --headless --dump-dom`
prints that DOM. Reported, each with the element it is about:

- overflow: an element whose box reaches past the viewport's right edge (the page scrolls
  sideways), and the document's own scroll width;
- clipped: an HTML element whose content is cut by its own `overflow` (scrollWidth >
  clientWidth), and an SVG <text> that leaves its <svg>, runs under a filled shape drawn after
  it (a bar painted over a label: "3,075 to"), or overlaps another <text>;
- height: document.body.scrollHeight with every <details> folded as the page ships (measured
  before they are opened).

Used by tests/shadowlab/test_report_layout.py and scripts/screenshot_report.py's --measure.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Runs in the page once it is parsed. Tolerances: 1 px for boxes (sub-pixel rounding), 2 px of
# overlap in both directions before two texts or a text and a bar count as colliding.
SCRIPT = r"""
(function () {
  const out = {width: window.innerWidth};
  out.folded_height = document.body.scrollHeight;
  document.querySelectorAll('details').forEach(d => d.open = true);
  out.open_height = document.body.scrollHeight;
  out.scroll_width = document.documentElement.scrollWidth;
  const name = el => {
    const cls = (el.getAttribute('class') || '').trim();
    const text = (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 60);
    return el.tagName.toLowerCase() + (cls ? '.' + cls.split(/\s+/).join('.') : '') + ' "' + text + '"';
  };
  const overflow = [], clipped = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') continue;
    if (el.id === 'layout-probe') continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right > window.innerWidth + 1) overflow.push(name(el) + ' right=' + Math.round(r.right));
    const st = getComputedStyle(el);
    if (/(hidden|clip|auto|scroll)/.test(st.overflowX) && el.scrollWidth > el.clientWidth + 1 && el.tagName.toLowerCase() !== 'svg')
      clipped.push(name(el) + ' content ' + el.scrollWidth + ' > box ' + el.clientWidth);
  }
  const hit = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 2 &&
                        Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 2;
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    if (box.width === 0) continue;
    const shapes = Array.from(svg.querySelectorAll('text, rect'));
    const texts = [];
    shapes.forEach((el, i) => {
      if (el.tagName.toLowerCase() !== 'text') return;
      const r = el.getBoundingClientRect();
      if (r.width === 0) return;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        clipped.push('svg text "' + el.textContent + '" leaves its svg');
      for (const other of texts)
        if (hit(r, other.r)) clipped.push('svg text "' + el.textContent + '" overlaps "' + other.el.textContent + '"');
      texts.push({el: el, r: r});
      for (const later of shapes.slice(i + 1)) {
        if (later.tagName.toLowerCase() !== 'rect') continue;
        const fill = getComputedStyle(later).fill;
        if (fill === 'none' || fill === 'rgb(255, 255, 255)' || fill === 'rgba(0, 0, 0, 0)') continue;
        if (hit(r, later.getBoundingClientRect()))
          clipped.push('svg text "' + el.textContent + '" runs under a bar drawn after it');
      }
    });
  }
  out.overflow = overflow;
  out.clipped = clipped;
  const pre = document.createElement('pre');
  pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""

CSP = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>', re.I)
RESULT = re.compile(r'<pre id="layout-probe">(.*?)</pre>', re.S)


@dataclass(frozen=True)
class Layout:
    width: int  # the viewport's CSS width the page was laid out at
    folded_height: int  # document.body.scrollHeight as shipped (<details> folded)
    open_height: int  # with every <details> open
    scroll_width: int
    overflow: tuple[str, ...]
    clipped: tuple[str, ...]


def chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def probe(page: Path, width: int, scratch: Path, height: int = 900, timeout_s: float = 180) -> Layout:
    """Lay `page` out at `width` px in headless Chromium and measure it (scratch: a directory
    for the instrumented copy and the browser profile)."""
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install -y chromium)")
    scratch.mkdir(parents=True, exist_ok=True)
    text = CSP.sub("", page.read_text(encoding="utf-8"), count=1)
    copy = scratch / f"probe-{width}-{page.name}"
    copy.write_text(text.replace("</body>", f"<script>{SCRIPT}</script></body>", 1), encoding="utf-8")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={scratch / 'profile'}",
           f"--window-size={width},{height}", "--dump-dom", copy.as_uri()]
    done = subprocess.run(cmd, capture_output=True, timeout=timeout_s)
    found = RESULT.search(done.stdout.decode("utf-8", errors="replace"))
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"chromium measured nothing (exit {done.returncode}): "
                           f"{done.stderr.decode(errors='replace')[-1500:]}")
    data = json.loads(html.unescape(found.group(1)))
    return Layout(data["width"], data["folded_height"], data["open_height"], data["scroll_width"],
                  tuple(data["overflow"]), tuple(data["clipped"]))
