"""Other hybrid and recurrent architectures in the real llama-server b11434.

shadowlab's checkpoint questions are not specific to Qwen3.5's 3:1 gated-delta-net/attention
mix. `shadowlab/engines/llama_server/gguf_model.py` also writes seeded-random models of four other architectures
of the same build, each with a different recurrent mechanism and ratio:

| arch            | recurrent layers                   | attention layers | state per checkpoint |
|-----------------|------------------------------------|------------------|----------------------|
| `lfm2`          | 5 gated short convs (3 taps)       | 3 of 8           | conv only (0.005 MiB)|
| `granitehybrid` | 7 Mamba-2 selective scans          | 1 of 8           | conv + SSM (0.245)   |
| `jamba`         | 7 Mamba-1 selective scans          | 1 of 8           | conv + SSM (0.065)   |
| `mamba2`        | 6 Mamba-2 selective scans          | none             | conv + SSM (0.210)   |

What the build does for each (read from `tools/server/server-context.cpp`, asserted here): the
memory of all four cannot be partially removed, so the server checkpoints exactly as it does
for qwen35 — the placement does not depend on the architecture:

- a raw token prompt gets the two tail checkpoints at L−4−n_ubatch and L−4;
- A→C (C shares A's first 600 of 1,200 tokens) finds no checkpoint below the divergence point:
  forced full re-processing, and the cascade erases both of A's checkpoints;
- `/completion` with `message_delimiters` (and chat) checkpoints at user-message starts, so the
  same A→C edit restores the last user start below the divergence point — even an LFM2 whose
  short-conv state is only the last two inputs cannot be rewound without one;
- `-cram 8192` saves the slot's recurrent state with its checkpoints and rescues A→B→A;
- where a checkpoint was restored, the warm completion equals a fresh server's, token for token.

Same prompt shapes as `test_llama_server.py` (a quarter of the case study's lengths), `-t 1`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from shadowlab.engines.llama_server import gguf_model

from .conftest import L_A, L_C, USER_DELIMITERS, LlamaServer, kinds

ARCHS = ("lfm2", "granitehybrid", "jamba", "mamba2")
UB = 512
# attention layers per arch (preset `tiny`) and the KV cache line llama.cpp prints for them
ATTENTION = {"lfm2": [2, 5, 7], "granitehybrid": [5], "jamba": [4], "mamba2": []}

try:
    import gguf
except ImportError:  # in the [test] and [llama] extras: CI has it, and must not skip these
    if os.environ.get("CI"):
        raise
    pytest.skip("the gguf package is not installed", allow_module_level=True)


def _ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _reuse(body: dict) -> tuple[int, int]:
    return body["timings"]["cache_n"], body["timings"]["prompt_n"]


# ------------------------------------------------------------------ the files themselves


def test_each_arch_is_deterministic_and_distinct(tmp_path):
    shas = {}
    for arch in ARCHS:
        first = gguf_model.write_gguf("tiny", 0, tmp_path / f"{arch}-a.gguf", arch=arch)
        again = gguf_model.write_gguf(f"{arch}-tiny", 0, tmp_path / f"{arch}-b.gguf")  # the qualified name
        other = gguf_model.write_gguf("tiny", 1, tmp_path / f"{arch}-c.gguf", arch=arch)
        sha = hashlib.sha256(first.read_bytes()).hexdigest()
        assert hashlib.sha256(again.read_bytes()).hexdigest() == sha, arch
        assert hashlib.sha256(other.read_bytes()).hexdigest() != sha, arch
        shas[arch] = sha
    assert len(set(shas.values())) == len(ARCHS)


def test_qualified_names_and_arch_argument_agree(tmp_path):
    assert gguf_model.resolve("tiny") == ("qwen35", "tiny")
    assert gguf_model.resolve("lfm2-tiny") == ("lfm2", "tiny")
    assert gguf_model.resolve("tiny", "granitehybrid") == ("granitehybrid", "tiny")
    assert gguf_model.gguf_filename("tiny", 0) == "qwen35-tiny-s0.gguf"
    assert gguf_model.gguf_filename("mamba2-tiny", 2) == gguf_model.gguf_filename("tiny", 2, "mamba2")
    path = gguf_model.ensure_gguf("tiny", 0, tmp_path, arch="lfm2")
    assert gguf_model.ensure_gguf("lfm2-tiny", 0, tmp_path) == path
    assert "lfm2-tiny" in gguf_model.preset_names() and "tiny" in gguf_model.preset_names()
    with pytest.raises(ValueError, match="unknown GGUF preset"):
        gguf_model.ensure_gguf("lfm2-huge", 0, tmp_path)
    with pytest.raises(ValueError, match="unknown GGUF architecture"):
        gguf_model.ensure_gguf("tiny", 0, tmp_path, arch="rwkv9")


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_mix_and_shapes_follow_llama_cpp(arch, tmp_path):
    p = gguf_model.preset("tiny", arch)
    reader = gguf.GGUFReader(gguf_model.write_gguf("tiny", 0, tmp_path / "m.gguf", arch=arch))
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == arch
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}  # ggml ne order
    attention = [il for il in range(p.n_layer) if f"blk.{il}.attn_q.weight" in shapes]
    assert attention == ATTENTION[arch]
    if attention:  # a layer is recurrent iff its head_count_kv is 0 (lfm2, granitehybrid)
        kv = [int(fields[f"{arch}.attention.head_count_kv"].parts[i][0])
              for i in fields[f"{arch}.attention.head_count_kv"].data]
        assert [il for il, n in enumerate(kv) if n > 0] == attention
    recurrent = [il for il in range(p.n_layer) if il not in attention]
    il = recurrent[0]
    if arch == "lfm2":
        assert shapes[f"blk.{il}.shortconv.conv.weight"] == (p.shortconv_l_cache, p.n_embd)
        assert shapes[f"blk.{il}.shortconv.in_proj.weight"] == (p.n_embd, 3 * p.n_embd)
        assert "token_embd_norm.weight" in shapes and "output_norm.weight" not in shapes
    elif arch == "jamba":  # Mamba-1: a per-channel A and a low-rank dt projection
        assert shapes[f"blk.{il}.ssm_in.weight"] == (p.n_embd, 2 * p.ssm_d_inner)
        assert shapes[f"blk.{il}.ssm_x.weight"] == (p.ssm_d_inner, p.ssm_dt_rank + 2 * p.ssm_d_state)
        assert shapes[f"blk.{il}.ssm_dt.weight"] == (p.ssm_dt_rank, p.ssm_d_inner)
        assert shapes[f"blk.{il}.ssm_a"] == (p.ssm_d_state, p.ssm_d_inner)
        a = next(t for t in reader.tensors if t.name == f"blk.{il}.ssm_a")
        assert (a.data < 0).all(), "A < 0: the state decays"
    else:
        conv_dim = p.ssm_d_inner + 2 * p.ssm_n_group * p.ssm_d_state
        assert shapes[f"blk.{il}.ssm_in.weight"] == (p.n_embd, p.ssm_d_inner + conv_dim + p.ssm_n_head)
        assert shapes[f"blk.{il}.ssm_conv1d.weight"] == (p.ssm_d_conv, conv_dim)
        assert shapes[f"blk.{il}.ssm_a"] == (1, p.ssm_n_head)
        assert shapes[f"blk.{il}.ssm_norm.weight"] == (p.ssm_d_inner // p.ssm_n_group, p.ssm_n_group)
        a = next(t for t in reader.tensors if t.name == f"blk.{il}.ssm_a")
        assert (a.data < 0).all(), "A < 0: the state decays"


# ------------------------------------------------------------------ the real server


@pytest.fixture
def arch_server(llama_binary: Path, model_cache: Path, tmp_path: Path):
    count = iter(range(1000))

    def start(arch: str, flags=()) -> LlamaServer:
        model = gguf_model.ensure_gguf("tiny", 0, model_cache, arch=arch)
        return LlamaServer(llama_binary, model, tmp_path / f"{arch}-{next(count)}.log", flags)

    return start


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_loads_with_its_recurrent_memory(arch_server, arch):
    with arch_server(arch, ["-cram", "0"]) as server:
        assert server.tokenize("hi") == [ord("h"), ord("i")]
        log = server.log_text()
    assert f"arch                  = {arch}" in log
    assert "llama_memory_recurrent: size" in log
    n_attn = len(ATTENTION[arch])
    if n_attn:
        assert f"cells, {n_attn:3d} layers" in log, "one KV cache layer per attention layer"
    else:
        assert "llama_kv_cache: size" not in log, "pure Mamba-2: no attention KV at all"


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_raw_a_then_c_tail_checkpoints_and_forced(arch_server, prompts, arch):
    with arch_server(arch, ["-cram", "0"]) as server:
        a = _ok(server.complete(prompts["A"]))
        created = kinds(server.turn_events(), "created")
        c = _ok(server.complete(prompts["C"]))
        events = server.turn_events()
    assert _reuse(a) == (0, L_A)
    assert [e.n_tokens for e in created] == [L_A - 4 - UB, L_A - 4]
    assert [e.pos_max for e in created] == [L_A - 5 - UB, L_A - 5]
    assert all(e.size_mib > 0 for e in created)
    # C diverges at 600, below both of A's checkpoints: forced, and the cascade takes both.
    assert _reuse(c) == (0, L_C)
    assert kinds(events, "forced") and not kinds(events, "restored")
    assert sorted(e.n_tokens for e in kinds(events, "erased_invalidated")) == [L_A - 4 - UB, L_A - 4]
    assert [e.n_tokens for e in kinds(events, "created")] == [L_C - 4 - UB, L_C - 4]


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_tail_placement_follows_the_ubatch(arch_server, prompts, arch):
    with arch_server(arch, ["-cram", "0", "-ub", "256"]) as server:
        _ok(server.complete(prompts["A"], n_predict=1))
        created = kinds(server.turn_events(), "created")
    assert [e.n_tokens for e in created] == [L_A - 4 - 256, L_A - 4]


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_cram_saves_and_restores_the_recurrent_state_a_b_a(arch_server, prompts, arch):
    """-cram 8192 saves A's slot (recurrent state + checkpoints) when B evicts it and loads it
    back for A again: the L−4 checkpoint is restored, as for qwen35. -cram 0 cannot."""
    with arch_server(arch, ["-cram", "8192"]) as server:
        for name in ("A", "B"):
            _ok(server.complete(prompts[name], n_predict=1))
        again = _ok(server.complete(prompts["A"], n_predict=1))
        restored = kinds(server.turn_events(), "restored")
    assert _reuse(again) == (L_A - 4, 4)
    assert [r.n_tokens for r in restored] == [L_A - 4]
    with arch_server(arch, ["-cram", "0"]) as server:
        for name in ("A", "B"):
            _ok(server.complete(prompts[name], n_predict=1))
        assert _reuse(_ok(server.complete(prompts["A"], n_predict=1))) == (0, L_A)


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_append_restores_the_tail_checkpoint_and_equals_cold(arch_server, prompts, arch):
    """A, then A + 200 tokens: the L−4 checkpoint is below the divergence point (1,200)."""
    longer = prompts["A"] + prompts["C"][-200:]
    with arch_server(arch, ["-cram", "0"]) as server:
        _ok(server.complete(prompts["A"]))
        warm = _ok(server.complete(longer, n_predict=16))
        restored = kinds(server.turn_events(), "restored")
    with arch_server(arch, ["-cram", "0"]) as server:
        cold = _ok(server.complete(longer, n_predict=16))
    assert [r.n_tokens for r in restored] == [L_A - 4]
    assert _reuse(warm) == (L_A - 4, len(longer) - (L_A - 4)) and _reuse(cold)[0] == 0
    assert warm["tokens"] and warm["tokens"] == cold["tokens"] and warm["content"] == cold["content"]


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_message_delimiters_make_a_then_c_restore_and_equal_cold(arch_server, arch):
    from .test_llama_server import _conversation, _user_starts

    flags = ["-cram", "0", "--checkpoint-min-step", "256"]
    with arch_server(arch, flags) as server:
        a, c = _conversation(server, edited=False), _conversation(server, edited=True)
        divergence = next(i for i, (x, y) in enumerate(zip(a, c)) if x != y)
        starts = _user_starts(a, gguf_model.special_token_id("<|im_start|>"))
        _ok(server.complete(a, message_delimiters=USER_DELIMITERS))
        created = [e.n_tokens for e in kinds(server.turn_events(), "created")]
        warm = _ok(server.complete(c, message_delimiters=USER_DELIMITERS, n_predict=16))
        events = server.turn_events()
    with arch_server(arch, flags) as server:
        cold = _ok(server.complete(c, message_delimiters=USER_DELIMITERS, n_predict=16))
    assert [n for n in created if n in starts] == starts, "a checkpoint at every user-message start"
    reentry = max(s for s in starts if s < divergence)
    assert [r.n_tokens for r in kinds(events, "restored")] == [reentry]
    assert not kinds(events, "forced")
    assert _reuse(warm) == (reentry, len(c) - reentry)
    assert warm["tokens"] and warm["tokens"] == cold["tokens"] and warm["content"] == cold["content"]


@pytest.mark.llama
@pytest.mark.parametrize("arch", ARCHS)
def test_chat_turn2_reuses_turn1_and_equals_cold(arch_server, arch):
    from shadowlab.run.prompts import seeded_text

    turn1 = [{"role": "system", "content": seeded_text(10, 150)},
             {"role": "user", "content": seeded_text(20, 400)}]
    with arch_server(arch, ["-cram", "0"]) as server:
        first = _ok(server.chat(turn1))
        reply = first["choices"][0]["message"]["content"]
        turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": seeded_text(21, 300)}]
        warm = _ok(server.chat(turn2))
    with arch_server(arch, ["-cram", "0"]) as server:
        cold = _ok(server.chat(turn2))
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert 0 < cached < warm["usage"]["prompt_tokens"]
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]


# ------------------------------------------------------------------ matrices/archs-llama.yaml


@pytest.mark.llama
def test_archs_matrix_qualifies_through_shadowlab(tmp_path, model_cache, llama_binary):
    """The committed matrix, run by shadowlab itself, with the raw prompts at a quarter length,
    the delimiter conversations one exchange shorter, and no control cells."""
    import yaml

    from shadowlab.judge import gate

    from .conftest import SHARED_C, run_matrix

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "matrices" / "archs-llama.yaml").read_text())
    assert [e["model"]["gguf"]["preset"] for e in data["engines"].values()] == [f"{a}-tiny" for a in ARCHS]
    for engine in data["engines"].values():
        engine["binary"] = str(llama_binary)
    data["prompts"]["A"]["tokens"] = L_A
    data["prompts"]["C"].update(shared=SHARED_C, tokens=L_C)
    data["prompts"]["B"]["tokens"] = 60
    for x in data["expectations"]:
        if "checkpoints_created_at" in x:
            x["checkpoints_created_at"] = [L_A - 5 - UB, L_A - 5]
    for name in ("A_msgs", "C_msgs"):  # drop the third user/assistant pair (C's edit is in the second)
        messages = data["prompts"][name]["messages"]
        assert [m["role"] for m in messages[5:7]] == ["user", "assistant"]
        del messages[5:7]
    data["identity"]["control"] = False
    path = tmp_path / "archs.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = gate.evaluate(run_matrix(path, tmp_path / "run", model_cache))

    failed = [f"{c.check} {c.subject}: {c.message}" for c in result.checks if not c.passed]
    assert result.exit_code == 0, failed
    verdict = result.inputs.verdict
    outcomes = {c.cell_id: [t.outcome.value for t in c.turns] for c in verdict.cells if c.kind == "warm"}
    for engine in ("lfm2", "granite", "jamba", "mamba2"):
        assert outcomes[f"{engine}.cram0.A-C"] == ["cold", "forced"]
        assert outcomes[f"{engine}.cram0.A-B-C"] == ["cold", "silent_reset", "silent_reset"]
        assert outcomes[f"{engine}.cram0_step256.msgs-A-C"] == ["cold", "restored"]
        assert outcomes[f"{engine}.cram0.chat"][1] in ("extended", "restored")
        restored = verdict.cell(f"{engine}.cram0_step256.msgs-A-C").turns[1]
        assert restored.reused_tokens > 500 and restored.identity.status.value == "identical"
