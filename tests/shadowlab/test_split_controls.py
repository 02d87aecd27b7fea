"""Split controls through `shadowlab run` on live reference engines (issue 16, DESIGN §5).

The append probe of tests/engine/test_split_faults.py, small: A, then EXT = A + 26 tokens,
which restores A's checkpoint near its end and so is prefilled through another batch
schedule than a cold EXT. A mismatch gets a split control cell (`<warm>.split.<turn>`) and a
triage class in verdicts.json, report.md and the gate.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import test_run  # noqa: E402
from shadowlab.judge import gate
from shadowlab.cli import main
from shadowlab.judge.gate import EXIT_CHECK_FAILED, EXIT_QUALIFIED

pytestmark = pytest.mark.slow

# test_run's small matrix, with C (a divergence) replaced by EXT (an append) and longer outputs,
# so that a perturbed prefill shows in the greedy tokens.
_C = "  C: {kind: diverge, from: A, shared: 70, tokens: 130, seed: 2}"
_EXT = "  EXT: {kind: append, from: A, extra: 26, seed: 2}"


def _matrix(path: Path, extra: str, generation: str = "") -> Path:
    path = test_run.write_matrix(path, name="split", sequences="  append: [A, EXT]", control=True)
    text = path.read_text()
    for old, new in ((_C, _EXT), ("n_predict: 4", f"n_predict: 24{generation}"),
                     ("{control: true}", f"{{control: true{extra}}}")):
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


WARM = "reference.defaults.append"
SPLIT = f"{WARM}.split.1"


def _run(tmp_path: Path, *faults: str, extra: str = "", generation: str = "") -> tuple[int, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    matrix = _matrix(tmp_path / "m.yaml", extra, generation)
    out = tmp_path / "run"
    args = ["run", str(matrix), "--out", str(out)]
    for fault in faults:
        args += ["--fault", fault]
    return main(args), out


def _ext(out: Path) -> dict:
    verdicts = json.loads((out / "verdicts.json").read_text())
    cell = next(c for c in verdicts["cells"] if c["cell_id"] == WARM)
    return cell["turns"][1]


def _planned(out: Path) -> list[str]:
    return [c["id"] for c in json.loads((out / "plan.json").read_text())["cells"]]


def test_stale_restore_is_corrupted_state_and_fails(tmp_path):
    code, out = _run(tmp_path, "stale-restore")
    turn = _ext(out)
    assert turn["identity"]["status"] == "mismatch"
    assert turn["triage"]["cls"] == "corrupted_state", turn["triage"]
    assert turn["triage"]["split_control_cell"] == SPLIT and turn["triage"]["warm_vs_split"]
    assert SPLIT in _planned(out) and (out / "cells" / SPLIT / "meta.json").is_file()
    assert code == EXIT_CHECK_FAILED
    assert "corrupted_state" in (out / "report.md").read_text()
    assert "triage: <b>corrupted_state</b>" in (out / "report.html").read_text()


def test_split_noise_is_split_sensitivity_and_fails_unless_allowed(tmp_path):
    code, out = _run(tmp_path / "a", "split-noise")
    turn = _ext(out)
    assert turn["triage"]["cls"] == "split_sensitivity", turn["triage"]
    assert turn["triage"]["warm_vs_split"] is None and turn["triage"]["warm_vs_cold"]
    assert code == EXIT_CHECK_FAILED
    code, out = _run(tmp_path / "b", "split-noise", extra=", split_sensitivity: allow")
    assert _ext(out)["triage"]["cls"] == "split_sensitivity"
    assert code == EXIT_QUALIFIED, gate.evaluate(out).summary()
    assert "split_sensitivity" in (out / "report.md").read_text()  # accepted, still reported


def test_top_logprobs_asked_are_recorded_and_shown_where_outputs_part(tmp_path):
    """generation.n_probs: each turn records its top candidates, and the triage's evidence shows
    them at the first differing token; without it, the undetermined text says they are missing."""
    code, out = _run(tmp_path, "stale-restore", generation=", n_probs: 3")
    turn = _ext(out)
    assert turn["triage"]["cls"] == "corrupted_state" and "top logprobs [" in turn["triage"]["warm_vs_cold"]
    meta = json.loads((out / "cells" / WARM / "meta.json").read_text())
    top = meta["turns"][1]["completion"]["top_logprobs"]
    assert len(top) == len(meta["turns"][1]["completion"]["tokens"]) and all(len(t) == 3 for t in top)
    assert all(t[0]["logprob"] >= t[1]["logprob"] >= t[2]["logprob"] for t in top)  # engine order: best first
    assert code == EXIT_CHECK_FAILED


def test_nondeterministic_engine_is_nondeterminism(tmp_path):
    code, out = _run(tmp_path, "nondeterministic")
    turn = _ext(out)
    assert turn["identity"]["status"] == "mismatch"
    assert turn["triage"]["cls"] == "nondeterminism", turn["triage"]
    assert code == EXIT_CHECK_FAILED  # inconclusive counts as a failure, as before


def test_healthy_engine_no_mismatch_no_class_no_split_control(tmp_path):
    code, out = _run(tmp_path)
    turn = _ext(out)
    assert turn["identity"]["status"] == "identical" and turn["triage"] is None
    assert not any(".split." in c for c in _planned(out))
    assert code == EXIT_QUALIFIED, gate.evaluate(out).summary()


def test_split_controls_all_runs_one_for_every_restored_turn_of_a_healthy_engine(tmp_path):
    code, out = _run(tmp_path, extra=", split_controls: all")
    assert _planned(out).count(SPLIT) == 1 and _ext(out)["triage"] is None
    split = json.loads((out / "cells" / SPLIT / "meta.json").read_text())
    warm = json.loads((out / "cells" / WARM / "meta.json").read_text())
    assert split["cell"]["kind"] == "split_control" and split["cell"]["turns"][0]["split_points"]
    assert split["turns"][0]["reused_tokens"] == 0  # computed in full, through the warm schedule
    assert split["turns"][0]["completion"]["tokens"] == warm["turns"][1]["completion"]["tokens"]
    assert code == EXIT_QUALIFIED


def test_resume_plans_a_missing_split_control_again_once(tmp_path):
    code, out = _run(tmp_path, "stale-restore")
    shutil.rmtree(out / "cells" / SPLIT)  # as if the run stopped before the split control ran
    plan = json.loads((out / "plan.json").read_text())
    plan["cells"] = [c for c in plan["cells"] if c["id"] != SPLIT]
    (out / "plan.json").write_text(json.dumps(plan))
    matrix = tmp_path / "m.yaml"
    assert main(["run", str(matrix), "--out", str(out), "--resume", "--fault", "stale-restore"]) == code
    assert _planned(out).count(SPLIT) == 1 and (out / "cells" / SPLIT / "meta.json").is_file()
    assert _ext(out)["triage"]["cls"] == "corrupted_state"
    assert main(["run", str(matrix), "--out", str(out), "--resume", "--fault", "stale-restore"]) == code
    assert _planned(out).count(SPLIT) == 1  # a finished run resumed plans nothing twice


def test_a_part_with_a_split_control_merges_into_the_whole_run(tmp_path):
    """A shard plans the split controls of the warm cells it owns; merge keeps them after the
    plan (every identity comparison of a warm cell is on one shard, so its split control is too)."""
    matrix = _matrix(tmp_path / "m.yaml", "")
    matrix.write_text(matrix.read_text().replace("  defaults: {}", "  defaults: {}\n  again: {}"))  # a unit each
    parts = [tmp_path / f"part{i}" for i in (1, 2)]
    for i, part in enumerate(parts, start=1):
        main(["run", str(matrix), "--shard", f"{i}/2", "--out", str(part), "--no-report", "--fault", "stale-restore"])
    out = tmp_path / "merged"
    assert main(["merge", *map(str, parts), "--out", str(out)]) == 0
    assert main(["gate", str(out)]) == EXIT_CHECK_FAILED
    again = SPLIT.replace(".defaults.", ".again.")
    assert _planned(out).count(SPLIT) == _planned(out).count(again) == 1
    assert (out / "cells" / SPLIT / "meta.json").is_file() and (out / "cells" / again / "meta.json").is_file()
    assert gate.load_run(out).verdict.cell(WARM).turns[1].triage.cls == "corrupted_state"
