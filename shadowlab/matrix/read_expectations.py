"""The matrix's `expectations`, `baseline`, `budgets` and `scale` sections: read once the cells are
known, since each names cells and turns."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shadowlab.matrix.read_cells import _selection
from shadowlab.matrix.schema import BUDGET_KEYS, CHECK_KEYS, OUTCOMES, schema_key
from shadowlab.matrix.specs import Budget, Expectation, Matrix, Scale, TrafficSequence
from shadowlab.matrix.values import (_At, _Errors, _bool, _bounded, _choice, _closest_hint, _fields, _given, _list,
                                     _num, _str, _text)


_CASCADE_HINT = ("write `cascade: true` (every checkpoint above the re-entry point must be erased) or "
                 "`cascade: false` (waive the default cascade check on these turns)")


def _expectation(value: Any, at: _At, matrix: Matrix, selected: list[tuple[str, str, str]]) -> Expectation:
    f = _fields(value, at, "expectation")
    names = {"engine": matrix.engines, "configuration": matrix.configurations, "sequence": matrix.sequences}
    selection = _selection(f, names)
    cells = [c for c in selected if selection.matches(*c)]
    if not cells:
        at.fail("this expectation selects no planned cell", "check its engine/configuration/sequence "
                "against cells.include / cells.exclude", line=value.line)
    checks = [k for k in CHECK_KEYS if k in f]
    if not checks:
        at.fail("an expectation needs at least one check", "add one of: " + ", ".join(CHECK_KEYS), line=value.line)
    turn = _turn(*f["turn"], matrix, cells) if "turn" in f else None
    outcome = None
    if "outcome" in f:
        raw, o_at = f["outcome"]
        items = _list(raw, o_at) if isinstance(raw, list) else [(raw, o_at)]
        if not items:
            o_at.fail("expected at least one outcome")
        outcome = tuple(_choice(v, a, OUTCOMES) for v, a in items)
    created = None
    if "checkpoints_created_at" in f:
        position = schema_key("expectation", "checkpoints_created_at").bounds
        created = tuple(_bounded(v, a, position) for v, a in _list(*f["checkpoints_created_at"]))
    cascade = None
    if "cascade" in f:
        cascade = _bool(*f["cascade"], hint=_CASCADE_HINT)
        blind = sorted({e for e, _, _ in cells if matrix.engines[e].log_family == "none"})
        if cascade and blind:
            f["cascade"][1].fail(
                f"engine {blind[0]!r} has log_family none: without its log the cascade cannot be seen",
                "narrow the selection to engines whose log is parsed, or set their log_family")
    return Expectation(
        selection=selection,
        turn=turn,
        outcome=outcome,
        min_reused=_num(f, "expectation", "min_reused"),
        min_saved_fraction=_num(f, "expectation", "min_saved_fraction"),
        max_forced=_num(f, "expectation", "max_forced"),
        checkpoints_created_at=created,
        identity=_bool(*f["identity"]) if "identity" in f else None,
        cascade=cascade,
        min_recovered_share=_num(f, "expectation", "min_recovered_share"),
        description=_given(f, "expectation", "description", _text),
        line=value.line,
    )


def _turn(value: Any, at: _At, matrix: Matrix, cells: list[tuple[str, str, str]]) -> int | str:
    sequences = [matrix.sequences[s] for s in dict.fromkeys(seq for _, _, seq in cells)]
    if isinstance(value, str) and any(isinstance(s, TrafficSequence) and s.request(value) for s in sequences):
        return value
    if isinstance(value, str):
        if value not in matrix.prompts:
            at.fail(f"unknown prompt {value!r}", _closest_hint(value, matrix.prompts, "prompts"))
        if not any(value in s.prompts for s in sequences):
            at.fail(f"prompt {value!r} is not a turn of the selected sequences ("
                    + ", ".join(s.name for s in sequences) + ")")
        return value
    index = _bounded(value, at, schema_key("expectation", "turn").bounds)
    short = [s.name for s in sequences if index >= len(s.prompts)]
    if short:
        at.fail(f"turn {index} is past the end of sequence {short[0]!r}",
                "turns are 0-based; narrow the selection or name the turn by prompt id")
    return index


def _baseline_and_budgets(matrix: Matrix, f: dict[str, tuple[Any, _At]], errors: _Errors) -> Matrix:
    baseline = None
    if "baseline" in f:
        baseline = _str(*f["baseline"])
        if baseline not in matrix.configurations:
            f["baseline"][1].fail(f"unknown configuration {baseline!r}",
                                  _closest_hint(baseline, matrix.configurations, "configurations"))
    budgets: tuple[Budget, ...] = ()
    if "budgets" in f:
        if baseline is None:
            f["budgets"][1].fail("budgets are judged against a baseline configuration, and none is named",
                                 "add `baseline: <configuration>` (e.g. the production defaults)")
        found = []
        for v, a in _list(*f["budgets"]):
            with errors.item():
                found.append(_budget(v, a, matrix))
        budgets = tuple(found)
    scale = None
    if "scale" in f:
        with errors.item():
            scale = _scale(*f["scale"])
    repeat = _num(f, "matrix", "repeat")
    return replace(matrix, baseline=baseline, budgets=budgets, scale=scale, repeat=repeat)


def _budget(value: Any, at: _At, matrix: Matrix) -> Budget:
    f = _fields(value, at, "budget")
    names = {"engine": matrix.engines, "configuration": matrix.configurations, "sequence": matrix.sequences}
    selection = _selection(f, names)
    if not any(selection.matches(*c) for c in matrix.selected()):
        at.fail("this budget selects no planned cell", "check its engine/configuration/sequence "
                "against cells.include / cells.exclude", line=value.line)
    if not any(k in f for k in BUDGET_KEYS):
        at.fail("a budget needs at least one check", "add one of: " + ", ".join(BUDGET_KEYS), line=value.line)
    limits = {k: float(_num(f, "budget", k)) for k in BUDGET_KEYS if k in f}
    return Budget(selection=selection, description=_given(f, "budget", "description", _text),
                  line=value.line, **limits)


def _scale(value: Any, at: _At) -> Scale:
    f = _fields(value, at, "scale")
    for explicit in ("checkpoint_mib", "checkpoint_ms"):
        if explicit in f and f"{explicit}_factor" in f:
            f[f"{explicit}_factor"][1].fail(f"{explicit} and {explicit}_factor both given",
                                            f"give the figure at scale ({explicit}) or a factor on the measured one")
    numbers = {k: float(_num(f, "scale", k)) for k in f if k != "name"}
    return Scale(name=_given(f, "scale", "name", _text), **numbers)
