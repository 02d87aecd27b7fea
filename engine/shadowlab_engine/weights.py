"""Seeded random weights, written as safetensors with the config in the file's metadata.

Each tensor is drawn from its own stream, seeded by sha256(seed, tensor name), with numpy's
legacy RandomState (its stream is frozen across numpy versions), so the same preset and seed
give the same bytes on any machine: tests check the file's sha256 is reproducible.

The scales are chosen so a random model behaves enough like a trained one for identity checks
to mean something: activations stay O(1)-O(10), completions are varied, and the greedy
completion of a 4k prompt changes when one early token does (see `_gdn_heads`).
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from safetensors.torch import save_file

from .config import CONFIG_METADATA_KEY, ModelConfig, preset
from .model import Transformer
from .modelfile import read_config, sha256_file, stored_config  # noqa: F401 - public here too
from .tokenizer import N_TOKENS


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float = 1.0) -> np.ndarray:
    stream = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")
    return np.random.RandomState(stream).standard_normal(shape) * std


def _spread(n: int, lo: float, hi: float) -> np.ndarray:
    return np.linspace(lo, hi, n) if n > 1 else np.array([lo])


def _gdn_heads(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A_log, beta_bias, beta gain) per GDN head.

    The first half are memory heads: decay ~1e-5 per token and rare small writes (beta ~0.003),
    so a 4k prompt's first tokens are still in the state at its end. The rest decay fast and
    have high-gain beta gates: a small change upstream flips some writes, which the attention
    layer then turns into a different choice of keys. Together they make the greedy completion
    depend on the whole prompt (test_model.py: one token changed at position 10 of 4,000).
    """
    n_mem = n // 2
    a_log = np.concatenate([np.full(n_mem, -12.0), _spread(n - n_mem, -2.0, -1.0)])
    beta_bias = np.concatenate([np.full(n_mem, -6.0), _spread(n - n_mem, -1.0, 0.0)])
    gain = np.concatenate([np.ones(n_mem), np.full(n - n_mem, 8.0)])
    return a_log, beta_bias, gain


# Output-row scale per token: printable ASCII wins most argmaxes, so completions read as text
# (other bytes still occur, and decode shows invalid UTF-8 as U+FFFD); the specials, two of
# which stop generation, are rarer still.
_PRIOR = np.array([1.3 if 32 <= i < 127 or i == 10 else 0.6 for i in range(256)] + [0.5] * (N_TOKENS - 256))


def _draw(c: ModelConfig, seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    a_log, beta_bias, beta_gain = _gdn_heads(c.gdn_n_heads)
    if name == "tok_embeddings.weight":         # small, so the layers' outputs dominate the residual
        return _normal(seed, name, shape, 0.2 if not c.tie_embeddings else 1.0)
    if name == "output.weight":                 # logits with std ~4: decisive, yet they move
        w = _normal(seed, name, shape, 4.0 / math.sqrt(shape[1]))
        w[:N_TOKENS] *= _PRIOR[:, None]
        w[N_TOKENS:] *= 0.1                     # padding ids of a padded vocab: next to never
        return w
    if leaf in ("q_norm", "k_norm"):
        return np.full(shape, 3.0)              # sharp attention: scores with std ~9 pick few keys
    if leaf.endswith("norm"):
        return np.ones(shape)
    if leaf == "conv":                          # mostly the current token, a little of the last 3
        w = _normal(seed, name, shape, 0.3)
        w[:, -1] += 1.0
        return w
    if leaf == "A_log":
        return a_log
    if leaf == "beta_bias":
        return beta_bias
    if leaf == "dt_bias":
        return np.zeros(shape)
    w = _normal(seed, name, shape, 1.0 / math.sqrt(shape[-1]))   # a linear layer
    if leaf == "in_proj_ba":                    # rows [0, H) make beta, [H, 2H) the decay
        w[:c.gdn_n_heads] *= beta_gain[:, None]
    if leaf == "wo":                            # attention output dominates the last residual
        w *= 3.0
    return w


def generate(c: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    shapes = {name: tuple(p.shape) for name, p in Transformer(c).named_parameters()}
    return {name: torch.from_numpy(_draw(c, seed, name, shape).astype(np.float32)) for name, shape in shapes.items()}


def write_model(preset_name: str, seed: int, path: str | Path) -> Path:
    """Write preset `preset_name` with weights drawn from `seed` to `path` (atomically)."""
    config = preset(preset_name)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # One metadata key only: safetensors writes the metadata map in hash order, which varies
    # between calls, so a second key would make the bytes (and the sha256) unstable.
    save_file(generate(config, seed), str(tmp), metadata={CONFIG_METADATA_KEY: config.to_json()})
    os.replace(tmp, path)
    return path


def ensure_model(preset_name: str, seed: int = 0, cache_dir: str | Path = Path("models")) -> Path:
    """The path of `<preset>-s<seed>.safetensors` in cache_dir, generated once under a file lock
    (and again if the cached file was made from another config or recipe)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{preset_name}-s{seed}.safetensors"
    with FileLock(str(path) + ".lock"):
        if not path.exists() or _cached_config(path) != preset(preset_name).to_json():
            write_model(preset_name, seed, path)
    return path


def _cached_config(path: Path) -> str | None:
    try:
        return stored_config(path)
    except Exception:   # truncated or foreign file: regenerate it
        return None
