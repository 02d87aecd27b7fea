"""Prompt materialization: exact token counts, divergence at exactly K, zero overlap, the same
tokens on every run — with a byte tokenizer, a word-piece tokenizer and the reference engine's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from shadowlab.run import prompts
from shadowlab.errors import RunDirError, ShadowlabError
from shadowlab.matrix import load, loads
from shadowlab.run.prompts import common_prefix, materialize, seeded_text, tokens_sha256
from shadowlab_engine import tokenizer as engine_tokenizer

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "matrices" / "ckpt.yaml"


def byte_tokenize(text: str) -> list[int]:
    return list(text.encode("utf-8"))


_PIECE = re.compile(r" ?[A-Za-z]{1,4}|[^A-Za-z]")


def wordpiece_tokenize(text: str) -> list[int]:
    """BPE-like: several characters per token, and a cut mid-word changes the last token."""
    return [1000 + zlib.crc32(p.encode()) % 30000 for p in _PIECE.findall(text)]


def engine_tokenize(text: str) -> list[int]:
    """What the reference engine's /tokenize answers (add_special=false parses no BOS)."""
    return engine_tokenizer.encode(text)


TOKENIZERS = {"bytes": byte_tokenize, "wordpiece": wordpiece_tokenize, "engine": engine_tokenize}


@pytest.fixture(scope="module")
def ckpt_matrix():
    return load(CKPT)


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def ckpt_prompts(request, ckpt_matrix):
    return request.param, materialize(ckpt_matrix.prompts, TOKENIZERS[request.param])


def test_ckpt_prompts_are_exact(ckpt_prompts, ckpt_matrix):
    _, got = ckpt_prompts
    assert list(got) == list(ckpt_matrix.prompts)
    for pid, spec in ckpt_matrix.prompts.items():
        assert len(got[pid].tokens) == spec.length, pid
        assert got[pid].sha256 == tokens_sha256(got[pid].tokens)
        assert got[pid].kind == spec.kind and got[pid].text_seed == spec.seed
    a, c, b = got["A"].tokens, got["C"].tokens, got["B"].tokens
    assert len(a) == 4560 and len(c) == 4947 and len(b) == 99
    assert common_prefix(a, c) == 2531 and c[2531] != a[2531]
    assert common_prefix(a, got["C_first_round"].tokens) == 1956
    assert got["A_append"].tokens[:4560] == a and len(got["A_append"].tokens) == 4766
    assert common_prefix(b, a) == 0 and common_prefix(b, c) == 0
    # The new parts are fresh text, not copies of A.
    assert c[2531:2600] != a[2531:2600]


def test_prompts_are_the_engines_tokens_of_seeded_text():
    m = load(CKPT)
    got = materialize(m.prompts, engine_tokenize)
    text = engine_tokenizer.decode(got["A"].tokens)
    assert text == seeded_text(1, len(text)) and text.isascii()
    tail = engine_tokenizer.decode(got["A_append"].tokens[4560:])
    assert tail == seeded_text(4, len(tail))


def test_wordpiece_prompts_follow_the_text_too():
    m = load(CKPT)
    got = materialize(m.prompts, wordpiece_tokenize)
    assert got["A"].tokens == tuple(wordpiece_tokenize(seeded_text(1, 20000))[:4560])


def test_pinned_values():
    """Changing the text generator changes every prompt of every recorded run: make it loud."""
    assert hashlib.sha256(seeded_text(7, 5000).encode()).hexdigest() == (
        "3b2214353738bde3c27dcd096160d00993e7f96392fcde913276442e373ae75e")
    got = materialize(load(CKPT).prompts, byte_tokenize)
    assert got["A"].sha256 == "a53c62f5efb00614b1a509a151357093df63d1b7324e3e57b061a7faf028cb3d"


def test_token_sha256_is_little_endian_int32():
    assert tokens_sha256([1, 2, 258]) == hashlib.sha256(
        b"\x01\x00\x00\x00" b"\x02\x00\x00\x00" b"\x02\x01\x00\x00").hexdigest()
    assert tokens_sha256([5]) == hashlib.sha256(struct.pack("<i", 5)).hexdigest()
    assert tokens_sha256([1, 2]) != tokens_sha256([2, 1])


def test_seeded_text_properties():
    long = seeded_text(3, 4000)
    assert seeded_text(3, 1000) == long[:1000] and len(long) == 4000
    assert long.isascii() and all(ch.isprintable() or ch == "\n" for ch in long)
    assert seeded_text(4, 1000) != long[:1000]
    assert len(set(long.split())) > 200  # varied words, not a repeated phrase


