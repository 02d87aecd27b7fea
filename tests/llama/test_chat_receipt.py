"""The chat receipt (seeds/001) as a matrix, run by shadowlab against the real llama-server.

`matrices/chat.yaml` is run as committed, restricted to its llama-server engine (its reference
engine cells belong to the reference engine's own tests): the gate must qualify it, with warm
turn 2 extending turn 1 (`cached_tokens` > 0) and equal to the cold run. Then the same matrix
with turn 2's system prompt changed — a client that re-renders the prompt differently — must
fail exactly that check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shadowlab.judge import gate

from .conftest import run_matrix

pytestmark = pytest.mark.llama

REPO = Path(__file__).resolve().parents[2]
CHAT = REPO / "matrices" / "chat.yaml"


def _llama_only(tmp_path: Path, edit=None) -> Path:
    data = yaml.safe_load(CHAT.read_text())
    data["engines"] = {"llama": data["engines"]["llama"]}
    data["expectations"] = [x for x in data["expectations"] if x.get("engine", "llama") == "llama"]
    data["identity"]["control"] = False  # the control is covered by the case-study run
    if edit is not None:
        edit(data)
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def receipt(tmp_path_factory, model_cache, llama_binary):
    tmp = tmp_path_factory.mktemp("chat")
    run_dir = run_matrix(_llama_only(tmp), tmp / "run", model_cache)
    return gate.evaluate(run_dir), run_dir


def _turn(result, cell_id: str, prompt_id: str):
    cell = result.inputs.verdict.cell(cell_id)
    return next(t for t in cell.turns if t.prompt_id == prompt_id)


def test_warm_turn2_extends_turn1_and_equals_the_cold_run(receipt):
    result, run_dir = receipt
    failed = [c for c in result.checks if not c.passed]
    assert result.exit_code == 0, [f"{c.check} {c.subject}: {c.message}" for c in failed]
    turn2 = _turn(result, "llama.default.receipt", "turn2")
    assert turn2.reused_tokens > 0
    assert turn2.identity is not None and turn2.identity.status.value == "identical"


def test_log_and_api_agree_on_every_chat_turn(receipt):
    result, _ = receipt
    cell = result.inputs.verdict.cell("llama.default.receipt")
    assert cell.reuse_source == "api+log"
    for turn in cell.turns:
        assert turn.reused_api == turn.reused_log, turn
        assert turn.processed_api == turn.processed_log, turn
        assert turn.disagreements == (), turn.disagreements
    outcomes = [t.outcome.value for t in cell.turns]
    assert outcomes[0] == "cold" and outcomes[1] in ("extended", "restored")
    assert outcomes[2:] == ["restored", "forced"]


def test_changed_render_fails_the_receipt(tmp_path, model_cache, llama_binary):
    def new_system_prompt_on_turn2(data):
        data["prompts"]["turn2"]["messages"][0]["content"] = "You are a cheerful assistant."

    run_dir = run_matrix(_llama_only(tmp_path, new_system_prompt_on_turn2), tmp_path / "run", model_cache)
    result = gate.evaluate(run_dir)
    assert result.exit_code == 1
    failed = {(c.check, c.turn) for c in result.checks if not c.passed}
    assert ("min_reused", 1) in failed and ("outcome", 1) in failed
    turn2 = _turn(result, "llama.default.receipt", "turn2")
    assert turn2.reused_tokens == 0 and turn2.outcome.value == "forced"
