"""A matrix run whole and as 3 shards merged (shadowlab/results/merge.py), on the real reference engine.

One module fixture runs a 9-cell matrix (3 configurations × A→C, each with its cold and control
cell: three units) as three `shadowlab run --shard I/3` processes at once, sharing this session's
lock directory like three CI jobs on one host, then whole. The merged parts must give the whole
run's verdicts, gate and report apart from per-run values (run id, times, ports); a missing,
duplicated, foreign (other matrix, other engine build) or unfinished part is refused by name; a
shard killed half-way is finished with --resume and merges cleanly. The shipped CI workflow and
Kubernetes manifest are checked in test_ci_examples.py.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shadowlab import cli
from shadowlab.results import records, rundir
from shadowlab.results.records import CellStatus

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
import test_run  # noqa: E402
from test_restructure_equivalence import _first_difference, normalize  # noqa: E402

THREE = "  defaults: {}\n  policy0: {env: {PXA_CKPT_PROMPT_POLICY: 0}}\n  prompt_end: {env: {PXA_CKPT_PROMPT_END: 1}}"


def write_matrix(path: Path, name: str = "shards", configurations: str = THREE, control: bool = True) -> Path:
    """test_run's small matrix: A (120 tokens) then C (diverges at 70), per configuration."""
    return test_run.write_matrix(path, name=name, configurations=configurations, control=control)


def shadowlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "shadowlab", *args]


def engines_of(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        try:
            if "shadowlab_engine" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"matrix", "parts": [p1, p2, p3], "whole", "samples": live engine cores sampled}."""
    root = tmp_path_factory.mktemp("shards")
    m = write_matrix(root / "m.yaml")
    parts = [root / f"part-{i}" for i in (1, 2, 3)]
    procs = [subprocess.Popen(shadowlab("run", str(m), "--shard", f"{i}/3", "--out", str(p), "--no-report"),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, p in enumerate(parts, start=1)]
    samples: list[list[tuple[int, int]]] = []  # per sample: (shard, core) of every live engine
    try:
        while any(p.poll() is None for p in procs):
            cores: list[tuple[int, int]] = []
            for index, proc in enumerate(procs, start=1):
                for engine in engines_of(proc.pid):
                    try:
                        cores += [(index, core) for core in engine.cpu_affinity()]
                    except psutil.NoSuchProcess:
                        continue
            samples.append(cores)
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        outputs = [proc.communicate() for proc in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    whole = root / "whole"
    done = subprocess.run(shadowlab("run", str(m), "--out", str(whole)), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return {"root": root, "matrix": m, "parts": parts, "whole": whole, "samples": samples}


def merge(parts, out: Path, capsys) -> tuple[int, str]:
    code = cli.main(["merge", *map(str, parts), "--out", str(out)])
    return code, capsys.readouterr().err


def judged(run_dir: Path, capsys) -> tuple[int, dict, str]:
    assert cli.main(["report", str(run_dir)]) == 0
    code = cli.main(["gate", str(run_dir)])
    capsys.readouterr()
    verdicts = json.loads((run_dir / "verdicts.json").read_text()) if (run_dir / "verdicts.json").exists() \
        else None
    return code, verdicts, (run_dir / "report.md").read_text()


def per_run_values_hidden(report_md: str, run_dir: Path) -> str:
    """report.md without what differs between two runs of one matrix: run id, ports, times."""
    text = report_md.replace(run_dir.name, "RUN").replace(str(run_dir), "RUN")
    text = re.sub(r"--port \d+", "--port N", text)
    # The shadowlab commit the footer names: the tree may get a commit between two runs here.
    text = re.sub(r" @ [0-9a-f]{12}", " @ COMMIT", text)
    return re.sub(r"\d+(\.\d+)? ms", "T ms", text)


def verdicts_of(run_dir: Path) -> dict:
    from shadowlab.judge import verdicts

    return records.to_jsonable(verdicts.compute(rundir.load(run_dir)))


@pytest.mark.slow
def test_three_shards_merged_equal_the_whole_run(runs, tmp_path, capsys):
    merged = tmp_path / "merged"
    code, err = merge(runs["parts"], merged, capsys)
    assert code == 0, err
    assert "merged 3 parts (9 cells)" in err
    whole = runs["whole"]
    for name in ("plan.json", "matrix.yaml", "options.json"):  # byte-equal records
        assert (merged / name).read_bytes() == (whole / name).read_bytes(), name
    assert {m.run_id for m in rundir.read_cell_metas(merged).values()} == {"merged"}
    a, b = normalize(verdicts_of(whole)), normalize(verdicts_of(merged))
    assert a == b, _first_difference(a, b)
    (w_code, _, w_md), (m_code, _, m_md) = judged(whole, capsys), judged(merged, capsys)
    assert w_code == m_code == 0
    assert per_run_values_hidden(m_md, merged) == per_run_values_hidden(w_md, whole)
    owners = json.loads((runs["parts"][0] / "shard.json").read_text())["owners"]
    merge_json = json.loads((merged / rundir.MERGE_NAME).read_text())
    assert [p["index"] for p in merge_json["parts"]] == [1, 2, 3]
    assert sorted(c for p in merge_json["parts"] for c in p["cells"]) == sorted(owners)


@pytest.mark.slow
def test_a_changed_turn_in_a_part_shows_in_the_merged_verdicts(runs, tmp_path, capsys):
    """The equality above can fail: a part whose warm turn answered differently merges into
    verdicts that differ from the whole run's (identity mismatch vs its cold cell)."""
    merged = tmp_path / "merged"
    assert merge(runs["parts"], merged, capsys)[0] == 0
    meta_path = next(merged.glob("cells/*.A-C/meta.json"))
    meta = records.read_meta(meta_path)
    meta.turns[1].completion.tokens[0] += 1
    records.write_json_atomic(meta_path, meta)
    assert normalize(verdicts_of(merged)) != normalize(verdicts_of(runs["whole"]))
    assert cli.main(["gate", str(merged)]) == 1
    capsys.readouterr()


