"""The noise band of policy0 vs defaults on A→C over the first N repeats of a `repeat: 8` run
(matrices/ckpt-repeat.yaml): shows the band narrowing as N grows (README, Comparing baseline and candidate).

    python benchmarks/noise_band.py RUN_DIR
"""
import sys
from shadowlab import compare
from shadowlab.judge import gate
from shadowlab.results import rundir
run = rundir.load(sys.argv[1]); v = gate.judge(run)
b = compare.repeats_by_key(run, v, "defaults"); c = compare.repeats_by_key(run, v, "policy0")
key = next(iter(b))
for name in ("prefill_ms", "startup_ms"):
    m = next(x for x in compare.METRICS if x.name == name)
    for n in (2, 3, 4, 6, 8):
        d = compare.judge(m, [f.value(m) for _, f in b[key][:n]], [f.value(m) for _, f in c[key][:n]])
        print(f"{name:<11} N={n}  delta {d.delta:+8.1f}  band [{d.band[0]:+9.1f}, {d.band[1]:+9.1f}]  width {d.band[1]-d.band[0]:8.1f}  {d.judgement}")
