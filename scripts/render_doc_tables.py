"""Render the measured tables and transcripts in the docs from stored runs, never by hand.

    python scripts/render_doc_tables.py            # rewrite every rendered block in README.md and docs/
    python scripts/render_doc_tables.py --check    # exit 1 naming each block that differs from its render

A rendered block sits between two marker comments; everything between them is this script's:

    <!-- rendered by scripts/render_doc_tables.py: NAME -->
    ...
    <!-- end rendered: NAME -->

Each NAME is one function below. Its input is a stored run under tests/fixtures/runs/docs/ (a
run's matrix.yaml, plan.json and verdicts.json, the JSON gzipped: tests/fixtures/runs/docs/README.md
says how each was made), a stored log, or shadowlab's own deterministic code (the simulator on a
preset traffic shape, each command's exit codes). Transcripts are shadowlab's own output on those
inputs, so a change of a figure or of a format shows as a block that differs: rerun this script
and review the diff. tests/test_docs.py fails while any block differs.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "tests" / "fixtures" / "runs" / "docs"
MARK = re.compile(r"<!-- rendered by scripts/render_doc_tables\.py: (?P<name>[\w-]+) -->\n"
                  r"(?P<body>.*?)<!-- end rendered: (?P=name) -->", re.S)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# ---------------------------------------------------------------- stored runs


class Stored:
    """The stored runs, unpacked once into a scratch directory as run directories
    (verdicts only: `shadowlab gate` and `compare` read them as UNVERIFIED)."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._verdicts: dict[str, Any] = {}
        self._matrices: dict[str, Any] = {}

    def run(self, name: str, extra_matrix: str = "", as_name: str | None = None) -> Path:
        out = self.scratch / (as_name or name)
        if not out.exists():
            out.mkdir()
            for piece in sorted((STORED / name).iterdir()):
                if piece.suffix == ".gz":
                    (out / piece.stem).write_bytes(gzip.decompress(piece.read_bytes()))
                elif piece.name != "README.md":
                    shutil.copyfile(piece, out / piece.name)
            if extra_matrix:
                with (out / "matrix.yaml").open("a", encoding="utf-8") as matrix:
                    matrix.write(extra_matrix)
        return out

    def verdict(self, name: str) -> Any:
        from shadowlab.judge import verdicts

        if name not in self._verdicts:
            self._verdicts[name] = verdicts.read(self.run(name))
        return self._verdicts[name]

    def matrix(self, name: str) -> Any:
        from shadowlab.results import rundir

        if name not in self._matrices:
            self._matrices[name] = rundir.load(self.run(name)).matrix
        return self._matrices[name]


def shadowlab(*args: str, scratch: Path | None = None, ok: Sequence[int] = (0,)) -> str:
    """What `shadowlab ARGS` prints, run from the repository root; scratch paths shown relative."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(REPO / "engine"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "shadowlab", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode not in ok:
        raise SystemExit(f"shadowlab {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    text = done.stdout
    return text.replace(f"{scratch}/", "") if scratch is not None else text


def fenced(command: str, output: str, lang: str = "") -> str:
    return f"```{lang}\n$ {command}\n{output.rstrip()}\n```\n"


def source(name: str, stored: Stored, note: str = "") -> str:
    """Which stored run a block comes from, and what the gate said of it."""
    from shadowlab.judge import gate

    result = gate.evaluate(stored.run(name))
    return (f"Stored run `tests/fixtures/runs/docs/{name}/` (`shadowlab run matrices/{stored.matrix(name).name}.yaml`: "
            f"{len(stored.verdict(name).cells)} cells, {len(result.checks)} checks, gate exit {result.exit_code}"
            f"{note}).\n\n")


# ---------------------------------------------------------------- formatting


def pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.1f} %"


def count(n: float | None) -> str:
    return "–" if n is None else f"{n:,.0f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def positions(refs: Sequence[Any]) -> str:
    return ", ".join(str(r.pos_max) for r in refs) or "none"


def knobs(matrix: Any, configuration: str) -> str:
    """A configuration's flags and environment as written in the matrix."""
    config = matrix.configurations[configuration]
    parts = [" ".join(map(str, config.flags))] if config.flags else []
    parts += [f"{k}={v}" for k, v in sorted(config.env.items())]
    for key in ("pin_slots", "message_delimiters"):
        value = getattr(config, key, None)
        if value:
            parts.append(f"{key}: {str(value).lower()}")
    return "`" + "`, `".join(parts) + "`" if parts else "(production defaults)"


