"""Command line: llama-server-style flags (docs/DESIGN.md §1 "Flags").

Imports nothing heavy: torch is loaded by the server's background thread after the socket is up.
"""

from __future__ import annotations

import argparse
import os
import sys

from .checkpoints import CacheConfig
from .faults import ENV_VAR, FaultError, parse_faults
from .httpd import serve
from .server import ServerOptions, engine_version
from .slotlog import ERROR, INFO, EngineLog


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shadowlab-engine",
        description="Reference hybrid attention/recurrent engine speaking llama-server's API.",
        allow_abbrev=False,
    )
    p.add_argument("-m", "--model", help="model .safetensors file (scripts/make_ref_model.py)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 = any free port (printed in the log)")
    p.add_argument("-c", "--ctx-size", type=int, default=8192, help="context size per slot")
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-np", "--parallel", type=int, default=1, help="number of slots")
    p.add_argument("--kv-unified", "-kvu", action="store_true", help="accepted; KV is always unified")
    p.add_argument("--ctx-checkpoints", "--swa-checkpoints", type=int, default=32)
    p.add_argument("--checkpoint-min-step", "-cms", type=int, default=8192)
    p.add_argument("-cram", "--cache-ram", type=int, default=8192, help="RAM prompt cache in MiB, 0 = off")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--log-file", default=None)
    p.add_argument("-lv", "--verbosity", "--log-verbosity", type=int, default=3)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]",
                   help=f"inject a fault (repeatable; also env {ENV_VAR})")
    p.add_argument("--version", action="store_true")
    return p


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"shadowlab-engine: {name}={value!r} is not an integer") from None


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    for name in ("ctx_size", "batch_size", "ubatch_size", "parallel"):
        if getattr(args, name) < 1:
            raise SystemExit(f"shadowlab-engine: --{name.replace('_', '-')} must be >= 1")
    if args.ctx_checkpoints < 0 or args.cache_ram < 0:
        raise SystemExit("shadowlab-engine: --ctx-checkpoints and -cram must be >= 0")
    try:
        faults = parse_faults(args.fault, os.environ.get(ENV_VAR))
    except FaultError as err:
        raise SystemExit(f"shadowlab-engine: {err}") from None
    cache = CacheConfig(
        n_ctx=args.ctx_size,
        n_batch=args.batch_size,
        n_ubatch=min(args.ubatch_size, args.batch_size),
        ctx_checkpoints=args.ctx_checkpoints,
        checkpoint_min_step=args.checkpoint_min_step,
        prompt_policy=_env_int("PXA_CKPT_PROMPT_POLICY", 1),
        prompt_end=_env_int("PXA_CKPT_PROMPT_END", 0),
        retain_mib=_env_int("SHADOWLAB_CKPT_RETAIN_MIB", 0),
    )
    if cache.retain_mib < 0:
        raise SystemExit("shadowlab-engine: SHADOWLAB_CKPT_RETAIN_MIB must be >= 0")
    affinity = _env_int("SHADOWLAB_SLOT_AFFINITY", 0)
    if affinity not in (0, 1):
        raise SystemExit(f"shadowlab-engine: SHADOWLAB_SLOT_AFFINITY must be 0 or 1, got {affinity}")
    return ServerOptions(
        model_path=args.model,
        host=args.host,
        port=args.port,
        n_parallel=args.parallel,
        cache_ram_mib=args.cache_ram,
        threads=args.threads,
        device=args.device,
        cache=cache,
        slot_affinity=bool(affinity),
        faults=faults,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.version:
        print(f"shadowlab-engine {engine_version()}")
        return 0
    if not args.model:
        build_parser().error("-m/--model is required")
    options = options_from_args(args)
    log = EngineLog(verbosity=args.verbosity, log_file=args.log_file)
    log.main(
        INFO,
        f"shadowlab-engine {engine_version()}, pid {os.getpid()}, "
        f"n_ctx = {options.cache.n_ctx}, n_batch = {options.cache.n_batch}, "
        f"n_ubatch = {options.cache.n_ubatch}, ctx_checkpoints = {options.cache.ctx_checkpoints}, "
        f"checkpoint_min_step = {options.cache.checkpoint_min_step}, cache_ram = {options.cache_ram_mib} MiB, "
        f"prompt_policy = {options.cache.prompt_policy}, prompt_end = {options.cache.prompt_end}, "
        f"slot_affinity = {int(options.slot_affinity)}, ckpt_retain = {options.cache.retain_mib} MiB, "
        f"faults = [{', '.join(options.faults.names())}]",
    )
    if not os.path.isfile(options.model_path):
        log.main(ERROR, f"error: model file not found: {options.model_path}")
        return 1
    try:
        return serve(options, log)
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
