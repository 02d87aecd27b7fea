"""A tiny seeded-random `qwen35` hybrid model as a GGUF file, for the real llama-server.

No model can be downloaded where shadowlab runs, yet llama.cpp's checkpoint mechanics only
engage for a hybrid (attention + recurrent) model. This module writes one from nothing, with
the PyPI `gguf` package: the keys and tensor shapes are the ones llama.cpp b11434 reads for
architecture `qwen35` (`src/models/qwen35.cpp`, `src/llama-model.cpp`):

- every `full_attention_interval`-th layer (4: three gated-delta-net layers, then one
  full-attention layer, like Qwen3.5) is gated full attention with q/k RMSNorm and MRoPE;
  the others are gated delta net layers (`ssm_*` tensors, conv state + recurrent state);
- a byte-level BPE vocabulary: the 256 byte tokens (id = byte value, spelled with GPT-2's
  byte-to-unicode map), a few ASCII merges, and the ChatML specials `<|endoftext|>`,
  `<|im_start|>`, `<|im_end|>`; a ChatML chat template.

Weights are seeded random: each tensor draws from its own generator, seeded from
`(seed, tensor name)`, so the same preset and seed always give the same bytes (and sha256).
The model answers nonsense, but deterministic nonsense, which is all a cache experiment needs.

Other hybrid and recurrent architectures of the same build (same vocabulary, same template),
chosen to differ in the recurrent mechanism (see `ARCHS`):

- `lfm2` (`src/models/lfm2.cpp`): LFM2's gated short convolution (`shortconv.*`: a 3-tap
  causal conv, state = the last 2 inputs, no recurrent matrix) with GQA attention layers; a
  layer is recurrent where `attention.head_count_kv[il]` is 0;
- `granitehybrid` (`src/models/granite-hybrid.cpp`, `mamba-base.cpp`): Mamba-2 selective-scan
  layers (`ssm_in`, conv1d + bias, `ssm_a`, `ssm_d`, grouped `ssm_norm`) with one GQA attention
  layer in eight (Granite 4.0-H's sparse mix), recurrent where `head_count_kv[il]` is 0;
- `jamba` (`src/models/jamba.cpp`, `mamba-base.cpp`): Mamba-1 selective-scan layers (`ssm_x`,
  `ssm_dt`, a per-channel `ssm_a` [d_inner, d_state], dt/B/C RMSNorms) with one attention layer
  in eight, at Jamba's offset; dense FFNs;
- `mamba2` (`src/models/mamba2.cpp`): the same Mamba-2 layers only, no attention at all.

Their presets are named `<arch>-<preset>` (`lfm2-tiny`), so a matrix's
`model: {gguf: {preset: lfm2-tiny}}` picks one; `qwen35-tiny` is the same model as `tiny`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shadowlab.results.records import atomic_path

if TYPE_CHECKING:  # numpy (the llama extra) only where a GGUF is generated: a GGUF path needs none
    import numpy as np

__all__ = [
    "ARCHS",
    "GGUFPreset",
    "OtherPreset",
    "PRESETS",
    "SPECIAL_TOKENS",
    "CHATML_TEMPLATE",
    "byte_to_unicode",
    "ensure_gguf",
    "gguf_filename",
    "invalid_utf8_token_ids",
    "resolve",
    "vocab",
    "write_gguf",
]

ARCH = "qwen35"
GENERATOR_VERSION = 1  # bump when the bytes written for a (preset, seed) change

# Merged tokens after the 256 byte tokens (pairs of GPT-2 byte-unicode spellings; `Ġ` is space).
MERGES = ("Ġ t", "h e", "Ġ a", "i n", "e r", "o n", "Ġ s", "r e", "a n", "e s")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, as Qwen renders it: `<|im_start|>{role}\n{content}<|im_end|>\n` per message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3


@dataclass(frozen=True)
class GGUFPreset:
    """Shape of a generated qwen35 model (names as in llama.cpp's hparams)."""

    name: str
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int             # full-attention query heads
    n_head_kv: int
    head_dim: int
    n_rot: int              # rotary dims per head (Qwen3.5: a quarter of the head)
    rope_sections: tuple[int, int, int, int]  # MRoPE sections, summing to n_rot / 2
    ssm_d_state: int        # gated delta net head size (keys and values)
    ssm_n_group: int        # key heads
    ssm_dt_rank: int        # value heads
    ssm_d_conv: int = 4
    full_attention_interval: int = 4
    context_length: int = 32768
    rope_freq_base: float = 10_000_000.0
    rms_eps: float = 1e-6
    logit_gain: float = 4.0  # makes the greedy argmax well separated (no near-ties)

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0


PRESETS: dict[str, GGUFPreset] = {
    # The shape BRIEF §3 observed on b11434: 8 layers (attention every 4th), n_embd 128,
    # 269-token vocab, ~1.2M parameters.
    "tiny": GGUFPreset(
        name="tiny", n_embd=128, n_layer=8, n_ff=256, n_head=4, n_head_kv=2, head_dim=32,
        n_rot=8, rope_sections=(2, 1, 1, 0), ssm_d_state=32, ssm_n_group=2, ssm_dt_rank=4,
    ),
    # The reference engine's `small` shape (d_model 256, 8 layers, 4 GDN heads of 64, 8/2
    # attention heads of 32, d_ff 768), so benchmarks compare like with like.
    "small": GGUFPreset(
        name="small", n_embd=256, n_layer=8, n_ff=768, n_head=8, n_head_kv=2, head_dim=32,
        n_rot=8, rope_sections=(2, 1, 1, 0), ssm_d_state=64, ssm_n_group=4, ssm_dt_rank=4,
    ),
}


@dataclass(frozen=True)
class OtherPreset:
    """Shape of a generated lfm2 / granitehybrid / mamba2 model (llama.cpp hparams names).

    `attention_layers` lists the attention layers; every other layer is recurrent (a short
    conv for lfm2, a Mamba-2 mixer for granitehybrid and mamba2).
    """

    name: str
    arch: str
    n_embd: int
    n_layer: int
    attention_layers: tuple[int, ...] = ()
    n_ff: int = 0              # 0: no feed-forward block (mamba2)
    n_head: int = 0            # attention query heads (head size n_embd / n_head)
    n_head_kv: int = 0
    shortconv_l_cache: int = 3  # lfm2: conv taps (state keeps l_cache - 1 inputs)
    ssm_d_state: int = 0       # Mamba-2: state size per head
    ssm_n_group: int = 1       # Mamba-2: B/C groups
    ssm_n_head: int = 0        # Mamba-2: heads (`ssm.time_step_rank`); head dim d_inner / heads
    ssm_dt_rank: int = 0       # Mamba-1 (jamba): rank of the dt projection (`ssm.time_step_rank`)
    ssm_d_conv: int = 4
    context_length: int = 32768
    rope_freq_base: float = 1_000_000.0
    rms_eps: float = 1e-5
    logit_gain: float = 4.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head if self.n_head else 0

    @property
    def ssm_d_inner(self) -> int:  # llama.cpp's granitehybrid requires an expansion of 2
        return 2 * self.n_embd

    def is_recurrent(self, layer: int) -> bool:
        return layer not in self.attention_layers

    def head_count_kv(self) -> list[int]:
        """Per layer: 0 marks a recurrent layer (how lfm2 and granitehybrid tell them apart)."""
        return [0 if self.is_recurrent(il) else self.n_head_kv for il in range(self.n_layer)]


# Shapes chosen to differ from qwen35's 3:1 mix, each at qwen35 tiny's width (n_embd 128).
OTHER_PRESETS: dict[str, dict[str, OtherPreset]] = {
    # LFM2-350M puts attention at layers 2, 5, 8, 10, 12, 14 of 16; here 3 of 8 (5 conv : 3 attn).
    "lfm2": {
        "tiny": OtherPreset(name="tiny", arch="lfm2", n_embd=128, n_layer=8, attention_layers=(2, 5, 7),
                            n_ff=256, n_head=4, n_head_kv=2),
    },
    # Granite 4.0-H: about one attention layer per nine; here 1 of 8 (7 Mamba-2 : 1 attn).
    "granitehybrid": {
        "tiny": OtherPreset(name="tiny", arch="granitehybrid", n_embd=128, n_layer=8, attention_layers=(5,),
                            n_ff=256, n_head=4, n_head_kv=2, ssm_d_state=32, ssm_n_group=1, ssm_n_head=8),
    },
    # Jamba: Mamba-1 selective scan (per-channel state, x/dt projections) + 1 attention of 8,
    # at the same offset as Jamba's (layer 4); dense FFNs (no MoE). Half the width of the others:
    # b11434's CPU Mamba-1 scan is the slowest here (measured, 1,200 tokens on one thread:
    # 1.75 s at n_embd 128, 0.76 s at 64).
    "jamba": {
        "tiny": OtherPreset(name="tiny", arch="jamba", n_embd=64, n_layer=8, attention_layers=(4,),
                            n_ff=128, n_head=2, n_head_kv=1, ssm_d_state=16, ssm_dt_rank=4),
    },
    # Pure Mamba-2: no attention, no FFN (llama.cpp's mamba2 graph has none).
    "mamba2": {
        "tiny": OtherPreset(name="tiny", arch="mamba2", n_embd=128, n_layer=6, ssm_d_state=32, ssm_n_group=1,
                            ssm_n_head=8),
    },
}

ARCHS: tuple[str, ...] = (ARCH, *OTHER_PRESETS)


def resolve(preset_name: str, arch: str | None = None) -> tuple[str, str]:
    """(arch, preset) for `tiny` (qwen35), `lfm2-tiny`, or `tiny` with `arch="lfm2"`."""
    if arch is None:
        head, sep, tail = preset_name.partition("-")
        arch, preset_name = (head, tail) if sep and head in ARCHS else (ARCH, preset_name)
    elif arch not in ARCHS:
        raise ValueError(f"unknown GGUF architecture {arch!r}; known: {', '.join(ARCHS)}")
    elif preset_name.startswith(f"{arch}-"):
        preset_name = preset_name[len(arch) + 1:]
    return arch, preset_name


def preset_names() -> list[str]:
    """Every preset a matrix or `scripts/make_gguf.py` can name."""
    return [*PRESETS, *(f"{a}-{n}" for a, ps in OTHER_PRESETS.items() for n in ps)]


def preset(name: str, arch: str | None = None) -> GGUFPreset | OtherPreset:
    arch, short = resolve(name, arch)
    known = PRESETS if arch == ARCH else OTHER_PRESETS[arch]
    try:
        return known[short]
    except KeyError:
        raise ValueError(f"unknown GGUF preset {name!r} for {arch}; known: {', '.join(known)}") from None


# --------------------------------------------------------------------------------------------
# Vocabulary.


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (bytes 0..255)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def vocab() -> tuple[list[str], list[int]]:
    """(token strings, token types): byte tokens (id = byte), merged tokens, then specials."""
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES] + list(SPECIAL_TOKENS)
    types = [TOKEN_TYPE_NORMAL] * (256 + len(MERGES)) + [TOKEN_TYPE_CONTROL] * len(SPECIAL_TOKENS)
    return tokens, types


