"""The noise band of policy0 vs defaults on A→C over the first N repeats of a `repeat: 8` run
(matrices/ckpt-repeat.yaml): shows the band narrowing as N grows (README, Comparing baseline and candidate).

    python benchmarks/noise_band.py RUN_DIR
"""
import argparse

from shadowlab import compare
from shadowlab.judge import gate
from shadowlab.results import rundir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a `repeat: 8` run of matrices/ckpt-repeat.yaml")
    run = rundir.load(ap.parse_args().run_dir)
    v = gate.judge(run)
    b = compare.repeats_by_key(run, v, "defaults")
    c = compare.repeats_by_key(run, v, "policy0")
    key = next(iter(b))
    for name in ("prefill_ms", "startup_ms"):
        m = next(x for x in compare.METRICS if x.name == name)
        for n in (2, 3, 4, 6, 8):
            d = compare.judge(m, [f.value(m) for _, f in b[key][:n]], [f.value(m) for _, f in c[key][:n]])
            print(f"{name:<11} N={n}  delta {d.delta:+8.1f}  band [{d.band[0]:+9.1f}, {d.band[1]:+9.1f}]  "
                  f"width {d.band[1] - d.band[0]:8.1f}  {d.judgement}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
