"""report.html / report.md / junit.xml: content, self-containment, escaping of engine text."""

from __future__ import annotations

import dataclasses
import html.parser
import re
import xml.etree.ElementTree as ET

import pytest

from shadowlab import report
from shadowlab.judge import gate
from shadowlab.report import build_timeline, md_cell, nice_step, render_run, visible
from shadowlab.judge.verdicts import IdentityCheck, IdentityStatus, Outcome

from synthetic_runs import ROOT, ckpt_verdict, with_turn, write_run

REAL_RUN = ROOT / "tests" / "fixtures" / "runs" / "llama.cpp-b9093"

# Engine output is untrusted: markup, an SVG breakout, quotes, control bytes (ESC, NUL, BEL),
# U+FFFD from an invalid byte, and a lone surrogate (what JSON can carry for an undecodable byte).
NASTY = 'x<script>alert("1")</script></svg><img src=x onerror=\'y\'>&amp;\x1b[31m\x00\x07\ufffd\udcff'


def nasty_verdict():
    verdict = ckpt_verdict(stale_restore=True, failed_cell="reference.prompt_end.A-B-C")
    mismatch = IdentityCheck(IdentityStatus.MISMATCH, reference_cell="reference.policy0.cold.C", reused_tokens=2048,
                             first_diff_token=1, first_diff_byte=3, text=NASTY, reference_text="x<b>" + NASTY,
                             tokens=(1, 2), reference_tokens=(1, 3), detail=NASTY)
    verdict = with_turn(verdict, "reference.policy0.A-C", 1, identity=mismatch, notes=(NASTY,))
    verdict = with_turn(verdict, "reference.defaults.A-B-C", 1, outcome=Outcome.ERROR, error=NASTY)
    cells = tuple(dataclasses.replace(c, reason=NASTY) if c.status != "ok" else
                  dataclasses.replace(c, unknown_lines=1, unknown_samples=(NASTY,)) for c in verdict.cells)
    return dataclasses.replace(verdict, cells=cells)


@pytest.fixture(scope="module")
def nasty_run(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("nasty") / "run", nasty_verdict())
    paths = render_run(run)
    return run, paths


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("good") / "run", ckpt_verdict())
    return run, render_run(run)


class _TagCounter(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs


def test_render_run_writes_the_three_files(good_run):
    run, paths = good_run
    assert [p.name for p in paths] == ["report.html", "report.md", "junit.xml"]
    assert all(p.is_file() and p.parent == run for p in paths)
    assert (run / "verdicts.json").is_file()


def test_html_is_self_contained(good_run):
    text = good_run[1].html.read_text(encoding="utf-8")
    parser = _TagCounter()
    parser.feed(text)
    assert not {"script", "link", "img", "iframe", "object"} & set(parser.tags)
    assert not [v for k, v in parser.attrs if k in ("src", "href") and v and not v.startswith("#")]
    assert "@import" not in text and "url(" not in text
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)


def test_html_shows_banner_grid_timelines_identity_and_provenance(good_run):
    text = good_run[1].html.read_text(encoding="utf-8")
    assert "QUALIFIED" in text and "NOT QUALIFIED" not in text
    for section in ("Matrix", "Turns", "Turn timelines", "Byte identity", "Cold-vs-cold controls",
                    "Expectations", "Provenance"):
        assert f"<h2>{section}" in text
    assert text.count("<svg xmlns") == 10  # one timeline per warm cell
    assert "divergence point 2531" in text and "re-entry point 2048" in text
    assert "checkpoint restored: pos_max 2047, n_tokens 2048" in text
    assert "checkpoint erased by the cascade: pos_max 4095" in text
    assert "0123456789abcdef0123" in text and "testhost" in text


def test_banner_lists_the_failing_checks(nasty_run):
    text = nasty_run[1].html.read_text(encoding="utf-8")
    banner = text.split('<div class="banner', 1)[1].split("</div>\n<div", 1)[0]
    assert "NOT QUALIFIED" in banner and "exit code <b>3</b>" in banner
    assert "reference.policy0.A-C turn 1 (C)" in banner and "identity" in banner
    assert "reference.prompt_end.A-B-C" in banner  # the cell that did not run


def test_engine_text_is_escaped_everywhere(nasty_run):
    text = nasty_run[1].html.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text and "</svg><" not in text.replace("</svg>\n", "")
    assert "onerror='" not in text and 'alert("1")' not in text
    assert "&lt;script&gt;alert(&#34;1&#34;)&lt;/script&gt;&lt;/svg&gt;" in text
    assert "&amp;amp;" in text  # an entity in engine text stays text
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    assert "\\x1b[31m\\x00\\x07" in text and "\\udcff" in text and "\ufffd" in text
    parser = _TagCounter()
    parser.feed(text)
    assert parser.tags.count("svg") == text.count("</svg>")


