"""Records: meta.json round trip, versioning, atomic writes, generated documentation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowlab.results import files, records, rundir
from shadowlab.errors import RunDirError
from shadowlab.results.records import CellMeta, CellStatus, Completion, RunLayout, TurnRecord


def sample_meta() -> CellMeta:
    turn = TurnRecord(
        index=0, prompt_id="A", prompt_sha256="ab" * 32, prompt_tokens=3,
        prompt_token_ids=[1, 2, 3], messages=None, endpoint="/completion", http_status=200,
        error=None, timings={"cache_n": 0, "prompt_n": 3}, reused_tokens=0, processed_tokens=3,
        prefill_ms=1.5, ttft_ms=4.0, response_ms=4.1,
        completion=Completion(text="h\ufffdi", tokens=[104, 255, 105], sha256="00", stop_type="limit"),
        log_offsets=[0, 120], log_complete=True, task_ids=[0], response_file="responses/turn-0.json",
    )
    return CellMeta(
        schema_version=records.SCHEMA_VERSION, run_id="r1", cell_id="c1",
        cell={"kind": "warm", "engine": "reference"}, status=CellStatus.OK, reason=None,
        log_tail=None, command=["python", "-m", "shadowlab_engine"], env_delta={"X": "1"},
        scratch_dir="scratch", cores=records.Cores(1, [0], [0], 1),
        gpu=records.Gpu(None, {"CUDA_VISIBLE_DEVICES": ""}, "cpu", True), port=20001,
        port_attempts=1, pid=123, engine=None, started_at="2026-01-01T00:00:00Z",
        health_ms=100.0, startup_ms=120.0, elapsed_ms=500.0,
        stop=records.StopRecord("TERM", -15, 20.0, [], True), turns=[turn],
    )


def test_meta_round_trips_through_disk(tmp_path: Path):
    layout = RunLayout(tmp_path / "run")
    meta = sample_meta()
    path = records.write_meta(layout, meta)
    assert path == tmp_path / "run" / "cells" / "c1" / "meta.json"
    raw = json.loads(path.read_text())
    assert raw["status"] == "ok" and raw["schema_version"] == 3
    assert raw["turns"][0]["completion"]["text"] == "h\ufffdi"
    back = records.read_meta(path)
    assert back == meta
    assert back.status is CellStatus.OK


@pytest.mark.parametrize("cell,expected", [
    ({"kind": "warm", "sequence": "A-C", "turns": [{"index": 0, "conversation": "chat-1"}]}, "chat-1"),
    ({"kind": "warm", "sequence": "A-C", "turns": [{"index": 0}]}, "A-C"),  # plan.json before kinds
    ({"kind": "cold", "sequence": None, "turns": [{"index": 0, "conversation": None}]}, None),
    ({"kind": "warm", "engine": "reference"}, None),  # no planned sequence to derive it from
])
def test_a_schema_1_record_gets_each_turns_conversation_from_its_planned_cell(tmp_path: Path, cell, expected):
    path = records.write_meta(RunLayout(tmp_path), sample_meta())
    data = json.loads(path.read_text())
    assert data["turns"][0].pop("conversation", "absent") is None  # sample_meta sets none
    path.write_text(json.dumps({**data, "schema_version": 1, "cell": cell}))
    back = records.read_meta(path)
    assert back.schema_version == records.SCHEMA_VERSION == 3
    assert back.turns[0].conversation == expected


def test_newer_schema_is_refused(tmp_path: Path):
    layout = RunLayout(tmp_path)
    path = records.write_meta(layout, sample_meta())
    data = json.loads(path.read_text())
    data["schema_version"] = records.SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match="newer than this shadowlab"):
        records.read_meta(path)


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path: Path, monkeypatch):
    path = tmp_path / "x.json"
    records.write_json_atomic(path, {"v": 1})

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", boom)  # the atomic writer is files.py's
    with pytest.raises(KeyboardInterrupt):
        records.write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp file left


def test_docs_are_generated_from_the_schema(repo_root: Path):
    assert (repo_root / "docs" / "records.md").read_text() == records.schema_markdown(), (
        "docs/records.md is stale: python -m shadowlab.results.records > docs/records.md"
    )


def test_every_field_is_documented():
    import dataclasses

    for cls in (records.CellMeta, records.TurnRecord, records.Completion, records.Cores,
                records.Gpu, records.EngineRecord, records.StopRecord):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"


# -- reading is bounded, typed and refuses what is not a record (issue 9 items 2, 11) -----------


def test_wrong_field_types_are_refused_with_their_path(tmp_path: Path):
    layout = RunLayout(tmp_path)
    path = records.write_meta(layout, sample_meta())
    good = json.loads(path.read_text())
    for change, field in [
        (lambda d: d.update(status="done"), "status: the string 'done' is not one of ok"),
        (lambda d: d["turns"][0].update(prompt_tokens=True), "turns[0].prompt_tokens: expected an integer, got true"),
        (lambda d: d["turns"][0].update(prefill_ms="1"), "turns[0].prefill_ms: expected a number"),
        (lambda d: d["turns"][0]["completion"].update(text=5), "turns[0].completion.text: expected a string"),
        (lambda d: d["cores"].update(leased="0"), "cores.leased: expected a list"),
        (lambda d: d.update(env_delta={"X": 1}), "env_delta.X: expected a string"),
        (lambda d: d.pop("turns"), "turns: missing or null"),
        (lambda d: d.update(stop=[]), "stop: expected an object, got a list"),
        # the planned cell, free-form in the schema, in the shape its readers take
        (lambda d: d["cell"].update(turns=["x"]), "cell.turns[0]: expected an object, got the string 'x'"),
        (lambda d: d["cell"].update(turns={}), "cell.turns: expected a list, got an object"),
        (lambda d: d["cell"].update(turns=[{"index": "0"}]), "cell.turns[0].index: expected an integer"),
        (lambda d: d["cell"].update(engine=["ref"]), "cell.engine: expected a string, got a list"),
    ]:
        data = json.loads(json.dumps(good))
        change(data)
        path.write_text(json.dumps(data))
        with pytest.raises(RunDirError) as info:
            records.read_meta(path)
        assert field in str(info.value) and str(path) in str(info.value)
    path.write_text(json.dumps(good))
    assert records.read_meta(path) == sample_meta()  # the unchanged record still reads


def test_what_is_not_a_regular_file_is_refused_unread(tmp_path: Path):
    import os

    os.mkfifo(tmp_path / "fifo.json")  # opening it for reading would wait for a writer
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    for name, kind in (("fifo.json", "a FIFO"), ("dir.json", "a directory"), ("zero.json", "a character device")):
        with pytest.raises(RunDirError, match=f"not a regular file \\({kind}\\)"):
            records.read_json(tmp_path / name)
    with pytest.raises(RunDirError, match="missing"):
        records.read_json(tmp_path / "nothing.json")


def test_size_depth_and_strictness_are_bounded(tmp_path: Path):
    path = tmp_path / "x.json"
    path.write_text('{"a": [1, 2, 3]}')
    assert records.read_json(path, max_bytes=16) == {"a": [1, 2, 3]}
    with pytest.raises(RunDirError, match="17 bytes, more than the 16 bytes"):
        path.write_text('{"a": [1, 2, 3]} ')
        records.read_json(path, max_bytes=16)
    for depth in (records.MAX_JSON_DEPTH + 1, 200_000):  # below and above the parser's recursion
        path.write_text("[" * depth + "]" * depth)
        with pytest.raises(RunDirError, match="nested deeper than 100"):
            records.read_json(path)
    depth = records.MAX_JSON_DEPTH
    path.write_text("[" * depth + "]" * depth)
    assert records.json_depth(records.read_json(path)) == depth
    for text in ('{"a": NaN}', '[Infinity]', "\xff"):
        path.write_bytes(text.encode("latin-1"))
        with pytest.raises(RunDirError):
            records.read_json(path)


def test_a_record_must_live_in_the_directory_named_by_its_cell_id(tmp_path: Path):
    layout = RunLayout(tmp_path)
    meta = sample_meta()
    records.write_meta(layout, meta)
    assert list(rundir.read_cell_metas(tmp_path)) == ["c1"]
    path = layout.meta("c1")
    path.write_text(path.read_text().replace('"cell_id": "c1"', '"cell_id": "../c2"'))
    with pytest.raises(RunDirError, match="is not the name of its directory"):
        rundir.read_cell_metas(tmp_path)
    for bad in ("..", "a/b", "", "x" * 256):
        with pytest.raises(RunDirError, match="not a single directory name"):
            layout.cell_dir(bad)


def test_atomic_path_renames_on_success_and_cleans_up_on_failure(tmp_path: Path):
    target = tmp_path / "m.bin"
    with records.atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.exists() and not target.exists()
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError), records.atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["m.bin"]
    long = tmp_path / ("n" * 250)  # the temp name must fit NAME_MAX too
    records.write_bytes_atomic(long, b"x")
    assert long.read_bytes() == b"x"
