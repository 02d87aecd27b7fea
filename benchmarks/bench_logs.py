"""shadowlab logs, the command, side by side with `grep -c` on real captures and a generated log.

    python benchmarks/bench_logs.py [--real-gb 0.5] [--gb 1.0] [--repeat 3] [--dir /tmp/bench_logs]
                                    [--only real|generated] [--dense] [--no-gz] [--base CHECKOUT]

Two logs, each with a 0.1 GB head of its own (the peak RSS at 0.1 GB against the whole):

- real: the project's real b11434 captures (tests/fixtures/logs/llama-server, llama.cpp-b11434*,
  llama-server's defaults among them: `-cram 8192`, idle-slot saves and clears), one after
  another and over again to --real-gb: a server restart (its own start-up lines) between each;
- generated: scripts/make_prodlogs.py traffic repeated to --gb (each copy starts again at task
  0 and time 0: a restart); --dense: its lifecycle lines only, the reader's worst case.

Each file is read once just before (every command reads from the page cache, said in the
output). Then, interleaved --repeat times: `grep -c "context checkpoint"` writing to a pipe
(GNU grep given /dev/null as its output stops at the first match and times nothing), and the
command three ways: `shadowlab logs --json`, `shadowlab logs --trace FILE` (the summary and the
trace written), `shadowlab logs --slot 0 --json` (a filter). Before each, untimed, the last trace
file is deleted and dirty pages are written back (`settle`): truncating the last ~100 MB trace
and its writeback would otherwise be charged to, or run under, the next command; then 256 MB of
page cache is written and freed, so that every command (grep too) takes its pages off the
kernel's free lists. On a VM that reports free memory to its host (this one: free page
reporting, page_reporting_order=11) a page the host took back costs a fault into the host at its
first touch, ~10x the CPU of writing the trace (0.22-0.29 s against 0.02-0.03 s per 113 MB); the
row `--trace, cold pages` is the trace written after that has happened (6 s after the freeing,
no recycling). The figures are the median of each
(wall clock and CPU, user + sys: on a shared machine the wall clock mostly measures the other
load, so the ratios are given for both; every run is listed), beside them the least CPU time of
each and its ratio to grep's least (the quietest moment: benchmarks/fold_series.py shows a VM's
compute moving under the fold in phases of seconds while grep's kind of work barely slows; the
median stays the figure), and the peak RSS of each mode on
the 0.1 GB head and on the whole file (flat: within 50 MiB). The .gz of the generated log is
read against `zcat | grep -c` once.

`--base CHECKOUT` (another tree, its accelerator built in place: `git worktree add ../base REV`,
`python setup.py build_ext --inplace` there) runs every mode of that tree too, in the same
rounds, each command from its own tree: a change measured side by side under the same load.

shadowlab's modules are byte-compiled first, as `pip install` does (where PYTHONDONTWRITEBYTECODE
is set, every start would otherwise compile them from source), and the start-up alone
(`shadowlab logs --help`) is timed too. The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_prodlogs  # noqa: E402

CAPTURES = ROOT / "tests" / "fixtures" / "logs"
MODES = (("--json", ("--json",)), ("--trace", ("--trace", "{trace}")), ("--slot 0", ("--slot", "0", "--json")))
COLD = "--trace, cold pages"  # the trace written into pages the host took back (settle's `cold`)


def real_captures() -> list[Path]:
    """The real b11434 captures, in a fixed order."""
    return sorted(CAPTURES.glob("llama-server/*.log")) + sorted(CAPTURES.glob("llama.cpp-b11434*/*.log"))


def build_real(path: Path, size: int) -> int:
    block = b"".join(p.read_bytes() for p in real_captures())
    with open(path, "wb") as out:
        while out.tell() < size:
            out.write(block)
    return len(real_captures())


def build_generated(path: Path, size: int, dense: bool) -> None:
    seed_dir = path.parent / ("seed-dense" if dense else "seed")
    make_prodlogs.generate(seed_dir, "b11434", seed=0, requests=2000, slots=2, pieces=1, days=1, chatter=not dense)
    block = (seed_dir / "server0.log").read_bytes()
    with open(path, "wb") as out:
        while out.tell() < size:
            out.write(block)


def head_of(big: Path, small: Path, size: int) -> None:
    with open(big, "rb") as src, open(small, "wb") as dst:
        dst.write(src.read(size).rsplit(b"\n", 1)[0] + b"\n")


def timed(cmd: str, out: Path, tree: Path = ROOT) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS KiB) of a shell command whose stdout goes to `out`, run in `tree`."""
    with open(out, "wb") as fh:
        # cwd=tree: `python -m shadowlab` puts the working directory first on sys.path, so run
        # from elsewhere it would time whichever shadowlab lies there, not this tree's
        p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", "sh", "-c", cmd], stdout=fh, stderr=subprocess.PIPE,
                           text=True, check=False, cwd=tree)
    wall, user, system, rss = p.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(system), int(rss)


