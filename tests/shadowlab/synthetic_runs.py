"""Synthetic run directories for the report / gate / expectations tests.

They hold what a run of matrices/ckpt.yaml on the reference engine leaves behind for the later
stages (matrix.yaml, plan.json, environment.json, verdicts.json; no cells/, so the gate reads
verdicts.json), with knobs that break it the way a faulty engine would.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from shadowlab.matrix import load as load_matrix
from shadowlab.plan import build_plan
from shadowlab.judge.verdicts import (
    CellVerdict,
    CheckpointRef,
    IdentityCheck,
    IdentityStatus,
    Outcome,
    RunVerdict,
    TurnVerdict,
)

ROOT = Path(__file__).resolve().parents[2]
CKPT_MATRIX = ROOT / "matrices" / "ckpt.yaml"
LENGTHS = {"A": 4560, "C": 4947, "B": 99, "A_append": 4766, "C_first_round": 4947}
SHARED = {"C": 2531, "C_first_round": 1956}
TEXT = "The quick brown fox."


def ckpt(n_tokens: int, turn: int) -> CheckpointRef:
    return CheckpointRef(pos_min=n_tokens - 1, pos_max=n_tokens - 1, n_tokens=n_tokens, size_mib=0.032,
                         took_ms=0.4, created_turn=turn)


def placements(length: int, configuration: str, re_entry: int = 0) -> list[int]:
    """The reference engine's placement (DESIGN.md §1) for a raw-token prompt."""
    positions = {length - 4 - 512, length - 4}
    if configuration.startswith("policy0"):
        positions |= set(range(2048, length + 1, 2048))
    if configuration.endswith("prompt_end"):
        positions.add(length)
    return sorted(p for p in positions if p > re_entry)


def simulate_cell(configuration: str, prompts: list[str], *, skip_cascade: bool = False,
                  stale_restore: bool = False) -> tuple[TurnVerdict, ...]:
    """What the reference engine does with one sequence, as verdicts."""
    ring: list[CheckpointRef] = []
    cached = 0
    previous: str | None = None
    turns = []
    for index, pid in enumerate(prompts):
        length = LENGTHS[pid]
        if previous is None:
            divergence, outcome = 0, Outcome.COLD
        elif pid == "A_append":
            divergence = LENGTHS["A"]
        elif pid in SHARED and previous == "A":
            divergence = SHARED[pid]
        else:
            divergence = 0
        n_past = min(divergence, length - 1)
        restored = None
        if previous is None:
            re_entry = 0
        elif n_past == 0:
            outcome, re_entry = Outcome.SILENT_RESET, 0
        else:
            usable = [c for c in ring if c.n_tokens <= n_past]
            if usable:
                restored = usable[-1]
                outcome, re_entry = Outcome.RESTORED, restored.n_tokens
            else:
                outcome, re_entry = Outcome.FORCED, 0
        alive = tuple(ring)
        below = tuple(c for c in ring if c.pos_max < divergence)
        above = tuple(c for c in ring if c.pos_max >= divergence)
        to_erase = [c for c in ring if c.pos_max >= re_entry] if previous is not None else []
        erased = () if skip_cascade else tuple(to_erase)
        missed = tuple(to_erase) if skip_cascade else ()
        if not skip_cascade:
            ring = [c for c in ring if c not in to_erase]
        created = tuple(ckpt(n, index) for n in placements(length, configuration, re_entry))
        ring += list(created)
        reused = re_entry
        identity = None
        if index > 0:
            broken = stale_restore and outcome is Outcome.RESTORED
            if broken:
                identity = IdentityCheck(
                    IdentityStatus.MISMATCH, reference_cell=f"reference.{configuration}.cold.{pid}",
                    reference_turn=0, reused_tokens=reused, first_diff_token=3, first_diff_byte=5,
                    text="The q<script>alert(1)</script>\x01", reference_text=TEXT,
                    tokens=(84, 104, 101, 32, 113), reference_tokens=(84, 104, 101, 32, 117),
                    detail="token 3 differs")
            else:
                identity = IdentityCheck(
                    IdentityStatus.IDENTICAL if reused > 0 else IdentityStatus.IDENTICAL_NO_REUSE,
                    reference_cell=f"reference.{configuration}.cold.{pid}", reference_turn=0,
                    reused_tokens=reused, text=TEXT, reference_text=TEXT)
        turns.append(TurnVerdict(
            index=index, prompt_id=pid, outcome=outcome, prompt_tokens=length, cached_tokens=cached,
            divergence_point=divergence if previous else None, re_entry_point=re_entry,
            re_entry_source="restore" if restored else "cache_trim", reused_tokens=reused,
            processed_tokens=length - reused, reused_api=reused, processed_api=length - reused,
            saved_fraction=reused / length, prefill_ms=(length - reused) * 0.2,
            forcing_line=outcome is Outcome.FORCED, restored=restored,
            restore_ms=2.5 if restored else None, alive_at_start=alive, alive_below_divergence=below,
            alive_above_divergence=above, created=created, erased_cascade=erased,
            cascade_missed=missed, cascade_checked=previous is not None, task_ids=(index,),
            log_complete=True, identity=identity))
        cached = length + 16
        previous = pid
    return tuple(turns)


