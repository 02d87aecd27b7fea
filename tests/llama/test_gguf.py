"""The generated qwen35 GGUF: deterministic, shaped like llama.cpp's loader expects, cached.

Read back with the PyPI `gguf` package's reader; the last test loads it in the real server.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from shadowlab.engines.llama_server import gguf_model  # noqa: E402


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _field(reader, key):
    f = reader.fields[key]
    if len(f.data) == 1:
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else value.tolist()[0]
    if f.types[-1] == gguf.GGUFValueType.STRING:
        return [bytes(f.parts[i]).decode() for i in f.data]
    return [f.parts[i].tolist()[0] for i in f.data]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return gguf_model.write_gguf("tiny", 0, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_same_seed_same_bytes_other_seed_other_bytes(tiny, tmp_path):
    again = gguf_model.write_gguf("tiny", 0, tmp_path / "again.gguf")
    other = gguf_model.write_gguf("tiny", 1, tmp_path / "other.gguf")
    assert _sha(again) == _sha(tiny)
    assert _sha(other) != _sha(tiny)


def test_hybrid_layer_mix_three_delta_net_layers_per_attention_layer(tiny):
    reader = gguf.GGUFReader(tiny)
    assert _field(reader, "general.architecture") == "qwen35"
    assert _field(reader, "qwen35.block_count") == 8
    assert _field(reader, "qwen35.embedding_length") == 128
    assert _field(reader, "qwen35.full_attention_interval") == 4
    names = {t.name for t in reader.tensors}
    attention = [il for il in range(8) if f"blk.{il}.attn_q.weight" in names]
    delta_net = [il for il in range(8) if f"blk.{il}.ssm_conv1d.weight" in names]
    assert attention == [3, 7]
    assert delta_net == [0, 1, 2, 4, 5, 6]
    assert not any(f"blk.{il}.ssm_a" in names for il in attention)


def test_tensor_shapes_follow_llama_cpp_qwen35(tiny):
    p = gguf_model.preset("tiny")
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in gguf.GGUFReader(tiny).tensors}  # ggml ne order
    key_dim, value_dim = p.ssm_d_state * p.ssm_n_group, p.ssm_d_inner
    assert shapes["blk.0.attn_qkv.weight"] == (p.n_embd, 2 * key_dim + value_dim)
    assert shapes["blk.0.ssm_conv1d.weight"] == (p.ssm_d_conv, 2 * key_dim + value_dim)
    assert shapes["blk.0.ssm_out.weight"] == (value_dim, p.n_embd)
    assert shapes["blk.0.ssm_a"] == (p.ssm_dt_rank,)
    assert shapes["blk.3.attn_q.weight"] == (p.n_embd, 2 * p.head_dim * p.n_head)  # query + gate
    assert shapes["blk.3.attn_k.weight"] == (p.n_embd, p.head_dim * p.n_head_kv)
    assert shapes["token_embd.weight"] == (p.n_embd, 269)


def test_decay_is_negative_so_the_recurrent_state_forgets(tiny):
    tensors = {t.name: t for t in gguf.GGUFReader(tiny).tensors}
    assert np.all(np.asarray(tensors["blk.0.ssm_a"].data) < 0)


def test_byte_level_vocab_with_chatml_specials(tiny):
    reader = gguf.GGUFReader(tiny)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    b2u = gguf_model.byte_to_unicode()
    assert len(tokens) == 269 and len(set(tokens)) == 269
    assert tokens[:256] == [b2u[b] for b in range(256)], "token id = byte value"
    assert tokens[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.eos_token_id") == gguf_model.special_token_id("<|im_end|>")
    template = _field(reader, "tokenizer.chat_template")
    assert "<|im_start|>" in template and "add_generation_prompt" in template


def test_ensure_gguf_generates_once_under_a_lock(tmp_path):
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(gguf_model.ensure_gguf("tiny", 3, tmp_path)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1
    path = paths[0]
    mtime = path.stat().st_mtime_ns
    assert gguf_model.ensure_gguf("tiny", 3, tmp_path) == path
    assert path.stat().st_mtime_ns == mtime, "a cached model is not rewritten"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    with pytest.raises(ValueError, match="unknown GGUF preset"):
        gguf_model.ensure_gguf("huge", 0, tmp_path)


@pytest.mark.llama
def test_llama_server_loads_and_tokenizes_it(llama):
    with llama(["-cram", "0"]) as server:
        props = server.client.get("/props").json()
        assert props["total_slots"] == 1 and props["eos_token"] == "<|im_end|>"
        assert server.tokenize("hi\n") == [ord("h"), ord("i"), ord("\n")]
        assert server.tokenize("<|im_start|>user") == [gguf_model.special_token_id("<|im_start|>"),
                                                         ord("u"), ord("s"), 256 + gguf_model.MERGES.index("e r")]
        log = server.log_text()
    assert "arch                  = qwen35" in log
    assert "llama_memory_recurrent:" in log, "the recurrent layers get a recurrent-state memory"
