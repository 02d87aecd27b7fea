"""Matrix loading: the shipped matrices load, and every kind of mistake gives one clear error
naming file, line and key path (and a hint where one helps), never a traceback."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from shadowlab import matrix as mx
from shadowlab.errors import MatrixError
from shadowlab.matrix.schema import Derived
from shadowlab.matrix import (
    AppendPrompt,
    ChatPrompt,
    DivergePrompt,
    Selection,
    UnrelatedPrompt,
    load,
    loads,
)

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "fixtures" / "matrices"
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

BASE = """\
version: 1
name: t
engines:
  ref:
    kind: reference
    model: {preset: tiny, seed: 0}
    threads: 1
configurations:
  plain: {}
  knob:
    env: {K: 1}
prompts:
  A: {kind: random, tokens: 100, seed: 1}
  C: {kind: diverge, from: A, shared: 40, tokens: 120, seed: 2}
  B: {kind: unrelated, tokens: 20, seed: 3}
  A2: {kind: append, from: A, extra: 10, seed: 4}
sequences:
  A-C: [A, C]
  A-B-C: [A, B, C]
  app: [A, A2]
"""


def fail(text: str, **kw) -> MatrixError:
    with pytest.raises(MatrixError) as info:
        loads(text, file="m.yaml", **kw)
    return info.value


def line_of(text: str, needle: str) -> int:
    """1-based line of the only line containing needle."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


# -- the shipped matrix -------------------------------------------------------------------------


def test_ckpt_matrix_loads_with_the_case_study_numbers():
    m = load(REPO / "matrices" / "ckpt.yaml")
    assert list(m.configurations) == ["defaults", "policy0", "prompt_end", "policy0_prompt_end"]
    assert m.configurations["policy0"].env == {"PXA_CKPT_PROMPT_POLICY": "0"}
    a, c, b = m.prompts["A"], m.prompts["C"], m.prompts["B"]
    assert a.length == 4560
    assert isinstance(c, DivergePrompt) and (c.source, c.shared, c.length) == ("A", 2531, 4947)
    assert isinstance(b, UnrelatedPrompt) and b.length == 99 and set(b.unrelated_to) == {"A", "C"}
    assert isinstance(m.prompts["A_append"], AppendPrompt) and m.prompts["A_append"].length == 4766
    assert m.prompts["C_first_round"].shared == 1956
    engine = m.engines["reference"]
    assert engine.flags == ("-c", "8192", "-b", "2048", "-ub", "512", "--kv-unified",
                            "--ctx-checkpoints", "64", "-cram", "0", "-np", "1")
    assert engine.model == mx.ModelSpec("preset", preset="tiny", seed=0)
    assert engine.threads == 1 and engine.log_family == "reference"
    assert m.generation.temperature <= 0 and m.generation.n_predict == 16
    assert m.identity.required and m.identity.control
    assert m.isolation.gpu is None


def test_ckpt_expectations_follow_the_reference_mechanics():
    """DESIGN §1: POLICY=1 checkpoints at n_tokens L-4-ub, L-4; POLICY=0 adds each -b boundary;
    a restore re-enters at the newest checkpoint with n_tokens <= the divergence point."""
    m = load(REPO / "matrices" / "ckpt.yaml")
    by = {(x.selection.configuration, x.selection.sequence, x.turn): x for x in m.expectations}
    L, ub, b = 4560, 512, 2048
    assert set(by["defaults", "A-C", "A"].checkpoints_created_at) == {L - 4 - ub - 1, L - 4 - 1}
    assert by["defaults", "A-C", "C"].outcome == ("forced",)
    assert by["prompt_end", "A-C", "C"].outcome == ("forced",)
    assert set(by["prompt_end", "A-C", "A"].checkpoints_created_at) == {L - 4 - ub - 1, L - 4 - 1, L - 1}
    policy0 = by["policy0*", "A-C", "C"]
    assert policy0.outcome == ("restored",) and policy0.min_reused == b
    assert policy0.min_saved_fraction <= b / 4947
    assert set(by["policy0*", "A-C", "A"].checkpoints_created_at) == {b - 1, 2 * b - 1}
    assert set(by["*", "A-B-C", "C"].outcome) == {"forced", "silent_reset"}
    append = by["defaults", "append", "A_append"]
    assert append.outcome == ("restored",) and append.min_reused == L - 4
    assert append.min_saved_fraction <= (L - 4) / 4766
    assert by["policy0", "first-round", "C_first_round"].outcome == ("forced",)
    assert m.prompts["C_first_round"].shared < b <= m.prompts["C"].shared
    # the erase cascade is declared on every turn that resets or restores below checkpoints of
    # an earlier turn (the append probe restores at L-4: nothing above it to erase)
    cascade = {k for k, x in by.items() if x.cascade}
    assert cascade == {("defaults", "A-C", "C"), ("prompt_end", "A-C", "C"), ("policy0*", "A-C", "C"),
                       ("*", "A-B-C", "B"), ("*", "A-B-C", "C"), ("policy0", "first-round", "C_first_round")}
    assert all(x.cascade is None for k, x in by.items() if k not in cascade)


