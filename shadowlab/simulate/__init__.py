"""`shadowlab simulate`: what each cache policy would reuse on a traffic, without an engine.

The cache model of each engine is `model.py` (docs/DESIGN.md §10); `tally.py` streams a traffic
through it once, every policy at a time; `sweep.py` runs a grid of policies on local cores or a
cluster. This module reads the sources (files, named shapes, run cells), and writes the table,
simulate.json and simulate.html.

Requests are served one after another (each finishes before the next starts). Where a real
engine's behaviour depends on timing — a request that arrives while another is still running on
a server with several slots — the turn is listed as timing-dependent in every output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowlab import traffic
from shadowlab.errors import ShadowlabError, TrafficError
from shadowlab.simulate.model import (MIB, OUTCOMES, PRESETS, TURN_CLASSES, Policy, Turn, _params, parse_policy,
                                      simulate, turn_class)
from shadowlab.simulate import sweep
from shadowlab.simulate.sources import open_source
from shadowlab.simulate.tally import PolicyTally, ShapeRun, one_pass, policy_doc, versus

__all__ = ["JSON_VERSION", "MIB", "OUTCOMES", "PRESETS", "TURN_CLASSES", "Policy", "RunCell", "Turn", "main",
           "parse_policy", "run_policies", "simulate", "summary", "turn_class", "versus"]

JSON_VERSION = 1


@dataclass(frozen=True)
class RunCell:
    """A warm traffic cell of a run directory as a simulator source: its traffic, the schedule
    its engine served it on (None: one request after another), what it reused per turn."""

    loaded: traffic.Loaded
    schedule: tuple[tuple[str, int], ...] | None
    reused: tuple[int | None, ...]
    sizes: dict[str, float] | None = None  # checkpoint_mib, kv_mib_per_token, state_mib of its engine

    def sized(self, policy: Policy) -> Policy:
        """The policy with the cell's engine's sizes (its /props), where its text (`name`, as
        parse_policy read it) sets none: what a retention or RAM-cache budget holds depends on them."""
        if not self.sizes:
            return policy
        given = {key for key, _ in _params(policy.name)}
        return dataclasses.replace(policy, **{k: v for k, v in self.sizes.items() if k not in given})


def is_run_cell(path: Path) -> bool:
    from shadowlab.results.layout import RunLayout

    return RunLayout.is_cell_dir(path)


def load_run_cell(path: Path) -> RunCell:
    """`RUN/cells/<cell>`: the traffic from the run's matrix, the schedule from the cell's
    records and engine.log (attribution.schedule of its tied tasks), its reuse per turn."""
    from shadowlab.judge import attribution
    from shadowlab.logs import parse as logparse
    from shadowlab.results import rundir
    from shadowlab.errors import RunDirError

    run = rundir.load(path.parent.parent)
    meta = run.metas.get(path.name)
    cell = (meta.cell or {}) if meta is not None else {}
    seq = run.matrix.sequences.get(cell.get("sequence") or "") if run.matrix is not None else None
    if meta is None or cell.get("kind") != "warm" or getattr(seq, "kind", None) != "traffic":
        raise RunDirError("not a warm cell of a traffic sequence", path=str(path),
                          hint="give RUN/cells/<engine>.<configuration>.<sequence> of a traffic run")
    turns = sorted(meta.turns, key=lambda t: t.index)
    if [t.index for t in turns] != list(range(len(seq.requests))):
        raise RunDirError(f"the cell answered {len(turns)} of its {len(seq.requests)} requests", path=str(path),
                          hint="a cell that failed part-way has no whole schedule to replay")
    _believable(run, path.name)
    schedule = None
    if any(t.log_attribution == "task" for t in turns):
        log = run.layout.engine_log(path.name)
        by_task = attribution.tasks(logparse.parse(log, meta.engine.log_family if meta.engine else "llama.cpp").events)
        missing = [t.index for t in turns if not t.task_ids or t.task_ids[0] not in by_task]
        if missing:
            raise RunDirError(f"turn {missing[0]}'s task is not in engine.log", path=str(log))
        tied = {t.index: by_task[t.task_ids[0]] for t in turns}
        schedule = tuple(attribution.schedule(tied, attribution.markers(log)))
    loaded = traffic.Loaded(tuple(seq.requests), (), str(path), "run cell")
    props = meta.engine.props if meta.engine is not None and isinstance(meta.engine.props, dict) else {}
    ckpt, kv = props.get("checkpoint_bytes"), props.get("kv_bytes_per_token")
    sizes = None
    if all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**40 for v in (ckpt, kv)):
        # The reference engine's /props: a checkpoint's bytes and the attention KV per token; its
        # prompt-cache entry is counted without a separate state (as in the live tests).
        sizes = {"checkpoint_mib": ckpt / MIB, "kv_mib_per_token": kv / MIB, "state_mib": 0.0}
    return RunCell(loaded, schedule, tuple(t.reused_tokens for t in turns), sizes)


def _believable(run: Any, cell_id: str) -> None:
    """The cell's reuse is what every policy is compared with: refused (exit 3, like the gate) when
    its engine reported figures the plausibility rules reject."""
    from shadowlab.judge import plausibility, verdicts
    from shadowlab.errors import ImpossibleFigures

    verdict = verdicts.cell_verdict(run, cell_id)
    problems = plausibility.cell_problems(verdict)
    if problems:
        raise ImpossibleFigures([plausibility.described(cell_id, problems)], engine=verdict.engine,
                                hint="the gate refuses this cell too (exit 3): its reuse is no measurement to "
                                     "compare a policy with")


def run_policies(loaded: traffic.Loaded | traffic.Stream, policies: Sequence[Policy], prefill_tps: float,
                 per_turn: bool = True, cell: RunCell | None = None) -> dict[str, Any]:
    """simulate.json for a traffic (in memory, or streamed: read once, whatever the number of
    policies) under each policy."""
    requests: Iterable[traffic.Request] = loaded.requests
    tallies: list[PolicyTally]
    if cell is not None:
        # What the cell's engine reused is each request's floor (the ideal never lies below it)
        # and what every policy is compared with, turn by turn.
        requests = [dataclasses.replace(r, reported_reuse=m) for r, m in zip(requests, cell.reused)]
        given = [simulate(requests, p, cell.schedule) if cell.schedule is not None else None for p in policies]
        tallies = [PolicyTally(p, prefill_tps, per_turn, g) for p, g in zip(policies, given)]
    else:
        tallies = [PolicyTally(p, prefill_tps, per_turn) for p in policies]
    shape = ShapeRun(per_turn)
    one_pass(requests, tallies, shape)
    return assemble(_source_of(loaded), shape.result(), [t.partial() for t in tallies], prefill_tps, cell)


def _source_of(loaded: traffic.Loaded | traffic.Stream) -> dict[str, Any]:
    """What the output says of the source (complete once its requests were consumed)."""
    return {"source": loaded.source, "format": loaded.format, "skipped": list(loaded.skipped),
            "block_size": loaded.block_size}


def assemble(source: dict[str, Any], traffic_side: dict[str, Any], parts: Sequence[dict[str, Any]],
             prefill_tps: float, cell: RunCell | None = None) -> dict[str, Any]:
    """simulate.json from the traffic's side and each policy's (however they were computed)."""
    key = "versus_run" if cell is not None else "versus_reported"
    results = [policy_doc(part, traffic_side, prefill_tps, key) for part in parts]
    for doc in results:
        if cell is not None and cell.schedule is not None:
            doc["timing_dependent_turns"] = []  # the measured schedule says which slot was free
        doc["versus_first"] = versus(results[0], doc)
    return {
        "version": JSON_VERSION,
        "source": source["source"],
        "format": source["format"],
        "skipped": source["skipped"],
        "prefill_tps": prefill_tps,
        "shape": traffic_side["shape"],
        "ideal": traffic_side["ideal"],
        "notes": _notes(source["format"], cell),
        "schedule": None if cell is None or cell.schedule is None else [list(step) for step in cell.schedule],
        "measured_reused": None if cell is None else list(cell.reused),
        "policies": results,
        "ideal_bound": ideal_bound(source, traffic_side["raised"]),
    }


def ideal_bound(source: dict[str, Any], raised: int) -> dict[str, Any]:
    """Whether the ideals are exact or a lower bound, and why (docs/DESIGN.md §10: a request's
    ideal is never below what an engine reused for it; where the source cannot say more, the
    figure is a lower bound and every output says so)."""
    reasons = []
    if source["format"] == "trace":
        reasons.append("a log states only what each request shared with the cache it met (its slot's, or a "
                       "prompt-cache entry's), never what it shares with older requests")
    elif source["format"] == "mooncake" and source["block_size"] > 1:
        reasons.append(f"hash ids of {source['block_size']}-token blocks: a prefix shared part-way into a "
                       "block is not seen")
    if raised:
        reasons.append(f"{raised:,} request(s) reused more on the engine than the traffic shows: their "
                       "ideal is what the engine reused")
    return {"exact": not reasons, "reasons": reasons, "raised_by_engine_reuse": raised}


def _notes(fmt: str, cell: RunCell | None = None) -> list[str]:
    if cell is not None and cell.schedule is not None:
        notes = ["requests are served on the schedule the run's engine served them on (its launch and "
                 "release lines): a request starts on a slot no unfinished request holds"]
    else:
        notes = ["requests are served one after another; a turn listed as timing-dependent would "
                 "meet busy slots on a real server with several slots, so its slot (and its reuse) may differ"]
    if cell is not None:
        notes.append("versus the run: each policy's reused tokens per turn against the cell's "
                     "(timings.cache_n); the policy must describe the cell's engine flags to agree")
        if cell.sizes:
            notes.append(f"sizes from the cell's engine (/props), unless a policy sets them: checkpoint "
                         f"{cell.sizes['checkpoint_mib']:.4g} MiB, attention KV {cell.sizes['kv_mib_per_token']:.4g} "
                         "MiB per token")
    if fmt == "trace":
        notes.append("a logs trace states only the prefix each request shared with its slot's previous "
                     "request (or with the prompt-cache entry it loaded): the ideal is that one, a lower bound, "
                     "and the trace names no conversation (they are inferred from those prefixes)")
    return notes


# --------------------------------------------------------------------------- outputs


def summary(doc: dict[str, Any]) -> str:
    s = doc["shape"]
    inferred = doc.get("conversations", {}).get("source") == "inferred"
    lines = [f"shadowlab simulate: {doc['source']} ({doc['format']}): {s['requests']:,} requests, "
             f"{s['prompt_tokens']:,} prompt tokens, {s['interlopers']:,} interlopers, "
             f"{s['conversations']:,} conversations" + (" (inferred from shared prefixes: the trace names none)"
                                                          if inferred else ""),
             f"  ideal (perfect cache) {s['ideal_tokens']:,} tokens{_bound_words(doc)}; consecutive-turn ideal "
             f"{s['consecutive_ideal_tokens']:,}; shared with the previous request: median "
             f"{s['shared_with_previous']['median']}, under 512 {_pc(s['share_near_zero_overlap'])}",
             ""]
    head = ("policy", "reused", "of ideal", "of consec.", "processed", "forced", "silent", "restored",
            "ckpt/turn", "MiB/turn", "ms/turn", "prefill s", "avoidable s", "net ms/turn", "timing-dep.")
    rows = [head]
    for p in doc["policies"]:
        rows.append((p["policy"], f"{p['reused_tokens']:,}", _pc(p["share_of_ideal"]),
                     _pc(p["share_of_consecutive_ideal"]), f"{p['processed_tokens']:,}", str(p["forced"]),
                     str(p["silent"]), str(p["restored"]), f"{p['creations_per_turn']:.2f}",
                     f"{p['checkpoint_mib_per_turn']:.1f}", f"{p['checkpoint_ms_per_turn']:.1f}",
                     f"{p['prefill_s']:,.1f}", f"{p['avoidable_prefill_s']:,.1f}",
                     f"{p['versus_first']['net_ms_per_turn']:+,.0f}", str(len(p["timing_dependent_turns"]))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    first = doc["policies"][0]["policy"]
    lines.append(f"  (prefill seconds at {doc['prefill_tps']:,.0f} tokens/s; cost per created checkpoint and "
                 f"restore from each policy's parameters; net ms/turn: prefill saved minus checkpoint time "
                 f"spent, against {first})")
    classes = doc["policies"][0]["by_turn_class"]
    lines.append("  reused tokens by turn (of the consecutive-turn ideal" + (", conversations inferred" if inferred else "")
                 + "): "
                 + "; ".join(f"{CLASS_LABELS[c]} ({classes[c]['turns']:,})" for c in TURN_CLASSES if classes[c]["turns"]))
    for p in doc["policies"]:
        cls = p["by_turn_class"]
        lines.append(f"    {p['policy']}: " + "; ".join(_class_cell(cls[c]) for c in TURN_CLASSES if cls[c]["turns"]))
    lines += _refused_lines(doc["policies"])
    for p in doc["policies"]:
        late = p["timing_dependent_turns"]
        if late:
            lines.append(f"  {p['policy']}: {len(late)} timing-dependent turn(s), first: "
                         + ", ".join(map(str, late[:10])))
    for key, against, what, unit, said in (
            ("versus_reported", "the log" if doc["format"] == "trace" else "the captured answers",
             "what the server reported", "request", "server reported"),
            ("versus_run", "the run", "exactly what the cell reused", "turn", "run reused")):
        for p in doc["policies"]:
            if p.get(key) is not None:
                lines.append(_versus_line(p["policy"], p[key], (against, what, unit, said)))
    lines += [f"  note: {n}" for n in doc["notes"]]
    lines += [f"  skipped: {s}" for s in doc["skipped"][:20]]
    return "\n".join(lines) + "\n"


def _refused_lines(policies: Sequence[dict[str, Any]]) -> list[str]:
    """Prompts a policy's context cannot hold: one line per distinct figure, naming its policies."""
    groups: dict[tuple[int, int, int], list[str]] = {}
    for p in policies:
        r = p.get("refused") or {}
        if r.get("requests"):
            groups.setdefault((r["requests"], r["prompt_tokens"], r["n_ctx"]), []).append(p["policy"])
    out = []
    for (n, tokens, n_ctx), names in groups.items():
        who = "every policy" if len(names) == len(policies) > 1 else ", ".join(names)
        out.append(f"  refused ({who}): {n:,} request(s), {tokens:,} prompt tokens, {n_ctx:,} tokens or more "
                   "(n_ctx): the engine answers HTTP 400 exceed_context_size_error and computes nothing")
    return out


