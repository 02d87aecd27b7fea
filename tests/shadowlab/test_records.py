"""Records: meta.json round trip, versioning, atomic writes, generated documentation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowlab import records
from shadowlab.errors import RunDirError
from shadowlab.records import CellMeta, CellStatus, Completion, RunLayout, TurnRecord


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
    assert raw["status"] == "ok" and raw["schema_version"] == 1
    assert raw["turns"][0]["completion"]["text"] == "h\ufffdi"
    back = records.read_meta(path)
    assert back == meta
    assert back.status is CellStatus.OK


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

    monkeypatch.setattr(records.os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        records.write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp file left


def test_docs_are_generated_from_the_schema(repo_root: Path):
    assert (repo_root / "docs" / "records.md").read_text() == records.schema_markdown(), (
        "docs/records.md is stale: python -m shadowlab.records > docs/records.md"
    )


def test_every_field_is_documented():
    import dataclasses

    for cls in (records.CellMeta, records.TurnRecord, records.Completion, records.Cores,
                records.Gpu, records.EngineRecord, records.StopRecord):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"
