"""Fuzz what users and other tools hand shadowlab: matrices, traces and run directories.

    python scripts/fuzz_inputs.py KIND [--rounds 500] [--seed 0] [--intensity 4] [--keep DIR]

KIND is `matrices` (matrices/*.yaml with keys dropped, renamed or set to another type, a huge
number, NaN, a 5,000-character string, NUL, a bidi control; through `shadowlab run --dry-run`),
`traces` (a generated Mooncake trace, the same with session ids, and a `shadowlab logs --trace`
of the b11434 fixtures, their JSON lines edited alike, dropped, repeated or cut; through
`shadowlab simulate --json` under a few policies) or `runs` (the run directories in
tests/fixtures/runs with their JSON records edited alike or cut; through `report`, `gate`,
`gate --json` and `compare`). Each round must end in an exit code the command documents, never
in an internal error (exit 3 with a traceback file) or a traceback; a simulate document must be
strict JSON whose figures are consistent (reused <= ideal <= prompt tokens, shares in [0, 1],
the consecutive ideal within the perfect one); a report must hold no raw `<script>` or bidi
control from the records. A failing round's input is kept in --keep.

Found this way (and fixed): a matrix without `version` (internal error), environment.json with
a `packages` string, and a planned turn that was a string (both failed `shadowlab report`).
tests/shadowlab/test_hostile.py runs a few seeded rounds of each kind in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("matrices", "traces", "runs")
VALUES: list[Any] = [None, -1, 0, 1, 2 ** 63, 10 ** 30, -10 ** 30, 1.5, float("nan"), float("inf"), "x", "", [], {},
                     [1, 2], True, "12", "../../etc/passwd", "-np", "a" * 5000, ["-c", "0"], "\u202e<script>", "\x00"]


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def edit(rng: random.Random, doc: Any, edits: int) -> Any:
    """A copy of a JSON/YAML document with `edits` random edits: a key or item dropped, a value
    replaced by one of VALUES, a key renamed, a number negated."""
    doc = copy.deepcopy(doc)
    for _ in range(edits):
        found = [p for p in _paths(doc) if p]
        if not found:
            break
        path = rng.choice(found)
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key, op = path[-1], rng.randrange(5)
        if op == 0:
            del parent[key]
        elif op in (1, 2):
            parent[key] = copy.deepcopy(rng.choice(VALUES))
        elif op == 3 and isinstance(parent, dict):
            parent[f"{key}{rng.choice(['_', 'x', ' '])}"] = parent[key]
        elif op == 4 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = -parent[key] - 1
    return doc


def cli_run(argv: list[str]) -> tuple[int, str, str]:
    """shadowlab's exit code, stdout and stderr for `argv`, in this process."""
    from shadowlab import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def _crashed(code: int, err: str, allowed: tuple[int, ...]) -> str | None:
    if code not in allowed or "internal error" in err or "Traceback" in err:
        return f"exit {code}: {err[-800:]}"
    return None


class Seeds:
    """The inputs rounds start from, made once (traces are generated here, in `work`)."""

    def __init__(self, work: Path) -> None:
        import yaml

        self.work = work
        self.matrices = {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "matrices").glob("*.yaml"))}
        self.runs = sorted(p for p in (ROOT / "tests" / "fixtures" / "runs").iterdir()
                           if (p / "verdicts.json").is_file() and (p / "cells").is_dir())
        self._traces: dict[str, list[str]] | None = None

    def traces(self) -> dict[str, list[str]]:
        if self._traces is None:
            sys.path.insert(0, str(ROOT / "scripts"))
            import make_mooncake_conversations as mooncake

            work = self.work / "seeds"
            work.mkdir(parents=True, exist_ok=True)
            logs = sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "logs" / "llama.cpp-b11434").glob("*.log"))
            cli_run(["logs", *logs, "--trace", str(work / "lt.jsonl")])
            truth = mooncake.generate(1, 300)
            self._traces = {
                "mc": [json.dumps({k: v for k, v in line.items() if k != "session_id"}) for line in truth],
                "mct": [json.dumps(line) for line in truth[:200]],  # with session ids
                "lt": (work / "lt.jsonl").read_text().splitlines(),
            }
        return self._traces


def round_matrices(rng: random.Random, seeds: Seeds, intensity: int, where: Path) -> str | None:
    import yaml

    doc = edit(rng, seeds.matrices[rng.choice(list(seeds.matrices))], rng.randrange(1, intensity + 1))
    where.mkdir(parents=True, exist_ok=True)
    path = where / "matrix.yaml"
    try:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    except (yaml.YAMLError, ValueError):
        return None
    code, _, err = cli_run(["run", str(path), "--dry-run", "--out", str(where / "out")])
    return _crashed(code, err, (0, 2))