def test_resolved_matrix_round_trips_through_yaml(tmp_path):
    m = load(REPO / "matrices" / "ckpt.yaml")
    resolved = tmp_path / "matrix.yaml"
    resolved.write_text(yaml.safe_dump(m.to_dict(), sort_keys=False))
    again = load(resolved)
    assert again.to_dict() == m.to_dict()
    assert again.expectations == m.expectations and again.prompts == m.prompts


def test_defaults_are_filled():
    m = loads(BASE, file="m.yaml")
    assert m.generation == mx.Generation(n_predict=16, temperature=0.0)
    assert m.isolation == mx.Isolation(cores_per_cell=1, gpu=None, keep_scratch=False, jobs=1)
    assert m.identity == mx.Identity(required=True, control=True)
    assert m.cells.include == (Selection(),) and m.expectations == ()
    e = m.engines["ref"]
    assert e.binary == "auto" and e.verbosity_flags == ("-lv", "4") and e.ready_timeout_s == 60
    assert m.prompts["A2"].length == 110
    assert m.prompts["B"].unrelated_to == ("A",)  # random prompts and earlier unrelated ones


def test_unrelated_defaults_to_every_random_prompt_wherever_it_is():
    text = """\
version: 1
name: t
engines: {ref: {kind: reference, model: {preset: tiny}}}
prompts:
  B: {kind: unrelated, tokens: 20, seed: 3}
  A: {kind: random, tokens: 100, seed: 1}
  C: {kind: diverge, from: A, shared: 40, tokens: 120, seed: 2}
  B2: {kind: unrelated, tokens: 20, seed: 5}
  Z: {kind: random, tokens: 9, seed: 9}
sequences: {s: [A, B, C, B2, Z]}
"""
    m = loads(text, file="m.yaml")
    assert m.prompts["B"].unrelated_to == ("A", "Z")  # C starts like A
    assert m.prompts["B2"].unrelated_to == ("B", "A", "Z")


def test_no_configurations_means_one_empty_configuration():
    text = BASE.split("configurations:")[0] + "prompts:" + BASE.split("prompts:")[1]
    m = loads(text, file="m.yaml")
    assert list(m.configurations) == ["default"] and m.configurations["default"].flags == ()


# -- bad files: one defect each, expectation in the first line ---------------------------------


def _bad_files() -> list[Path]:
    return sorted(BAD.glob("*.yaml"))


def test_there_are_bad_fixtures():
    assert len(_bad_files()) >= 15


@pytest.mark.parametrize("path", _bad_files(), ids=lambda p: p.stem)
def test_bad_fixture_reports_file_line_path_and_hint(path):
    header = path.read_text().splitlines()[0]
    line, key_path, message, hint = (f.strip() for f in header.removeprefix("# expect:").split("|"))
    with pytest.raises(MatrixError) as info:
        load(path)
    err = info.value
    assert (err.file, err.line, err.key_path) == (str(path), int(line), key_path)
    assert message in err.message
    if hint:
        assert err.hint and hint in err.hint
    rendered = str(err)
    assert rendered.startswith(f"{path}:{line}: " + (f"{key_path}: " if key_path else ""))
    assert "Traceback" not in rendered
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)


def test_rendering_matches_the_documented_shape():
    err = MatrixError("expected an integer ≥ 1 and ≤ 4096, got 'two'", file="matrices/x.yaml", line=12,
                      key_path="engines.reference.threads", hint="write 2")
    assert str(err) == ("matrices/x.yaml:12: engines.reference.threads: expected an integer ≥ 1 and ≤ 4096, "
                        "got 'two'\n"
                        "  hint: write 2")


# -- more mistakes, inline ----------------------------------------------------------------------