# ---------------------------------------------------------------- the case study


def ckpt_turns(stored: Stored) -> str:
    verdict = stored.verdict("ckpt")
    rows = []
    for cell in verdict.cells:
        if cell.kind != "warm":
            continue
        for turn in cell.turns[1:]:
            below = positions(turn.alive_below_divergence)
            above = positions(turn.alive_above_divergence)
            restored = f"restored at {turn.restored.pos_max}" if turn.restored else turn.outcome.value
            forcing = " (forcing line)" if turn.forcing_line else ""
            rows.append((cell.configuration, " → ".join(t.prompt_id for t in cell.turns), turn.prompt_id,
                         count(turn.divergence_point), below, above, restored.replace("_", " ") + forcing,
                         f"{count(turn.reused_tokens)} / {count(turn.processed_tokens)} ({pct(turn.saved_fraction)})",
                         turn.identity.status.value.replace("_", " ") if turn.identity else "–"))
    return source("ckpt", stored) + table(
        ("configuration", "sequence", "turn", "divergence", "checkpoints below it (pos_max)", "above it",
         "outcome", "reused / processed (saved)", "vs cold"), rows)


# ---------------------------------------------------------------- traffic


def _warm(verdict: Any, sequence: str) -> dict[str, list[Any]]:
    """Warm cells of a sequence by configuration (repeats in plan order)."""
    out: dict[str, list[Any]] = {}
    for cell in verdict.cells:
        if cell.kind == "warm" and cell.sequence == sequence:
            out.setdefault(cell.configuration, []).append(cell)
    return out


def _recovered(cell: Any) -> float | None:
    from shadowlab.judge.verdicts import traffic_summary

    return traffic_summary(cell)[3]


def _identical(cell: Any) -> str:
    """Warm turns that reused cache, and how many of them equal their replay."""
    reused = [t for t in cell.turns if (t.reused_tokens or 0) > 0]
    same = [t for t in reused if t.identity is not None and t.identity.status.value == "identical"]
    return f"{len(same)} of {len(reused)}" if reused else "– (nothing reused)"


def _each(texts: Iterable[str]) -> str:
    """Per repeat, or once when every repeat says the same."""
    texts = list(texts)
    return texts[0] + (" each" if len(texts) > 1 else "") if len(set(texts)) == 1 else ", ".join(texts)


def _traffic_totals(cell: Any) -> str:
    from shadowlab.judge.verdicts import traffic_summary

    prompt, ideal, _, _ = traffic_summary(cell)
    return (f"The traffic: {len(cell.turns)} requests, {count(prompt)} prompt tokens, "
            f"{count(ideal)} of them the ideal.\n\n")


def _created(cell: Any) -> str:
    created = sum(len(t.created) for t in cell.turns)
    return f"{created} ({created / len(cell.turns):.2f})"


def traffic_table(stored: Stored, name: str, sequence: str = "traffic") -> str:
    verdict, matrix = stored.verdict(name), stored.matrix(name)
    warm = _warm(verdict, sequence)
    rows = [(f"`{config}`", knobs(matrix, config), pct(_recovered(cells[0])), _identical(cells[0]), _created(cells[0]))
            for config, cells in warm.items()]
    return source(name, stored) + _traffic_totals(next(iter(warm.values()))[0]) + table(
        ("configuration", "flags / env", "recovered of the ideal", "reused turns identical to their replay",
         "checkpoints created (per turn)"), rows)


def traffic_reference(stored: Stored) -> str:
    return traffic_table(stored, "traffic")


