"""The real llama-server b11434 with a generated hybrid GGUF does what BRIEF §3 reports.

Each test starts fresh server processes on 127.0.0.1 and reads both the API (`timings`) and
the `-lv 4` log (through shadowlab's own parser). Prompts are the case study's A, B, C at a
quarter of the length (A 1,200 tokens, C shares 600, B 60 with zero overlap) so the suite stays
fast on two shared cores; the positions scale with L exactly as the source says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowlab.engines.llama_server import gguf_model
from shadowlab.engines import TurnRequest, get_adapter
from shadowlab.engines.llama_server import LlamaServerAdapter, has_verbosity_flag, reused_tokens

from .conftest import L_A, L_C, SHARED_C, USER_DELIMITERS, kinds

pytestmark = pytest.mark.llama

UB = 512


def _ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def _reuse(body: dict) -> tuple[int, int]:
    return body["timings"]["cache_n"], body["timings"]["prompt_n"]


# ------------------------------------------------------------------ placement


@pytest.mark.parametrize("ub", [512, 256])
def test_raw_prompt_gets_tail_checkpoints_only(llama, prompts, ub):
    with llama(["-cram", "0", "-ub", str(ub)]) as server:
        _ok(server.complete(prompts["A"]))
        created = kinds(server.turn_events(), "created")
    assert [c.n_tokens for c in created] == [L_A - 4 - ub, L_A - 4]
    assert [c.pos_max for c in created] == [L_A - 5 - ub, L_A - 5]


# ------------------------------------------------------------------ A→C, A→B→C at -cram 0


def test_a_then_c_is_forced_at_cram0(llama, prompts):
    with llama(["-cram", "0"]) as server:
        _ok(server.complete(prompts["A"]))
        body = _ok(server.complete(prompts["C"]))
        events = server.turn_events()
    assert _reuse(body) == (0, L_C)
    assert kinds(events, "forced"), "a partial match with no usable checkpoint logs the forcing line"
    assert not kinds(events, "restored")
    # The cascade erased both of A's checkpoints (both lie above the divergence point).
    assert sorted(e.n_tokens for e in kinds(events, "erased_invalidated")) == [L_A - 4 - UB, L_A - 4]


def test_a_then_b_then_c_is_silent_at_cram0(llama, prompts):
    with llama(["-cram", "0"]) as server:
        _ok(server.complete(prompts["A"]))
        b = _ok(server.complete(prompts["B"]))
        b_events = server.turn_events()
        c = _ok(server.complete(prompts["C"]))
        c_events = server.turn_events()
    assert _reuse(b)[0] == 0 and _reuse(c)[0] == 0
    # Zero overlap: the slot resets without a forcing line — the loss is silent, twice.
    assert not kinds(b_events, "forced") and not kinds(c_events, "forced")
    assert len(kinds(b_events, "erased_invalidated")) == 2, "B's cascade erases every checkpoint of A"


# ------------------------------------------------------------------ the RAM prompt cache


def test_cram_rescues_a_b_a_but_not_a_b_c(llama, prompts):
    with llama(["-cram", "8192"]) as server:
        for name in ("A", "B"):
            _ok(server.complete(prompts[name]))
        again = _ok(server.complete(prompts["A"]))
        restored = kinds(server.turn_events(), "restored")
    assert _reuse(again) == (L_A - 4, 4)
    assert [r.n_tokens for r in restored] == [L_A - 4]

    with llama(["-cram", "8192"]) as server:
        for name in ("A", "B"):
            _ok(server.complete(prompts[name]))
        c = _ok(server.complete(prompts["C"]))
        events = server.turn_events()
    assert _reuse(c) == (0, L_C)
    # The cache brought A's state back, but its checkpoints lie above the divergence point.
    assert kinds(events, "forced") and not kinds(events, "restored")


def test_cram0_does_not_rescue_a_b_a(llama, prompts):
    """The control for the test above: the same sequence without the prompt cache."""
    with llama(["-cram", "0"]) as server:
        for name in ("A", "B"):
            _ok(server.complete(prompts[name]))
        again = _ok(server.complete(prompts["A"]))
    assert _reuse(again) == (0, L_A)


# ------------------------------------------------------------------ message delimiters


def _conversation(server, edited: bool) -> list[int]:
    from shadowlab.run.prompts import render_chatml, seeded_text

    messages = [{"role": "system", "content": seeded_text(10, 150)}]
    for i in range(3):
        user = seeded_text(20 + i, 300)
        if edited and i == 1:
            user = user[:100] + seeded_text(99, 200)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": seeded_text(30 + i, 300)}]
    messages.append({"role": "user", "content": seeded_text(41 if edited else 40, 700)})
    return server.tokenize(render_chatml(messages))


def _user_starts(tokens: list[int], start_id: int) -> list[int]:
    user = [ord("u"), ord("s")]
    return [i for i in range(len(tokens) - 2) if tokens[i] == start_id and tokens[i + 1:i + 3] == user]


@pytest.mark.parametrize("min_step", [None, 256])
def test_message_delimiters_make_a_then_c_restore(llama, min_step):
    flags = ["-cram", "0"] + ([] if min_step is None else ["--checkpoint-min-step", str(min_step)])
    with llama(flags) as server:
        a, c = _conversation(server, edited=False), _conversation(server, edited=True)
        divergence = next(i for i, (x, y) in enumerate(zip(a, c)) if x != y)
        starts = _user_starts(a, gguf_model.special_token_id("<|im_start|>"))
        _ok(server.complete(a, message_delimiters=USER_DELIMITERS))
        created = [e.n_tokens for e in kinds(server.turn_events(), "created")]
        body = _ok(server.complete(c, message_delimiters=USER_DELIMITERS))
        restored = kinds(server.turn_events(), "restored")
    below = [s for s in starts if s < divergence]
    # Default spacing (8192): the first and the last user-message start; 256: every one.
    expected_starts = [starts[0], starts[-1]] if min_step is None else starts
    assert [n for n in created if n in starts] == expected_starts
    reentry = max(s for s in below if s in expected_starts)
    assert [r.n_tokens for r in restored] == [reentry]
    assert _reuse(body) == (reentry, len(c) - reentry)


def test_message_delimiters_with_cram_rescue_a_b_c(llama, prompts):
    with llama(["-cram", "8192", "--checkpoint-min-step", "256"]) as server:
        a, c = _conversation(server, edited=False), _conversation(server, edited=True)
        divergence = next(i for i, (x, y) in enumerate(zip(a, c)) if x != y)
        starts = _user_starts(a, gguf_model.special_token_id("<|im_start|>"))
        _ok(server.complete(a, message_delimiters=USER_DELIMITERS))
        _ok(server.complete(prompts["B"]))
        body = _ok(server.complete(c, message_delimiters=USER_DELIMITERS))
    assert _reuse(body)[0] == max(s for s in starts if s < divergence)


# ------------------------------------------------------------------ identity


def test_warm_restore_equals_cold_run(llama):
    """Where reuse happened, the warm completion equals a fresh server's: text and token ids."""
    with llama(["-cram", "0", "--checkpoint-min-step", "256"]) as server:
        a, c = _conversation(server, edited=False), _conversation(server, edited=True)
        _ok(server.complete(a, message_delimiters=USER_DELIMITERS, n_predict=16))
        warm = _ok(server.complete(c, message_delimiters=USER_DELIMITERS, n_predict=16))
    with llama(["-cram", "0", "--checkpoint-min-step", "256"]) as server:
        cold = _ok(server.complete(c, message_delimiters=USER_DELIMITERS, n_predict=16))
    assert warm["timings"]["cache_n"] > 0 and cold["timings"]["cache_n"] == 0
    assert warm["tokens"] and warm["tokens"] == cold["tokens"]
    assert warm["content"] == cold["content"]


