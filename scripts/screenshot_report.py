#!/usr/bin/env python3
"""Render a run's report.html in headless Chromium and save a PNG (docs/report-NAME.png).

    python scripts/screenshot_report.py reports/<run-id> --out docs/report-ckpt.png [--width 1280] [--height 2400]

Re-renders the report first (`shadowlab.report.render_run`) unless --no-render. Chromium runs
offline: no network, no GPU, a throw-away profile. The PNG is then shrunk (palette
quantisation via Pillow when available); it warns when the result is over --max-kb.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("screenshot_report: no Chromium found (apt-get install -y chromium)")


def screenshot(html: Path, png: Path, width: int, height: int, timeout_s: float = 120) -> None:
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="shadowlab-chromium-") as profile:
        cmd = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1",
            f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}",
            html.resolve().as_uri(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not png.exists():
        raise SystemExit(f"screenshot_report: chromium failed ({done.returncode}):\n{done.stderr[-2000:]}")


def shrink(png: Path, max_kb: int) -> None:
    """Quantise to a 256-colour palette (the report is flat colours; text stays crisp)."""
    try:
        from PIL import Image
    except ImportError:
        print(f"screenshot_report: {png} is {png.stat().st_size // 1024} KB and Pillow is not installed "
              "to shrink it", file=sys.stderr)
        return
    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        small.save(png, optimize=True)
    if png.stat().st_size > max_kb * 1024:
        print(f"screenshot_report: {png} is still {png.stat().st_size // 1024} KB (> {max_kb} KB)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write, e.g. docs/report-ckpt.png")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in CSS px (default 1280: a laptop)")
    parser.add_argument("--height", type=int, default=2400)
    parser.add_argument("--max-kb", type=int, default=500)
    parser.add_argument("--no-render", action="store_true", help="use the existing report.html as is")
    parser.add_argument("--gate-candidate", metavar="NAME", default=None,
                        help="render the report gating this configuration (shadowlab report --gate-candidate)")
    args = parser.parse_args(argv)
    if not args.no_render:
        from shadowlab.report import render_run

        render_run(args.run_dir, candidate=args.gate_candidate)
    html = args.run_dir / "report.html"
    if not html.is_file():
        raise SystemExit(f"screenshot_report: {html} does not exist")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    screenshot(html, args.out, args.width, args.height)
    shrink(args.out, args.max_kb)
    print(f"{args.out}: {args.out.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