def traffic_llama(stored: Stored) -> str:
    return traffic_table(stored, "traffic-llama")


def in_flight_reference(stored: Stored) -> str:
    verdict, matrix = stored.verdict("traffic-in-flight"), stored.matrix("traffic-in-flight")
    rows = [(f"`{config}`", knobs(matrix, config), " / ".join(pct(_recovered(c)) for c in cells),
             _each(_identical(c) for c in cells)) for config, cells in _warm(verdict, "traffic").items()]
    return source("traffic-in-flight", stored) + table(
        ("configuration, 4 in flight", "flags / env", "recovered, each repeat", "reused turns identical, each repeat"),
        rows)


def in_flight_llama(stored: Stored) -> str:
    verdict, matrix = stored.verdict("traffic-llama"), stored.matrix("traffic-llama")
    one_by_one = _warm(verdict, "traffic")
    rows = [(f"`{config}`", knobs(matrix, config), pct(_recovered(cells[0])), _identical(cells[0]),
             pct(_recovered(one_by_one[config][0])))
            for config, cells in _warm(verdict, "traffic_in_flight").items()]
    return source("traffic-llama", stored, note="; sequence `traffic_in_flight`") + table(
        ("configuration, 4 in flight", "flags / env", "recovered", "reused turns identical", "one after another"),
        rows)


def busy_slot_gate(stored: Stored) -> str:
    run = "tests/fixtures/runs/llama.cpp-b11434-busy-slot-load"
    return fenced(f"shadowlab gate {run}", shadowlab("gate", run, ok=(1,)))


# ---------------------------------------------------------------- compare, budgets, decision


CKPT_BUDGET = """
baseline: defaults
budgets:
  - {max_created_per_turn: 2, min_net_benefit_ms: 0}
scale: {name: 35B, checkpoint_mib: 62.9, checkpoint_ms: 63, prompt_length_factor: 10, prefill_ms_per_token: 0.476}
"""


def _compare(stored: Stored, name: str, baseline: str, candidate: str) -> str:
    run = stored.run(name)
    args = ("compare", name, name, "--baseline-config", baseline, "--candidate-config", candidate, "--allow", "unverified")
    output = shadowlab(*(str(run) if a == name else a for a in args), scratch=stored.scratch)
    return source(name, stored, note="; `--allow unverified`: a stored run keeps its verdicts, not its cells, "
                                     "so start-up and time to first token are `?`") + fenced(
        "shadowlab " + " ".join(args), output)


def compare_ckpt(stored: Stored) -> str:
    return _compare(stored, "ckpt", "defaults", "policy0")


def compare_traffic(stored: Stored) -> str:
    return _compare(stored, "traffic", "baseline", "affinity")


def _budget_table(run: Path) -> str:
    """Every budget check of the gate on ``run``, passed or not (`shadowlab gate` prints the
    failed ones; report.md lists them all), then the costs they judged."""
    from shadowlab.judge import budgets, gate

    inputs = gate.load_run(run)
    checks = [c for c in gate.evaluate_inputs(inputs).checks if c.check == "budget"]
    rows = [(c.subject, c.status.value.upper(), c.message.removeprefix(f"{c.subject}: ")) for c in checks]
    costs = [(c.label, f"{_figure(c.created)} ({_figure(c.baseline_created)})", _figure(c.created_at_scale),
              count(c.mib_at_scale), _figure(c.saved_ms), _figure(c.spent_ms), _figure(c.net_ms))
             for c in budgets.costs(inputs.run, inputs.verdict) if c.configuration != inputs.matrix.baseline]
    return table(("budget check", "result", "figures"), rows) + "\n" + table(
        ("per turn", "checkpoints created (baseline)", "at scale", "their MiB", "prefill ms saved",
         "checkpoint ms spent", "net ms"), costs)


def _figure(value: float | None) -> str:
    return "–" if value is None else f"{value:,.3g}" if abs(value) < 100 else count(value)


def budget_ckpt_matrix(stored: Stored) -> str:
    return f"```yaml{CKPT_BUDGET}```\n"