def special_token_id(text: str) -> int:
    return 256 + len(MERGES) + SPECIAL_TOKENS.index(text)


def invalid_utf8_token_ids() -> list[int]:
    """Tokens that are a lone non-ASCII byte: generated alone they are invalid UTF-8.

    llama-server answers HTTP 400 (`invalid UTF-8 byte`) when a completion ends in one, so
    a caller biases these away (`logit_bias`) for models made here.
    """
    return list(range(128, 256))


def describe_token_ids(ids: Sequence[int]) -> str:
    """`128-255` for the token ids a logit_bias bans (identity records stay readable)."""
    if not ids:
        return ""
    out, start, prev = [], ids[0], ids[0]
    for t in (*ids[1:], None):
        if t is not None and t == prev + 1:
            prev = t
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if t is not None:
            start = prev = t
    return ",".join(out)


# --------------------------------------------------------------------------------------------
# Tensors.


def _rng(seed: int, name: str, arch: str = ARCH) -> np.random.Generator:
    # qwen35 keeps its original stream names (its files' bytes must not change)
    stream = name if arch == ARCH else f"{arch}/{name}"
    digest = hashlib.sha256(f"shadowlab-gguf/{GENERATOR_VERSION}/{seed}/{stream}".encode()).digest()
    import numpy as np

    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def _tensor_specs(p: GGUFPreset, n_vocab: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, init) for every tensor; numpy shape is ggml's ne reversed."""
    yield "token_embd.weight", (n_vocab, p.n_embd), "embed"
    yield "output_norm.weight", (p.n_embd,), "norm"
    yield "output.weight", (n_vocab, p.n_embd), "output"
    key_dim = p.ssm_d_state * p.ssm_n_group
    value_dim = p.ssm_d_inner
    for il in range(p.n_layer):
        blk = f"blk.{il}"
        yield f"{blk}.attn_norm.weight", (p.n_embd,), "norm"
        yield f"{blk}.post_attention_norm.weight", (p.n_embd,), "norm"
        if p.is_recurrent(il):
            yield f"{blk}.attn_qkv.weight", (key_dim * 2 + value_dim, p.n_embd), "linear"
            yield f"{blk}.attn_gate.weight", (value_dim, p.n_embd), "linear"
            yield f"{blk}.ssm_conv1d.weight", (key_dim * 2 + value_dim, p.ssm_d_conv), "conv"
            yield f"{blk}.ssm_dt.bias", (p.ssm_dt_rank,), "ones"
            yield f"{blk}.ssm_a", (p.ssm_dt_rank,), "ssm_a"
            yield f"{blk}.ssm_beta.weight", (p.ssm_dt_rank, p.n_embd), "linear"
            yield f"{blk}.ssm_alpha.weight", (p.ssm_dt_rank, p.n_embd), "linear"
            yield f"{blk}.ssm_norm.weight", (p.ssm_d_state,), "norm"
            yield f"{blk}.ssm_out.weight", (p.n_embd, value_dim), "linear"
        else:
            # The query projection carries query and gate (2 × head_dim per head).
            yield f"{blk}.attn_q.weight", (p.head_dim * p.n_head * 2, p.n_embd), "linear"
            yield f"{blk}.attn_k.weight", (p.head_dim * p.n_head_kv, p.n_embd), "linear"
            yield f"{blk}.attn_v.weight", (p.head_dim * p.n_head_kv, p.n_embd), "linear"
            yield f"{blk}.attn_output.weight", (p.n_embd, p.head_dim * p.n_head), "linear"
            yield f"{blk}.attn_q_norm.weight", (p.head_dim,), "norm"
            yield f"{blk}.attn_k_norm.weight", (p.head_dim,), "norm"
        yield f"{blk}.ffn_gate.weight", (p.n_ff, p.n_embd), "linear"
        yield f"{blk}.ffn_up.weight", (p.n_ff, p.n_embd), "linear"
        yield f"{blk}.ffn_down.weight", (p.n_embd, p.n_ff), "linear"