# ------------------------------------------------------------------ invalid UTF-8


def test_lone_bytes_are_generated_unless_banned(llama, prompts):
    """The byte-level model does emit lone non-UTF-8 bytes; the adapter's logit_bias bans them.

    BRIEF §3 saw llama-server refuse such a completion with HTTP 400 (`invalid UTF-8 byte`);
    b11434 as built here answers 200 with U+FFFD in `content` (measured: 120 of 120 unbiased
    requests). Either way the ids differ from what the text says, so the harness bans them.
    """
    lone = set(gguf_model.invalid_utf8_token_ids())
    with llama(["-cram", "0"]) as server:
        hit = None
        for start in range(0, 400, 40):
            prompt = prompts["A"][start:start + 30]
            response = server.complete(prompt, n_predict=8, logit_bias=[])
            if response.status_code != 200 or lone & set(response.json()["tokens"]):
                hit = (prompt, response)
                break
        assert hit is not None, "no unbiased completion produced a lone byte in 10 tries"
        prompt, response = hit
        if response.status_code == 200:
            assert "\ufffd" in response.json()["content"]
        else:
            assert response.status_code == 400 and "UTF-8" in response.text
        banned = _ok(server.complete(prompt, n_predict=8))
        assert not lone & set(banned["tokens"])
        assert "\ufffd" not in banned["content"]
        assert server.proc.poll() is None