@pytest.mark.parametrize("old, new, needle, path, message, hint", [
    ("version: 1", "version: 2", "version: 2", "version", "version 2 is not supported", "upgrade"),
    ("version: 1\n", "", "name: t", "", "missing required key 'version'", "needs: version"),
    ("kind: reference", "kind: llama", "kind: llama", "engines.ref.kind",
     "expected one of reference, llama-server, openai, got 'llama'", "did you mean 'llama-server'?"),
    ("A: {kind: random", "A: {kind: randm", "A: {kind: randm", "prompts.A.kind", "got 'randm'",
     "did you mean 'random'?"),
    ("tokens: 100, seed: 1}", "tokens: 100, sed: 1}", "sed: 1", "prompts.A.sed", "unknown key 'sed'",
     "did you mean 'seed'?"),
    ("tokens: 100, seed: 1}", "tokens: 100}", "A: {kind", "prompts.A", "missing required key 'seed'", "seed"),
    ("from: A, shared", "from: AA, shared", "from: AA", "prompts.C.from", "unknown prompt 'AA'",
     "did you mean 'A'?"),
    ("env: {K: 1}", "env: {K: true}", "K: true", "configurations.knob.env.K", "expected a string, got true",
     "quote it"),
    ("  knob:\n", "  kn.ob:\n", "kn.ob", "configurations.kn.ob", "cannot be used in a cell id", "no dots"),
    ("A-B-C: [A, B, C]", "A-B-C: []", "A-B-C: []", "sequences.A-B-C", "at least one prompt", None),
    ("B: {kind: unrelated, tokens: 20, seed: 3}", "B: {kind: unrelated, tokens: 20, seed: 3, unrelated_to: [Q]}",
     "unrelated_to", "prompts.B.unrelated_to[0]", "unknown prompt 'Q'", None),
    ("A2: {kind: append, from: A,", "A2: {kind: append, from: A2,", "A2: {kind", "prompts.A2.from",
     "cannot be built from itself", None),
    ("C: {kind: diverge, from: A, shared: 40, tokens: 120, seed: 2}",
     "C: {kind: diverge, from: A, shared: 40, tokens: 120, seed: 2, endpoint: chat}",
     "endpoint: chat", "prompts.C.endpoint", "cannot go to the chat endpoint", "kind: chat"),
    ("    threads: 1", "    threads: 2", "threads: 2", "engines.ref.threads", "exceeds isolation.cores_per_cell",
     "cores_per_cell"),
    ("    model: {preset: tiny, seed: 0}", "    model: {preset: tiny, path: x.gguf}", "model:",
     "engines.ref.model", "exactly one of preset, path, gguf (got preset, path)", None),
    ("    model: {preset: tiny, seed: 0}", "    model: {gguf: {preset: tiny}}", "model:",
     "engines.ref.model", "a reference engine cannot load a gguf model", "llama-server takes"),
    ("    model: {preset: tiny, seed: 0}", "    model: {preset: tine, seed: 0}", "model:",
     "engines.ref.model.preset", "unknown reference-engine preset 'tine'", "did you mean 'tiny'?"),
    ("    model: {preset: tiny, seed: 0}", "    model: {preset: tiny, seed: -1}", "model:",
     "engines.ref.model.seed", "expected an integer ≥ 0, got -1", None),
    ("    threads: 1", "    threads: 1\n    command: [x, --port, '{prot}']", "command:",
     "engines.ref.command[2]", "unknown placeholder {prot}", "did you mean 'port'?"),
    ("    threads: 1", "    threads: 1\n    command: [x, '{model}']", "command:", "engines.ref.command",
     "never uses {port}", None),
    ("    threads: 1", "    threads: 1\n    command: [x, '{port']", "command:", "engines.ref.command[1]",
     "bad template", None),
    ("    threads: 1", "    threads: 1\n    log_family: ik", "log_family", "engines.ref.log_family",
     "got 'ik'", None),
    ("    threads: 1", "    threads: 1\n    ready_timeout_s: 0", "ready_timeout_s", "engines.ref.ready_timeout_s",
     "expected seconds > 0, got 0", None),
    ("    threads: 1", "    threads: 1\n    binary: no-such-engine-binary-xyz", "binary", "engines.ref.binary",
     "is not on PATH", "auto"),
    ("    threads: 1", "    threads: 1\n    binary: ./bin/none", "binary", "engines.ref.binary",
     "binary './bin/none' does not exist", None),
])
def test_inline_mistakes(old, new, needle, path, message, hint):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    err = fail(text)
    assert err.line == line_of(text, needle), str(err)
    assert err.key_path == path, str(err)
    assert message in err.message, str(err)
    if hint:
        assert err.hint and hint in err.hint, str(err)


@pytest.mark.parametrize("tail, needle, path, message", [
    ("isolation: {gpu: cuda}", "gpu", "isolation.gpu", "expected none or a device index"),
    ("isolation: {jobs: 0}", "jobs", "isolation.jobs", "expected an integer ≥ 1, got 0"),
    ("identity: {required: yes please}", "required", "identity.required", "expected true or false"),
    ("identity: {required: " + "y" * 100_000 + "}", "required", "identity.required",
     "expected true or false, got '" + "y" * 60 + "'… (100,000 characters)"),
    ("generation: {n_predict: 16.5}", "n_predict", "generation.n_predict",
     "expected an integer ≥ 1 and ≤ 1048576, got 16.5"),
    ("cells: {exclude: [{sequence: '*'}]}", "cells:", "cells", "selects no cells"),
    ("cells: {include: [{sequence: 'X*'}]}", "cells:", "cells.include[0].sequence", "'X*' matches no sequence"),
    ("expectations: [{sequence: A-C, turn: C, outcome: restord}]", "expectations",
     "expectations[0].outcome", "got 'restord'"),
    ("expectations: [{sequence: A-C, turn: C}]", "expectations", "expectations[0]", "at least one check"),
    ("expectations: [{sequence: A-C, turn: 2, outcome: forced}]", "expectations", "expectations[0].turn",
     "turn 2 is past the end of sequence 'A-C'"),
    ("expectations: [{sequence: nope, outcome: forced}]", "expectations", "expectations[0].sequence",
     "'nope' matches no sequence"),
    ("expectations: [{sequence: A-C, min_saved_fraction: 41.4}]", "expectations",
     "expectations[0].min_saved_fraction", "41.4 is too large (at most 1)"),
    ("expectations: [{sequence: A-C, turn: Z, outcome: forced}]", "expectations", "expectations[0].turn",
     "unknown prompt 'Z'"),
    ("expectations: [{sequence: A-C, outcome: forced, turns: 1}]", "expectations", "expectations[0].turns",
     "unknown key 'turns'"),
    ("cells: {exclude: [{sequence: A-C}]}\nexpectations: [{sequence: A-C, outcome: forced}]",
     "expectations", "expectations[0]", "selects no planned cell"),
])
def test_mistakes_in_settings_and_expectations(tail, needle, path, message):
    text = BASE + tail + "\n"
    err = fail(text)
    assert err.line == line_of(text, needle), str(err)
    assert err.key_path == path, str(err)
    assert message in err.message, str(err)