def budget_ckpt(stored: Stored) -> str:
    run = stored.run("ckpt", extra_matrix=CKPT_BUDGET, as_name="ckpt-budgeted")
    return source("ckpt", stored, note=", judged under its matrix plus the budget above") + _budget_table(run)


def budget_traffic(stored: Stored) -> str:
    return source("traffic", stored, note=", its own `baseline`, `budgets` and `scale`") + _budget_table(
        stored.run("traffic"))


def decision_ckpt(stored: Stored) -> str:
    run = stored.run("ckpt", extra_matrix=CKPT_BUDGET, as_name="ckpt-budgeted")
    if not (run / "report.md").exists():
        shadowlab("report", str(run), scratch=stored.scratch)
    report = (run / "report.md").read_text(encoding="utf-8")
    found = re.search(r"^(#+) Decision.*?\n(.*?)(?=^\1 |\Z)", report, re.M | re.S)
    if found is None:
        raise SystemExit(f"{run}/report.md has no Decision section")
    return "```markdown\n" + found.group(2).strip() + "\n```\n"


# ---------------------------------------------------------------- production logs, simulate


def logs_cram0(stored: Stored) -> str:
    log = "tests/fixtures/logs/llama-server/cram0-A-C-B-C.log"
    return fenced(f"shadowlab logs {log}", shadowlab("logs", log))


SIMULATED = ("baseline", "policy0", "affinity+policy0", "retention+policy0")


def _simulate(source_name: str, policies: Sequence[str]) -> str:
    args = ["simulate", source_name, *(a for p in policies for a in ("--policy", p))]
    return fenced("shadowlab " + " ".join(args), shadowlab(*args))


def simulate_case_study(stored: Stored) -> str:
    return _simulate("shape:case-study", (*SIMULATED, "llama-defaults"))


def simulate_interleaved(stored: Stored) -> str:
    return _simulate("shape:case-study-interleaved", SIMULATED)


def case_study_shape(stored: Stored) -> str:
    """`TrafficShape.case_study()` as the YAML a user would write (round-trips: tests)."""
    import dataclasses

    from shadowlab import traffic

    shape, default = traffic.TrafficShape.case_study(), traffic.TrafficShape()
    lines = []
    for field in dataclasses.fields(shape):
        value = getattr(shape, field.name)
        if value != getattr(default, field.name) or field.name in ("conversations", "turns", "seed"):
            lines.append(f"{field.name}: {_yaml_value(value)}")
    return "```yaml\n" + "\n".join(lines) + "\n```\n"


def _yaml_value(value: Any) -> str:
    if hasattr(value, "kind") and hasattr(value, "low"):  # a Dist
        if value.kind == "uniform":
            return f"[{_number(value.a)}, {_number(value.b)}]"
        return (f"{{kind: {value.kind}, a: {_number(value.a)}, b: {_number(value.b)}, "
                f"low: {_number(value.low)}, high: {_number(value.high)}}}")
    if isinstance(value, tuple):  # ((key, weight), ...)
        return "{" + ", ".join(f"{k}: {_number(w)}" for k, w in value) + "}"
    return _number(value)


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def case_study_realised(stored: Stored) -> str:
    import json

    from shadowlab import traffic

    shape = json.loads(shadowlab("simulate", "shape:case-study", "--policy", "baseline", "--json"))["shape"]
    target = traffic.CASE_STUDY
    shared = shape["shared_with_previous"]
    rows = [("requests", count(shape["requests"]), f"~{count(target['requests'])}"),
            ("prompt tokens", f"{shape['prompt_tokens'] / 1e6:.1f}M", f"{target['prompt_tokens'] / 1e6:.1f}M"),
            ("prompt median / max", f"{count(shape['prompt_size']['median'])} / {count(shape['prompt_size']['max'])}",
             f"{count(target['prompt_size']['median'])} / {count(target['prompt_size']['max'])}")]
    rows += [(f"shared with the request before: {k}", count(shared[k]), count(v))
             for k, v in target["shared_with_previous"].items()]
    rows += [("shared under 512 tokens", pct(shape["share_near_zero_overlap"]), pct(target["share_near_zero_overlap"])),
             ("shared 4,096 or more", pct(shape["share_4096_or_more"]), pct(target["share_4096_or_more"])),
             ("reusable with the request before, of prompt tokens",
              pct(shape["reusable_with_previous"] / shape["prompt_tokens"]), pct(target["reusable_share"]))]
    return table(("figure", "`shape:case-study`", "the case study measured"), rows)


