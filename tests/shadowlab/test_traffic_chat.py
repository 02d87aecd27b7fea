"""Issue 12's chat lever on traffic, the matrix side: a traffic shape's `user_delimiter` and a
configuration's `message_delimiters` load, dump and are refused by name when malformed; the
turns of such a configuration carry llama.cpp's `message_delimiters` (and only theirs)."""

from __future__ import annotations

import pytest

from shadowlab.errors import MatrixError
from shadowlab.matrix import loads

MATRIX = """\
version: 1
name: chat
engines:
  llama:
    kind: llama-server
    model: {gguf: {preset: tiny, seed: 0}}
configurations:
  raw: {}
  chat:
    message_delimiters: true
sequences:
  traffic:
    kind: traffic
    shape: {conversations: 2, turns: 3, user_delimiter: true}
"""


def test_the_two_keys_load_and_dump():
    m = loads(MATRIX, file="m.yaml")
    assert m.configurations["chat"].message_delimiters and not m.configurations["raw"].message_delimiters
    assert m.sequences["traffic"].source.user_delimiter
    assert all(r.user_starts for r in m.sequences["traffic"].requests if r.conversation is not None)
    dumped = m.to_dict()["configurations"]
    assert dumped["chat"]["message_delimiters"] is True and "message_delimiters" not in dumped["raw"]


@pytest.mark.parametrize("old, new, path, message", [
    ("message_delimiters: true", "message_delimiters: 1", "configurations.chat.message_delimiters",
     "expected true or false"),
    ("user_delimiter: true", "user_delimiter: yes please", "sequences.traffic.shape",
     "user_delimiter must be true or false"),
])
def test_a_bad_value_is_named_by_its_key(old, new, path, message):
    with pytest.raises(MatrixError) as info:
        loads(MATRIX.replace(old, new), file="m.yaml")
    assert info.value.key_path.startswith(path) and message in info.value.message


def test_a_chat_configurations_traffic_turns_carry_the_delimiters(tmp_path):
    from shadowlab.plan import Turn
    from shadowlab.run import TurnExchange

    from shadowlab.run.prompts import MaterializedPrompt

    class Engine:
        prompts = {"traffic-t0000": MaterializedPrompt.of("traffic-t0000", "traffic", [1, 2], None)}

    class Ctx:
        prompt_specs = loads(MATRIX, file="m.yaml").prompts

    from shadowlab.engines import get_adapter
    from shadowlab.plan import build_plan

    plan = build_plan(loads(MATRIX, file="m.yaml"))
    carried: dict[str, set[bool]] = {}
    for c in plan.cells:  # the plan carries the configuration's flag on every turn, references too
        carried.setdefault(c.configuration, set()).update(t.message_delimiters for t in c.turns)
    assert carried == {"raw": {False}, "chat": {True}}
    bodies = []
    for d in (False, True):
        turn = Turn(0, "traffic-t0000", "completion", conversation="c0", message_delimiters=d)
        request = TurnExchange(Ctx(), Engine(), None, tmp_path, turn, {}, generation=None)._request()
        bodies.append(get_adapter("reference").completion_request(request, plan.cells[0].generation)[1])
    assert "message_delimiters" not in bodies[0]
    assert bodies[1]["message_delimiters"] == [{"role": "user", "delimiter": "<|im_start|>user"}]
