"""Shard assignment (shadowlab/plan/shard.py) and device leases (isolation.py), without engines.

The assignment is checked on the case study's matrix: every cell in exactly one shard, every
identity comparison (warm vs cold, cold vs control, a chat cell and the warm run it splices)
inside one shard, balance within LPT's bound, the same split under another hash seed. Device
leases use declared fake device indices and the machine-wide lock directory; no GPU work starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shadowlab import cli, matrix, plan
from shadowlab.run import isolation
from shadowlab.plan import shard
from shadowlab.errors import MatrixError
from shadowlab.plan.shard import ShardSpec, ShardUsageError

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "matrices" / "ckpt.yaml"
CHAT = REPO / "matrices" / "chat.yaml"


def ckpt_plan(path: Path = CKPT) -> tuple[matrix.Matrix, plan.Plan]:
    m = matrix.load(path, check_files=False)
    return m, plan.build_plan(m)


# ---------------------------------------------------------------- which shard


@pytest.mark.parametrize(("text", "expected"), [("1/3", (1, 3)), ("3/3", (3, 3)), (" 2/ 4", (2, 4))])
def test_shard_spec_parses_one_based(text, expected):
    spec = ShardSpec.parse(text)
    assert (spec.index, spec.count) == expected and str(spec) == f"{expected[0]}/{expected[1]}"


@pytest.mark.parametrize(("text", "named"), [("0/3", "shard 0 of 3 does not exist"), ("4/3", "shard 4 of 3"),
                                             ("3", "expected I/N"), ("a/3", "'a' is not"), ("1/0", "count"),
                                             ("-1/3", "is not a non-negative")])
def test_a_shard_that_does_not_exist_is_refused(text, named):
    with pytest.raises(ShardUsageError, match=named):
        ShardSpec.parse(text)


@pytest.mark.parametrize(("source", "env", "count", "expected"), [
    ("k8s", {"JOB_COMPLETION_INDEX": "0", "SHADOWLAB_SHARD_COUNT": "3"}, None, (1, 3)),
    ("k8s", {"JOB_COMPLETION_INDEX": "2"}, 3, (3, 3)),
    ("gitlab", {"CI_NODE_INDEX": "1", "CI_NODE_TOTAL": "2"}, None, (1, 2)),
    ("github", {"SHADOWLAB_SHARD_INDEX": "1", "SHADOWLAB_SHARD_COUNT": "2"}, None, (2, 2)),
])
def test_the_shard_comes_from_the_ci_variables(source, env, count, expected):
    spec = ShardSpec.from_ci(source, env, count)
    assert (spec.index, spec.count) == expected


def test_a_missing_or_impossible_ci_variable_is_named():
    with pytest.raises(ShardUsageError, match=r"\$SHADOWLAB_SHARD_COUNT is not set"):
        ShardSpec.from_ci("k8s", {"JOB_COMPLETION_INDEX": "0"})
    with pytest.raises(ShardUsageError, match=r"JOB_COMPLETION_INDEX=3.*shard 4 of 3"):
        ShardSpec.from_ci("k8s", {"JOB_COMPLETION_INDEX": "3"}, 3)
    with pytest.raises(ShardUsageError, match=r"CI_NODE_INDEX=0.*shard 0 of 2"):
        ShardSpec.from_ci("gitlab", {"CI_NODE_INDEX": "0", "CI_NODE_TOTAL": "2"})


def test_cli_refuses_a_bad_shard_with_exit_2(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", str(CKPT), "--dry-run", "--shard", "5/3"])
    assert exc.value.code == 2 and "shard 5 of 3 does not exist" in capsys.readouterr().err
    monkeypatch.delenv("SHADOWLAB_SHARD_COUNT", raising=False)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    assert cli.main(["run", str(CKPT), "--dry-run", "--shard-from", "k8s"]) == 2
    assert "$SHADOWLAB_SHARD_COUNT is not set" in capsys.readouterr().err
    assert cli.main(["run", str(CKPT), "--dry-run", "--shard-from", "k8s", "--shard-count", "3"]) == 0
    assert "shard 2/3: " in capsys.readouterr().out


# ---------------------------------------------------------------- the assignment


def _same_shard_pairs(p: plan.Plan):
    """Every (cell, cell it is compared with or needs) of the plan."""
    for cell in p.cells:
        for turn in cell.turns:
            if turn.cold_cell:
                yield cell.id, turn.cold_cell
        for other in (cell.depends_on, cell.control_of):
            if other:
                yield cell.id, other


@pytest.mark.parametrize("count", [1, 2, 3, 5])
@pytest.mark.parametrize("path", [CKPT, CHAT], ids=["ckpt", "chat"])
def test_every_cell_in_one_shard_with_the_cells_it_is_compared_with(path, count):
    m, p = ckpt_plan(path)
    a = shard.assign(p, m, count)
    assert list(a.owners) == [c.id for c in p.cells]  # plan order, each cell once
    parts = [a.part(p, i).cells for i in range(1, count + 1)]
    assert sorted(c.id for part in parts for c in part) == sorted(c.id for c in p.cells)
    pairs = list(_same_shard_pairs(p))
    assert pairs, "the matrix has comparisons to keep together"
    for cell_id, other in pairs:
        assert a.owners[cell_id] == a.owners[other], (cell_id, other)


def test_shards_are_balanced_within_lpts_bound():
    m, p = ckpt_plan()
    units = shard.units(p)
    biggest = max(sum(shard.cell_cost(c, m) for c in u) for u in units)
    for count in (2, 3, 4):
        a = shard.assign(p, m, count)
        assert sum(a.costs) == sum(shard.cell_cost(c, m) for c in p.cells)
        # LPT: no shard exceeds the lightest by more than one unit (the one placed last on it).
        assert max(a.costs) - min(a.costs) <= biggest, a.costs
        assert all(len(a.cells_of(i)) > 0 for i in range(1, count + 1))


def test_a_cell_costs_its_prompt_tokens_and_a_start():
    m, p = ckpt_plan()
    warm = p.cell("reference.defaults.A-C")
    assert shard.cell_cost(warm, m) == shard.STARTUP_TOKENS + 4560 + 4947
    cold = p.cell("reference.defaults.cold.C")
    assert shard.cell_cost(cold, m) == shard.STARTUP_TOKENS + 4947


def test_more_shards_than_units_leaves_shards_empty_and_dry_run_says_so(capsys):
    m, p = ckpt_plan()
    count = len(shard.units(p)) + 2
    a = shard.assign(p, m, count)
    assert [i for i in range(1, count + 1) if not a.cells_of(i)] == [count - 1, count]
    assert cli.main(["run", str(CKPT), "--dry-run", "--shard", f"{count}/{count}"]) == 0
    out = capsys.readouterr().out
    assert f"shard {count}/{count}: 0 cells, cost 0 (empty: fewer units than shards)  <- this shard" in out


def test_the_split_is_the_same_under_another_hash_seed():
    """Deterministic: nothing depends on set or hash order, so every CI job computes one split."""
    code = ("import json; from shadowlab import matrix, plan; from shadowlab.plan import shard; "
            f"m = matrix.load({str(CKPT)!r}, check_files=False); "
            "print(json.dumps(dict(shard.assign(plan.build_plan(m), m, 3).owners)))")
    splits = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout for seed in ("1", "2")]
    assert splits[0] == splits[1]
    m, p = ckpt_plan()
    assert json.loads(splits[0]) == dict(shard.assign(p, m, 3).owners)


def test_dry_run_shows_which_shard_owns_each_cell(capsys):
    m, p = ckpt_plan()
    a = shard.assign(p, m, 3)
    assert cli.main(["run", str(CKPT), "--dry-run", "--shard", "2/3"]) == 0
    out = capsys.readouterr().out
    sections = out.split("\nshard ")[1:]
    assert [s.split(":")[0] for s in sections] == ["1/3", "2/3", "3/3"]
    for index, section in enumerate(sections, start=1):
        listed = [line.strip() for line in section.splitlines()[1:] if line.strip()]
        assert listed == list(a.cells_of(index))
    assert "<- this shard" in sections[1] and "<- this shard" not in sections[0] + sections[2]


def test_a_shard_record_from_another_machine_is_checked_field_by_field(tmp_path):
    m, p = ckpt_plan()
    a = shard.assign(p, m, 2)
    record = shard.record_for(ShardSpec(1, 2), a, p, m, b"yaml", {"reference": None})
    assert shard.ShardRecord.from_dict(json.loads(json.dumps(record.to_dict())), source="s") == record
    broken = {**record.to_dict(), "index": "1"}
    with pytest.raises(Exception, match="index: expected int"):
        shard.ShardRecord.from_dict(broken, source="s")
    with pytest.raises(Exception, match="shard_version 2"):
        shard.ShardRecord.from_dict({**record.to_dict(), "shard_version": 2}, source="s")


# ---------------------------------------------------------------- GPU devices on one host
# Fake device indices: nothing here starts GPU work; the leases are the machine-wide flocks.


def test_cells_lease_disjoint_devices_and_wait_when_all_are_held(monkeypatch):
    # Cores are not what runs out here (a 2-core machine would run out of them first).
    monkeypatch.setattr(isolation, "lease_cores", lambda count, candidates=None: isolation.CoreLease((0,)))
    a = isolation.lease_cell(1, 1, (6, 7))
    b = isolation.lease_cell(1, 1, (6, 7))
    try:
        assert {a.devices, b.devices} == {(6,), (7,)}
        with pytest.raises(isolation.LeaseUnavailable, match=r"fewer than 1 free GPU devices among \[6, 7\]"):
            isolation.lease_cell(1, 1, (6, 7))
        b.release()
        c = isolation.lease_cell(1, 1, (6, 7))  # b's device is free again
        assert c.devices == b.devices or c.devices == (7,)
        c.release()
    finally:
        a.release()
        b.release()


def test_a_cell_that_gets_no_device_gives_its_cores_back():
    held = isolation.lease_cell(1, 1, (5,))
    try:
        with pytest.raises(isolation.LeaseUnavailable):
            isolation.lease_cell(1, 1, (5,))
        # The refused lease released its core: every other core is still free.
        free = isolation.lease_cores(len(isolation.usable_cores()) - 1)
        assert not set(free.cores) & set(held.cores)
        free.release()
    finally:
        held.release()


def test_device_leases_are_shared_with_another_shadowlab_on_the_host(tmp_path):
    """Another process (any shadowlab, same lock directory) holding device 3 keeps it from us."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from shadowlab.run import isolation; "
         "lease = isolation.lease_cell(1, 1, (3,)); print(lease.devices, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "(3,)"
        with pytest.raises(isolation.LeaseUnavailable):
            isolation.lease_cell(1, 1, (3,))
        mine = isolation.lease_cell(1, 1, (3, 4))
        assert mine.devices == (4,)
        mine.release()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    again = isolation.lease_cell(1, 1, (3,))  # the kernel dropped the holder's flock with it
    assert again.devices == (3,)
    again.release()


