"""The plan: warm cells from the selection, cold references and controls added, stable ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

from shadowlab.matrix import load, loads
from shadowlab.plan import Cell, CellKind, Plan, build_plan

REPO = Path(__file__).resolve().parents[2]

BASE = """\
version: 1
name: t
engines:
  ref: {kind: reference, model: {preset: tiny}}
configurations:
  plain: {}
  knob: {flags: [--ctx-checkpoints, 3], env: {K: 1}}
prompts:
  A: {kind: random, tokens: 100, seed: 1}
  C: {kind: diverge, from: A, shared: 40, tokens: 120, seed: 2}
  B: {kind: unrelated, tokens: 20, seed: 3}
sequences:
  A-C: [A, C]
  A-B-C: [A, B, C]
"""


def plan_of(text: str) -> Plan:
    return build_plan(loads(text, file="m.yaml"))


def ids(plan: Plan, kind: CellKind | None = None) -> list[str]:
    return [c.id for c in plan.cells if kind is None or c.kind is kind]


def test_ckpt_plan_has_the_case_study_cells():
    plan = build_plan(load(REPO / "matrices" / "ckpt.yaml"))
    warm = ids(plan, CellKind.WARM)
    assert len(warm) == 10
    assert {f"reference.{c}.{s}" for c in ("defaults", "policy0", "prompt_end", "policy0_prompt_end")
            for s in ("A-C", "A-B-C")} | {"reference.defaults.append", "reference.policy0.first-round"} == set(warm)
    # C and B for every configuration, plus the two probes' second prompts.
    assert len(ids(plan, CellKind.COLD)) == 10
    assert "reference.defaults.cold.A_append" in ids(plan) and "reference.policy0.cold.C_first_round" in ids(plan)
    assert "reference.defaults.cold.A" not in ids(plan)  # first turns are cold already
    assert ids(plan, CellKind.CONTROL) == [f"reference.{c}.control.C" for c in
                                           ("defaults", "policy0", "prompt_end", "policy0_prompt_end")]
    assert plan.cell("reference.policy0.A-C").env == {"PXA_CKPT_PROMPT_POLICY": "0"}


def test_ids_are_unique_and_safe_directory_names():
    plan = build_plan(load(REPO / "matrices" / "ckpt.yaml"))
    assert len(set(ids(plan))) == len(plan.cells)
    for cell_id in ids(plan):
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", cell_id) and ".." not in cell_id


def test_every_later_warm_turn_points_at_a_matching_cold_cell():
    plan = plan_of(BASE)
    checked = 0
    for cell in plan.of_kind(CellKind.WARM):
        assert cell.turns[0].cold_cell is None
        for turn in cell.turns[1:]:
            cold = plan.cell(turn.cold_cell)
            assert cold.kind is CellKind.COLD
            assert (cold.engine, cold.configuration, cold.flags, cold.env) == \
                   (cell.engine, cell.configuration, cell.flags, cell.env)
            assert [t.prompt_id for t in cold.turns] == [turn.prompt_id]
            checked += 1
    assert checked == 2 * 3  # (C) + (B, C) per configuration
    # One cold cell per (engine, configuration, prompt), even when two sequences send it.
    assert ids(plan, CellKind.COLD) == ["ref.plain.cold.C", "ref.plain.cold.B", "ref.knob.cold.C", "ref.knob.cold.B"]


def test_order_is_deterministic_and_grouped():
    first, second = plan_of(BASE), plan_of(BASE)
    assert first == second
    assert ids(first) == [
        "ref.plain.A-C", "ref.plain.A-B-C", "ref.plain.cold.C", "ref.plain.cold.B", "ref.plain.control.C",
        "ref.knob.A-C", "ref.knob.A-B-C", "ref.knob.cold.C", "ref.knob.cold.B", "ref.knob.control.C",
    ]


def test_configuration_delta_travels_with_each_cell():
    plan = plan_of(BASE)
    for cell in plan.cells:
        if cell.configuration == "knob":
            assert cell.flags == ("--ctx-checkpoints", "3") and cell.env == {"K": "1"}
        else:
            assert cell.flags == () and cell.env == {}


def test_include_and_exclude_with_globs():
    plan = plan_of(BASE + "cells:\n  include: [{sequence: 'A-*'}]\n  exclude: [{configuration: kn*, sequence: A-B-C}]\n")
    assert ids(plan, CellKind.WARM) == ["ref.plain.A-C", "ref.plain.A-B-C", "ref.knob.A-C"]
    assert ids(plan, CellKind.COLD) == ["ref.plain.cold.C", "ref.plain.cold.B", "ref.knob.cold.C"]
    plan = plan_of(BASE + "cells:\n  include: [{configuration: knob, sequence: A-C}]\n")
    assert ids(plan) == ["ref.knob.A-C", "ref.knob.cold.C", "ref.knob.control.C"]


def test_control_cells_follow_identity_control():
    plan = plan_of(BASE)
    control = plan.cell("ref.plain.control.C")
    assert control.control_of == "ref.plain.cold.C"
    assert control.turns == plan.cell("ref.plain.cold.C").turns
    assert ids(plan_of(BASE + "identity: {control: false}\n"), CellKind.CONTROL) == []


def test_single_turn_sequences_need_no_cold_cells():
    plan = plan_of(BASE.replace("  A-C: [A, C]\n  A-B-C: [A, B, C]\n", "  one: [A]\n"))
    assert ids(plan) == ["ref.plain.one", "ref.knob.one"]


def test_several_engines():
    text = BASE.replace("engines:\n", "engines:\n  other: {kind: reference, model: {preset: tiny, seed: 1}}\n")
    plan = plan_of(text + "cells: {include: [{sequence: A-C}]}\n")
    assert ids(plan, CellKind.WARM) == ["other.plain.A-C", "other.knob.A-C", "ref.plain.A-C", "ref.knob.A-C"]
    assert "other.plain.cold.C" in ids(plan) and "ref.plain.cold.C" in ids(plan)


CHAT = BASE.replace("sequences:\n", """\
  T1: {kind: chat, messages: [{role: user, content: hi}]}
  T2:
    kind: chat
    messages:
      - {role: user, content: hi}
      - {role: assistant, content: {from_turn: 0}}
      - {role: user, content: more}
  Q: {kind: chat, messages: [{role: system, content: be brief}, {role: user, content: hi}]}
