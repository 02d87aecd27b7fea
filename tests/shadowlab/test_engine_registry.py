"""An engine kind is one adapter registered by its `kind`: matrix validation, the runner and the
generated docs ask the registry, so a kind defined here, in the test, runs a matrix cell through
the real run stage with its own defaults (docs/DESIGN.md §3).

The kind `standin-test` drives the reference engine (it subclasses the reference adapter) with
defaults of its own, each of which would be wrong for kind `reference`, so a run that shows them
shows they came from the registered adapter: log family `llama.cpp` (the reference engine prints
llama.cpp b11434's lines), verbosity spelled `--verbosity 4`, a default context of 1024 tokens
which its command passes on as `-c 1024`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from shadowlab import engines, run
from shadowlab.results import records
from shadowlab.engines.reference import ReferenceAdapter
from shadowlab.errors import MatrixError
from shadowlab.matrix import load, loads, reference_markdown
from shadowlab.results.records import CellStatus

KIND = "standin-test"


class StandinAdapter(ReferenceAdapter):
    kind = KIND
    log_family = "llama.cpp"
    verbosity_flags = ("--verbosity", "4")
    model_sources = ("preset",)
    model_hint = "kind standin-test takes {preset, seed}"
    default_context = 1024

    def command(self, spec: Any, cell_flags: Sequence[str], port: int, threads: int,
                log_file: Path) -> list[str]:
        argv = super().command(spec, cell_flags, port, threads, log_file)
        return argv if "-c" in argv else [*argv, "-c", str(self.default_context)]


@pytest.fixture
def standin_kind() -> Iterator[None]:
    engines.register(KIND, StandinAdapter)
    try:
        yield
    finally:
        engines.unregister(KIND)  # the docs test sees the built-in kinds only


MATRIX = """\
version: 1
name: registry
engines:
  standin:
    kind: {kind}
    model: {{preset: tiny, seed: 0}}
    flags: [-b, 64, -ub, 32, --ctx-checkpoints, 8, -cram, 0, -np, 1]
    threads: 1
prompts:
  A: {{kind: random, tokens: {tokens}, seed: 1}}
sequences:
  A: [A]
generation: {{n_predict: 4, temperature: 0}}
isolation: {{cores_per_cell: 1}}
identity: {{control: false}}
"""


def test_a_kind_registered_by_a_test_runs_a_cell_with_its_own_defaults(standin_kind, tmp_path, repo_root):
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(kind=KIND, tokens=100))
    spec = load(path).engines["standin"]
    assert (spec.log_family, spec.verbosity_flags) == ("llama.cpp", ("--verbosity", "4"))

    outcome = run.run(run.RunOptions(matrix_path=path, out=tmp_path / "run", model_cache=repo_root / "models",
                                     progress=lambda line: None))
    assert outcome.statuses == {"standin.default.A": CellStatus.OK}
    meta = records.read_meta(records.RunLayout(outcome.run_dir).meta("standin.default.A"))
    assert meta.engine.kind == KIND and meta.engine.log_family == "llama.cpp"
    command = meta.command
    assert command[command.index("--verbosity") + 1] == "4" and "-lv" not in command
    assert command[command.index("-c") + 1] == "1024"
    (turn,) = meta.turns
    assert turn.http_status == 200 and len(turn.completion.tokens) == 4


def test_the_kinds_default_context_bounds_its_prompts(standin_kind):
    err = _refused(MATRIX.format(kind=KIND, tokens=1021))  # 1021 + n_predict 4 > 1024
    assert "has 1024 (the standin-test engine's default 1024)" in err.message
    loads(MATRIX.format(kind=KIND, tokens=1020), file="m.yaml")  # 1020 + 4 fits


def test_the_kinds_model_sources_are_the_ones_accepted(standin_kind):
    err = _refused(MATRIX.format(kind=KIND, tokens=10).replace("{preset: tiny, seed: 0}", "{path: m.gguf}"))
    assert err.key_path == "engines.standin.model"
    assert err.message == "a standin-test engine cannot load a path model" and err.hint == StandinAdapter.model_hint


def test_an_unknown_kind_is_refused_naming_the_registered_kinds(standin_kind):
    err = _refused(MATRIX.format(kind="sglang", tokens=10))
    assert err.key_path == "engines.standin.kind" and err.line == 5
    assert err.message == "expected one of reference, llama-server, openai, standin-test, got 'sglang'"
    assert KIND in reference_markdown()  # the generated docs list what is registered


def test_a_kind_nobody_registered_is_unknown():
    assert KIND not in engines.known_kinds()
    err = _refused(MATRIX.format(kind=KIND, tokens=10))
    assert err.message == "expected one of reference, llama-server, openai, got 'standin-test'"
    assert KIND not in reference_markdown()


def _refused(text: str) -> MatrixError:
    with pytest.raises(MatrixError) as info:
        loads(text, file="m.yaml", check_files=False)
    return info.value


def test_top_logprobs_are_read_as_evidence_never_as_an_error():
    """llama.cpp's completion_probabilities become (id, logprob) pairs per token; another shape
    gives None (no evidence), a candidate that is no id or no finite number is left out."""
    from shadowlab.engines import get_adapter, top_logprobs

    good = [{"id": 5, "logprob": -0.1, "top_logprobs": [{"id": 5, "logprob": -0.1}, {"id": 9, "logprob": -2.5}]},
            {"id": 7, "logprob": -0.3, "top_logprobs": [{"id": 7, "logprob": -0.3}]}]
    assert top_logprobs(good) == (((5, -0.1), (9, -2.5)), ((7, -0.3),))
    for other in (None, [], "x", [{"id": 5, "probs": [{"tok_str": "a", "prob": 0.9}]}], [5]):
        assert top_logprobs(other) is None
    hostile = [{"top_logprobs": [{"id": -1, "logprob": 0.0}, {"id": True, "logprob": 0.0}, {"id": 3, "logprob": "x"},
                                 {"id": 4, "logprob": float("nan")}, {"id": 6, "logprob": -1.0}, 7]}]
    assert top_logprobs(hostile) == (((6, -1.0),),)
    body = {"content": "ab", "tokens": [5, 7], "completion_probabilities": good, "timings": {}}
    assert get_adapter("llama-server").parse_response(body).top_logprobs == top_logprobs(good)