# ---------------------------------------------------------------- exit codes


def exit_codes(stored: Stored) -> str:
    """Each command's exit codes from its module's EXITS: what its `--help` prints."""
    from shadowlab import cli

    rows = []
    for name, (module_name, _) in cli.COMMANDS.items():
        for code, meaning in importlib.import_module(module_name).EXITS:
            rows.append((f"`{name}`", str(code), meaning))
    return table(("command", "exit", "meaning"), rows)


# ---------------------------------------------------------------- the blocks

RENDERERS: dict[str, Callable[[Stored], str]] = {
    "ckpt-turns": ckpt_turns,
    "traffic-reference": traffic_reference,
    "traffic-llama": traffic_llama,
    "in-flight-reference": in_flight_reference,
    "in-flight-llama": in_flight_llama,
    "busy-slot-gate": busy_slot_gate,
    "compare-ckpt": compare_ckpt,
    "compare-traffic": compare_traffic,
    "budget-ckpt-matrix": budget_ckpt_matrix,
    "budget-ckpt": budget_ckpt,
    "budget-traffic": budget_traffic,
    "decision-ckpt": decision_ckpt,
    "logs-cram0": logs_cram0,
    "simulate-case-study": simulate_case_study,
    "simulate-interleaved": simulate_interleaved,
    "case-study-shape": case_study_shape,
    "case-study-realised": case_study_realised,
    "exit-codes": exit_codes,
}


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group("name"), m.group("body")) for m in MARK.finditer(text)]


def render(names: Iterable[str]) -> dict[str, str]:
    """The named blocks, rendered from the stored runs."""
    with tempfile.TemporaryDirectory(prefix="shadowlab-doc-tables-") as scratch:
        stored = Stored(Path(scratch))
        return {name: RENDERERS[name](stored) for name in dict.fromkeys(names)}


def rewritten(text: str, rendered: dict[str, str]) -> str:
    return MARK.sub(lambda m: (f"<!-- rendered by scripts/render_doc_tables.py: {m.group('name')} -->\n"
                               f"{rendered[m.group('name')]}<!-- end rendered: {m.group('name')} -->"), text)


def differences(texts: dict[Path, str], rendered: dict[str, str]) -> list[str]:
    """One entry per block whose text is not its render: the document, the block, a diff."""
    found = []
    for path, text in texts.items():
        for name, body in blocks(text):
            if body != rendered[name]:
                diff = "".join(difflib.unified_diff(body.splitlines(True), rendered[name].splitlines(True),
                                                    "in the document", "rendered", n=1))
                found.append(f"{path.relative_to(REPO)}: block {name} differs from its stored run\n{diff}")
    return found


def check_names(texts: dict[Path, str]) -> list[str]:
    """Markers naming no renderer, and renderers no document uses."""
    used = [name for text in texts.values() for name, _ in blocks(text)]
    problems = [f"unknown block {name!r}" for name in used if name not in RENDERERS]
    problems += [f"block {name!r} is rendered nowhere" for name in RENDERERS if name not in used]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs")
    args = parser.parse_args(argv)
    texts = {path: path.read_text(encoding="utf-8") for path in documents()}
    problems = check_names(texts)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    rendered = render(name for text in texts.values() for name, _ in blocks(text))
    if args.check:
        found = differences(texts, rendered)
        print("\n".join(found) or "every rendered block matches its stored run", file=sys.stderr if found else sys.stdout)
        return 1 if found else 0
    for path, text in texts.items():
        new = rewritten(text, rendered)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO), str(REPO / "engine")]
    raise SystemExit(main())
