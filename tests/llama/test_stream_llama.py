"""Streamed answers on the real llama-server b11434 (issue 14): the events shadowlab reads back
(shadowlab/engines/streamed.py) add up to the answer the same request gets unstreamed, token ids and
text; through `shadowlab run` the first token is timed at its event, well before the answer ends.

llama-server sends no event for a token whose text ends inside a UTF-8 character, so its ids
never reach the stream; the lone-byte tokens of the generated model are banned (as the adapter
bans them), and a stream that lost ids anyway keeps its text and drops its ids, so identity
compares the text (tests/shadowlab/test_streamed.py, on a captured b11434 stream).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowlab.results import rundir
from shadowlab.engines import streamed

from .conftest import BANNED, run_matrix

pytestmark = pytest.mark.llama

N_PREDICT = 64


def _streamed(server, prompt: list[int], **extra) -> streamed.StreamedAnswer:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False,
            "return_tokens": True, "logit_bias": BANNED, "stream": True, **extra}
    with server.client.stream("POST", "/completion", json=body) as response:
        assert response.status_code == 200 and streamed.is_event_stream(response.headers["content-type"])
        return streamed.read(response.iter_raw(), n_predict=N_PREDICT, max_bytes=1 << 24, deadline=float("inf"))


def test_the_streamed_answer_equals_the_unstreamed_one(llama, prompts):
    with llama() as server:
        for prompt in (prompts["B"], prompts["A"][:300]):
            plain = server.complete(prompt, n_predict=N_PREDICT, cache_prompt=False).json()
            answer = _streamed(server, prompt).body
            assert len(plain["tokens"]) > 8  # an EOS may end it sooner: then both end there
            assert answer["tokens"] == plain["tokens"] and answer["content"] == plain["content"]
            assert answer["stop_type"] == plain["stop_type"] and answer["timings"].keys() == plain["timings"].keys()
            assert answer["timings"]["prompt_n"] == plain["timings"]["prompt_n"] == len(prompt)
        # with n_probs the probabilities come one per token event; joined, they are the answer's
        plain = server.complete(prompts["B"], n_predict=N_PREDICT, cache_prompt=False, n_probs=2).json()
        answer = _streamed(server, prompts["B"], n_probs=2).body
        assert answer["completion_probabilities"] == plain["completion_probabilities"]
        assert len(plain["completion_probabilities"]) == len(plain["tokens"])


MATRIX = """\
version: 1
name: ttft-llama
engines:
  llama:
    kind: llama-server
    model: {gguf: {preset: tiny, seed: 0}}
    binary: auto
    flags: [-c, 2048, -np, 1, -cram, 0]
    threads: 1
prompts:
  A: {kind: random, tokens: 200, seed: 1}
sequences:
  A: [A]
generation: {n_predict: %d, temperature: 0}
isolation: {cores_per_cell: 1}
identity: {control: false}
""" % N_PREDICT


def test_through_shadowlab_run_the_first_token_comes_before_the_answer(llama, tmp_path: Path, model_cache):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(MATRIX)
    run = run_matrix(matrix, tmp_path / "run", model_cache)
    metas = rundir.read_cell_metas(run)
    assert metas
    with llama() as server:
        for meta in metas.values():
            turn = meta.turns[0]
            assert turn.error is None and len(turn.completion.tokens) > 8, turn.error
            assert 0 < turn.ttft_ms < turn.response_ms - 0.5 * turn.timings["predicted_ms"]
            stored = json.loads((run / "cells" / meta.cell_id / turn.response_file).read_text())
            assert stored["tokens"] == turn.completion.tokens
            plain = server.complete(turn.prompt_token_ids, n_predict=N_PREDICT, cache_prompt=False).json()
            assert plain["tokens"] == turn.completion.tokens