def _bound_words(doc: dict[str, Any]) -> str:
    bound = doc.get("ideal_bound") or {"exact": True}
    return "" if bound["exact"] else " (a lower bound: " + "; ".join(bound["reasons"]) + ")"


def _versus_line(policy: str, vs: dict[str, Any], words: tuple[str, str, str, str]) -> str:
    against, what, unit, said = words
    first = vs["first_difference"]
    tail = "" if first is None else (f"; first difference at {unit} {first['turn']}: {said} "
                                     f"{first['measured']}, predicted {first['predicted']}")
    return f"  {policy} versus {against}: {vs['equal_turns']} of {vs['turns']} {unit}s reuse {what}{tail}"


CLASS_LABELS = {"after_own_turn": "after its own previous turn", "after_other_request": "after another request",
                "interloper": "interlopers"}


def _class_cell(row: dict[str, Any]) -> str:
    if not row["consecutive_ideal_tokens"]:
        return f"{row['reused_tokens']:,}"
    return f"{row['reused_tokens']:,} of {row['consecutive_ideal_tokens']:,} ({_pc(row['share_of_consecutive_ideal'])})"


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def render_html(doc: dict[str, Any]) -> str:
    from shadowlab import present  # the HTML environment: autoescape, |visible, StrictUndefined

    env = present.environment()
    return env.get_template("simulate.html.j2").render(doc=doc)