sequences:
""") + "  talk: [T1, T2]\n  talk2: [T1, T2, Q]\ncells: {include: [{configuration: plain, sequence: 'talk*'}]}\n"


def test_chat_cold_cells_depend_on_the_warm_cell_that_wrote_the_replies():
    plan = plan_of(CHAT)
    assert ids(plan) == [
        "ref.plain.talk", "ref.plain.talk2",
        "ref.plain.cold.talk.T2", "ref.plain.cold.talk2.T2", "ref.plain.cold.Q",
        "ref.plain.control.Q",  # the control prefers a cold cell that depends on nothing
    ]
    assert plan.cell("ref.plain.cold.talk.T2").depends_on == "ref.plain.talk"
    assert plan.cell("ref.plain.cold.talk2.T2").depends_on == "ref.plain.talk2"
    assert plan.cell("ref.plain.cold.Q").depends_on is None
    assert plan.cell("ref.plain.talk2").turns[1].cold_cell == "ref.plain.cold.talk2.T2"
    assert all(t.endpoint == "chat" for c in plan.cells for t in c.turns)
    # Every dependency runs earlier in plan order.
    position = {c.id: i for i, c in enumerate(plan.cells)}
    assert all(position[c.depends_on] < position[c.id] for c in plan.cells if c.depends_on)


def test_control_of_a_dependent_chat_cell_keeps_the_dependency():
    plan = plan_of(CHAT.replace("talk2: [T1, T2, Q]", "talk2: [T1, T2]"))
    control = plan.cell("ref.plain.control.talk.T2")
    assert control.depends_on == "ref.plain.talk" and control.control_of == "ref.plain.cold.talk.T2"


def test_plan_json_round_trip():
    plan = plan_of(CHAT)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["plan_version"] == 1
    assert Plan.from_dict(data) == plan
    assert isinstance(Plan.from_dict(data).cells[0], Cell)


def test_describe_lists_every_cell_with_its_delta():
    plan = plan_of(BASE)
    text = plan.describe()
    assert text.splitlines()[0] == "10 cells: 4 warm, 4 cold, 2 control"
    for cell in plan.cells:
        row = next(line for line in text.splitlines() if line.startswith(cell.id + " "))
        assert cell.kind.value in row and " → ".join(t.prompt_id for t in cell.turns) in row
        if cell.configuration == "knob":
            assert row.endswith("--ctx-checkpoints 3 K=1")
        else:
            assert row.endswith("-")


def test_every_warm_turn_carries_its_conversation_and_cold_turns_none():
    plan = plan_of(BASE)
    warm = plan.cell("ref.plain.A-B-C")
    assert [t.conversation for t in warm.turns] == ["A-B-C"] * 3  # ordered: one conversation
    assert all(t.conversation is None for c in plan.of_kind(CellKind.COLD) for t in c.turns)


def test_a_plan_json_written_before_turns_had_a_conversation_still_loads():
    plan = plan_of(BASE)
    data = json.loads(json.dumps(plan.to_dict()))
    for cell in data["cells"]:
        for turn in cell["turns"]:
            del turn["conversation"]
    assert Plan.from_dict(data) == plan  # a warm cell's turns: its (ordered) sequence


FIXTURE_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def test_a_plan_json_written_before_cells_carried_their_launch_reads_with_the_defaults():
    """The stored runs' plan.json (written before engine_flags, in_flight, generation and the
    turns' message_delimiters) read as before: every cell with the defaults, nothing refused."""
    stored = sorted(FIXTURE_RUNS.glob("*/plan.json"))
    assert len(stored) >= 3
    for path in stored:
        data = json.loads(path.read_text())
        assert not any("engine_flags" in c or "generation" in c for c in data["cells"]), path
        plan = Plan.from_dict(data)
        assert [c.id for c in plan.cells] == [c["id"] for c in data["cells"]]
        for cell in plan.cells:
            assert (cell.engine_flags, dict(cell.engine_env), cell.in_flight, cell.generation) == ((), {}, 1, None)
            assert not any(t.message_delimiters for t in cell.turns)


def test_every_cell_carries_the_engines_flags_the_generation_and_the_delimiters():
    text = BASE.replace("A: {kind: random, tokens: 100, seed: 1}",
                        "A: {kind: random, tokens: 100, seed: 1, message_delimiters: true}").replace(
        "ref: {kind: reference, model: {preset: tiny}}",
        "ref: {kind: reference, model: {preset: tiny}, flags: [-np, 1], env: {E: x}}")
    m = loads(text, file="m.yaml")
    plan = build_plan(m)
    assert plan.cells[0].engine_flags == ("-lv", "4", "-np", "1") and dict(plan.cells[0].engine_env) == {"E": "x"}
    for cell in plan.cells:
        spec = m.engines[cell.engine]
        assert cell.engine_flags == (*spec.verbosity_flags, *spec.flags) and dict(cell.engine_env) == dict(spec.env)
        assert cell.generation == m.generation and cell.in_flight == 1
        for turn in cell.turns:
            assert turn.message_delimiters == (turn.prompt_id == "A")
    written = json.loads(json.dumps(plan.to_dict()))
    assert Plan.from_dict(written) == plan
    assert all("in_flight" not in c for c in written["cells"])  # 1 is not written