# ------------------------------------------------------------------ the adapter itself


def _spec(binary, model_path=None, family="llama.cpp", flags=(), verbosity=("-lv", "4")):
    from shadowlab.matrix import EngineSpec, ModelSpec

    model = ModelSpec("gguf", preset="tiny", seed=0) if model_path is None else ModelSpec("path", path=model_path)
    return EngineSpec(name="llama", kind="llama-server", model=model, binary=str(binary), command=None,
                      flags=tuple(flags), env={}, threads=1, ready_timeout_s=60, log_family=family,
                      log_patterns=(), verbosity_flags=tuple(verbosity))


def test_adapter_identity_and_command(llama_binary, model_cache, tmp_path):
    adapter = get_adapter("llama-server")
    identity = adapter.prepare(_spec(llama_binary), model_cache)
    assert identity.binary_path == str(llama_binary) and len(identity.binary_sha256) == 64
    assert "version" in identity.version
    assert identity.extra["build"] == 11434, "pip builds print build 0: the package version says b11434"
    assert identity.model_sha256 == gguf_sha(model_cache)
    argv = adapter.command(_spec(llama_binary), ["-cram", "0"], 12345, 1, tmp_path / "log")
    assert argv[0] == str(llama_binary) and argv.count("-lv") == 1 and argv[-2:] == ["-cram", "0"]
    # -lv 4 is added when the family needs TRACE lines and the matrix gave no verbosity flag.
    quiet = adapter.command(_spec(llama_binary, verbosity=()), [], 12345, 1, tmp_path / "log")
    assert quiet[quiet.index("-lv") + 1] == "4"
    ik = get_adapter("llama-server")
    ik.prepare(_spec(llama_binary, family="ik_llama.cpp", verbosity=()), model_cache)
    assert not has_verbosity_flag(ik.command(_spec(llama_binary, family="ik_llama.cpp", verbosity=()), [],
                                             12345, 1, tmp_path / "log"))


def gguf_sha(cache: Path) -> str:
    from shadowlab.engines import sha256_file

    return sha256_file(gguf_model.ensure_gguf("tiny", 0, cache))


def test_adapter_bans_lone_bytes_only_for_generated_models(llama_binary, model_cache, tiny_gguf):
    from shadowlab.matrix import Generation

    generation = Generation(n_predict=4, temperature=0.0)
    turn = TurnRequest(0, "A", prompt_tokens=(1, 2, 3))
    generated = get_adapter("llama-server")
    generated.prepare(_spec(llama_binary), model_cache)
    _, body = generated.completion_request(turn, generation)
    assert body["logit_bias"] == [[t, False] for t in range(128, 256)]
    given = get_adapter("llama-server")
    given.prepare(_spec(llama_binary, model_path=tiny_gguf), model_cache)
    _, body = given.completion_request(turn, generation)
    assert "logit_bias" not in body


