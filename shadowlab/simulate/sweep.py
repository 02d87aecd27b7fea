"""`shadowlab simulate --sweep KEY=V1,V2,...`: a grid of policies over one traffic, on local
cores (`--jobs N`, processes) or on a Dask cluster (`--cluster ADDRESS`, the `cluster` extra).

The grid is every combination of the swept values applied to each `--policy` (the first key
varies slowest). The work is cut into one task per worker: a task reads the traffic itself
(streamed, from its path: nothing but the path and the policies' texts travels) and simulates
its share of the grid points; the first task also computes the traffic's shape and ideals
(once per run). Each point's figures are a pure function of the traffic and the policy
(`tally.PolicyTally.partial`), joined by `tally.policy_doc` in the order of the grid, so the
JSON is the same bit for bit whatever the executor and the number of jobs
(tests/shadowlab/test_simulate_sweep.py).

Why Dask and not Ray: `distributed.Client.get_executor()` is a `concurrent.futures.Executor`,
the interface the local pool already has, so one code path serves both; it is pure Python on
PyPI (a few MiB with its dependencies, where Ray is a ~70 MiB wheel with its own object store
and daemons that a 2-core machine shared by six engineers cannot spare); a LocalCluster of two
worker processes starts in seconds for the test, and `dask scheduler` / `dask worker HOST` is
all a cluster needs.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowlab.errors import TrafficError
from shadowlab.simulate.model import _FIELDS, parse_policy
from shadowlab.simulate.sources import open_source
from shadowlab.simulate.tally import PolicyTally, ShapeRun, one_pass

# Short names for the keys a sweep is usually about (llama-server's flags); a Policy field name
# works too.
ALIASES = {"cram": "cache_ram_mib", "cache_ram": "cache_ram_mib", "np": "slots", "parallel": "slots",
           "b": "n_batch", "ub": "n_ubatch", "cms": "checkpoint_min_step", "checkpoint_step": "checkpoint_min_step",
           "retain": "retain_mib", "c": "n_ctx", "ctx_size": "n_ctx"}
MAX_POINTS = 4096  # grid points in one sweep: beyond this, a typo (`--sweep slots=1,...` pasted twice)
KNEE_SHARE = 0.95  # the knee: the first point reaching this much of the best recovered share
CLUSTER_HINT = "pip install 'shadowlab[cluster]' (Dask's distributed), then start `dask scheduler` and workers"


@dataclass(frozen=True)
class Sweep:
    keys: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]  # per key, the values as given

    def points(self, bases: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
        """(policy text, {key: value}) for each grid point, in grid order."""
        out = []
        for base in bases:
            for combo in itertools.product(*self.values):
                chosen = dict(zip(self.keys, combo))
                items = ",".join(f"{k}={v}" for k, v in chosen.items())
                out.append((base + ("," if ":" in base else ":") + items, chosen))
        return out


def parse_sweeps(texts: Sequence[str]) -> Sweep:
    """`KEY=V1,V2,...` per --sweep; keys are Policy fields or ALIASES; each key once."""
    keys, values = [], []
    for text in texts:
        key, eq, rest = text.partition("=")
        key = key.strip().replace("-", "_")
        key = ALIASES.get(key, key)
        items = tuple(v.strip() for v in rest.split(",") if v.strip())
        if not eq or key not in _FIELDS or key == "name" or not items:
            raise TrafficError(f"--sweep {text!r} is not KEY=V1,V2,... with a known key",
                               hint="keys: " + ", ".join(sorted({*ALIASES, *(k for k in _FIELDS if k != 'name')})))
        if key in keys:
            raise TrafficError(f"--sweep {text!r}: {key} is swept twice", hint="give all its values in one --sweep")
        repeated = sorted({v for v in items if items.count(v) > 1})
        if repeated:  # the grid would hold the same point twice, and the knee would read it twice
            raise TrafficError(f"--sweep {text!r}: {', '.join(repeated)} given more than once",
                               hint="give each value once, from the least to the most")
        keys.append(key)
        values.append(items)
    count = math.prod(len(v) for v in values)
    if count > MAX_POINTS:
        raise TrafficError(f"--sweep: {count:,} grid points, more than {MAX_POINTS:,}", hint="fewer values per key")
    return Sweep(tuple(keys), tuple(values))


def knee(shares: Sequence[float | None]) -> int | None:
    """The first grid point whose recovered share reaches KNEE_SHARE of the best one: where more
    of the swept resource stops paying (the values are taken in the order they were given, so give
    them from the least to the most)."""
    known = [s for s in shares if s is not None]
    if not known or max(known) <= 0:
        return None
    best = max(known)
    return next(i for i, s in enumerate(shares) if s is not None and s >= KNEE_SHARE * best)


def simulate_points(source: str, policy_texts: Sequence[str], prefill_tps: float,
                    with_shape: bool) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """One task: the traffic at `source` (a path or `shape:NAME`) read again here, its shape when
    asked, and each policy's partial figures. Top-level, so a process pool and a Dask worker can
    import it."""
    stream, inference = open_source(source)
    tallies = [PolicyTally(parse_policy(t), prefill_tps, per_turn=False) for t in policy_texts]
    shape = ShapeRun(per_turn=False) if with_shape else None
    one_pass(stream.requests, tallies, shape)
    if shape is None:
        return None, [t.partial() for t in tallies]
    given = {"source": "given"}
    side = {**shape.result(), "source": _source_fields(stream),
            "conversations": inference.summary() if inference is not None else given}
    return side, [t.partial() for t in tallies]


def _source_fields(stream: Any) -> dict[str, Any]:
    return {"source": stream.source, "format": stream.format, "skipped": list(stream.skipped),
            "block_size": stream.block_size}


def run_grid(source: Path | str, policy_texts: Sequence[str], prefill_tps: float, jobs: int = 1,
             cluster: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the traffic's side with its source fields, each point's partial figures in grid order)."""
    text = str(source)
    if jobs <= 1 and cluster is None:
        shape, parts = simulate_points(text, policy_texts, prefill_tps, True)
        assert shape is not None
        return shape, parts
    with _executor(jobs, cluster) as (pool, workers):
        chunks = _chunks(list(policy_texts), workers)
        futures = [pool.submit(simulate_points, text, chunk, prefill_tps, i == 0) for i, chunk in enumerate(chunks)]
        results = [f.result() for f in futures]
    by_text: dict[str, dict[str, Any]] = {}
    for chunk, (_, parts) in zip(chunks, results):
        by_text.update(zip(chunk, parts))
    shape = results[0][0]
    assert shape is not None
    return shape, [by_text[t] for t in policy_texts]


def _chunks(items: list[str], n: int) -> list[list[str]]:
    """Round-robin: neighbouring grid points (alike in cost) go to different workers."""
    n = max(1, min(n, len(items)))
    return [items[i::n] for i in range(n)]


@contextlib.contextmanager
def _executor(jobs: int, cluster: str | None) -> Iterator[tuple[Any, int]]:
    """(a concurrent.futures executor, how many tasks it runs at once)."""
    if cluster is None:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            yield pool, jobs
        return
    try:
        from distributed import Client
    except ImportError:
        raise TrafficError("--cluster needs Dask's distributed, which is not installed", hint=CLUSTER_HINT) from None
    try:
        client = Client(cluster, timeout="30s")
    except (OSError, TimeoutError) as exc:
        raise TrafficError(f"--cluster {cluster}: no Dask scheduler answers there ({exc})", hint=CLUSTER_HINT) from None
    try:
        yield client.get_executor(pure=False), max(1, sum(client.nthreads().values()))
    finally:
        client.close()