def test_cascade_expectation_is_parsed_and_round_trips():
    text = BASE + ("expectations:\n"
                   "  - {sequence: A-B-C, turn: B, outcome: silent_reset, cascade: true}\n"
                   "  - {sequence: A-C, cascade: false}\n")
    m = loads(text, file="m.yaml")
    assert [x.cascade for x in m.expectations] == [True, False]
    assert m.expectations[1].turn is None  # `cascade: false` alone is a valid (waiving) expectation
    again = loads(yaml.safe_dump(m.to_dict(), sort_keys=False), file="again.yaml")
    assert again.expectations == m.expectations
    assert [x.get("cascade") for x in m.to_dict()["expectations"]] == [True, False]


@pytest.mark.parametrize("value, got", [
    ("{erased_min: 2}", "got a mapping"), ("all", "got 'all'"), ("1", "got 1"), ("null", "got nothing"),
    ("[4043]", "got a list"),
])
def test_cascade_of_the_wrong_type_says_what_to_write(value, got):
    text = BASE + f"expectations:\n  - sequence: A-B-C\n    turn: B\n    cascade: {value}\n"
    err = fail(text)
    assert (err.file, err.line, err.key_path) == ("m.yaml", line_of(text, "cascade:"), "expectations[0].cascade")
    assert "expected true or false" in err.message and got in err.message, str(err)
    assert "`cascade: true`" in err.hint and "`cascade: false`" in err.hint, str(err)
    assert str(err).startswith(f"m.yaml:{err.line}: expectations[0].cascade: expected true or false")


def test_cascade_true_needs_an_engine_whose_log_is_parsed():
    text = BASE.replace("    threads: 1", "    threads: 1\n    log_family: none", 1)
    text += "expectations:\n  - {sequence: A-C, turn: C,\n     cascade: true}\n"
    err = fail(text)
    assert (err.line, err.key_path) == (line_of(text, "cascade: true"), "expectations[0].cascade")
    assert "engine 'ref' has log_family none" in err.message and "log_family" in err.hint
    # waiving it is fine: there is nothing to waive, but nothing is claimed either
    loads(text.replace("cascade: true", "cascade: false"), file="m.yaml")


def test_a_section_of_the_wrong_type():
    err = fail("version: 1\nname: t\nengines: [ref]\nprompts: {}\nsequences: {}\n")
    assert (err.line, err.key_path) == (3, "engines")
    assert "expected a mapping of engine name → definition, got a list" in err.message


def test_prompt_cycle_is_reported():
    text = BASE.replace("A: {kind: random, tokens: 100, seed: 1}",
                        "A: {kind: append, from: A2, extra: 5, seed: 1}")
    err = fail(text)
    assert "cycle" in err.message and "A → A2 → A" in err.message


def test_chat_rules():
    chat = BASE + """\
  talk: [T1, T2]
"""
    chat = chat.replace("sequences:", """\
  T1:
    kind: chat
    messages: [{role: user, content: hi}]
  T2:
    kind: chat
    messages:
      - {role: user, content: hi}
      - {role: assistant, content: {from_turn: 0}}
      - {role: user, content: more}
sequences:""")
    m = loads(chat, file="m.yaml")
    t2 = m.prompts["T2"]
    assert isinstance(t2, ChatPrompt) and t2.endpoint == "chat" and t2.reply_turns() == (0,)

    err = fail(chat.replace("{role: assistant, content: {from_turn: 0}}", "{role: user, content: {from_turn: 0}}"))
    assert "only an assistant message" in err.message and err.key_path == "prompts.T2.messages[1].content"
    err = fail(chat.replace("from_turn: 0", "from_tun: 0"))
    assert "expected {from_turn" in err.message and "did you mean 'from_turn'?" in err.hint
    err = fail(chat.replace("{role: user, content: more}", "{role: robot, content: more}"))
    assert err.key_path == "prompts.T2.messages[2].role" and "got 'robot'" in err.message
    err = fail(chat.replace("      - {role: user, content: more}\n", ""))
    assert "last message is the assistant's" in err.message
    err = fail(chat.replace("talk: [T1, T2]", "talk: [T2, T1]"))
    assert err.key_path == "sequences.talk[0]" and "uses the reply of turn 0" in err.message
    err = fail(chat.replace("messages: [{role: user, content: hi}]",
                            "messages: [{role: user, content: hi}]\n    message_delimiters: true"))
    assert err.key_path == "prompts.T1.message_delimiters" and "completion endpoint" in err.message
    err = fail(chat.replace("from: A, shared", "from: T1, shared"))
    assert err.key_path == "prompts.C.from" and "chat prompt" in err.message


