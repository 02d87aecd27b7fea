"""The generic OpenAI-compatible adapter: reuse from `usage.prompt_tokens_details.cached_tokens`.

Proven against two real servers' `/v1/chat/completions`: llama-server (whose own adapter and
`-lv 4` log give the reference figures, turn by turn) and the reference engine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from shadowlab.judge import verdicts
from shadowlab.engines import TurnRequest
from shadowlab.engines.openai import OpenAIAdapter, cached_tokens
from shadowlab.matrix import Generation

from .conftest import run_matrix

REPO = Path(__file__).resolve().parents[2]

CHAT_ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Check the relief valve."},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 6, "total_tokens": 126,
              "prompt_tokens_details": {"cached_tokens": 96}},
}


def test_reuse_comes_from_cached_tokens():
    result = OpenAIAdapter().parse_response(CHAT_ANSWER)
    assert (result.reused_tokens, result.processed_tokens) == (96, 24)
    assert result.text == "Check the relief valve." and result.stop_type == "length"
    assert result.tokens == () and result.prompt_ms is None


def test_missing_or_malformed_usage_means_unknown_not_zero():
    text = {"choices": [{"text": "abc", "finish_reason": "stop"}]}
    for usage in ({}, {"usage": {"prompt_tokens": 5}},
                  {"usage": {"prompt_tokens_details": {"cached_tokens": "12"}}},
                  {"usage": {"prompt_tokens_details": {"cached_tokens": True}}}):
        body = {**text, **usage}
        assert cached_tokens(body) is None
        assert OpenAIAdapter().parse_response(body).reused_tokens is None
    completion = {**text, "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}}
    result = OpenAIAdapter().parse_response(completion)
    assert (result.text, result.reused_tokens, result.processed_tokens) == ("abc", 0, 10)


def test_an_answer_without_choices_is_an_error_not_an_empty_completion():
    for body in ({"choices": []}, {"usage": {"prompt_tokens": 5}}, {"choices": ["x"]}):
        with pytest.raises(ValueError):
            OpenAIAdapter().parse_response(body)


def test_requests_use_openai_shapes():
    adapter = OpenAIAdapter()
    adapter._banned_tokens = (200,)  # noqa: SLF001 - as prepare() sets it for a generated GGUF
    generation = Generation(n_predict=5, temperature=0.0)
    path, body = adapter.completion_request(
        TurnRequest(0, "t", messages=({"role": "user", "content": "hi"},)), generation)
    assert path == "/v1/chat/completions"
    assert body == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.0,
                    "logit_bias": {"200": -100}}
    path, body = adapter.completion_request(TurnRequest(0, "t", prompt_tokens=(1, 2)), generation)
    assert path == "/v1/completions" and body["prompt"] == [1, 2]


# ------------------------------------------------------------------ against real servers


def _matrix(tmp_path: Path, binary: Path) -> Path:
    chat = yaml.safe_load((REPO / "matrices" / "chat.yaml").read_text())
    server_flags = ["-c", "8192", "-b", "2048", "-ub", "512", "--kv-unified", "--ctx-checkpoints", "64",
                    "-cram", "0", "-np", "1"]
    data = {
        "version": 1,
        "name": "openai-adapter",
        "engines": {
            "llama_native": {"kind": "llama-server", "model": {"gguf": {"preset": "tiny", "seed": 0}},
                             "binary": str(binary), "flags": server_flags, "threads": 1},
            "llama_openai": {"kind": "openai", "model": {"gguf": {"preset": "tiny", "seed": 0}},
                             "command": [str(binary), "-m", "{model}", "--host", "{host}", "--port", "{port}",
                                         "-t", "{threads}", *server_flags], "threads": 1},
            "reference_openai": {"kind": "openai", "model": {"preset": "tiny", "seed": 0},
                                 "command": [sys.executable, "-m", "shadowlab_engine", "-m", "{model}",
                                             "--port", "{port}", "-t", "{threads}", *server_flags],
                                 "threads": 1},
        },
        "prompts": {k: chat["prompts"][k] for k in ("turn1", "turn2", "turn4_new_system")},
        "sequences": {"receipt": ["turn1", "turn2", "turn4_new_system"], "short": ["turn1", "turn2"]},
        "cells": {"include": [{"engine": "llama_*", "sequence": "receipt"},
                              {"engine": "reference_openai", "sequence": "short"}]},
        "generation": {"n_predict": 8, "temperature": 0},
        "identity": {"required": True, "control": False},
    }
    path = tmp_path / "openai.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.llama
def test_openai_adapter_against_llama_server_and_reference_engine(tmp_path, model_cache, llama_binary):
    run_dir = run_matrix(_matrix(tmp_path, llama_binary), tmp_path / "run", model_cache)
    verdict = verdicts.compute(run_dir)
    native = verdict.cell("llama_native.default.receipt")
    openai = verdict.cell("llama_openai.default.receipt")
    reference = verdict.cell("reference_openai.default.short")
    assert all(c.status == "ok" for c in verdict.cells), [(c.cell_id, c.reason) for c in verdict.cells]
    assert openai.reuse_source == "api" and native.reuse_source == "api+log"
    # Turn by turn, cached_tokens says what llama-server's timings and log say.
    assert [t.reused_tokens for t in openai.turns] == [t.reused_log for t in native.turns]
    assert [t.reused_tokens for t in openai.turns] == [t.reused_api for t in native.turns]
    assert openai.turns[1].reused_tokens > 0 and openai.turns[2].reused_tokens == 0
    assert [t.identity.status.value for t in openai.turns[1:]] == ["identical", "identical_no_reuse"]
    # The reference engine reports cached_tokens the same way: turn 2 reuses turn 1.
    assert reference.turns[1].reused_tokens > 0
    assert reference.turns[1].identity.status.value == "identical"