@pytest.mark.slow
def test_three_shards_at_once_ran_on_disjoint_cores(runs):
    """Sampled from the live engines while the three shard processes ran: engines of different
    shards at once, never two on one core (each pinned to the cores its shadowlab leased)."""
    samples = runs["samples"]
    assert any(len({shard for shard, _ in s}) >= 2 for s in samples), "the shards never ran engines at once"
    for sample in samples:
        cores = [core for _, core in sample]
        assert len(cores) == len(set(cores)), f"engines of two shards share a core: {sample}"
    for part in runs["parts"]:
        for meta in rundir.read_cell_metas(part).values():
            assert meta.cores.observed_affinity == meta.cores.leased, meta.cell_id


@pytest.mark.slow
def test_a_missing_shard_is_refused_naming_its_cells(runs, tmp_path, capsys):
    p1, p2, p3 = runs["parts"]
    code, err = merge([p1, p3], tmp_path / "out", capsys)
    owed = [c for c, i in json.loads((p1 / "shard.json").read_text())["owners"].items() if i == 2]
    assert code == 2 and "missing shards: shard 2/3 (cells: " + ", ".join(owed) + ")" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_duplicated_shard_is_refused_naming_both(runs, tmp_path, capsys):
    p1, p2, p3 = runs["parts"]
    code, err = merge([p1, p2, p2, p3], tmp_path / "out", capsys)
    assert code == 2 and f"duplicate shard 2/3: {p2} and {p2}" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_shard_of_another_matrix_is_refused(runs, tmp_path, capsys):
    other = write_matrix(tmp_path / "other.yaml", name="other", configurations="  defaults: {}", control=False)
    part = tmp_path / "other-part"
    done = subprocess.run(shadowlab("run", str(other), "--shard", "2/3", "--out", str(part), "--no-report"),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    p1, _, p3 = runs["parts"]
    code, err = merge([p1, part, p3], tmp_path / "out", capsys)
    assert code == 2 and f"foreign shard: {part} (shard 2/3) is a part of matrix 'other'" in err, err
    assert "the first of matrix 'shards'" in err


@pytest.mark.slow
def test_a_shard_of_another_engine_build_is_refused(runs, tmp_path, capsys, monkeypatch):
    """Shard 2 really run by another reference-engine build (its package hash differs)."""
    from shadowlab.engines import reference

    monkeypatch.setattr(reference, "package_sha256", lambda path: "b" * 64)
    part = tmp_path / "other-build"
    assert cli.main(["run", str(runs["matrix"]), "--shard", "2/3", "--out", str(part), "--no-report"]) == 0
    capsys.readouterr()
    p1, _, p3 = runs["parts"]
    code, err = merge([p1, part, p3], tmp_path / "out", capsys)
    assert code == 2 and f"foreign shard: {part} (shard 2/3) ran engine 'reference' binary bbbbbbbbbbbb" in err
    assert "(another engine build)" in err


@pytest.mark.slow
def test_a_part_whose_matrix_copy_was_edited_is_refused(runs, tmp_path, capsys):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(runs["parts"][1], edited)
    (edited / "matrix.yaml").write_text((edited / "matrix.yaml").read_text() + "\n")
    code, err = merge([runs["parts"][0], edited, runs["parts"][2]], tmp_path / "out", capsys)
    assert code == 2 and "matrix.yaml does not hash to the matrix_sha256" in err and str(edited) in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_shard_killed_half_way_is_resumed_and_merges(runs, tmp_path, capsys, sig):
    p1, _, p3 = runs["parts"]
    part = tmp_path / "part-2"
    args = ("run", str(runs["matrix"]), "--shard", "2/3", "--out", str(part), "--no-report")
    proc = subprocess.Popen(shadowlab(*args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engines: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not list(part.glob("cells/*/meta.json")) or not engines_of(proc.pid):
            assert time.monotonic() < deadline and proc.poll() is None, "the shard never got half-way"
            time.sleep(0.05)
        engines = engines_of(proc.pid)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    recorded = {m.cell_id: m.status for m in rundir.read_cell_metas(part).values()}
    assert recorded and len(recorded) < 3 or CellStatus.ABORTED in recorded.values(), recorded
    code, err = merge([p1, part, p3], tmp_path / "early", capsys)
    assert code == 2 and "(shard 2/3) did not finish: cells it owes are" in err and "--resume" in err, err

    again = subprocess.run(shadowlab(*args, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert not [e.pid for e in engines if e.is_running() and e.status() != psutil.STATUS_ZOMBIE]
    merged = tmp_path / "merged"
    code, err = merge([p1, part, p3], merged, capsys)
    assert code == 0, err
    a, b = normalize(verdicts_of(runs["whole"])), normalize(verdicts_of(merged))
    assert a == b, _first_difference(a, b)


@pytest.mark.slow
def test_resume_of_a_part_must_repeat_its_shard(runs, tmp_path, capsys):
    import shutil

    part = tmp_path / "part"
    shutil.copytree(runs["parts"][0], part)
    code = cli.main(["run", str(runs["matrix"]), "--out", str(part), "--resume", "--no-report"])
    assert code == 2 and "--shard 1/3 then, not given now" in capsys.readouterr().err