def _other_tensor_specs(p: OtherPreset, n_vocab: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """lfm2 / granitehybrid / mamba2 tensors, in llama.cpp's `load_arch_tensors` shapes (reversed)."""
    yield "token_embd.weight", (n_vocab, p.n_embd), "embed"
    # lfm2's final norm is stored under the name `token_embd_norm` (LLM_TENSOR_OUTPUT_NORM_LFM2)
    yield ("token_embd_norm.weight" if p.arch == "lfm2" else "output_norm.weight"), (p.n_embd,), "norm"
    yield "output.weight", (n_vocab, p.n_embd), "output"
    d_inner, conv_dim = p.ssm_d_inner, p.ssm_d_inner + 2 * p.ssm_n_group * p.ssm_d_state
    for il in range(p.n_layer):
        blk = f"blk.{il}"
        yield f"{blk}.attn_norm.weight", (p.n_embd,), "norm"
        if not p.is_recurrent(il):
            kv_dim = p.head_dim * p.n_head_kv
            yield f"{blk}.attn_q.weight", (p.head_dim * p.n_head, p.n_embd), "linear"
            yield f"{blk}.attn_k.weight", (kv_dim, p.n_embd), "linear"
            yield f"{blk}.attn_v.weight", (kv_dim, p.n_embd), "linear"
            yield f"{blk}.attn_output.weight", (p.n_embd, p.head_dim * p.n_head), "linear"
            if p.arch == "lfm2":
                yield f"{blk}.attn_q_norm.weight", (p.head_dim,), "norm"
                yield f"{blk}.attn_k_norm.weight", (p.head_dim,), "norm"
        elif p.arch == "jamba":  # Mamba-1 mixer
            yield f"{blk}.ssm_in.weight", (2 * d_inner, p.n_embd), "linear"
            yield f"{blk}.ssm_conv1d.weight", (d_inner, p.ssm_d_conv), "conv"
            yield f"{blk}.ssm_conv1d.bias", (d_inner,), "small"
            yield f"{blk}.ssm_x.weight", (p.ssm_dt_rank + 2 * p.ssm_d_state, d_inner), "linear"
            yield f"{blk}.ssm_dt_norm.weight", (p.ssm_dt_rank,), "norm"
            yield f"{blk}.ssm_dt.weight", (d_inner, p.ssm_dt_rank), "linear"
            yield f"{blk}.ssm_dt.bias", (d_inner,), "dt_bias"
            yield f"{blk}.ssm_b_norm.weight", (p.ssm_d_state,), "norm"
            yield f"{blk}.ssm_c_norm.weight", (p.ssm_d_state,), "norm"
            yield f"{blk}.ssm_a", (d_inner, p.ssm_d_state), "ssm_a"
            yield f"{blk}.ssm_d", (d_inner,), "ones"
            yield f"{blk}.ssm_out.weight", (p.n_embd, d_inner), "linear"
        elif p.arch == "lfm2":
            yield f"{blk}.shortconv.conv.weight", (p.n_embd, p.shortconv_l_cache), "conv"
            yield f"{blk}.shortconv.in_proj.weight", (3 * p.n_embd, p.n_embd), "linear"
            yield f"{blk}.shortconv.out_proj.weight", (p.n_embd, p.n_embd), "linear"
        else:  # Mamba-2 mixer: in_proj gives z, xBC, dt
            yield f"{blk}.ssm_in.weight", (2 * d_inner + 2 * p.ssm_n_group * p.ssm_d_state + p.ssm_n_head,
                                           p.n_embd), "linear"
            yield f"{blk}.ssm_conv1d.weight", (conv_dim, p.ssm_d_conv), "conv"
            yield f"{blk}.ssm_conv1d.bias", (conv_dim,), "small"
            yield f"{blk}.ssm_dt.bias", (p.ssm_n_head,), "dt_bias"
            yield f"{blk}.ssm_a", (p.ssm_n_head, 1), "ssm_a"
            yield f"{blk}.ssm_d", (p.ssm_n_head, 1), "ones"
            yield f"{blk}.ssm_norm.weight", (p.ssm_n_group, d_inner // p.ssm_n_group), "norm"
            yield f"{blk}.ssm_out.weight", (p.n_embd, d_inner), "linear"
        if p.n_ff:
            yield f"{blk}.ffn_norm.weight", (p.n_embd,), "norm"
            yield f"{blk}.ffn_gate.weight", (p.n_ff, p.n_embd), "linear"
            yield f"{blk}.ffn_up.weight", (p.n_ff, p.n_embd), "linear"
            yield f"{blk}.ffn_down.weight", (p.n_embd, p.n_ff), "linear"


def _specs(p: GGUFPreset | OtherPreset, n_vocab: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    return _other_tensor_specs(p, n_vocab) if isinstance(p, OtherPreset) else _tensor_specs(p, n_vocab)


def _init(rng: np.random.Generator, shape: tuple[int, ...], kind: str, p: GGUFPreset | OtherPreset) -> np.ndarray:
    import numpy as np

    if kind == "small":
        data = 0.1 * rng.standard_normal(shape)
    elif kind == "dt_bias":  # Mamba-2's init: softplus(dt_bias) = dt ~ log U(1e-3, 1e-1)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
        data = dt + np.log(-np.expm1(-dt))
    elif kind == "norm":
        data = 1.0 + 0.05 * rng.standard_normal(shape)
    elif kind == "ones":
        data = np.ones(shape)
    elif kind == "ssm_a":  # A = -exp(A_log), A_log ~ log U(1, 16) as in Qwen3-Next's init
        data = -rng.uniform(1.0, 16.0, shape)
    elif kind == "embed":
        data = rng.standard_normal(shape)
    elif kind == "output":
        data = p.logit_gain * rng.standard_normal(shape) / np.sqrt(shape[-1])
    elif kind == "conv":
        data = rng.standard_normal(shape) / np.sqrt(shape[-1])
    else:  # linear: [out, in]
        data = rng.standard_normal(shape) / np.sqrt(shape[-1])
    return data.astype(np.float32)


# --------------------------------------------------------------------------------------------
# Writing.


def gguf_filename(preset_name: str, seed: int, arch: str | None = None) -> str:
    arch, short = resolve(preset_name, arch)
    return f"{arch}-{short}-s{seed}.gguf"


def write_gguf(preset_name: str, seed: int, path: str | Path, arch: str | None = None) -> Path:
    """Write the model atomically (temp file + rename); same preset + seed → same bytes."""
    import gguf  # optional dependency: only the llama-server path needs it

    p = preset(preset_name, arch)
    arch = p.arch if isinstance(p, OtherPreset) else ARCH
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, types = vocab()
    with atomic_path(path) as tmp:  # the file mode a plain open() gives (0666 & ~umask)
        writer = gguf.GGUFWriter(str(tmp), arch)
        if isinstance(p, OtherPreset):
            _write_other_metadata(writer, p, seed)
        else:
            _write_metadata(writer, p, seed, tokens, types)
        _write_tokenizer(writer, tokens, types)
        for name, shape, kind in _specs(p, len(tokens)):
            writer.add_tensor(name, _init(_rng(seed, name, arch), shape, kind, p))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def _write_other_metadata(writer, p: OtherPreset, seed: int) -> None:
    writer.add_name(f"shadowlab {p.arch} {p.name} seed {seed}")
    writer.add_string("shadowlab.generator", f"shadowlab.gguf_model v{GENERATOR_VERSION}")
    writer.add_uint32("shadowlab.seed", seed)
    writer.add_string("shadowlab.preset", f"{p.arch}-{p.name}")
    writer.add_context_length(p.context_length)
    writer.add_embedding_length(p.n_embd)
    writer.add_block_count(p.n_layer)
    writer.add_layer_norm_rms_eps(p.rms_eps)
    if p.n_ff:
        writer.add_feed_forward_length(p.n_ff)
    if p.attention_layers:
        writer.add_head_count(p.n_head)
        writer.add_head_count_kv(p.head_count_kv())
        writer.add_rope_freq_base(p.rope_freq_base)
    else:
        writer.add_head_count(0)
    if p.arch == "lfm2":
        writer.add_shortconv_l_cache(p.shortconv_l_cache)
    else:
        writer.add_ssm_conv_kernel(p.ssm_d_conv)
        writer.add_ssm_inner_size(p.ssm_d_inner)
        writer.add_ssm_state_size(p.ssm_d_state)
        if p.arch == "jamba":
            writer.add_ssm_time_step_rank(p.ssm_dt_rank)
        else:
            writer.add_ssm_time_step_rank(p.ssm_n_head)
            writer.add_ssm_group_count(p.ssm_n_group)
    writer.add_file_type(0)  # all f32


def _write_metadata(writer, p: GGUFPreset, seed: int, tokens: list[str], types: list[int]) -> None:
    writer.add_name(f"shadowlab {ARCH} {p.name} seed {seed}")
    writer.add_string("shadowlab.generator", f"shadowlab.gguf_model v{GENERATOR_VERSION}")
    writer.add_uint32("shadowlab.seed", seed)
    writer.add_string("shadowlab.preset", p.name)
    writer.add_context_length(p.context_length)
    writer.add_embedding_length(p.n_embd)
    writer.add_block_count(p.n_layer)
    writer.add_feed_forward_length(p.n_ff)
    writer.add_head_count(p.n_head)
    writer.add_head_count_kv(p.n_head_kv)
    writer.add_key_length(p.head_dim)
    writer.add_value_length(p.head_dim)
    writer.add_layer_norm_rms_eps(p.rms_eps)
    writer.add_rope_freq_base(p.rope_freq_base)
    writer.add_rope_dimension_count(p.n_rot)
    writer.add_rope_dimension_sections(list(p.rope_sections))
    writer.add_ssm_conv_kernel(p.ssm_d_conv)
    writer.add_ssm_state_size(p.ssm_d_state)
    writer.add_ssm_group_count(p.ssm_n_group)
    writer.add_ssm_time_step_rank(p.ssm_dt_rank)
    writer.add_ssm_inner_size(p.ssm_d_inner)
    writer.add_full_attention_interval(p.full_attention_interval)
    writer.add_file_type(0)  # all f32


def _write_tokenizer(writer, tokens: list[str], types: list[int]) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(special_token_id("<|endoftext|>"))
    writer.add_eos_token_id(special_token_id("<|im_end|>"))
    writer.add_pad_token_id(special_token_id("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)


def ensure_gguf(preset_name: str, seed: int = 0, cache_dir: str | Path = Path("models"),
                arch: str | None = None) -> Path:
    """The path of the model in cache_dir, generated once under a file lock.

    `preset_name` is a qwen35 preset (`tiny`) or `<arch>-<preset>` (`lfm2-tiny`); `arch`
    names the architecture instead (`ensure_gguf("tiny", 0, arch="lfm2")`).
    """
    from filelock import FileLock

    preset(preset_name, arch)  # unknown names fail before anything is created
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / gguf_filename(preset_name, seed, arch)
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            write_gguf(preset_name, seed, path, arch)
    return path


def parameter_count(preset_name: str, arch: str | None = None) -> int:
    p = preset(preset_name, arch)
    n_vocab = len(vocab()[0])
    return sum(math.prod(shape) for _, shape, _ in _specs(p, n_vocab))
