"""`shadowlab run matrices/ckpt.yaml` against a stored verdicts.json, and the run directory read
once (issue 10).

One real run of the case study (24 cells on the reference engine, ~30 s) is shared by every test
here (module fixture). Its verdicts.json must equal ``tests/fixtures/runs/ckpt-verdicts/
verdicts.json`` (written by shadowlab before the restructuring of issue 10) once both sides went
through ``normalize``, which drops only what differs from run to run: the run id and the times
(every ``*_ms`` field). A test shows the comparison still catches a changed outcome or completion.

Regenerate the stored copy (only when a verdict is meant to change, and say why in the commit):
``python tests/shadowlab/test_restructure_equivalence.py RUN_DIR``.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "tests" / "fixtures" / "runs" / "ckpt-verdicts" / "verdicts.json"
PER_RUN_KEYS = frozenset({"run_id"})  # besides every key ending in _ms (timings)


def normalize(obj: Any) -> Any:
    """``obj`` without the values that differ between two runs of the same matrix."""
    if isinstance(obj, dict):
        return {k: normalize(v) for k, v in obj.items() if k not in PER_RUN_KEYS and not k.endswith("_ms")}
    if isinstance(obj, list):
        return [normalize(v) for v in obj]
    return obj


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{where}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}.{key}: only on one side"
            found = _first_difference(a[key], b[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def ckpt_run(tmp_path_factory: pytest.TempPathFactory):
    """(run directory, exit code, verdicts.compute calls) of `shadowlab run matrices/ckpt.yaml`,
    run in this process through the CLI so that the computations can be counted."""
    from shadowlab import cli
    from shadowlab.judge import verdicts

    out = tmp_path_factory.mktemp("ckpt") / "run"
    real = verdicts.compute
    calls: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(verdicts, "compute", counted)
    mp.chdir(REPO)
    try:
        code = cli.main(["run", "matrices/ckpt.yaml", "--out", str(out)])
    finally:
        mp.undo()
    return out, code, calls


def _stored() -> dict[str, Any]:
    return json.loads(STORED.read_text(encoding="utf-8"))


def test_ckpt_writes_the_stored_verdicts_apart_from_timings(ckpt_run):
    out, code, _ = ckpt_run
    assert code == 0
    fresh = normalize(json.loads((out / "verdicts.json").read_text(encoding="utf-8")))
    assert _first_difference(fresh, _stored()) is None
    assert fresh == _stored()


@pytest.mark.parametrize("change", ["outcome", "completion", "checkpoint", "note"])
def test_the_comparison_fails_on_a_changed_verdict(ckpt_run, change):
    # The normalizer must not hide real fields: change one and the comparison fails.
    out, _, _ = ckpt_run
    fresh = json.loads((out / "verdicts.json").read_text(encoding="utf-8"))
    changed = copy.deepcopy(fresh)
    turn = changed["cells"][0]["turns"][1]
    if change == "outcome":
        turn["outcome"] = "restored" if turn["outcome"] != "restored" else "forced"
    elif change == "completion":
        turn["identity"]["text"] += "x"
    elif change == "checkpoint":
        turn["alive_at_start"][0]["n_tokens"] += 1
    else:
        turn["notes"] = [*turn["notes"], "a note"]
    assert normalize(fresh) == _stored()
    assert normalize(changed) != _stored()


def test_the_normalizer_drops_only_run_ids_and_times():
    stored = _stored()
    assert "run_id" not in stored
    kept = Counter()

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            kept.update(obj.keys())
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(stored)
    assert not [k for k in kept if k.endswith("_ms")]
    for field in ("outcome", "divergence_point", "re_entry_point", "reused_tokens", "alive_at_start",
                  "cascade_missed", "identity", "text", "tokens", "n_tokens", "size_mib", "line"):
        assert kept[field] > 0, field


def test_run_computes_the_verdicts_once(ckpt_run):
    _, code, calls = ckpt_run
    assert code == 0
    assert len(calls) == 1


def test_verdicts_json_reads_back_whole_through_the_records_codec(ckpt_run):
    # verdicts.json is written and read by records' one JSON dataclass codec.
    from shadowlab.judge import verdicts

    out, _, _ = ckpt_run
    data = json.loads((out / "verdicts.json").read_text(encoding="utf-8"))
    back = verdicts.read(out)
    assert back.to_dict() == data
    assert back.cells[0].turns[1].alive_at_start[0].n_tokens == data["cells"][0]["turns"][1]["alive_at_start"][0]["n_tokens"]
    broken = copy.deepcopy(data)
    broken["cells"][0]["turns"][1]["outcome"] = "teleported"
    with pytest.raises(ValueError):
        verdicts.RunVerdict.from_dict(broken)


@pytest.mark.parametrize("command", ["report", "gate"])
def test_report_and_gate_read_the_run_directory_once(ckpt_run, command, monkeypatch):
    """Every file a command reads is read once: one load of the directory, one verdicts.compute,
    each JSON record, the matrix and each engine.log once."""
    from shadowlab import cli
    from shadowlab.logs import parse as logparse
    from shadowlab.results import files, rundir
    from shadowlab.judge import verdicts

    out, _, _ = ckpt_run
    reads: Counter[str] = Counter()

    def counting(module: Any, name: str, key: Any = lambda *a, **k: str(a[0]) if a else name) -> None:
        real = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reads[f"{name}:{key(*args, **kwargs)}"] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(files, "read_json")
    counting(rundir, "load_matrix")
    counting(logparse, "parse")
    counting(rundir, "load", key=lambda *a, **k: "run")
    counting(verdicts, "compute", key=lambda *a, **k: "run")
    assert cli.main([command, str(out)]) == 0
    assert reads["load:run"] == 1 and reads["compute:run"] == 1
    assert reads[f"load_matrix:{out / 'matrix.yaml'}"] == 1
    metas = sorted(str(p) for p in out.glob("cells/*/meta.json"))
    logs = sorted(str(p) for p in out.glob("cells/*/engine.log"))
    assert len(metas) == len(logs) == 24
    for path in [*metas, str(out / "plan.json"), str(out / "environment.json"), str(out / "prompts" / "reference.json")]:
        assert reads[f"read_json:{path}"] == 1, path
    for path in logs:
        assert reads[f"parse:{path}"] == 1, path
    assert max(reads.values()) == 1, [k for k, n in reads.items() if n > 1]


if __name__ == "__main__":  # regenerate the stored copy from a run directory
    data = json.loads((Path(sys.argv[1]) / "verdicts.json").read_text(encoding="utf-8"))
    STORED.parent.mkdir(parents=True, exist_ok=True)
    STORED.write_text(json.dumps(normalize(data), indent=1, sort_keys=True) + "\n", encoding="utf-8")