def test_version_text_of_several_builds():
    from shadowlab.engines.llama_server import parse_version

    assert parse_version("version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0") == (None, None)
    assert parse_version("version: 11434 (build 11434, commit 1a2b3c4)") == (11434, "1a2b3c4")
    assert parse_version("version: 4521 (6171c9d2)\nbuilt with cc") == (4521, "6171c9d2")
    assert parse_version("llama-server: unknown option --version") == (None, None)


def test_families_read_reuse_their_own_way():
    upstream = {"timings": {"cache_n": 700, "prompt_n": 600}, "tokens_evaluated": 1300}
    ik = {"timings": {"prompt_n": 600}, "tokens_evaluated": 1300, "tokens_cached": 1316}
    assert reused_tokens(upstream, "llama.cpp") == 700
    assert reused_tokens(ik, "ik_llama.cpp") == 700
    assert reused_tokens(ik, "llama.cpp") is None, "never guessed across families"
    adapter = LlamaServerAdapter()
    adapter.log_family = "ik_llama.cpp"
    result = adapter.parse_response(ik | {"content": "x", "tokens": [120], "stop_type": "limit"})
    assert (result.reused_tokens, result.processed_tokens) == (700, 600)


# ------------------------------------------------------------------ the harness end to end


def test_harness_verdicts_from_log_and_timings_agree(tmp_path, model_cache, llama_binary):
    """matrices/ckpt-llama.yaml at a quarter of its prompt lengths, run by shadowlab itself.

    On every turn of every cell the reuse the parser reads from the `-lv 4` log equals
    `timings.cache_n`, and the processed count equals `timings.prompt_n`.
    """
    import yaml

    from shadowlab.judge import verdicts

    from .conftest import run_matrix

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "matrices" / "ckpt-llama.yaml").read_text())
    data["engines"]["llama"]["binary"] = str(llama_binary)
    data["prompts"] = {k: data["prompts"][k] for k in ("A", "C", "B")}
    data["prompts"]["A"]["tokens"] = L_A
    data["prompts"]["C"].update(shared=SHARED_C, tokens=L_C)
    data["prompts"]["B"]["tokens"] = 60
    data["sequences"] = {k: data["sequences"][k] for k in ("A-C", "A-B-C", "A-B-A")}
    data["cells"] = {"include": [{"configuration": "cram0", "sequence": "*"},
                                 {"configuration": "cram8192", "sequence": "A-B-*"}]}
    data["identity"]["control"] = False
    data["expectations"] = []
    path = tmp_path / "ckpt-llama-short.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    verdict = verdicts.compute(run_matrix(path, tmp_path / "run", model_cache))

    for cell in verdict.cells:
        assert cell.status == "ok" and cell.reuse_source == "api+log", (cell.cell_id, cell.reason)
        for turn in cell.turns:
            where = f"{cell.cell_id} turn {turn.index}"
            assert turn.reused_api is not None and turn.reused_api == turn.reused_log, where
            assert turn.processed_api is not None and turn.processed_api == turn.processed_log, where
            assert not [d for d in turn.disagreements if "API says" in d], (where, turn.disagreements)
            if turn.reused_tokens and cell.kind == "warm":
                assert turn.identity.status.value == "identical", (where, turn.identity)
    outcomes = {c.cell_id: [t.outcome.value for t in c.turns] for c in verdict.cells if c.kind == "warm"}
    assert outcomes == {
        "llama.cram0.A-C": ["cold", "forced"],
        "llama.cram0.A-B-C": ["cold", "silent_reset", "silent_reset"],
        "llama.cram0.A-B-A": ["cold", "silent_reset", "silent_reset"],
        "llama.cram8192.A-B-C": ["cold", "silent_reset", "forced"],
        "llama.cram8192.A-B-A": ["cold", "silent_reset", "restored"],
    }
    assert verdict.cell("llama.cram8192.A-B-A").turns[2].reused_tokens == L_A - 4
