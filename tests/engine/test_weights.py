"""Seeded weights: reproducible bytes, self-describing files, generate-once cache."""
import threading

import pytest
import torch
from safetensors.torch import save_file

from shadowlab_engine.config import PRESETS, ModelConfig, preset
from shadowlab_engine.weights import ensure_model, read_config, sha256_file, write_model


def test_same_preset_and_seed_give_the_same_bytes(tmp_path):
    a = write_model("tiny", 0, tmp_path / "a.safetensors")
    b = write_model("tiny", 0, tmp_path / "b.safetensors")
    c = write_model("tiny", 1, tmp_path / "c.safetensors")
    assert sha256_file(a) == sha256_file(b)
    assert sha256_file(a) != sha256_file(c)


def test_config_travels_in_the_file_metadata(tmp_path):
    for name in PRESETS:
        cfg = preset(name)
        assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert read_config(write_model("tiny", 3, tmp_path / "t.safetensors")) == preset("tiny")


def test_a_file_without_config_is_refused(tmp_path):
    path = tmp_path / "foreign.safetensors"
    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="shadowlab_config"):
        read_config(path)
    with pytest.raises(ValueError, match="unknown model config keys"):
        ModelConfig.from_json('{"name": "x", "future_knob": 1}')
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


def test_ensure_model_generates_once_even_when_raced(tmp_path):
    paths: list = []
    threads = [threading.Thread(target=lambda: paths.append(ensure_model("tiny", 0, tmp_path))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and paths[0].name == "tiny-s0.safetensors"
    stamp = paths[0].stat().st_mtime_ns
    assert ensure_model("tiny", 0, tmp_path).stat().st_mtime_ns == stamp   # not rewritten
    assert sha256_file(paths[0]) == sha256_file(write_model("tiny", 0, tmp_path / "fresh.safetensors"))
    assert not list(tmp_path.glob(".*.tmp"))                                 # no temp files left


def test_ensure_model_replaces_a_stale_or_broken_cached_file(tmp_path):
    path = tmp_path / "tiny-s0.safetensors"
    save_file({"x": torch.zeros(2)}, str(path), metadata={"shadowlab_config": '{"name": "tiny", "old_knob": 1}'})
    assert read_config(ensure_model("tiny", 0, tmp_path)) == preset("tiny")
    path.write_bytes(b"truncated")
    assert read_config(ensure_model("tiny", 0, tmp_path)) == preset("tiny")


def test_script_writes_the_same_file(tmp_path):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "make_ref_model", Path(__file__).parents[2] / "scripts" / "make_ref_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "s.safetensors"
    assert script.main(["--preset", "tiny", "--seed", "0", "--out", str(out)]) == 0
    assert sha256_file(out) == sha256_file(write_model("tiny", 0, tmp_path / "w.safetensors"))