def round_traces(rng: random.Random, seeds: Seeds, intensity: int, where: Path) -> str | None:
    traces = seeds.traces()
    lines = list(traces[rng.choice(sorted(traces))])
    for _ in range(rng.randrange(1, intensity + 1)):
        if not lines:
            break
        k, op = rng.randrange(len(lines)), rng.randrange(6)
        if op <= 2:
            try:
                lines[k] = json.dumps(edit(rng, json.loads(lines[k]), 1))
            except ValueError:
                pass
        elif op == 3:
            del lines[k]
        elif op == 4:
            lines.insert(k, lines[rng.randrange(len(lines))])
        else:
            lines[k] = lines[k][: rng.randrange(len(lines[k]) + 1)]
    where.mkdir(parents=True, exist_ok=True)
    path = where / "trace.jsonl"
    path.write_text("\n".join(lines) + ("\n" if rng.random() < 0.9 else ""))
    policies = rng.choice([[], ["--policy", "llama-cram"], ["--policy", "baseline", "--policy", "retention"]])
    code, out, err = cli_run(["simulate", str(path), "--json", *policies])
    crashed = _crashed(code, err, (0, 2))
    if crashed or code != 0:
        return crashed
    try:
        doc = json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not JSON")))
        return _inconsistent(doc)
    except (ValueError, KeyError, TypeError) as exc:
        return f"simulate's document: {exc!r}"


def _inconsistent(doc: dict[str, Any]) -> str | None:
    perfect, consecutive = doc["ideal"]["perfect"], doc["ideal"]["consecutive"]
    if any(c > p for c, p in zip(consecutive, perfect)):
        return "a consecutive ideal above the perfect one"
    for p in doc["policies"]:
        if not p["reused_tokens"] <= p["ideal_tokens"] <= p["prompt_tokens"]:
            return f"{p['policy']}: reused {p['reused_tokens']}, ideal {p['ideal_tokens']}, prompt {p['prompt_tokens']}"
        shares = [p["share_of_ideal"], p["share_of_consecutive_ideal"],
                  *(t.get("share_of_consecutive_ideal") for t in p["by_turn_class"].values())]
        if any(s is not None and not 0 <= s <= 1 for s in shares):
            return f"{p['policy']}: a share outside [0, 1]: {shares}"
    return None


def round_runs(rng: random.Random, seeds: Seeds, intensity: int, where: Path) -> str | None:
    source = rng.choice(seeds.runs)
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(source, where)
    records = sorted(where.rglob("*.json"))
    for _ in range(rng.randrange(1, 4)):
        record = rng.choice(records)
        try:
            doc = json.loads(record.read_text())
        except ValueError:
            continue
        if rng.random() < 0.1:
            record.write_text(record.read_text()[: rng.randrange(50)])
        else:
            record.write_text(json.dumps(edit(rng, doc, rng.randrange(1, intensity + 1))))
    command = rng.choice([["gate", str(where)], ["report", str(where)], ["gate", str(where), "--json"],
                          ["compare", str(where), str(seeds.runs[0])],
                          ["compare", str(where), str(where), "--allow", "unverified"]])
    code, _, err = cli_run(command)
    # 3: the gate refuses impossible engine figures, by design (a fuzzed record holds some)
    crashed = _crashed(code, err, (0, 1, 2, 3))
    if crashed:
        return f"{command[0]}: {crashed}"
    html = where / "report.html"
    if html.is_file() and ("\u202e" in (text := html.read_text()) or "<script>" in text):
        return "report.html holds a raw bidi control or <script> from the records"
    return None


ROUNDS = {"matrices": round_matrices, "traces": round_traces, "runs": round_runs}


def one_round(kind: str, number: int, seeds: Seeds, intensity: int, where: Path) -> str | None:
    """What went wrong in round `number` of `kind` (its input under `where`); None: nothing."""
    return ROUNDS[kind](random.Random(f"{kind}:{number}"), seeds, intensity, where)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0, help="the first round's number (rounds are seeded by it)")
    ap.add_argument("--intensity", type=int, default=4, help="at most this many edits per input")
    ap.add_argument("--keep", type=Path, default=Path("fuzz-inputs"), help="where failing rounds' inputs are kept")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    seeds = Seeds(args.keep)
    failed = 0
    for n in range(args.seed, args.seed + args.rounds):
        where = args.keep / f"{args.kind}-{n}"
        problem = one_round(args.kind, n, seeds, args.intensity, where)
        if problem:
            failed += 1
            print(f"round {n} ({where}): {problem}", flush=True)
        else:
            shutil.rmtree(where, ignore_errors=True)
    print(f"{args.kind}: {args.rounds} rounds, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