# --------------------------------------------------------------------------- command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", type=Path, metavar="SOURCE",
                   help="a Mooncake JSON-lines trace, a `shadowlab logs --trace` file, a traffic shape (YAML/JSON), "
                        "a named shape (" + ", ".join(f"shape:{n}[:seed]" for n in traffic.PRESETS) + "), or a "
                        "warm traffic cell of a run, RUN/cells/CELL: its traffic on the schedule its engine "
                        "served it on, each policy compared turn by turn with what the cell reused")
    p.add_argument("--policy", action="append", default=[], metavar="NAME[:key=value,...]",
                   help="a preset (" + ", ".join(PRESETS) + ") with optional parameters; repeatable "
                        "(default: baseline, policy0, prompt-end, affinity, retention)")
    p.add_argument("--prefill-tps", type=float, default=2200.0, metavar="TOKENS_PER_S",
                   help="prefill rate for the seconds columns (default 2200, the case study's 2,100-2,300; "
                        f"above 0, at most {MAX_PREFILL_TPS:g})")
    p.add_argument("--json", action="store_true", help="print the JSON document (version 1) instead of the table")
    p.add_argument("--out", type=Path, default=None, help="write simulate.json and simulate.html into DIR")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="simulate every combination of these values (repeatable: a grid) applied to each --policy; "
                        "keys are policy parameters or " + ", ".join(f"{a} ({k})" for a, k in sweep.ALIASES.items()
                                                                     if a in ("cram", "np", "b", "ub", "cms", "retain"))
                        + "; one table, the knee marked")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="simulate the policies (or grid points) in N local processes (same results as 1)")
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help="simulate them on a Dask cluster (tcp://HOST:8786; the `cluster` extra; SOURCE must be "
                        "readable at the same path on the workers)")


