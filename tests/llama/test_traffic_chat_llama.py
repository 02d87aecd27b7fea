"""Issue 12's chat lever on the real llama-server: matrices/traffic-llama.yaml's delimited
traffic (every user message opens with <|im_start|>user's tokens) run by shadowlab under a raw
configuration and two that send `message_delimiters`. Read from the engine's log (the
verdicts' created checkpoints): the chat cells get checkpoints at the traffic's user starts, the
raw cell at none; every chat turn that reused cache is byte-identical to its replayed
reference, and the gate qualifies the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shadowlab.judge import gate
from shadowlab.judge.identity import IdentityStatus
from shadowlab.matrix import load as load_matrix

from .conftest import run_matrix

pytestmark = pytest.mark.llama

REPO = Path(__file__).resolve().parents[2]
CONFIGURATIONS = ("np1", "np1_chat_cms256", "np1_cram_chat")


@pytest.fixture(scope="module")
def run(tmp_path_factory, model_cache, llama_binary):
    tmp = tmp_path_factory.mktemp("traffic-chat")
    data = yaml.safe_load((REPO / "matrices" / "traffic-llama.yaml").read_text())
    data["configurations"] = {n: data["configurations"][n] for n in CONFIGURATIONS}
    data["sequences"] = {"traffic": data["sequences"]["traffic"]}  # sent one after another
    data.pop("cells")
    data["identity"]["control"] = False  # the control is the ordered matrices' business
    path = tmp / "traffic-chat.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = run_matrix(path, tmp / "run", model_cache)
    return gate.evaluate(run_dir), load_matrix(path).sequences["traffic"].requests


def _at_user_starts(result, requests, configuration: str) -> int:
    cell = result.inputs.verdict.cell(f"llama.{configuration}.traffic")
    return sum(len({c.n_tokens for c in t.created} & set(r.user_starts)) for t, r in zip(cell.turns, requests))


def test_the_delimited_traffic_qualifies(run):
    result, _ = run
    failed = [f"{c.check} {c.subject}: {c.message}" for c in result.checks if not c.passed]
    assert result.exit_code == 0, failed


def test_message_delimiters_put_checkpoints_at_the_user_starts(run):
    result, requests = run
    assert _at_user_starts(result, requests, "np1") == 0  # raw /completion: the tail ones only
    assert _at_user_starts(result, requests, "np1_chat_cms256") > 0
    assert _at_user_starts(result, requests, "np1_cram_chat") > 0


def test_every_reused_chat_turn_is_identical_to_its_reference(run):
    result, _ = run
    for configuration in ("np1_chat_cms256", "np1_cram_chat"):
        turns = result.inputs.verdict.cell(f"llama.{configuration}.traffic").turns
        reused = [t for t in turns if t.reused_tokens]
        assert all(t.identity is not None and t.identity.status is IdentityStatus.IDENTICAL for t in reused)
    assert any(t.reused_tokens for t in result.inputs.verdict.cell("llama.np1_cram_chat.traffic").turns)
