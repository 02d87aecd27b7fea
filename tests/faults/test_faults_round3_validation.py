"""Hostile matrices, round 3 (issue 21): every number of a matrix is finite and bounded by key.

Items covered:
   5. `ready_timeout_s: .nan` (or `.inf`) made the readiness deadline none: a slow-starting
      engine's run never ended. Every numeric key of the schema now declares its bounds
      (shadowlab/matrix/schema.py, shown in docs/matrix.md): NaN, ±infinity and a value beyond
      either bound are refused at load (exit 2), naming file, line, key path, the bound and the
      value — each key tried here, so a key added without bounds fails;
  12. (shape count) `conversations: 1000000000, turns: 4` was refused quoting 6,000,000,000
      turns (the default 6 turns, not the matrix's 4): a shape's figures are the matrix's.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from shadowlab.run import listeners
from shadowlab.bounds import Bounds, figure
from shadowlab.errors import MatrixError
from shadowlab.matrix import SCHEMA, loads

HOSTILE = Path(__file__).resolve().parents[1] / "shadowlab" / "hostile_engine.py"
TAG = "SHADOWLAB_TEST_ROUND3_TAG"


# ---------------------------------------------------------------------------- item 5, the run

SLOW_MATRIX = """\
version: 1
name: slow-start
engines:
  bad:
    kind: openai
    binary: {python}
    command: ['{{binary}}', {script}, --port, '{{port}}', --mode, slow-health]
    ready_timeout_s: {timeout}
    threads: 1
prompts:
  A: {{kind: chat, messages: [{{role: user, content: hi}}]}}
sequences:
  A: [A]