def ckpt_verdict(run_id: str = "ckpt-synthetic", *, skip_cascade: bool = False,
                 stale_restore: bool = False, control_mismatch: bool = False,
                 failed_cell: str | None = None) -> RunVerdict:
    matrix = load_matrix(CKPT_MATRIX)
    cells = []
    for c in build_plan(matrix).cells:
        prompts = [t.prompt_id for t in c.turns]
        status, reason = "ok", None
        if c.id == failed_cell:
            status, reason = "failed", "engine exited with status 1 before /health answered"
        turns = simulate_cell(c.configuration, prompts, skip_cascade=skip_cascade,
                              stale_restore=stale_restore) if status == "ok" else ()
        control = None
        if c.kind.value == "control":
            control = IdentityCheck(
                IdentityStatus.MISMATCH if control_mismatch else IdentityStatus.IDENTICAL_NO_REUSE,
                reference_cell=c.control_of, reference_turn=0, reused_tokens=0, text=TEXT,
                reference_text=TEXT + "!" if control_mismatch else TEXT,
                first_diff_byte=len(TEXT) if control_mismatch else None)
        cells.append(CellVerdict(
            cell_id=c.id, kind=c.kind.value, engine=c.engine, configuration=c.configuration,
            sequence=c.sequence or "", status=status, reason=reason, log_family="reference",
            turns=turns, control=control, event_counts={"created": 2, "prompt_eval": len(turns)}))
    return RunVerdict(run_id=run_id, cells=tuple(cells))


def write_run(directory: Path, verdict: RunVerdict, *, matrix_path: Path = CKPT_MATRIX) -> Path:
    """A run directory holding the matrix, plan, environment and verdicts.json."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(matrix_path, directory / "matrix.yaml")
    plan = build_plan(load_matrix(matrix_path))
    (directory / "plan.json").write_text(json.dumps(plan.to_dict()), encoding="utf-8")
    (directory / "environment.json").write_text(json.dumps({
        "captured_at": "2026-11-29T10:00:00+00:00", "host": "testhost",
        "os": {"system": "Linux", "release": "6.1", "machine": "x86_64"},
        "cpu": {"model": "Test CPU", "logical_cores": 2, "usable_cores": [0, 1]},
        "memory_bytes": 8 << 30, "python": {"version": "3.11.2", "executable": "python3"},
        "packages": {"shadowlab": "0.1.0", "torch": "2.4.0"},
        "shadowlab": {"version": "0.1.0", "commit": "0123456789abcdef0123", "dirty": False},
    }), encoding="utf-8")
    (directory / "verdicts.json").write_text(json.dumps(verdict.to_dict()), encoding="utf-8")
    return directory


def with_turn(verdict: RunVerdict, cell_id: str, index: int, **changes) -> RunVerdict:
    """A copy of `verdict` with one turn of one cell changed."""
    cells = []
    for c in verdict.cells:
        if c.cell_id == cell_id:
            turns = tuple(dataclasses.replace(t, **changes) if t.index == index else t for t in c.turns)
            c = dataclasses.replace(c, turns=turns)
        cells.append(c)
    return dataclasses.replace(verdict, cells=tuple(cells))
