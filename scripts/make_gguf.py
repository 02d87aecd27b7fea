#!/usr/bin/env python3
"""Write a tiny seeded-random qwen35 hybrid GGUF for llama-server (see shadowlab/gguf_model.py).

    python scripts/make_gguf.py --preset tiny --seed 0 --out models/qwen35-tiny-s0.gguf
    python scripts/make_gguf.py --preset small --seed 0          # into models/, cached

Same preset and seed → the same bytes (the sha256 is printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shadowlab import gguf_model
from shadowlab.engines import sha256_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(gguf_model.PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="output file (default: cached under --cache-dir)")
    parser.add_argument("--cache-dir", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    if args.out is None:
        path = gguf_model.ensure_gguf(args.preset, args.seed, args.cache_dir)
    else:
        path = gguf_model.write_gguf(args.preset, args.seed, args.out)
    params = gguf_model.parameter_count(args.preset)
    print(f"{path}  {path.stat().st_size / 2**20:.2f} MiB  {params:,} parameters  "
          f"sha256 {sha256_file(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
