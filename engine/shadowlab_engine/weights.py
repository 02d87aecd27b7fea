"""Seeded random weights, written as safetensors with the config in the file's metadata.

Each tensor is drawn from its own stream, seeded by sha256(seed, tensor name), with numpy's
legacy RandomState (its stream is frozen across numpy versions), so the same preset and seed
give the same bytes on any machine: tests check the file's sha256 is reproducible.

The scales are chosen so a random model behaves enough like a trained one for identity checks
to mean something: some GDN heads decay slowly and write sparsely (they remember the start of a
4k prompt), attention q/k norms are sharp, and the logits are scaled so greedy choices are
decisive yet still move when the context changes.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import save_file

from .config import CONFIG_METADATA_KEY, ModelConfig, preset
from .model import Transformer
from .tokenizer import N_TOKENS


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_config(path: str | Path) -> ModelConfig:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if CONFIG_METADATA_KEY not in meta:
        raise ValueError(f"{path}: no {CONFIG_METADATA_KEY!r} metadata; not a shadowlab model (see scripts/make_ref_model.py)")
    return ModelConfig.from_json(meta[CONFIG_METADATA_KEY])


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float = 1.0) -> np.ndarray:
    stream = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")
    return np.random.RandomState(stream).standard_normal(shape) * std


def _spread(n: int, lo: float, hi: float) -> np.ndarray:
    """n values from lo to hi: heads get a range of time scales, from memory to local."""
    return np.linspace(lo, hi, n) if n > 1 else np.array([lo])


def _draw(c: ModelConfig, seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    H = c.gdn_n_heads
    if name == "tok_embeddings.weight":
        return _normal(seed, name, shape)
    if name == "output.weight":
        w = _normal(seed, name, shape, c.logit_scale / math.sqrt(shape[1]))
        w[N_TOKENS - 4:N_TOKENS] *= 0.5        # specials (EOS, <|im_end|> stop generation): rarer
        return w
    if leaf in ("q_norm", "k_norm"):
        return np.full(shape, 1.6)             # sharp attention: scores reach well above 1
    if leaf.endswith("norm"):
        return np.ones(shape)
    if leaf == "conv":                         # mostly the current token, a little of the last 3
        w = _normal(seed, name, shape, 0.3)
        w[:, -1] += 1.0
        return w
    if leaf == "A_log":                        # per-step decay rates from 1e-4 (memory) to 1
        return _spread(H, math.log(1e-4), 0.0)
    if leaf == "dt_bias":
        return np.zeros(shape)
    if leaf == "beta_bias":                    # memory heads write rarely, so they are not overwritten
        return _spread(H, -4.0, 0.0)
    return _normal(seed, name, shape, c.init_gain / math.sqrt(shape[-1]))   # a linear layer


def generate(c: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    shapes = {name: tuple(p.shape) for name, p in Transformer(c).named_parameters()}
    return {name: torch.from_numpy(_draw(c, seed, name, shape).astype(np.float32)) for name, shape in shapes.items()}


def write_model(preset_name: str, seed: int, path: str | Path) -> Path:
    """Write preset `preset_name` with weights drawn from `seed` to `path` (atomically)."""
    config = preset(preset_name)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(generate(config, seed), str(tmp), metadata={CONFIG_METADATA_KEY: config.to_json()})
    os.replace(tmp, path)
    return path


def ensure_model(preset_name: str, seed: int = 0, cache_dir: str | Path = Path("models")) -> Path:
    """The path of `<preset>-s<seed>.safetensors` in cache_dir, generated once under a file lock."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{preset_name}-s{seed}.safetensors"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            write_model(preset_name, seed, path)
    return path
