"""The values a numeric input may take: finite, between a low and a high bound, whole or not.

Declared once with what they bound — a matrix key in shadowlab/matrix/schema.py (validation
applies them, docs/matrix.md shows them), a command-line option in its `add_argument` (`type=
Bounds(...).argument`) — so NaN, an infinity or a value out of range is refused where it was
written, naming the bound and the value, and never reaches a deadline, a sleep or a loop count.
Stdlib only: the command line imports it before it knows which subcommand runs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

MAX_INT = (1 << 63) - 1  # every integer must fit an engine's int64


@dataclass(frozen=True)
class Bounds:
    """low ≤ x ≤ high (`low_open` / `high_open`: that bound itself excluded), x finite, and whole
    when `integer`. `unit` names the value in messages ("seconds"; default "a number"/"an
    integer"); `hint` says what to write instead."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    high_open: bool = False
    unit: str = ""
    hint: str | None = None

    def admits(self, x: float) -> bool:
        # NaN compares false with everything: test what is allowed, not what is not.
        above = self.low < x if self.low_open else self.low <= x
        below = x < self.high if self.high_open else x <= self.high
        return above and below and (not self.integer or x == int(x))

    @property
    def what(self) -> str:
        return self.unit or ("an integer" if self.integer else "a number")

    def text(self) -> str:
        """`≥ 1 and ≤ 4096`, `> 0 and ≤ 86400`."""
        return (f"{'>' if self.low_open else '≥'} {figure(self.low)} and "
                f"{'<' if self.high_open else '≤'} {figure(self.high)}")

    def problem(self, x: float) -> str | None:
        """Why the number ``x`` is refused, naming the bound it breaks and ``x``; None: admitted."""
        if self.admits(x):
            return None
        if isinstance(x, float) and math.isnan(x) or self.integer and math.isfinite(x) and x != int(x):
            return f"expected {self.what} {self.text()}, got {figure(x)}"
        if x > self.high or x == self.high:
            return f"{figure(x)} is too large ({'below' if self.high_open else 'at most'} {figure(self.high)})"
        return f"expected {self.what} {'>' if self.low_open else '≥'} {figure(self.low)}, got {figure(x)}"

    def argument(self, text: str) -> int | float:
        """An option's value (argparse's `type=`): refused as a usage error (exit 2) unless it is a
        number within the bounds."""
        try:
            x: int | float = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.what}") from None
        problem = self.problem(x)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem + (f" ({self.hint})" if self.hint else ""))
        return x


def figure(x: float) -> str:
    """A number as a message shows it: whole ones without a fraction, a huge one by its length."""
    if isinstance(x, int) and len(str(abs(x))) > 24:
        return f"a {len(str(abs(x)))}-digit number"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return str(x) if isinstance(x, int) else f"{x:g}"
