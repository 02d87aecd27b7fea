#!/usr/bin/env python3
"""Write the reference engine's seeded-random model: same preset and seed, same bytes.

    python scripts/make_ref_model.py --preset tiny --seed 0 --out models/tiny-s0.safetensors
"""
from __future__ import annotations

import argparse
from pathlib import Path

from shadowlab_engine.config import PRESETS
from shadowlab_engine.weights import sha256_file, write_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="default: models/<preset>-s<seed>.safetensors")
    args = ap.parse_args(argv)
    out = args.out or Path("models") / f"{args.preset}-s{args.seed}.safetensors"
    path = write_model(args.preset, args.seed, out)
    print(f"{path}  sha256={sha256_file(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