def test_same_tokens_in_another_process():
    """No hash-order or global-state dependence: a fresh interpreter with another hash seed
    materializes the same token ids."""
    here = {pid: p.sha256 for pid, p in materialize(load(CKPT).prompts, byte_tokenize).items()}
    code = ("import json; from shadowlab.matrix import load; from shadowlab.run.prompts import materialize;"
            f"m = load({str(CKPT)!r});"
            "print(json.dumps({k: p.sha256 for k, p in materialize(m.prompts, lambda t: list(t.encode())).items()}))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == here


def _matrix(prompts_yaml: str, sequence: str):
    return loads(f"""\
version: 1
name: t
engines: {{ref: {{kind: reference, model: {{preset: tiny}}}}}}
prompts:
{prompts_yaml}
sequences: {{s: {sequence}}}
""", file="m.yaml")


def test_divergence_is_exact_even_when_the_new_text_starts_like_the_source():
    """Pick K where the source holds exactly the first token of the new text: a naive splice
    would share K + 1 tokens."""
    source = seeded_text(11, 3000)
    new_first = ord(seeded_text(12, 1)[0])
    k = next(i for i in range(1, 3000) if ord(source[i]) == new_first)
    m = _matrix(f"  A: {{kind: random, tokens: 3000, seed: 11}}\n"
                f"  C: {{kind: diverge, from: A, shared: {k}, tokens: 3500, seed: 12}}", "[A, C]")
    got = materialize(m.prompts, byte_tokenize)
    a, c = got["A"].tokens, got["C"].tokens
    assert a[k] == new_first  # the trap is set
    assert common_prefix(a, c) == k and len(c) == 3500


def test_unrelated_has_zero_overlap_even_when_every_text_starts_alike():
    """A tokenizer that starts every text with the same token (like a BOS) must not make B
    share a prefix with A."""
    def with_bos(text: str) -> list[int]:
        return [256] + list(text.encode())

    m = _matrix("  A: {kind: random, tokens: 200, seed: 1}\n  B: {kind: unrelated, tokens: 50, seed: 2}", "[A, B]")
    got = materialize(m.prompts, with_bos)
    assert got["A"].tokens[0] == 256
    assert got["B"].tokens[0] != 256 and common_prefix(got["A"].tokens, got["B"].tokens) == 0
    assert len(got["B"].tokens) == 50


def test_unrelated_prompts_differ_from_each_other_by_default():
    m = _matrix("  A: {kind: random, tokens: 20, seed: 1}\n  B: {kind: unrelated, tokens: 20, seed: 1}\n"
                "  D: {kind: unrelated, tokens: 20, seed: 1}", "[A, B, D]")
    got = materialize(m.prompts, byte_tokenize)
    firsts = {got[p].tokens[0] for p in "ABD"}
    assert len(firsts) == 3  # same seed everywhere, still three different first tokens


def test_a_tokenizer_that_gives_nothing_is_an_error():
    m = _matrix("  A: {kind: random, tokens: 20, seed: 1}", "[A]")
    with pytest.raises(ShadowlabError, match="only 0 usable tokens"):
        materialize(m.prompts, lambda text: [])


def test_chat_prompts_are_not_materialized_ahead():
    m = _matrix("  A: {kind: random, tokens: 20, seed: 1}\n  T: {kind: chat, messages: [{role: user, content: hi}]}",
                "[A, T]")
    assert list(materialize(m.prompts, byte_tokenize)) == ["A"]


def test_save_and_load(tmp_path):
    got = materialize(load(CKPT).prompts, byte_tokenize)
    path = tmp_path / "prompts" / "reference.json"
    prompts.save(got, path)
    data = json.loads(path.read_text())
    assert set(data["A"]) == {"kind", "tokens", "sha256", "text_seed"}
    assert prompts.load(path) == got
    assert [p.name for p in path.parent.iterdir()] == ["reference.json"]  # no temp files left
    data["C"]["tokens"][0] += 1
    path.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match="'C': sha256 does not match"):
        prompts.load(path)
    path.write_text("{not json")
    with pytest.raises(RunDirError, match="cannot read prompts"):
        prompts.load(path)


CHAT = """\
  T1: {kind: chat, messages: [{role: system, content: be brief}, {role: user, content: hi}]}
  T2:
    kind: chat
    messages:
      - {role: system, content: be brief}
      - {role: user, content: hi}
      - {role: assistant, content: {from_turn: 0}}
      - {role: user, content: and then}"""


def test_chat_messages_splice_the_warm_reply():
    m = _matrix(CHAT, "[T1, T2]")
    messages = prompts.chat_messages(m.prompts["T2"], {0: "hello there"})
    assert messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "and then"}]
    with pytest.raises(ShadowlabError, match="reply to turn 0"):
        prompts.chat_messages(m.prompts["T2"], {})


def test_chatml_rendering_matches_the_reference_engine():
    m = _matrix(CHAT, "[T1, T2]")
    messages = prompts.chat_messages(m.prompts["T2"], {0: "yes <ok>"})
    assert prompts.render_chatml(messages) == engine_tokenizer.chatml_text(messages)
    turn = prompts.materialize_chat(m.prompts["T2"], {0: "yes"}, engine_tokenize)
    assert turn.tokens == tuple(engine_tokenizer.render_chatml(prompts.chat_messages(m.prompts["T2"], {0: "yes"})))
    assert turn.tokens.count(engine_tokenizer.IM_START) == 5 and turn.sha256 == tokens_sha256(turn.tokens)