DEFAULT_POLICIES = ("baseline", "policy0", "prompt-end", "affinity", "retention")
MAX_PREFILL_TPS = 1e9  # tokens per second: a thousand times any engine measured
OUT_HINT = "free space or choose a writable --out"


def run(args: argparse.Namespace) -> int:
    """The subcommand: 0 when the traffic was simulated, 2 on bad input, 3 when a run cell's
    engine reported impossible figures or --out cannot be written (one line, no traceback)."""
    from shadowlab.results import records
    from shadowlab.errors import EngineError, InfrastructureError

    try:
        if not 0 < args.prefill_tps <= MAX_PREFILL_TPS:  # NaN fails the test too
            raise TrafficError(f"--prefill-tps {args.prefill_tps!r} is outside (0, {MAX_PREFILL_TPS:g}] tokens/s")
        policies = [parse_policy(t) for t in (args.policy or DEFAULT_POLICIES)]
        cell = load_run_cell(args.source) if is_run_cell(args.source) else None
        if cell is not None:
            policies = [cell.sized(p) for p in policies]
            source: traffic.Loaded | traffic.Stream = cell.loaded
            inference = None
        elif not (args.sweep or args.jobs != 1 or args.cluster is not None):
            source, inference = open_source(args.source)
        if args.sweep or args.jobs != 1 or args.cluster is not None:
            if cell is not None:
                raise TrafficError("--sweep, --jobs and --cluster take a trace or a shape, not a run cell",
                                   file=str(args.source))
            # A grid varies one policy by default (the first default); a parallel list is the usual one.
            doc = run_sweep(args, args.policy or (DEFAULT_POLICIES[:1] if args.sweep else DEFAULT_POLICIES))
        else:
            per_turn = bool(args.json or args.out is not None)  # the table needs no per-turn lists
            doc = run_policies(source, policies, args.prefill_tps, per_turn=per_turn, cell=cell)
            doc["conversations"] = inference.summary() if inference is not None else {"source": "given"}
        if not doc["shape"]["requests"]:
            raise TrafficError("no request in the traffic", file=str(args.source))
        text = json.dumps(doc, ensure_ascii=True)
        if args.out is not None:
            with records.storage_errors(OUT_HINT):
                records.write_bytes_atomic(args.out / "simulate.json", (text + "\n").encode("ascii"))
                records.write_bytes_atomic(args.out / "simulate.html", render_html(doc).encode("utf-8"))
    except ShadowlabError as exc:
        print(f"shadowlab simulate: {records.terminal_safe(str(exc))}", file=sys.stderr)
        return 3 if isinstance(exc, (EngineError, InfrastructureError)) else 2
    sys.stdout.write(text + "\n" if args.json else summary(doc) if "sweep" not in doc else sweep_summary(doc))
    return 0


