#!/usr/bin/env python3
"""Write a tiny seeded-random hybrid GGUF for llama-server (see shadowlab/engines/llama_server/gguf_model.py).

    python scripts/make_gguf.py --preset tiny --seed 0 --out models/qwen35-tiny-s0.gguf
    python scripts/make_gguf.py --preset small --seed 0          # into models/, cached
    python scripts/make_gguf.py --arch lfm2 --preset tiny        # models/lfm2-tiny-s0.gguf
    python scripts/make_gguf.py --preset granitehybrid-tiny      # the same as --arch granitehybrid

Architectures: qwen35 (default), lfm2, granitehybrid, mamba2.

Same preset and seed → the same bytes (the sha256 is printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shadowlab.engines.llama_server import gguf_model
from shadowlab.engines import sha256_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=None, choices=gguf_model.ARCHS,
                        help="architecture (default: qwen35, or the one a qualified --preset names)")
    parser.add_argument("--preset", default="tiny",
                        help=f"preset: {', '.join(gguf_model.preset_names())}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="output file (default: cached under --cache-dir)")
    parser.add_argument("--cache-dir", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    try:
        gguf_model.preset(args.preset, args.arch)
    except ValueError as exc:
        parser.error(str(exc))
    if args.out is None:
        path = gguf_model.ensure_gguf(args.preset, args.seed, args.cache_dir, arch=args.arch)
    else:
        path = gguf_model.write_gguf(args.preset, args.seed, args.out, arch=args.arch)
    params = gguf_model.parameter_count(args.preset, args.arch)
    print(f"{path}  {path.stat().st_size / 2**20:.2f} MiB  {params:,} parameters  "
          f"sha256 {sha256_file(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
