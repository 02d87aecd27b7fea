"""Model configuration: one frozen dataclass and the named presets.

The config travels inside the weights file (safetensors metadata key `shadowlab_config`),
so a weights file is self-describing and `HybridModel.load` needs nothing else.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

CONFIG_METADATA_KEY = "shadowlab_config"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int = 260            # 256 bytes + 4 specials (tokenizer.py)
    d_model: int = 64
    n_layers: int = 4
    attention_interval: int = 4      # every 4th layer is full attention (3 GDN + 1 attention)
    # Explicit layer mix, repeated over the layers: "G" = gated delta net, "A" = full attention
    # (e.g. "GA" = 1:1, "G" = pure recurrent). Empty: the `attention_interval` rule. Left out of
    # the config JSON when empty, so the presets made before it keep their bytes and sha256.
    layer_pattern: str = ""
    # gated delta net (linear attention) layers
    gdn_n_heads: int = 4
    gdn_head_dim: int = 16           # key and value head size
    conv_kernel: int = 4
    # full-attention layers (grouped-query, RoPE, per-head q/k RMSNorm as in Qwen3)
    n_heads: int = 2
    n_kv_heads: int = 1
    head_dim: int = 16
    rope_theta: float = 10000.0
    # SwiGLU MLP
    d_ff: int = 128
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    # Chunk of the gated delta rule AND the grid every forward pass is computed on: positions
    # [k*chunk, (k+1)*chunk) always form one fixed-shape tile, which is what makes results
    # independent of how a prompt is split into calls (model.py).
    chunk_size: int = 64
    # Version of weights.py's drawing recipe: bumped when it changes, so a cached file made by
    # an older recipe no longer matches its preset and ensure_model regenerates it.
    weights_recipe: int = 3

    def __post_init__(self) -> None:
        if self.layer_pattern and set(self.layer_pattern) - {"G", "A"}:
            raise ValueError(f"layer_pattern {self.layer_pattern!r}: use only G (gated delta net) and A (attention)")

    def is_attention(self, layer: int) -> bool:
        if self.layer_pattern:
            return self.layer_pattern[layer % len(self.layer_pattern)] == "A"
        return (layer + 1) % self.attention_interval == 0

    def layer_kinds(self) -> str:
        """The layer mix spelled out, one letter per layer: "GGGA" for `tiny`."""
        return "".join("A" if self.is_attention(i) else "G" for i in range(self.n_layers))

    @property
    def gdn_dim(self) -> int:
        return self.gdn_n_heads * self.gdn_head_dim

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if not data["layer_pattern"]:
            del data["layer_pattern"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        data = json.loads(text)
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown model config keys {unknown}; the weights file is newer than this engine")
        return cls(**data)


PRESETS: dict[str, ModelConfig] = {
    # Fast enough for tests: a cold 4,560-token prefill well under 1 s on one core.
    "tiny": ModelConfig(name="tiny"),
    # Closer to a real hybrid's shape (Qwen3.5: 128-wide GDN heads, GQA 4:1), for benchmarks.
    "small": ModelConfig(
        name="small", d_model=256, n_layers=8, gdn_n_heads=4, gdn_head_dim=64,
        n_heads=8, n_kv_heads=2, head_dim=32, d_ff=768,
    ),
    # `tiny` with other mixes than Qwen3.5's 3:1, for checking that the cache mechanics do not
    # depend on it: 1:1 (GAGA), and pure recurrent (GGGG: no attention KV at all; a checkpoint
    # is still the only way back to an earlier position).
    "tiny-1to1": ModelConfig(name="tiny-1to1", layer_pattern="GA"),
    "tiny-rec": ModelConfig(name="tiny-rec", layer_pattern="G"),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