MAX_JOBS = 1024


def run_sweep(args: argparse.Namespace, bases: Sequence[str]) -> dict[str, Any]:
    """simulate.json of a grid (or of the --policy list, in parallel): per-turn lists are left
    out (a grid of them would be the trace's length times the points)."""
    if not 1 <= args.jobs <= MAX_JOBS:
        raise TrafficError(f"--jobs {args.jobs} is outside 1..{MAX_JOBS}")
    grid = sweep.parse_sweeps(args.sweep) if args.sweep else None
    points = grid.points(bases) if grid is not None else [(b, {}) for b in bases]
    for text, _ in points:
        parse_policy(text)  # every point's error before any work
    side, parts = sweep.run_grid(args.source, [t for t, _ in points], args.prefill_tps, args.jobs, args.cluster)
    if not side["shape"]["requests"]:
        raise TrafficError("no request in the traffic", file=str(args.source))
    doc = assemble(side["source"], side, parts, args.prefill_tps)
    doc["conversations"] = side["conversations"]
    if grid is not None:
        shares = [p["share_of_ideal"] for p in doc["policies"]]
        doc["sweep"] = {"keys": list(grid.keys), "points": [
            {"policy": p["policy"], "values": values, "share_of_ideal": p["share_of_ideal"],
             "reused_tokens": p["reused_tokens"], "net_ms_per_turn": p["versus_first"]["net_ms_per_turn"],
             "refused": p["refused"]["requests"]}
            for p, (_, values) in zip(doc["policies"], points)], "knee": sweep.knee(shares),
            "knee_rule": f"the first point (values in the order given) reaching {sweep.KNEE_SHARE:.0%} of the "
                         "best recovered share"}
    return doc


