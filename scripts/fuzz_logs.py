"""Differential fuzz of `shadowlab logs`: mutated real captures, each read three ways.

    python scripts/fuzz_logs.py [--rounds 500] [--seed 0] [--intensity 40] [--keep DIR]

Each round takes a stretch of a fixture log (tests/fixtures/logs: every build there), mutates it
line by line (lines deleted, repeated, swapped, joined, cut, spliced in from other captures; a
number set to 0, -1, 007 or 20 digits; a float to 400 digits; a slot id changed; NUL, CR, ANSI,
bad UTF-8, a stray `| task N |` or a side note's text inserted; a timestamp made huge) and reads it as
`shadowlab logs --json --trace` does, three ways: the C fold (at a random block size: 997,
4099 or 1 MiB bytes), the Python replay over the C scan, and pure Python, with a random filter
(none, a slot, --since/--until). The documents and the trace text must be equal, and no way may
raise. A failing round's log is kept in --keep and named with its round; the first differences
are printed. tests/shadowlab/test_logscan.py runs a few seeded rounds in CI.

Found this way (and fixed): a 20-digit number crashed the command (Figures' int64 arrays), a
400-digit float reached --trace as `inf`, and a headless `prompt eval time` took a different
owner when a block ended between it and its header.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
_NUMBER = re.compile(rb"-?\d+")
_FLOAT = re.compile(rb"\d+\.\d+")
_STAMP = re.compile(rb"^\d+\.\d+\.\d+\.\d+")
_HEAD_ID = re.compile(rb"id +\d+ \|")


def sources() -> list[list[bytes]]:
    """The fixture logs, as lines (newline kept)."""
    return [p.read_bytes().splitlines(keepends=True) for p in sorted(FIXTURES.glob("*/*.log"))]


# side-note text put inside another line (a trigger line's tail among them: the fold finds the
# notes there in the finder's newline search, not in its chunks)
_NOTES = (b"id  1 | task 7 | checking checkpoint with [3, 3] against 5...", b"hecking ",
          b"id  0 | task -1 |  - checking sim = 0.500 (3/9) > 0.100", b"Checking checkpoint with [")


def mutate(rng: random.Random, lines: list[bytes], pool: list[bytes], intensity: int) -> list[bytes]:
    """`lines` with 1 to `intensity` random edits; `pool`: lines to splice in."""
    out = list(lines)
    for _ in range(rng.randrange(1, max(2, intensity))):
        if not out:
            break
        k, op = rng.randrange(len(out)), rng.randrange(13)
        line = out[k]
        if op == 0:
            del out[k]
        elif op == 1:
            out.insert(k, out[rng.randrange(len(out))])
        elif op == 2 and k + 1 < len(out):
            out[k], out[k + 1] = out[k + 1], out[k]
        elif op in (3, 4) and (found := list(_NUMBER.finditer(line))):
            m = rng.choice(found)
            value = rng.choice([b"0", b"1", b"-1", b"9" * 20, b"007", str(int(m.group()) + rng.randrange(-3, 4)).encode()])
            out[k] = line[:m.start()] + value + line[m.end():]
        elif op == 5:
            out[k] = line[: rng.randrange(len(line) + 1)].rstrip(b"\n") + b"\n"
        elif op == 6:
            out.insert(k, rng.choice(pool))
        elif op == 7:
            j = rng.randrange(len(out))
            out[k:k] = out[j:j + rng.randrange(1, 30)]
        elif op == 8:
            out[k] = _HEAD_ID.sub(b"id  %d |" % rng.randrange(4), line, count=1)
        elif op == 9 and k + 1 < len(out):
            out[k:k + 2] = [line.rstrip(b"\n") + b" " + out[k + 1]]
        elif op == 10:
            j = rng.randrange(len(line) + 1)
            out[k] = line[:j] + rng.choice([b"\x00", b"\r", b"\x1b[31m", b"\xff\xfe", b"|", b" | task 3 | ", *_NOTES]) + line[j:]
        elif op == 11 and (found := list(_FLOAT.finditer(line))):
            m = rng.choice(found)
            value = rng.choice([b"9" * 400 + b".0", b"0.0", b"1" * 30 + b".5", b"0." + b"0" * 50 + b"1"])
            out[k] = line[:m.start()] + value + line[m.end():]
        elif op == 12:
            out[k] = _STAMP.sub(rng.choice([b"9" * 30 + b".00.000.000", b"0.00.000.000", b"99.99.999.999"]), line, count=1)
    return out


def filters() -> list[Callable[[], dict[str, Any]] | None]:
    from shadowlab.logs import analysis as logs

    return [None, None, lambda: {"slot": 0}, lambda: {"slot": 1}, lambda: {"since": logs.parse_time("2")},
            lambda: {"until": logs.parse_time("3")},
            lambda: {"since": logs.parse_time("1"), "until": logs.parse_time("8")}]


def three_ways(paths: list[Path], block: int, options: Callable[[], dict[str, Any]] | None) -> tuple[list, list]:
    """(documents, trace texts) of the fold at `block`, the replay over the C scan, pure Python."""
    from pytest import MonkeyPatch

    from shadowlab.logs import analysis as logs
    from shadowlab.logs import reading

    docs, traces = [], []

    def analyse() -> None:
        o = logs.Options(**(options() if options else {}))
        o.trace = io.StringIO()
        doc = logs.analyse([str(p) for p in paths], o)
        doc.pop("reader")  # which reader read it: the one thing that differs
        docs.append(doc)
        traces.append(o.trace.getvalue())

    mp = MonkeyPatch()
    try:
        mp.setattr(logs, "_FOLD_BLOCK", block)
        analyse()
        mp.setattr(logs, "_FOLD_BLOCK", 1 << 20)
        mp.setattr(logs, "FOLD", False)
        analyse()
        mp.setattr(reading, "_logscan", None)
        analyse()
    finally:
        mp.undo()
    return docs, traces


def differences(docs: list, traces: list) -> list[str]:
    out = []
    for name, i in (("fold vs replay", 1), ("fold vs pure Python", 2)):
        if docs[0] != docs[i]:
            a, b = (json.dumps(d, indent=1, default=repr).splitlines() for d in (docs[0], docs[i]))
            out.append(f"{name}: " + "; ".join(f"{x.strip()} | {y.strip()}" for x, y in zip(a, b) if x != y)[:600])
        if traces[0] != traces[i]:
            out.append(f"{name}: the --trace text differs")
    return out


def one_round(round_no: int, texts: list[list[bytes]], pool: list[bytes], intensity: int, path: Path) -> list[str]:
    """What went wrong in round `round_no` (its log written to `path`); empty: nothing."""
    rng = random.Random(round_no)
    base = texts[rng.randrange(len(texts))]
    if len(base) > 3000:
        at = rng.randrange(len(base) - 2000)
        base = base[at:at + 2000]
    text = b"".join(mutate(rng, base, pool, intensity))
    path.write_bytes(text)
    paths = [path]
    if rng.random() < 0.3:  # rotated pieces (path.2, path.1, path; some gzipped), cut anywhere
        cuts = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        pieces = [text[:cuts[0]], text[cuts[0]:cuts[1]], text[cuts[1]:]]
        paths = []
        for i, piece in enumerate(pieces):
            name = path if i == 2 else path.with_name(f"{path.name}.{2 - i}")
            if rng.random() < 0.3:
                name, piece = name.with_name(name.name + ".gz"), gzip.compress(piece)
            name.write_bytes(piece)
            paths.append(name)
    block = rng.choice([1 << 20, 4099, 997])
    options = rng.choice(filters())
    try:
        docs, traces = three_ways(paths, block, options)
    except Exception:  # noqa: BLE001 - any exception is the finding
        return ["raised: " + traceback.format_exc()[-1200:]]
    return [f"block {block}: {d}" for d in differences(docs, traces)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0, help="the first round's number (rounds are seeded by it)")
    ap.add_argument("--intensity", type=int, default=40, help="at most this many edits per log")
    ap.add_argument("--keep", type=Path, default=Path("fuzz-logs"), help="where failing rounds' logs are kept")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    texts = sources()
    pool = [line for text in texts for line in text]
    args.keep.mkdir(parents=True, exist_ok=True)
    failed = 0
    for n in range(args.seed, args.seed + args.rounds):
        path = args.keep / f"round{n}.log"
        found = one_round(n, texts, pool, args.intensity, path)
        if found:
            failed += 1
            print(f"round {n} ({path}):", *found, sep="\n  ", flush=True)
        else:
            for p in args.keep.glob(f"round{n}.log*"):
                p.unlink()
    print(f"{args.rounds} rounds, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