identity: {{control: false}}
"""


@pytest.fixture
def tag():
    """A tag in shadowlab's environment (so in its engines'): what a hung run left is killed."""
    value = uuid.uuid4().hex
    yield value
    for pid, seen in listeners.environment_values(TAG).items():
        if seen == value:
            psutil.Process(pid).kill()


@pytest.mark.parametrize("timeout", [".nan", ".inf", ".NaN", "-.inf"])
def test_a_readiness_deadline_of_nan_or_infinity_is_refused_before_anything_starts(tmp_path, tag, timeout):
    # The engine trickles /health forever: with the deadline NaN the run never ended (this
    # subprocess timed out before the fix). Now: exit 2 at once, nothing started.
    matrix = tmp_path / "m.yaml"
    matrix.write_text(SLOW_MATRIX.format(python=json.dumps(sys.executable), script=json.dumps(str(HOSTILE)),
                                         timeout=timeout))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "run", matrix, "--out", out], capture_output=True,
                          text=True, timeout=60, env={**os.environ, TAG: tag})
    line = 1 + matrix.read_text().splitlines().index(f"    ready_timeout_s: {timeout}")
    value = "nan" if "nan" in timeout.lower() else timeout.replace(".", "")
    assert f"{matrix}:{line}: engines.bad.ready_timeout_s: " in proc.stderr, proc.stderr
    assert f"got {value}" in proc.stderr or f"{value} is too large (at most 86400)" in proc.stderr, proc.stderr
    assert "86400" in proc.stderr or "> 0" in proc.stderr, proc.stderr
    assert proc.returncode == 2 and not out.exists()


# ---------------------------------------------------------------------------- item 5, every key

BASE = {
    "version": 1, "name": "bounds", "repeat": 1,
    "engines": {"e": {"kind": "reference", "model": {"preset": "tiny", "seed": 0}, "threads": 1,
                      "ready_timeout_s": 60},
                "g": {"kind": "llama-server", "model": {"gguf": {"preset": "tiny", "seed": 0}}}},
    "configurations": {"default": {"pin_slots": 0}},
    "prompts": {"R": {"kind": "random", "tokens": 8, "seed": 1},
                "D": {"kind": "diverge", "from": "R", "shared": 4, "tokens": 8, "seed": 2},
                "U": {"kind": "unrelated", "tokens": 8, "seed": 3},
                "P": {"kind": "append", "from": "R", "extra": 2, "seed": 4}},
    "sequences": {"s": ["R", "D", "U", "P"],
                  "t": {"kind": "traffic", "shape": {"conversations": 1, "turns": 2}},
                  "m": {"kind": "traffic", "trace": "t.jsonl", "limit": 1, "in_flight": 1}},
    "generation": {"n_predict": 4, "temperature": 0, "n_probs": 0},
    "isolation": {"cores_per_cell": 1, "gpus_per_cell": 1, "jobs": 1, "max_log_mib": 1024},
    "expectations": [{"sequence": "s", "turn": 0, "outcome": "cold", "min_reused": 0, "min_saved_fraction": 0,
                      "max_forced": 0, "checkpoints_created_at": [0], "min_recovered_share": 0}],
    "baseline": "default",
    "budgets": [{"max_created_per_turn": 1, "max_checkpoint_mib_per_turn": 1, "max_checkpoint_ms_per_turn": 1,
                 "min_net_benefit_ms": 0}],
    "scale": {"checkpoint_mib": 1, "checkpoint_ms": 1, "prompt_length_factor": 1, "prefill_ms_per_token": 1},
}
# Where each schema section's keys live in BASE. A section with a bounded key that is not here
# fails test_every_bounded_key_is_tried: a new one must say where it is.
WHERE = {
    "matrix": (), "engine": ("engines", "e"), "model": ("engines", "e", "model"),
    "gguf": ("engines", "g", "model", "gguf"), "configuration": ("configurations", "default"),
    "prompt.random": ("prompts", "R"), "prompt.diverge": ("prompts", "D"), "prompt.unrelated": ("prompts", "U"),
    "prompt.append": ("prompts", "P"), "sequence.traffic": ("sequences", "m"), "shape": ("sequences", "t", "shape"),
    "generation": ("generation",), "isolation": ("isolation",), "expectation": ("expectations", 0),
    "budget": ("budgets", 0), "scale": ("scale",),
}
NUMERIC_TYPE = re.compile(r"\bints?\b|number|size|weight")


def bounded_keys():
    for section, spec in SCHEMA.items():
        for key in spec.keys:
            if key.bounds is not None:
                yield section, key


def bad_values(bounds: Bounds) -> list[tuple[float, float | None]]:
    """(value, the bound a message must quote; None: NaN, which quotes both)."""
    step = 1 if bounds.integer or abs(bounds.high) < 1e15 else bounds.high
    below = bounds.low if bounds.low_open else bounds.low - 1
    above = bounds.high if bounds.high_open else bounds.high + step
    if bounds.integer:
        below, above = int(below), int(above)
    return [(float("nan"), None), (float("inf"), bounds.high), (float("-inf"), bounds.low),
            (below, bounds.low), (above, bounds.high)]


def test_every_numeric_key_declares_bounds_and_is_tried():
    for section, spec in SCHEMA.items():
        for key in spec.keys:
            numeric = bool(NUMERIC_TYPE.search(key.type))
            assert (key.bounds is not None) == numeric, f"{section}.{key.name}: {key.type}"
    assert {s for s, _ in bounded_keys()} <= set(WHERE)


@pytest.mark.parametrize("section, key", [pytest.param(s, k, id=f"{s}.{k.name}") for s, k in bounded_keys()])
def test_every_bounded_key_refuses_nan_infinity_and_out_of_range(tmp_path, section, key):
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    for value, bound in bad_values(key.bounds):
        doc = copy.deepcopy(BASE)
        body = doc
        for step in WHERE[section]:
            body = body[step]
        body.pop(key.name.removesuffix("_factor"), None)  # scale: a factor, not the figure too
        body[key.name], path = _placed(key.name, value, key.type)
        text = yaml.safe_dump(doc, sort_keys=False)
        with pytest.raises(MatrixError) as caught:
            loads(text, file="m.yaml", base_dir=tmp_path, check_files=False)
        err = caught.value
        where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in (*WHERE[section], key.name))
        assert err.file == "m.yaml" and err.key_path == (where + path).lstrip("."), (value, str(err))
        assert yaml.safe_dump(value).split("\n")[0] in text.splitlines()[err.line - 1], (value, str(err))
        assert (f"got {figure(value)}" in err.message or f"{figure(value)} is too large" in err.message), str(err)
        assert (key.bounds.text() if bound is None else figure(bound)) in err.message, (value, str(err))


def _placed(name: str, value: float, type_: str) -> tuple[object, str]:
    """How `value` is written for a key of this type, and the path below the key it lands at."""
    if type_.startswith("list"):
        return [value], "[0]"
    if name == "interloper_kinds":
        return {"zero": value}, ".zero"
    if name == "preamble":
        return {5: value}, ".5"
    return value, ""


# ---------------------------------------------------------------------------- item 12, the count

TRAFFIC = """\
version: 1
name: count
engines:
  e: {{kind: reference, model: {{preset: tiny, seed: 0}}}}
sequences:
  tr: {{kind: traffic, shape: {{{shape}}}}}
"""


@pytest.mark.parametrize("shape, path, figures, not_quoted", [
    # The issue's case: refused at the key, quoting the matrix's own figure (before: 6,000,000,000
    # turns, conversations × the default 6 turns).
    ("conversations: 1000000000, turns: 4", "sequences.tr.shape.conversations",
     "1000000000 is too large (at most 4096)", "6,000,000,000"),
    ("conversations: 4096, turns: 4096", "sequences.tr.shape", "about 16,777,216 requests", "24,576"),
    ("conversations: 1000, turns: 4, interloper_share: 0.5", "sequences.tr.shape", "about 8,000 requests", "12,000"),
])
def test_a_shape_too_large_is_refused_with_its_own_figures(shape, path, figures, not_quoted):
    with pytest.raises(MatrixError) as caught:
        loads(TRAFFIC.format(shape=shape), file="m.yaml", check_files=False)
    err = caught.value
    assert err.key_path == path and figures in err.message and not_quoted not in str(err), str(err)
    assert err.line == 6