def sweep_summary(doc: dict[str, Any]) -> str:
    """The sweep's one table: a row per grid point, the knee marked."""
    s, sw = doc["shape"], doc["sweep"]
    lines = [f"shadowlab simulate --sweep: {doc['source']} ({doc['format']}): {s['requests']:,} requests, "
             f"{s['prompt_tokens']:,} prompt tokens; ideal {s['ideal_tokens']:,} tokens{_bound_words(doc)}", ""]
    head = ("", "policy", *sw["keys"], "reused", "of ideal", "net ms/turn", "refused")
    rows = [head]
    for i, p in enumerate(sw["points"]):
        rows.append(("knee" if i == sw["knee"] else "", p["policy"].partition(":")[0],
                     *(p["values"][k] for k in sw["keys"]), f"{p['reused_tokens']:,}", _pc(p["share_of_ideal"]),
                     f"{p['net_ms_per_turn']:+,.0f}", f"{p['refused']:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    first = sw["points"][0]["policy"]
    lines.append(f"  (net ms/turn: prefill saved at {doc['prefill_tps']:,.0f} tokens/s minus checkpoint time, "
                 f"against {first}; knee: {sw['knee_rule']})")
    lines += [f"  note: {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowlab simulate", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(list(argv) if argv is not None else None))


if __name__ == "__main__":
    sys.exit(main())