def warm(path: Path) -> int:
    """Read it once (into the page cache); its line count."""
    lines = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            lines += chunk.count(b"\n")
    return lines


RECYCLE = 256 << 20  # bytes of page cache written and freed before each timed command (settle)
COLD_WAIT = 6.0  # seconds after freeing before a "cold pages" run: the kernel reports free pages after 2 s


def settle(trace: Path, cold: bool = False) -> None:
    """Before each timed command, untimed: the last --trace file goes (opening it again with "w"
    would truncate ~100 MB of it, the kernel's work charged to the next run) and the dirty pages
    are written back (or their writeback would run under the next command). Then RECYCLE bytes
    are written to a scratch file and deleted, so the pages the command takes (its trace's page
    cache, its heap) come off the kernel's free lists: a VM that reports its free memory to the
    host (free page reporting: Firecracker's balloon, page_reporting_order on the kernel command
    line) gets each page it reported back by a fault into the host at its first touch, and on
    such a VM writing ~100 MB into reported pages costs ~10x the CPU of writing them into free
    ones (0.22-0.29 s against 0.02-0.03 s, measured). ``cold``: no recycling, and COLD_WAIT
    seconds for the free memory to be reported first: the run pays those faults."""
    trace.unlink(missing_ok=True)
    os.sync()
    if cold:
        time.sleep(COLD_WAIT)
        return
    scratch = trace.with_name("recycle.bin")
    block = b"\0" * (4 << 20)
    with open(scratch, "wb") as fh:
        for _ in range(RECYCLE // len(block)):
            fh.write(block)
    scratch.unlink()  # its pages go back to the free lists at once (a deleted file's dirty pages are dropped)


def median_run(runs: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """The run of median CPU time (its wall clock and RSS with it)."""
    return sorted(runs, key=lambda r: r[1])[len(runs) // 2]


def least(runs: list[tuple[float, float, int]]) -> float:
    """The least CPU time of the runs: the one that ran in the machine's quietest moment (on a VM
    whose host moves its compute under the bench, fold_series.py shows it: the median's ratio to
    grep falls in slow phases because grep's streaming slows least). Printed beside the median,
    which stays the figure; never in place of it."""
    return min(r[1] for r in runs)


def command(log: Path, args: tuple[str, ...], trace: Path) -> str:
    return " ".join([sys.executable, "-m", "shadowlab", "logs", *(a.format(trace=trace) for a in args), str(log)])


def bench(name: str, big: Path, small: Path, repeat: int, work: Path, base: Path | None = None) -> None:
    """Every mode, interleaved with grep; with `base` (another checkout, built), every mode of
    that tree too, in the same rounds: the two trees side by side under the same load."""
    lines = warm(big)
    warm(small)
    out, trace = work / "out.txt", work / "trace.jsonl"
    grep = f'grep -c "context checkpoint" {big} | cat'
    trees = {"": ROOT} if base is None else {" (base)": base, "": ROOT}
    runs: dict[str, list[tuple[float, float, int]]] = {"grep": []}
    for _ in range(repeat):  # interleaved: the load changes under all of them alike
        settle(trace)
        runs["grep"].append(timed(grep, out))
        for mode, args in MODES:
            for label, tree in trees.items():
                settle(trace)
                runs.setdefault(mode + label, []).append(timed(command(big, args, trace), out, tree))
        for label, tree in trees.items():
            settle(trace, cold=True)
            runs.setdefault(COLD + label, []).append(timed(command(big, dict(MODES)["--trace"], trace), out, tree))
    heads = {}
    for mode, args in MODES:
        for label, tree in trees.items():
            settle(trace)
            heads[mode + label] = timed(command(small, args, trace), out, tree)
    g = median_run(runs["grep"])
    g_least = least(runs["grep"])
    print(f"\n{name}: {big.stat().st_size / 1e9:.2f} GB, {lines:,} lines; grep -c to a pipe: "
          f"{g[0]:.2f} s wall, {g[1]:.2f} s CPU, least {g_least:.2f} s (runs: "
          f"{', '.join(f'{r[1]:.2f}' for r in runs['grep'])})")
    for mode, _ in MODES:
        for label in trees:
            s, head = median_run(runs[mode + label]), heads[mode + label]
            lo = least(runs[mode + label])
            print(f"  shadowlab logs {mode}{label}: {s[0]:.2f} s wall, {s[1]:.2f} s CPU = {lines / s[1] / 1e6:.2f}M "
                  f"lines/s CPU; ratio {g[0] / s[0]:.2f}x wall, {g[1] / s[1]:.2f}x CPU; least {lo:.2f} s CPU = "
                  f"{g_least / lo:.2f}x (runs: {', '.join(f'{r[1]:.2f}' for r in runs[mode + label])}); "
                  f"peak RSS 0.1 GB {head[2] / 1024:.0f} MiB, whole {s[2] / 1024:.0f} MiB (+{(s[2] - head[2]) / 1024:.0f})")
    for label in trees:
        s = median_run(runs[COLD + label])
        lo = least(runs[COLD + label])
        print(f"  shadowlab logs {COLD}{label}: {s[0]:.2f} s wall, {s[1]:.2f} s CPU; ratio {g[1] / s[1]:.2f}x CPU; "
              f"least {lo:.2f} s = {g_least / lo:.2f}x (runs: {', '.join(f'{r[1]:.2f}' for r in runs[COLD + label])})")
    if base is not None:  # each round's two runs ran a few seconds apart: their ratio shares its load
        for mode in [m for m, _ in MODES] + [COLD]:
            pairs = sorted(a[1] / b[1] for a, b in zip(runs[mode], runs[mode + " (base)"]))
            print(f"  {mode}: this tree / base, round by round: median {pairs[len(pairs) // 2]:.2f} "
                  f"({', '.join(f'{x:.2f}' for x in pairs)})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real-gb", type=float, default=0.5)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_logs"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("real", "generated"), default=None)
    ap.add_argument("--no-gz", action="store_true", help="skip the .gz of the generated log")
    ap.add_argument("--base", type=Path, default=None,
                    help="another checkout (built in place) timed side by side with this one")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    for tree in (ROOT, a.base) if a.base is not None else (ROOT,):
        for package in (tree / "shadowlab", tree / "engine"):
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True, stdout=subprocess.DEVNULL)
    load0 = os.getloadavg()
    print(f"nproc {os.cpu_count()}; load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          "every file read from the page cache (each read once just before)")
    start = timed(f"{sys.executable} -m shadowlab logs --help", a.dir / "out.txt")
    print(f"start-up (shadowlab logs --help): {start[0]:.2f} s wall, {start[1]:.2f} s CPU")
    if a.only in (None, "real"):
        real, real_head = a.dir / "real.log", a.dir / "real-0.1.log"
        n = build_real(real, int(a.real_gb * 1e9))
        head_of(real, real_head, int(0.1e9))
        bench(f"real captures ({n} b11434 captures over and over, a restart between each)", real, real_head,
              a.repeat, a.dir, a.base)
    if a.only in (None, "generated"):
        big, small = a.dir / "generated.log", a.dir / "generated-0.1.log"
        build_generated(big, int(a.gb * 1e9), a.dense)
        head_of(big, small, int(0.1e9))
        bench(f"generated ({'dense' if a.dense else 'realistic'}, make_prodlogs.py)", big, small, a.repeat, a.dir,
              a.base)
        if not a.no_gz:
            gz = Path(str(big) + ".gz")
            with open(big, "rb") as src, gzip.open(gz, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
            warm(gz)
            zg = timed(f'zcat {gz} | grep -c "context checkpoint"', a.dir / "out.txt")
            zs = timed(command(gz, ("--json",), a.dir / "trace.jsonl"), a.dir / "out.txt")
            print(f"  .gz: zcat | grep -c {zg[0]:.2f} s wall, {zg[1]:.2f} s CPU; shadowlab logs --json {zs[0]:.2f} s "
                  f"wall, {zs[1]:.2f} s CPU; ratio {zg[0] / zs[0]:.2f}x wall; peak RSS {zs[2] / 1024:.0f} MiB")
    load1 = os.getloadavg()
    print(f"\nload average after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