def test_mismatch_is_expanded_with_both_outputs_and_the_first_difference(nasty_run):
    text = nasty_run[1].html.read_text(encoding="utf-8")
    section = text.split("<h3>Mismatches</h3>", 1)[1].split("<h2>", 1)[0]
    assert "reference.policy0.A-C" in section and "first differing token #1, byte 3" in section
    assert "warm output" in section and "cold output (reference.policy0.cold.C)" in section
    # the first 3 bytes are common; the rest is highlighted
    assert '<pre class="out">x&lt;s<mark class="diff">cript&gt;' in section
    assert '<pre class="out">x&lt;b<mark class="diff">&gt;x&lt;script' in section
    assert 'tokens: 1 <mark class="diff" title="first differing token (#1)">2</mark>' in section
    assert 'tokens: 1 <mark class="diff" title="first differing token (#1)">3</mark>' in section


def test_markdown_is_compact_and_escaped(nasty_run, good_run):
    good = good_run[1].markdown.read_text(encoding="utf-8")
    # a synthetic run holds verdicts.json, not the records it was computed from: said in the headline
    assert good.startswith("## ⚠️ shadowlab `ckpt` — qualified — UNVERIFIED: judged from verdicts.json alone")
    assert good.splitlines()[0].endswith("(exit 0)")
    assert "| defaults | A:cold → C:forced 0.0% |" in good
    bad = nasty_run[1].markdown.read_text(encoding="utf-8")
    assert "### Failed checks" in bad and "<script" not in bad and "\x1b" not in bad
    assert "&lt;script&gt;" in bad
    for line in bad.splitlines():
        if line.startswith("| error ") or line.startswith("| fail "):
            assert line.count(" | ") == 5  # no stray pipes from engine text


def test_junit_has_a_case_per_cell_and_per_check(nasty_run):
    run, paths = nasty_run
    root = ET.parse(paths.junit).getroot()  # parses: control bytes were made XML-safe
    assert root.tag == "testsuites"
    cells, checks, evidence = root.findall("testsuite")  # evidence: the synthetic run is verdicts.json alone
    assert (cells.get("name"), checks.get("name"), evidence.get("name")) == ("cells", "checks", "evidence")
    assert evidence.find("testcase/skipped") is not None and root.get("skipped") == "1"
    cell_cases = cells.findall("testcase")
    assert len(cell_cases) == 24 == int(cells.get("tests"))
    errored = [c.get("name") for c in cell_cases if c.find("error") is not None]
    assert errored == ["reference.prompt_end.A-B-C"]
    # a cell's failed checks are the checks suite's cases, not the cell's too: counted once
    assert not [c for c in cell_cases if c.find("failure") is not None]
    check_cases = checks.findall("testcase")
    failing_cells = {c.cell_id for c in gate.evaluate(run).failures if c.check != "ran"}
    assert {"reference.policy0.A-C", "reference.defaults.A-B-C"} <= failing_cells
    identity = [c for c in check_cases if c.get("classname") == "shadowlab.checks.identity"
                and c.find("failure") is not None]
    assert identity and all("differs from the cold run" in c.find("failure").get("message") for c in identity)
    assert int(root.get("failures")) == sum(1 for c in root.iter("testcase") if c.find("failure") is not None)
    assert int(root.get("errors")) == sum(1 for c in root.iter("testcase") if c.find("error") is not None)
    assert int(root.get("tests")) == len(cell_cases) + len(check_cases) + 1


def test_junit_counts_each_failed_check_once_as_the_gate_does(nasty_run, good_run):
    for run, paths in (nasty_run, good_run):
        result = gate.evaluate(run)
        root = ET.parse(paths.junit).getroot()
        counts = result.counts
        assert int(root.get("failures")) == counts["fail"] + counts["inconclusive"]
        assert int(root.get("errors")) == counts["error"]
        assert int(root.get("failures")) + int(root.get("errors")) == len(result.failures) == counts["failed"]
        assert gate.counts_text(counts) in result.summary()
        assert gate.counts_text(counts) in paths.html.read_text() and gate.counts_text(counts) in paths.markdown.read_text()
    assert len(gate.evaluate(nasty_run[0]).failures) > 2  # the broken run has failures to count


def test_junit_of_a_qualified_run_has_no_failure(good_run):
    root = ET.parse(good_run[1].junit).getroot()
    assert root.get("failures") == "0" and root.get("errors") == "0"
    assert int(root.get("tests")) > 50


def test_report_of_a_bad_run_dir_raises_a_usage_error(tmp_path):
    from shadowlab.errors import RunDirError

    with pytest.raises(RunDirError):
        render_run(tmp_path / "nope")


# ---------------------------------------------------------------- pieces


def test_visible_shows_control_bytes_and_keeps_text():
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible("\x00\x1b\x7f\udcff") == "\\x00\\x1b\\x7f\\udcff"
    assert visible(None) == ""
    assert md_cell("a|b<c>\nd") == "a\\|b&lt;c&gt; d"
    assert report.xml_text("ok\x01\udc80") == "ok\\x01\\udc80"


