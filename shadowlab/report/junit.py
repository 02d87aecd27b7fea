"""junit.xml: one test case per cell and one per check, for CI (report/__init__.py renders it
with the HTML and Markdown reports, from the same gate result).

    render_junit(inputs, result) -> bytes
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from shadowlab.escape import xml_text
from shadowlab.judge import gate as gate_mod
from shadowlab.judge.expectations import CheckResult, CheckStatus
from shadowlab.judge.gate import GateResult, RunInputs
from shadowlab.judge.verdicts import CellVerdict

__all__ = ["CELL_ERRORS", "render_junit"]

# Checks whose failure is the cell's own junit case's <error> (one per cell, the first that
# failed): a cell that did not run, or one whose engine reported impossible figures.
CELL_ERRORS = ("ran", "plausible")


def render_junit(inputs: RunInputs, result: GateResult) -> bytes:
    """<testsuites> with a `cells` suite (one case per cell) and a `checks` suite (one per check).

    Each failed check is counted once, where it belongs: a cell that did not run (`ran`) or whose
    engine reported impossible figures (`plausible`) is its cell's <error> (the first of the two
    to fail; a second stays in `checks`); every other check is its own case in `checks`. So
    failures + errors is the gate's count of failed checks. Checks `--gate-candidate`
    leaves out are <skipped>, their status in the message."""
    root = ET.Element("testsuites", name=xml_text(f"shadowlab {inputs.matrix.name}"))
    if result.unverified or result.partial:
        props = ET.SubElement(root, "properties")
        if result.unverified:
            ET.SubElement(props, "property", name="shadowlab.unverified", value=xml_text(result.unverified))
        if result.partial:
            ET.SubElement(props, "property", name="shadowlab.partial", value=xml_text(result.partial))
    cells = ET.SubElement(root, "testsuite", name="cells")
    cell_error: dict[str, CheckResult] = {}  # the cell's one <error>: the first of CELL_ERRORS failed
    for c in result.checks:
        if c.cell_id and c.check in CELL_ERRORS and c.status.failed:
            cell_error.setdefault(c.cell_id, c)
    own = {id(c) for c in cell_error.values()}
    skipped_cells = {c.cell_id: c for c in result.not_gated if c.cell_id and c.check in CELL_ERRORS and c.status.failed}
    cell_ids = list(dict.fromkeys([*inputs.planned, *(c.cell_id for c in inputs.verdict.cells)]))
    known = {c.cell_id: c for c in inputs.verdict.cells}
    for cell_id in cell_ids:
        case = ET.SubElement(cells, "testcase", classname=xml_text(f"shadowlab.cells.{_kind(known, cell_id)}"),
                             name=xml_text(cell_id))
        error = cell_error.get(cell_id)
        if error is not None:
            _fail(case, "error", error.message, f"{error.check}: {error.message}")
        elif cell_id in skipped_cells:
            ET.SubElement(case, "skipped", message=xml_text(_not_gated(result, skipped_cells[cell_id])))
        if cell_id in known:
            ET.SubElement(case, "system-out").text = xml_text(_cell_summary(known[cell_id]))
    checks = ET.SubElement(root, "testsuite", name="checks")
    for c in (*result.checks, *result.not_gated):
        if c.check in CELL_ERRORS and (id(c) in own or not c.status.failed or c in result.not_gated):
            continue  # it is the cell's own test case (a second failure of one cell stays here)
        case = ET.SubElement(checks, "testcase", classname=xml_text(f"shadowlab.checks.{c.check}"),
                             name=xml_text(f"{c.subject} [{c.source}]"))
        if c in result.not_gated:
            ET.SubElement(case, "skipped", message=xml_text(_not_gated(result, c)))
        elif c.status.failed:
            detail = f"expected: {c.expected}\nactual: {c.actual}\n{c.message}"
            if c.description:
                detail += f"\nwhy expected: {c.description}"
            _fail(case, "error" if c.status is CheckStatus.ERROR else "failure",
                  f"{c.status.value}: {gate_mod.message_after_subject(c)}", detail)
    suites = [cells, checks]
    if result.unverified:  # shown in CI as not verified, not as a pass of the evidence
        evidence = ET.SubElement(root, "testsuite", name="evidence")
        case = ET.SubElement(evidence, "testcase", classname="shadowlab.evidence", name="cell records (cells/)")
        ET.SubElement(case, "skipped", message=xml_text(result.unverified))
        suites.append(evidence)
    if result.partial:  # shown in CI as skipped: the cells `run -k` left out were not qualified
        selection = ET.SubElement(root, "testsuite", name="selection")
        case = ET.SubElement(selection, "testcase", classname="shadowlab.selection",
                             name="cells left out by run -k")
        ET.SubElement(case, "skipped", message=xml_text(result.partial))
        suites.append(selection)
    for suite in suites:
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for k in cases if k.find("failure") is not None)))
        suite.set("errors", str(sum(1 for k in cases if k.find("error") is not None)))
        suite.set("skipped", str(sum(1 for k in cases if k.find("skipped") is not None)))
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _not_gated(result: GateResult, check: CheckResult) -> str:
    return f"not gated (--gate-candidate {result.candidate}): {check.status.value}: {gate_mod.message_after_subject(check)}"


def _fail(case: ET.Element, tag: str, message: str, text: str) -> None:
    element = ET.SubElement(case, tag, message=xml_text(message), type=tag)
    element.text = xml_text(text)


def _kind(known: dict[str, CellVerdict], cell_id: str) -> str:
    return known[cell_id].kind if cell_id in known else "missing"


def _cell_summary(cell: CellVerdict) -> str:
    parts = [f"{cell.kind} {cell.engine}/{cell.configuration}/{cell.sequence}: {cell.status}"]
    for t in cell.turns:
        parts.append(f"turn {t.index} {t.prompt_id}: {t.outcome.value}, reused {t.reused_tokens} of "
                     f"{t.prompt_tokens}")
    return "\n".join(parts)