def test_yaml_anchors_and_merge_keys_work():
    text = BASE.replace("configurations:\n", "configurations:\n  base: &b {env: {X: 1}}\n  more: {<<: *b, flags: [-v]}\n")
    m = loads(text, file="m.yaml")
    assert m.configurations["more"].env == {"X": "1"} and m.configurations["more"].flags == ("-v",)


def test_model_path_is_resolved_from_the_matrix_directory(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(b"GGUF")
    path = tmp_path / "x.yaml"
    path.write_text(BASE.replace("kind: reference\n    model: {preset: tiny, seed: 0}",
                                 "kind: llama-server\n    model: {path: models/m.gguf}"))
    m = load(path)
    assert m.engines["ref"].model == mx.ModelSpec("path", path=tmp_path / "models" / "m.gguf")
    assert m.engines["ref"].log_family == "llama.cpp"
    (tmp_path / "models" / "m.gguf").unlink()
    with pytest.raises(MatrixError):
        load(path)
    assert load(path, check_files=False).engines["ref"].model.path == tmp_path / "models" / "m.gguf"


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(MatrixError, match="no such matrix file"):
        load(tmp_path / "absent.yaml")
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(MatrixError, match="empty"):
        load(tmp_path / "empty.yaml")


FULL_TAIL = """\
cells:
  include: [{sequence: 'A-*'}, {configuration: plain, sequence: app}]
  exclude: [{engine: ref, configuration: knob, sequence: A-B-C}]
generation: {n_predict: 8, temperature: 0, allow_sampling: false, ignore_eos: true}
isolation: {cores_per_cell: 2, gpu: 0, keep_scratch: true, jobs: 2}
identity: {required: true, control: false}
expectations:
  - {configuration: plain, sequence: A-C, turn: C, outcome: [restored, extended], min_reused: 40,
     min_saved_fraction: 0.3, max_forced: 0, checkpoints_created_at: [39], identity: true,
     cascade: true, description: all checks}
"""


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def test_any_wrong_value_anywhere_is_a_matrix_error_not_a_crash():
    """Replace every node of a full matrix with values of every YAML type: load() either
    accepts the result or raises MatrixError — never another exception."""
    full = loads(BASE + FULL_TAIL, file="m.yaml").to_dict()
    full["engines"]["ref"]["command"] = ["python", "-m", "eng", "--port", "{port}"]
    full["engines"]["ref"]["log_patterns"] = ["x(\\d+)"]
    full["prompts"]["T"] = {"kind": "chat", "messages": [{"role": "user", "content": "q"},
                                                         {"role": "assistant", "content": {"from_turn": 0}},
                                                         {"role": "user", "content": "r"}]}
    full["sequences"]["chat"] = ["A", "T"]
    junk = [None, "x", 7, -3, 0.5, True, [1], {"q": 1}, "*"]
    paths = [p for p in _paths(full) if p]
    assert len(paths) > 100
    outcomes = {"ok": 0, "error": 0}
    for i, p in enumerate(paths):
        for value in (junk[(i + k) % len(junk)] for k in range(4)):  # 4 of them per node, rotating
            doc = copy.deepcopy(full)
            parent = doc
            for part in p[:-1]:
                parent = parent[part]
            parent[p[-1]] = value
            try:
                loads(yaml.dump(doc, Dumper=DUMPER), file="fuzz.yaml", check_files=False)
                outcomes["ok"] += 1
            except MatrixError as err:
                assert err.line is not None, (p, value, str(err))
                outcomes["error"] += 1
    assert outcomes["error"] > outcomes["ok"] > 0


# -- limits: what would hang, crash or exhaust memory later is refused at load (issue 9) -------


def test_names_are_one_short_path_component():
    for bad in ("../../../x", "a/b", ".hidden", "-x", "x" * (mx.MAX_NAME_CHARS + 1)):
        err = fail(BASE.replace("name: t", f"name: '{bad}'"))
        assert err.key_path == "name" and err.line == 2, err
    assert loads(BASE.replace("name: t", "name: " + "x" * mx.MAX_NAME_CHARS), file="m.yaml")
    err = fail(BASE.replace("  plain: {}", "  " + "p" * 300 + ": {}"))
    assert "at most 48" in str(err) and err.line == line_of(BASE, "plain: {}")


def test_the_longest_cell_id_fits_a_directory_name():
    """Four names of MAX_NAME_CHARS and `control`: the worst case the name limit allows."""
    from shadowlab.plan import build_plan

    e, c, s, a, h = (ch * mx.MAX_NAME_CHARS for ch in "ecsah")
    text = f"""\
version: 1
name: {"n" * mx.MAX_NAME_CHARS}
engines:
  {e}: {{kind: reference, model: {{preset: tiny, seed: 0}}}}
configurations:
  {c}: {{}}
prompts:
  {a}: {{kind: random, tokens: 10, seed: 1}}
  {h}:
    kind: chat
    messages: [{{role: user, content: hi}}, {{role: assistant, content: {{from_turn: 0}}}}, {{role: user, content: more}}]
sequences:
  {s}: [{a}, {h}]
"""
    ids = [cell.id for cell in build_plan(loads(text, file="m.yaml")).cells]
    longest = f"{e}.{c}.control.{s}.{h}"  # the control of a cold cell that splices replies
    assert longest in ids and max(len(i.encode()) for i in ids) == len(longest) == 203


@pytest.mark.parametrize("old, new, key", [
    ("tokens: 100, seed: 1", "tokens: 10000000000000000000000000000000, seed: 1", "prompts.A.tokens"),
    ("tokens: 100, seed: 1", f"tokens: {mx.MAX_PROMPT_TOKENS + 1}, seed: 1", "prompts.A.tokens"),
    ("extra: 10", f"extra: {mx.MAX_PROMPT_TOKENS}", "prompts.A2.extra"),  # A + extra: too long
    ("seed: 0}", f"seed: {2 ** 64}}}", "engines.ref.model.seed"),
])
def test_huge_numbers_are_refused(old, new, key):
    err = fail(BASE.replace(old, new))
    assert err.key_path == key and ("too large" in str(err) or "longer than" in str(err)), err


def test_a_prompt_longer_than_the_context_is_refused():
    text = BASE.replace("tokens: 100,", "tokens: 8180,")  # + n_predict 16 > the default 8192
    err = fail(text)
    assert err.key_path == "prompts.A" and err.line == line_of(text, "  A: {")
    assert "8196 tokens of context" in str(err) and "the reference engine's default 8192" in str(err)
    knob = "    env: {K: 1}"
    assert loads(text.replace(knob, knob + "\n    flags: [--ctx-size=9000]").replace(
        "  plain: {}", "  plain: {flags: [-c, 9000]}"), file="m.yaml")
    err = fail(text.replace("  plain: {}", "  plain: {flags: [-c, 9000]}"))
    assert "configuration 'knob'" in str(err)  # plain is large enough now, knob is not


def test_context_size_reads_the_flags_in_the_engines_order():
    m = loads(BASE, file="m.yaml")
    engine, plain = m.engines["ref"], m.configurations["plain"]
    assert mx.context_size(engine, plain) == (8192, "the reference engine's default 8192")
    from dataclasses import replace

    engine = replace(engine, flags=("-c", "4096", "--ctx-size=2048"))
    assert mx.context_size(engine, plain) == (2048, "--ctx-size 2048")
    assert mx.context_size(engine, replace(plain, flags=("-c", "100")))[0] == 100
    assert mx.context_size(engine, replace(plain, flags=("-c", "0")))[0] is None  # llama.cpp: the model's
    assert mx.context_size(replace(engine, kind="llama-server", flags=()), plain)[0] is None


def test_the_reference_default_context_is_the_engines():
    from shadowlab_engine.cli import build_parser

    from shadowlab.engines import get_adapter

    assert build_parser().parse_args([]).ctx_size == get_adapter("reference").default_context


@pytest.mark.parametrize("old, new, key", [
    ("env: {K: 1}", 'env: {K: "a\\0b"}', "configurations.knob.env.K"),
    ("    threads: 1", '    threads: 1\n    flags: ["-x\\0"]', "engines.ref.flags[0]"),
    ("    threads: 1", '    threads: 1\n    binary: "/bin/tr\\0ue"', "engines.ref.binary"),
])
def test_a_nul_character_is_refused(old, new, key):
    err = fail(BASE.replace(old, new))
    assert err.key_path == key and "NUL" in str(err), err


def test_devices_and_fifos_are_not_model_files(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for path in ("/dev/zero", str(tmp_path / "fifo"), str(tmp_path / "dir")):
        err = fail(BASE.replace("{preset: tiny, seed: 0}", f"{{path: {path}}}"))
        assert err.key_path == "engines.ref.model.path" and "not a regular file" in str(err), err


def test_the_matrix_file_is_read_only_when_regular_and_small(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.yaml")
    for path in (Path("/dev/zero"), tmp_path / "fifo.yaml", tmp_path):
        with pytest.raises(MatrixError, match="not a regular file"):
            load(path)
    big = tmp_path / "big.yaml"
    big.write_text(BASE + "# padding\n" * (mx.MAX_MATRIX_BYTES // 10))
    with pytest.raises(MatrixError, match="more than the 1 MiB"):
        load(big)


def test_free_text_is_bounded():
    err = fail(BASE.replace("name: t", "name: t\ndescription: " + "x" * (mx.MAX_TEXT_CHARS + 1)))
    assert err.key_path == "description" and "at most 4096" in str(err)
    err = fail(BASE.replace("seed: 1}", "seed: 1, description: " + "y" * (mx.MAX_TEXT_CHARS + 1) + "}"))
    assert err.key_path == "prompts.A.description"


def test_more_cores_than_the_machine_is_refused_or_warned():
    text = BASE.replace("    threads: 1", "    threads: 1\nisolation: {cores_per_cell: 64}")
    m = loads(text, file="m.yaml")
    mx.check_machine(m, cores=64)  # enough
    with pytest.raises(MatrixError) as info:
        mx.check_machine(m, cores=2)
    err = info.value
    assert (err.file, err.line, err.key_path) == ("m.yaml", line_of(text, "cores_per_cell"),
                                                  "isolation.cores_per_cell")
    assert "64 cores per cell, but this process may use only 2" in str(err) and "at most 2" in err.hint
    warnings = []
    mx.check_machine(m, cores=2, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith("shadowlab: warning: m.yaml:")


# -- docs/matrix.md is generated from the schema ----------------------------------------------


def test_docs_reference_matches_the_schema():
    doc = (REPO / "docs" / "matrix.md").read_text()
    begin, end = doc.index(mx.DOC_BEGIN), doc.index(mx.DOC_END)
    assert doc[begin + len(mx.DOC_BEGIN):end].strip() == mx.reference_markdown().strip(), (
        "docs/matrix.md is stale: run `python -m shadowlab.matrix docs/matrix.md`")


def test_every_schema_key_is_documented_and_accepted():
    reference = mx.reference_markdown()
    for section in mx.SCHEMA.values():
        assert f"### `{section.title}`" in reference
        for key in section.keys:
            assert re.search(rf"^\| `{re.escape(key.name)}` \|", reference, re.M), key.name
            assert key.doc


def test_docs_examples_load(tmp_path):
    """Every ```yaml block of docs/matrix.md that starts with `version:` is a valid matrix."""
    doc = (REPO / "docs" / "matrix.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if b.startswith("version:")]
    assert blocks
    for block in blocks:
        loads(block, file="docs/matrix.md", check_files=False)


@pytest.mark.parametrize("path", _bad_files()[:4] + _bad_files()[-2:], ids=lambda p: p.stem)
def test_cli_prints_the_error_and_exits_2_without_traceback(path, capsys):
    from shadowlab import cli

    assert cli.main(["run", str(path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{path}:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # the error and its hint


def test_a_sequence_in_mapping_form_is_the_same_ordered_sequence_and_dumps_as_a_list():
    listed = loads(BASE, file="m.yaml")
    mapped = loads(BASE.replace("  A-C: [A, C]", "  A-C: {kind: ordered, prompts: [A, C]}"), file="m.yaml")
    assert mapped.sequences == listed.sequences and mapped.sequences["A-C"].kind == "ordered"
    assert mapped.to_dict()["sequences"]["A-C"] == ["A", "C"]  # matrix.yaml unchanged for a resume
    assert {mapped.sequences["A-C"].conversation(i) for i in range(2)} == {"A-C"}


@pytest.mark.parametrize("body, path, message", [
    ("{kind: trafic, prompts: [A]}", "sequences.A-C.kind", "expected one of ordered, traffic, got 'trafic'"),
    ("{kind: traffic, prompts: [A]}", "sequences.A-C.prompts", "unknown key 'prompts'"),
    ("{kind: traffic, shape: {arrival: sideways}}", "sequences.A-C.shape.arrival", "arrival must be one of"),
    ("{kind: traffic, shape: {turns: 2}, trace: x.jsonl}", "sequences.A-C.shape", "a shape or a trace, not both"),
    ("{kind: traffic, trace: nowhere.jsonl}", "sequences.A-C.trace", "no such trace file"),
    ("{kind: traffic, shape: {conversations: 1, turns: 2, system_tokens: {kind: fixed, a: 1.0e+8, high: 1.0e+8}}}",
     "sequences.A-C.shape.system_tokens.a", "100000000 is too large (at most 1048576)"),  # beyond any context
    ("{kind: traffic, shape: {conversations: 100000000, turns: 300}}", "sequences.A-C.shape.conversations",
     "100000000 is too large (at most 4096)"),
    ("{kind: traffic, shape: {conversations: 1000, turns: 300}}", "sequences.A-C.shape",
     "about 300,000 requests; a traffic sequence may have at most"),  # refused before generating
    ("{kind: ordered}", "sequences.A-C", "missing required key 'prompts'"),
    ("{prompts: [A, Q]}", "sequences.A-C.prompts[1]", "unknown prompt 'Q'"),
])
def test_a_bad_sequence_in_mapping_form_is_named(body, path, message):
    err = fail(BASE.replace("  A-C: [A, C]", f"  A-C: {body}"))
    assert err.key_path == path and message in err.message


def test_each_settings_default_is_the_schemas():
    """A default is written once, in the schema: sections left empty or out load as it says."""
    for text in (BASE, BASE + "generation: {}\nisolation: {}\nidentity: {}\n"):
        m = loads(text, file="m.yaml")
        for section, spec in (("generation", m.generation), ("isolation", m.isolation), ("identity", m.identity)):
            for key in mx.SCHEMA[section].keys:
                assert getattr(spec, key.name) == key.default, f"{section}.{key.name}"


# -- each default is defined once: in the schema ------------------------------------------------

# A matrix in which every section of the schema occurs once with only the keys it needs, and where
# each section's mapping is (the path of keys and list indices into it). A schema section missing
# here fails the test: a new section must say where it lives; a new key is covered by itself.
_EVERY_SECTION = {
    "version": 1, "name": "defaults",
    "engines": {"e": {"kind": "reference", "model": {"preset": "tiny"}},
                "g": {"kind": "llama-server", "model": {"gguf": {"preset": "tiny"}}}},
    "configurations": {"default": {}},
    "prompts": {"R": {"kind": "random", "tokens": 8, "seed": 1},
                "D": {"kind": "diverge", "from": "R", "shared": 4, "tokens": 8, "seed": 2},
                "U": {"kind": "unrelated", "tokens": 8, "seed": 3},
                "P": {"kind": "append", "from": "R", "extra": 2, "seed": 4},
                "H": {"kind": "chat", "messages": [{"role": "user", "content": "hi"}]}},
    "sequences": {"s": {"prompts": ["R", "D"]},
                  "t": {"kind": "traffic", "shape": {"conversations": 1, "turns": 2}}},
    "cells": {"include": [{}]},
    "generation": {}, "isolation": {}, "identity": {},
    "expectations": [{"turn": 0, "outcome": "cold"}],
    "baseline": "default", "budgets": [{"max_created_per_turn": 2}], "scale": {},
}
_SECTION_AT = {
    "matrix": (), "engine": ("engines", "e"), "model": ("engines", "e", "model"),
    "gguf": ("engines", "g", "model", "gguf"), "configuration": ("configurations", "default"),
    "prompt.random": ("prompts", "R"), "prompt.diverge": ("prompts", "D"),
    "prompt.unrelated": ("prompts", "U"), "prompt.append": ("prompts", "P"),
    "prompt.chat": ("prompts", "H"), "message": ("prompts", "H", "messages", 0),
    "sequence": ("sequences", "s"), "sequence.traffic": ("sequences", "t"), "shape": ("sequences", "t", "shape"),
    "cells": ("cells",), "selection": ("cells", "include", 0),
    "generation": ("generation",), "isolation": ("isolation",), "identity": ("identity",),
    "expectation": ("expectations", 0), "budget": ("budgets", 0), "scale": ("scale",),
}


def _documented_defaults() -> dict[tuple[str, str], str]:
    """(section title, key) → the default cell of docs/matrix.md's table, backticks removed."""
    doc = (REPO / "docs" / "matrix.md").read_text()
    out, title = {}, None
    for line in doc.splitlines():
        if m := re.match(r"### `(.+)`$", line):
            title = m.group(1)
        elif m := re.match(r"\| `([^`]+)` \| (?:[^|\\]|\\.)* \| `?(.*?)`? \| ", line):
            out[title, m.group(1)] = m.group(2)
    return out


def _omitted_keys():
    for section_name, section in mx.SCHEMA.items():
        for key in section.keys:
            yield pytest.param(section_name, key, id=f"{section_name}.{key.name}")


@pytest.mark.parametrize("section_name,key", list(_omitted_keys()))
def test_an_omitted_key_loads_as_the_schema_default_the_docs_show(section_name, key):
    """Omitting a key loads the same matrix as writing the default docs/matrix.md shows for it,
    and what the docs show is the schema's default: so a default written anywhere else (loader,
    spec dataclass) that disagrees fails here."""
    assert set(_SECTION_AT) == set(mx.SCHEMA), "say where each schema section lives in _EVERY_SECTION"
    section = mx.SCHEMA[section_name]
    shown = _documented_defaults()[section.title, key.name]
    if key.required:
        assert shown == "**required**"
        return
    if isinstance(key.default, Derived):  # computed from other keys: the docs say how
        assert shown == key.default.text
        return
    if key.default is None and key.shown is None:  # unset: no value to load
        assert shown == "—"
        return
    written = yaml.safe_load(shown)
    if key.shown is None:  # the docs show the schema's value (a tuple as a YAML list)
        assert written == json.loads(json.dumps(key.default))
    base = copy.deepcopy(_EVERY_SECTION)
    body = base
    for step in _SECTION_AT[section_name]:
        body = body[step]
    body.pop(key.name, None)  # a key the base writes (so its section occurs) is omitted here
    omitted = loads(yaml.safe_dump(base), file="m.yaml", check_files=False)
    body[key.name] = written
    explicit = loads(yaml.safe_dump(base), file="m.yaml", check_files=False)
    assert explicit == omitted
