"""Engine text made visible: the one escape every output (terminal, HTML, Markdown, JUnit) uses.

    visible(text) -> str     control bytes, bidirectional controls and lone surrogates as escapes
    xml_text(text) -> str    the same, plus the code points XML 1.0 forbids (for junit.xml)

An engine's text is untrusted. Escaping markup is each format's own job (Jinja's autoescape, the
Markdown cell writer, ElementTree); what no format does is make *invisible* characters visible:

- C0/C1 control bytes (ANSI escapes rewrite a terminal, NUL truncates C strings, CR overwrites
  a line); newlines and tabs are kept;
- bidirectional controls (U+202A-U+202E embeddings and overrides, U+2066-U+2069 isolates,
  U+200E/U+200F marks, U+061C the Arabic letter mark): a browser, terminal or CI log reorders
  the text around them, so `abc\\u202edcba` reads as something it is not ("Trojan Source",
  CVE-2021-42574);
- lone surrogates (an engine's invalid UTF-8, escaped in its JSON): not encodable at all.

Each becomes `\\xNN` (below U+0100) or `\\uNNNN`, so a reader sees that it was there.
"""

from __future__ import annotations

import re
from typing import Any

_C0_C1 = "\x00-\x08\x0b-\x1f\x7f-\x9f"
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_SURROGATES = "\ud800-\udfff"

# ASCII text can hold only C0 controls and DEL of all the above: a small class, compiled at once.
# The full classes (the ranges of surrogates and bidirectional controls, ~1 ms to compile: a
# noticeable part of a short command's start) are compiled at the first text that needs them.
_ASCII_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_FULL: dict[str, re.Pattern[str]] = {}


def _full(name: str) -> re.Pattern[str]:
    pattern = _FULL.get(name)
    if pattern is None:
        # XML 1.0 also forbids U+FFFE/U+FFFF (and keeps only tab, LF, CR among C0; CR is escaped).
        extra = "\ufffe\uffff" if name == "xml" else ""
        pattern = _FULL[name] = re.compile(f"[{_C0_C1}{_BIDI}{_SURROGATES}{extra}]")
    return pattern


def visible(text: Any) -> str:
    """`text` with every invisible or reordering character shown as an escape (None: "")."""
    if text is None:
        return ""
    text = str(text)
    return (_ASCII_INVISIBLE if text.isascii() else _full("visible")).sub(_escape_match, text)


def xml_text(text: Any) -> str:
    """Text allowed in XML 1.0, invisible characters shown (ElementTree escapes markup but writes
    control bytes raw, which makes the file unreadable)."""
    text = "" if text is None else str(text)
    return (_ASCII_INVISIBLE if text.isascii() else _full("xml")).sub(_escape_match, text)


def _escape_match(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


__all__ = ["visible", "xml_text"]
