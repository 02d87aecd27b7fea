"""Extension cost (issue 22, "Must show"): a new sequence kind is its own module plus one
`matrix.sequences.register` call — nothing else in shadowlab changes.

The kind below, `repeat` ({kind: repeat, prompt: A, times: 3}: the same prompt sent N times on
one slot, the shape of a client that retries), is defined here, as a module of its own would
define it, and registered with one call. Then the matrix loader reads it (its own keys checked
like every section's, its errors naming their line), matrix.yaml dumps and reloads it, the plan
gives its warm cell one turn per repeat, and a real run on the reference engine judges every
repeat after the first as restored and identical to a cold run.
"""

from __future__ import annotations

import pytest

from shadowlab import cli, plan
from shadowlab.bounds import Bounds
from shadowlab.errors import MatrixError
from shadowlab.judge import gate
from shadowlab.matrix import loads, sequences
from shadowlab.matrix.schema import REQUIRED, Key, Section
from shadowlab.matrix.specs import SequenceSpec
from shadowlab.matrix.values import _fields, _num

# ---------------------------------------------------------------- the new kind's module

SECTION = Section("sequences.<name> (kind: repeat)", (
    Key("kind", "repeat", REQUIRED, "The same prompt, sent `times` times on one slot."),
    Key("prompt", "prompt id", REQUIRED, "The prompt to repeat."),
    Key("times", "int", 2, "How many times (2 to 8).", bounds=Bounds(2, 8, integer=True)),
))


def read_repeat(given: sequences.SequenceInput) -> SequenceSpec:
    f = _fields(given.body, given.at, "sequence.repeat")
    times = _num(f, "sequence.repeat", "times")  # held to its Key's bounds
    value, at = f["prompt"]
    (pid,) = sequences.prompt_ids([(value, at)], given)
    return SequenceSpec(given.name, (pid,) * times, "repeat")


def dump_repeat(s: SequenceSpec) -> dict[str, object]:
    return {"kind": "repeat", "prompt": s.prompts[0], "times": len(s.prompts)}


REPEAT = sequences.SequenceKind("repeat", read_repeat, dump_repeat, SECTION)

# ---------------------------------------------------------------- the tests

MATRIX = """\
version: 1
name: repeat-kind
engines:
  ref:
    kind: reference
    model: {{preset: tiny, seed: 0}}
    flags: [-c, 1024, --ctx-checkpoints, 8, -cram, 0]
    threads: 1
prompts:
  A: {{kind: random, tokens: 200, seed: 1}}
sequences:
  again: {body}
generation: {{n_predict: 4, temperature: 0}}
identity: {{required: true}}
"""


@pytest.fixture
def repeat_kind():
    sequences.register(REPEAT)  # the one line a new kind's module runs at import
    yield
    sequences.unregister("repeat")


def test_the_kind_is_read_and_planned(repeat_kind):
    matrix = loads(MATRIX.format(body="{kind: repeat, prompt: A, times: 3}"), file="m.yaml")
    assert matrix.sequences["again"].prompts == ("A", "A", "A")
    warm = [c for c in plan.build_plan(matrix).cells if c.kind.value == "warm"]
    assert [len(c.turns) for c in warm] == [3]


def test_its_own_keys_are_checked_and_errors_name_the_line(repeat_kind):
    with pytest.raises(MatrixError) as err:
        loads(MATRIX.format(body="{kind: repeat, prompt: A, tims: 3}"), file="m.yaml")
    assert "tims" in str(err.value) and "times" in str(err.value)  # unknown key, closest named
    with pytest.raises(MatrixError) as err:
        loads(MATRIX.format(body="{kind: repeat, prompt: Z}"), file="m.yaml")
    assert "unknown prompt 'Z'" in str(err.value) and "m.yaml:12" in str(err.value)
    with pytest.raises(MatrixError) as err:
        loads(MATRIX.format(body="{kind: repeat, prompt: A, times: 99}"), file="m.yaml")
    assert "sequences.again.times" in str(err.value) and "99" in str(err.value)


def test_the_dump_reloads_as_the_same_matrix(repeat_kind):
    matrix = loads(MATRIX.format(body="{kind: repeat, prompt: A, times: 3}"), file="m.yaml")
    dumped = matrix.to_dict()["sequences"]["again"]
    assert dumped == {"kind": "repeat", "prompt": "A", "times": 3}


def test_without_registration_the_kind_does_not_exist():
    with pytest.raises(MatrixError) as err:
        loads(MATRIX.format(body="{kind: repeat, prompt: A, times: 3}"), file="m.yaml")
    assert "repeat" in str(err.value) and "ordered" in str(err.value) and "traffic" in str(err.value)


def test_a_real_run_judges_each_repeat(repeat_kind, tmp_path, repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)  # the model cache (models/) of the reference engine
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.format(body="{kind: repeat, prompt: A, times: 3}"))
    assert cli.main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    result = gate.evaluate(tmp_path / "run")
    cell = result.inputs.verdict.cell("ref.default.again")
    assert [t.prompt_id for t in cell.turns] == ["A", "A", "A"]
    # every repeat after the first is served from the checkpoint the one before left, and its
    # output is the cold run's, byte for byte
    assert [t.outcome.value for t in cell.turns] == ["cold", "restored", "restored"]
    assert all(0 < t.reused_tokens < t.prompt_tokens for t in cell.turns[1:])
    assert all(t.identity is not None and t.identity.status.value == "identical" for t in cell.turns[1:])
