"""The model file on disk: its sha256 and the config stored in its safetensors metadata.

Its own module so that both the loader (`model.py`) and the generator (`weights.py`) can read
a model file without importing each other.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from safetensors import safe_open

from .config import CONFIG_METADATA_KEY, ModelConfig


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stored_config(path: str | Path) -> str | None:
    """The config JSON in the file's metadata, or None for a file shadowlab did not write."""
    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get(CONFIG_METADATA_KEY)


def read_config(path: str | Path) -> ModelConfig:
    text = stored_config(path)
    if text is None:
        raise ValueError(f"{path}: no {CONFIG_METADATA_KEY!r} metadata; not a shadowlab model (see scripts/make_ref_model.py)")
    return ModelConfig.from_json(text)
