"""Extension cost (issue 22, "Must show"): a new engine kind with its own log family is one
module of its own plus one registry line each — nothing else in shadowlab changes.

The kind below stands for a vLLM-like server: its own context flag (`--max-model-len`), no `-c`,
no split points, its own verbosity flag and its own log family, whose turns end with a line of
its own (the slot's release line). It is defined here, in the test, and registered with two calls
(`engines.register`, `engines.register_family`: the lines an `engines/<kind>/` package would run
at import). Then everything that reads kinds asks the registry: matrix validation accepts the
kind and its family and bounds its prompts by the kind's context, plan building gives every
cell the kind's flags, a kind flag nowhere appears outside `engines/`
(tests/shadowlab/test_layout_guards.py, which reads the registry and so guards this kind too),
and the runner finds a turn's log span with the family's own pattern.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from shadowlab import engines, plan, run
from shadowlab.engines.reference import ReferenceAdapter
from shadowlab.errors import MatrixError
from shadowlab.matrix import loads
from shadowlab.results import records
from shadowlab.results.records import CellStatus

KIND, FAMILY = "fixture-vllm", "fixture-vllm-log"

# Its log family: read by the reference parser (its engine below prints llama.cpp's lines), but
# a turn ends at a line of its own choosing (the slot's release), and it names no task ids.
LOG_FAMILY = engines.LogFamily(FAMILY, "reference", default_level=False, streams=True,
                               turn_end=re.compile(rb"\| stop processing"), task_id=None,
                               description="a test kind's own format")


class FixtureAdapter(ReferenceAdapter):
    """Drives the reference engine (a real process) under facts of its own."""

    kind = KIND
    log_family = FAMILY
    verbosity_flags = ("--log-level", "debug")
    context_flags = ("--max-model-len",)
    default_context = 2048
    split_control = "none"

    def command(self, spec: Any, cell_flags: Sequence[str], port: int, threads: int, log_file: Path) -> list[str]:
        # Its flags are its own: the reference engine underneath gets -lv 4 and its context.
        flags = list(cell_flags)
        kept = [f for i, f in enumerate(flags) if f not in ("--log-level", "debug", "--max-model-len")
                and (i == 0 or flags[i - 1] != "--max-model-len")]
        size, _ = self.context_size(flags)
        return super().command(spec, ["-lv", "4", "-c", str(size), *kept], port, threads, log_file)


@pytest.fixture
def fixture_kind() -> Iterator[None]:
    engines.register(KIND, FixtureAdapter)  # the one registry line of the kind
    engines.register_family(LOG_FAMILY)  # ... and of its log family
    try:
        yield
    finally:
        engines.unregister(KIND)
        engines.unregister_family(FAMILY)


MATRIX = """\
version: 1
name: extension
engines:
  vllm:
    kind: fixture-vllm
    model: {{preset: tiny, seed: 0}}
    flags: [--max-model-len, "{context}"]
    threads: 1
configurations:
  small: {{flags: [-cram, "0"]}}
prompts:
  A: {{kind: random, tokens: {tokens}, seed: 1}}
  B: {{kind: diverge, from: A, shared: 40, tokens: 60, seed: 2}}
sequences:
  AB: [A, B]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
identity: {{control: false}}
"""


def test_the_kind_and_its_family_are_accepted_and_bound_its_prompts(fixture_kind):
    spec = loads(MATRIX.format(context=512, tokens=100), file="m.yaml").engines["vllm"]
    assert (spec.kind, spec.log_family, spec.verbosity_flags) == (KIND, FAMILY, ("--log-level", "debug"))
    with pytest.raises(MatrixError) as info:  # 509 + n_predict 4 > its --max-model-len 512
        loads(MATRIX.format(context=512, tokens=509), file="m.yaml", check_files=False)
    assert "has 512 (--max-model-len 512)" in info.value.message
    loads(MATRIX.format(context=512, tokens=508), file="m.yaml", check_files=False)


def test_without_registration_neither_the_kind_nor_its_family_exists():
    assert KIND not in engines.known_kinds() and FAMILY not in engines.known_families()
    with pytest.raises(MatrixError, match="expected one of reference, llama-server, openai, got 'fixture-vllm'"):
        loads(MATRIX.format(context=512, tokens=100), file="m.yaml", check_files=False)


def test_plan_building_gives_every_cell_the_kinds_flags_and_plan_json_keeps_them(fixture_kind):
    matrix = loads(MATRIX.format(context=512, tokens=100), file="m.yaml")
    built = plan.build_plan(matrix)
    assert [c.id for c in built.cells] == ["vllm.small.AB", "vllm.small.cold.B"]
    for cell in built.cells:
        assert cell.engine_flags == ("--log-level", "debug", "--max-model-len", "512")
        assert cell.flags == ("-cram", "0") and cell.generation.n_predict == 4
    assert plan.Plan.from_dict(built.to_dict()) == built


def test_the_layout_guard_reads_the_new_kinds_flags_from_the_registry(fixture_kind):
    from test_layout_guards import kind_flags, kind_names

    assert "--max-model-len" in kind_flags() and {KIND, FAMILY} <= kind_names()


def test_the_runner_finds_each_turns_span_with_the_familys_own_pattern(fixture_kind, tmp_path, repo_root):
    """A real cell (the reference engine under the kind's flags): the runner closes each turn's
    span at the family's own turn-ending line (its slot's `stop processing`, not llama.cpp's
    `prompt eval time`) and reads no task ids, since the family has no such pattern."""
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(context=512, tokens=100))
    outcome = run.run(run.RunOptions(matrix_path=path, out=tmp_path / "run", model_cache=repo_root / "models",
                                     progress=lambda line: None))
    assert outcome.statuses == {"vllm.small.AB": CellStatus.OK, "vllm.small.cold.B": CellStatus.OK}
    layout = records.RunLayout(outcome.run_dir)
    meta = records.read_meta(layout.meta("vllm.small.AB"))
    assert meta.engine.kind == KIND and meta.engine.log_family == FAMILY
    assert meta.command[meta.command.index("-c") + 1] == "512" and "--max-model-len" not in meta.command
    log = layout.engine_log("vllm.small.AB").read_bytes()
    for turn in meta.turns:
        start, end = turn.log_offsets
        span = log[start:end]
        assert turn.http_status == 200 and turn.log_complete and turn.task_ids == []
        assert b"| stop processing" in span and b"prompt eval time" in span
