"""`shadowlab run -k PATTERN` (`--only`): run part of a matrix, and say so.

    narrow(matrix, patterns) -> (Matrix, Partial | None)

A pattern is a name or a glob (`fnmatch`, case-sensitive) matched against each warm cell's engine,
configuration, sequence and cell id (`<engine>.<configuration>.<sequence>`); `-k` again adds
cells (a union). The cells kept are those warm cells and what judging them needs, which the plan
adds as for any matrix: their cold references and the control. The matrix comes back with
`cells.include` listing exactly the warm cells kept, and without the expectations and budgets
that select none of them (a budget also needs the baseline's cell of the same engine and
sequence): what the run directory holds is then a complete, smaller experiment, judged by the
same code as any other. `Partial` says what was left out; plan.json keeps it (`selection`), and
the narrowed matrix's description (which the report shows first) begins with it, so a partial
run never reads as the whole matrix.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shadowlab.errors import MatrixError
from shadowlab.matrix import MAX_TEXT_CHARS, CellsSpec, Matrix, Selection


@dataclass(frozen=True)
class Partial:
    only: tuple[str, ...]  # the patterns as given
    warm: tuple[str, ...]  # the warm cell ids kept
    of_warm: int  # warm cells the whole matrix selects
    dropped: tuple[str, ...]  # expectations and budgets left unjudged, as "expectation 2 (line 40)"
    cells: int = 0  # cells planned for the part (warm, cold references, controls); 0: not counted
    of_cells: int = 0  # cells the whole matrix plans

    def to_dict(self) -> dict[str, Any]:
        data = {"only": list(self.only), "warm_cells": list(self.warm), "of_warm_cells": self.of_warm,
                "not_judged": list(self.dropped)}
        if self.of_cells:  # written only when counted: an older plan.json reads as before
            data.update(planned_cells=self.cells, of_planned_cells=self.of_cells)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Partial | None:
        if not isinstance(data, dict):
            return None
        return cls(tuple(data.get("only", ())), tuple(data.get("warm_cells", ())),
                   int(data.get("of_warm_cells", 0)), tuple(data.get("not_judged", ())),
                   int(data.get("planned_cells", 0)), int(data.get("of_planned_cells", 0)))

    @property
    def left_out(self) -> int:
        """Planned cells of the whole matrix the part does not run (warm cells where not counted)."""
        return self.of_cells - self.cells if self.of_cells else self.of_warm - len(self.warm)

    def describe(self) -> str:
        """One line for the dry run, the progress output and the report."""
        text = (f"partial run (-k {' -k '.join(self.only)}): {len(self.warm)} of {self.of_warm} warm cells "
                "with their references")
        if self.of_cells:
            text += f"; {self.left_out} of the matrix's {self.of_cells} planned cells left out"
        if self.dropped:
            text += "; not judged: " + ", ".join(self.dropped)
        return text


def _cell_id(combo: tuple[str, str, str]) -> str:
    return ".".join(combo)


def matches(pattern: str, combo: tuple[str, str, str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for name in (*combo, _cell_id(combo)))


def narrow(matrix: Matrix, patterns: Sequence[str]) -> tuple[Matrix, Partial | None]:
    """The matrix with only the warm cells the patterns select (none given: as it is)."""
    if not patterns:
        return matrix, None
    selected = matrix.selected()
    for pattern in patterns:
        if not any(matches(pattern, combo) for combo in selected):
            raise MatrixError(f"-k {pattern!r} matches no cell of the matrix", file=str(matrix.path),
                              key_path="cells", hint=_known(matrix, selected))
    kept = [combo for combo in selected if any(matches(p, combo) for p in patterns)]
    judged = [any(x.selection.matches(*c) for c in kept) for x in matrix.expectations]
    affordable = [_judgeable(b.selection, kept, matrix.baseline) for b in matrix.budgets]
    expectations = tuple(x for x, keep in zip(matrix.expectations, judged) if keep)
    budgets = tuple(b for b, keep in zip(matrix.budgets, affordable) if keep)
    dropped = [_label("expectation", i, x.line) for i, (x, keep) in enumerate(zip(matrix.expectations, judged), 1)
               if not keep]
    dropped += [_label("budget", i, b.line) for i, (b, keep) in enumerate(zip(matrix.budgets, affordable), 1)
                if not keep]
    partial = Partial(tuple(patterns), tuple(_cell_id(c) for c in kept), len(selected), tuple(dropped))
    # The run directory's matrix.yaml is this matrix: its description says it is a part, so the
    # report (which shows it first) and anyone reading the file see it.
    description = (partial.describe() + ". " + matrix.description).strip()[:MAX_TEXT_CHARS]
    narrowed = replace(matrix, cells=CellsSpec(include=tuple(Selection(*c) for c in kept), exclude=()),
                       expectations=expectations, budgets=budgets, description=description)
    return narrowed, partial


def _judgeable(selection: Selection, kept: list[tuple[str, str, str]], baseline: str | None) -> bool:
    """A budget is judged on a kept candidate cell whose baseline cell is kept too."""
    return any(selection.matches(*c) and (c[0], baseline, c[2]) in kept for c in kept if c[1] != baseline)


def _label(what: str, number: int, line: int | None) -> str:
    return f"{what} {number}" + (f" (line {line})" if line else "")


def _known(matrix: Matrix, selected: list[tuple[str, str, str]]) -> str:
    names = {"engines": matrix.engines, "configurations": matrix.configurations,
             "sequences": matrix.sequences}
    parts = [f"{key}: {', '.join(values)}" for key, values in names.items()]
    return ("a pattern (a name or a glob) matches an engine, configuration, sequence or warm cell id; "
            + "; ".join(parts) + f"; e.g. -k {_cell_id(selected[0])}")


def prepare(matrix: Matrix, overrides: Any, only: Sequence[str], gate_candidate: str | None = None,
            count_cells: Callable[[Matrix], int] | None = None) -> tuple[Matrix, dict[str, Any]]:
    """What `shadowlab run` plans from: the matrix with the command line's build and model
    (`matrix.overrides.Overrides`, may be None) and its `-k` selection, and the notes plan.json
    keeps about both (`overrides`, `selection`; none when neither was given). A
    `--gate-candidate` must name a configuration the (narrowed) matrix runs: checked here,
    before anything starts. `count_cells` (the run's `len(build_plan(m).cells)`: this module
    cannot import the plan, which imports it) counts the planned cells of the part and of the
    whole, for the "N of the matrix's M planned cells left out" every output says."""
    notes: dict[str, Any] = {}
    if overrides:
        notes["overrides"] = overrides.applied_to(matrix)
        matrix = overrides.apply(matrix)
    whole = matrix
    matrix, partial = narrow(matrix, only)
    if partial is not None:
        if count_cells is not None:
            partial = replace(partial, cells=count_cells(matrix), of_cells=count_cells(whole))
        notes["selection"] = partial.to_dict()
    if gate_candidate is not None:
        check_gate_candidate(matrix, gate_candidate)
        if partial is not None and not any(w.split(".")[1] == gate_candidate for w in partial.warm):
            raise MatrixError(f"--gate-candidate {gate_candidate!r}: -k left it out (no warm cell of it runs)",
                              file=str(matrix.path), key_path="configurations",
                              hint="add -k " + gate_candidate + ", or gate a configuration this part runs")
    return matrix, notes


def check_gate_candidate(matrix: Matrix, name: str) -> None:
    """MatrixError unless `--gate-candidate NAME` names a configuration of `matrix` (the gate's
    rule too: judge/gate.py asks here)."""
    if name not in matrix.configurations:
        raise MatrixError(f"--gate-candidate {name!r}: no configuration of that name in the matrix",
                          file=str(matrix.path), key_path="configurations",
                          hint="name one of: " + ", ".join(matrix.configurations))