def test_two_devices_per_cell_are_both_visible_to_the_engine():
    lease = isolation.lease_cell(1, 2, (1, 2, 8))
    try:
        assert lease.devices == (1, 2)
        assert isolation.gpu_env(lease.devices)["CUDA_VISIBLE_DEVICES"] == "1,2"
    finally:
        lease.release()
    assert isolation.gpu_env(None)["CUDA_VISIBLE_DEVICES"] == ""


def with_isolation(settings: dict) -> matrix.Matrix:
    """The case study's matrix with other isolation settings."""
    data = yaml.safe_load(CKPT.read_text())
    data["isolation"] = {**data.get("isolation", {}), **settings}
    return matrix.loads(yaml.safe_dump(data, sort_keys=False), file=str(CKPT), check_files=False)


def test_the_scheduler_never_gives_one_device_to_two_running_cells(monkeypatch, tmp_path):
    """jobs 3 over a pool of 2 fake devices: at most two cells at once, never on one device."""
    import threading
    from types import SimpleNamespace

    from shadowlab import run
    from shadowlab.results.records import CellStatus, RunLayout

    m = with_isolation({"jobs": 3, "gpu": [4, 9]})
    assert m.isolation.devices == (4, 9) and m.isolation.gpus_per_cell == 1
    in_use: dict[int, str] = {}
    seen: list[tuple[str, tuple[int, ...]]] = []
    lock = threading.Lock()

    class FakeRunner:
        def __init__(self, ctx, cell, cores):
            self.cell, self.cores = cell, cores

        def run(self):
            with lock:
                for device in self.cores.devices:
                    assert device not in in_use, f"{self.cell.id} got device {device} of {in_use[device]}"
                    in_use[device] = self.cell.id
                seen.append((self.cell.id, self.cores.devices))
            threading.Event().wait(0.02)
            with lock:
                for device in self.cores.devices:
                    del in_use[device]
            return CellStatus.OK

    monkeypatch.setattr(run.scheduler, "CellRunner", FakeRunner)
    monkeypatch.setattr(isolation, "lease_cores", lambda count, candidates=None: isolation.CoreLease((0,)))
    ctx = SimpleNamespace(options=SimpleNamespace(jobs=None, resume=False), isolation=m.isolation,
                          layout=RunLayout(tmp_path),
                          stop=threading.Event(), unavailable={}, say=lambda text: None,
                          device_request=(1, m.isolation.devices), stop_all=lambda: None)
    p = plan.build_plan(m)
    statuses = run.CellScheduler(ctx, p).run()
    assert set(statuses.values()) == {CellStatus.OK} and len(seen) == len(p.cells)
    assert {d for _, devices in seen for d in devices} == {4, 9}


def test_a_device_pool_in_the_matrix_is_checked():
    def load(isolation_yaml: str) -> matrix.Matrix:
        return with_isolation(yaml.safe_load(isolation_yaml))

    assert load("{gpu: [0, 2]}").isolation.devices == (0, 2)
    assert load("{gpu: 1}").isolation.devices == (1,)
    assert load("{}").isolation.devices is None
    for bad, message in (("{gpu: [0, 0]}", "distinct device indices"), ("{gpu: []}", "distinct device indices"),
                         ("{gpu: [0, -1]}", r"isolation.gpu\[1\]: expected an integer ≥ 0, got -1"),
                         ("{gpu: [0], gpus_per_cell: 2}", "2 devices per cell, but isolation.gpu names 1")):
        with pytest.raises(MatrixError, match=message):
            load(bad)
    resolved = load("{gpu: [0, 2], gpus_per_cell: 2}").to_dict()["isolation"]
    assert resolved["gpu"] == [0, 2] and resolved["gpus_per_cell"] == 2