def test_one_escape_for_every_output_shows_bidirectional_controls():
    from shadowlab.results import records

    bidi = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    shown = "".join(f"\\u{ord(c):04x}" for c in bidi)
    for escape in (visible, report.xml_text, records.terminal_safe, md_cell):
        assert escape("a" + bidi + "b") == "a" + shown + "b", escape
    assert visible("עברית and العربية") == "עברית and العربية"  # right-to-left text itself stays


def test_ascii_text_is_escaped_as_the_full_classes_escape_it():
    """escape.py reads ASCII text with a small class: every character, alone and beside non-ASCII
    text (the full classes), is escaped alike both ways."""
    from shadowlab import escape

    for c in map(chr, range(0x100)):
        full = escape._full("visible").sub(escape._escape_match, c)
        assert visible(c) == full and visible(c + "\u00e9").startswith(full), repr(c)
        assert report.xml_text(c) == escape._full("xml").sub(escape._escape_match, c), repr(c)
    assert visible("\x1b[31m") == "\\x1b[31m" and visible("\x9b") == "\\x9b"


def test_findings_tell_each_turn_in_the_case_study_words():
    verdict = ckpt_verdict()
    (restored,) = verdict.cell("reference.policy0.A-C").turns[1:]
    text = report.describe_turn(restored)
    assert "restored the checkpoint at pos_max 2047, re-entry 2,048" in text
    assert "2,048 tokens saved = 41.4% of the prefill" in text
    (forced,) = verdict.cell("reference.policy0.first-round").turns[1:]
    text = report.describe_turn(forced)
    assert text.startswith("diverged at 1,956; 0 checkpoint(s) below it")
    assert "the nearest (pos_max 2047) lies 91 tokens above it" in text and "forced" in text
    silent = verdict.cell("reference.defaults.A-B-C").turns[1]
    assert report.describe_turn(silent).startswith("zero overlap: silent reset (no forcing line)")
    kept = ckpt_verdict(skip_cascade=True).cell("reference.policy0.A-C").turns[1]
    assert "cascade erased 0 but KEPT 3 stale checkpoint(s) above the re-entry point" in report.describe_turn(kept)


def test_nice_step():
    assert nice_step(4947) == 1000
    assert nice_step(99) == 20
    assert nice_step(1) == 1


def test_timeline_positions_follow_the_token_axis():
    cell = ckpt_verdict().cell("reference.policy0.A-C")
    tl = build_timeline(cell)
    row = tl.rows[1]
    left, width, span = tl.plot_left, tl.plot_width, 4947  # the longest prompt of the cell (C)
    assert row.divergence_x == pytest.approx(left + 2531 * width / span, abs=0.1)
    assert row.re_entry_x == pytest.approx(left + 2048 * width / span, abs=0.1)
    kinds = sorted(m.kind for m in row.marks)
    assert kinds.count("restored") == 1 and kinds.count("erased") == 3 and kinds.count("created") == 3
    assert tl.rows[0].divergence_x is None  # the first turn has nothing to diverge from


def test_engine_processes_are_said_once_per_engine_with_what_differs(tmp_path):
    """Provenance of a real run (llama.cpp b9093, 14 cells): one row per engine command line (a
    configuration that adds a flag has its own), the port, different in every cell, marked and
    its range named; every cell's own line is still there, folded."""
    import shutil

    from shadowlab.judge import gate

    run = tmp_path / "run"
    shutil.copytree(REAL_RUN, run)
    inputs = gate.load_run(run)
    groups = report.process_groups(inputs.metas)
    assert len(groups) == 2 and sum(g.cells for g in groups) == len(inputs.metas) > 10
    for group in groups:
        marks = {"\0c": report.PER_CELL, "\0k": report.PER_CONFIGURATION}  # the marks hold a space
        template = [marks.get(t, t) for t in group.command.replace(report.PER_CELL, "\0c")
                    .replace(report.PER_CONFIGURATION, "\0k").split(" ")]
        mine = [m for m in inputs.metas.values() if m.cell["configuration"] in
                {c.configuration for c in group.configurations}]
        assert len(mine) == group.cells
        for m in mine:
            argv = [str(a) for a in m.command]
            assert len(argv) == len(template)
            assert all(t in (a, report.PER_CELL, report.PER_CONFIGURATION) for t, a in zip(template, argv))
        assert report.PER_CELL in template and any(v.startswith("--port: ") for v in group.varying)
    page = report.render_run(run).html.read_text()
    section = page[page.index('id="processes"'):]
    grouped, folded = section.split("every cell's command line and environment delta", 1)
    assert grouped.count("<tr>") - 1 < len(inputs.metas) / 2  # header + a row per group and configuration
    assert all(m.cell_id not in grouped and m.cell_id in folded for m in inputs.metas.values())
