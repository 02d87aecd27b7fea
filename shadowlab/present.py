"""How shadowlab shows figures: the HTML template environment and the number formatters.

    environment() -> jinja2.Environment     every page's environment (report, logs, simulate)
    pct(0.414) -> "41.4%"    num(4560) -> "4,560"    ms(12.34) -> "12.3"    signed(-3) -> "−3"

One home for both, so that a share reads the same on every page and no page renders engine text
without the escape: autoescape is on for every template whatever its extension, StrictUndefined
turns a misspelt field into an error instead of an empty cell, and `finalize` passes every
`{{ }}` output through `escape.visible` (control bytes and bidirectional controls shown as
escapes) before autoescape — no field can forget `| visible`. A missing figure is "—".

A floor below the stages (it imports only `escape`): report, logs and simulate import it, never
each other's environment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shadowlab.escape import visible

if TYPE_CHECKING:
    import jinja2

MISSING = "—"


def pct(share: float | None, digits: int = 1) -> str:
    """A share (0..1) as a percentage: 0.414 -> "41.4%"."""
    return MISSING if share is None else f"{share * 100:.{digits}f}%"


def num(value: int | float | None) -> str:
    """A count with thousands separators; a float with one decimal."""
    if value is None:
        return MISSING
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def ms(value: float | None) -> str:
    """Milliseconds, one decimal (the unit is the column's or the sentence's)."""
    return MISSING if value is None else f"{value:,.1f}"


def signed(value: float | None, digits: int = 0) -> str:
    """A difference with its sign (a true minus, not a hyphen): +1,234 / −56 / 0."""
    if value is None:
        return MISSING
    text = f"{abs(value):,.{digits}f}"
    return ("+" if value > 0 else "−" if value < 0 else "") + text


def short_sha(value: str | None) -> str:
    return MISSING if not value else value[:12]


# SVG labels: a label column is as wide as its longest label at CHAR_PX per character (an upper
# bound for 11 px bold DejaVu Sans, the widest of the fonts the pages name), so no label runs
# under the bars drawn after it; tests/shadowlab/test_report_layout.py measures it in Chromium.
CHAR_PX = 7.7
LABEL_CHARS = 28


def label_width(labels: Sequence[str], least: int = 110, most: int = 300) -> int:
    """SVG units a column of 11 px labels needs (bounded), with a margin."""
    widest = max((len(t) for t in labels), default=0)
    return int(min(max(12 + widest * CHAR_PX, least), most))


def fit_label(text: str, chars: int = LABEL_CHARS) -> str:
    """A label cut to `chars` with "…" (the element's tooltip holds it whole)."""
    return text if len(text) <= chars else text[:chars - 1] + "…"


def nice_step(span: int, target_ticks: int = 8) -> int:
    """A round tick step (1, 2, 2.5 or 5 × 10^k) giving about `target_ticks` ticks over `span`."""
    raw = max(span / target_ticks, 1)
    power = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * power:
            return max(int(mult * power), 1)
    return int(10 * power)


def environment() -> "jinja2.Environment":
    """The Jinja2 environment of every shadowlab HTML page (templates in shadowlab/templates).
    Jinja is imported here, not at the top: the gate and the text outputs use the formatters
    without paying for it."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("shadowlab", "templates"),
        autoescape=True,  # every template, whatever its extension: engine text is untrusted
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_visible_output,
    )
    env.filters.update(visible=visible, pct=pct, num=num, ms=ms, signed=signed, short_sha=short_sha, fit=fit_label)
    env.globals.update(nice_step=nice_step, label_width=label_width)  # for pages that draw their own axes
    return env


def _visible_output(value: Any) -> Any:
    """Each template output made visible before autoescape. Markup (a macro's own HTML, whose
    parts went through here already) passes as it is."""
    import markupsafe  # jinja2's own dependency: loaded already when this runs

    if value is None or isinstance(value, (markupsafe.Markup, int, float)):
        return value
    return visible(value)


__all__ = ["CHAR_PX", "MISSING", "environment", "fit_label", "label_width", "nice_step", "ms", "num", "pct", "short_sha", "signed"]
