"""The traffic model: seeded generation, the ideals against brute force on exact tokens, the
Mooncake and logs-trace readers (exact lengths and prefixes, bad lines named, cut lines skipped)."""

from __future__ import annotations

import json
import random

import pytest

from shadowlab import traffic
from shadowlab.errors import TrafficError
from shadowlab.traffic import Dist, Request, Segment, TrafficShape

SHAPE = TrafficShape(conversations=4, turns=5, concurrent=2, volatile_tokens=Dist("uniform", -50, 150, low=0),
                     interloper_share=0.4, interloper_kinds=(("zero", 1), ("system", 1), ("near_duplicate", 1)),
                     arrival="random", seed=7)


def lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_generation_is_deterministic_from_the_seed():
    assert traffic.generate(SHAPE) == traffic.generate(SHAPE)
    assert traffic.generate(SHAPE) != traffic.generate(TrafficShape(**{**SHAPE.__dict__, "seed": 8}))
    kinds = {r.kind for r in traffic.generate(SHAPE)}
    assert kinds == {"turn", "zero", "system", "near_duplicate"}


@pytest.mark.parametrize("arrival", TrafficShape.ARRIVALS)
def test_ideals_equal_brute_force_on_exact_tokens(arrival):
    requests = traffic.generate(TrafficShape(**{**SHAPE.__dict__, "arrival": arrival}))
    m = traffic.Materialiser(range(32, 127), 0)
    prompts = [m.prompt(r) for r in requests]
    assert [len(p) for p in prompts] == [r.prompt_tokens for r in requests]
    got = list(traffic.ideals(requests))
    for i, r in enumerate(requests):
        perfect = max([lcp(prompts[i], prompts[j]) for j in range(i)], default=0)
        prev = [j for j in range(i) if r.conversation is not None and requests[j].conversation == r.conversation]
        consecutive = lcp(prompts[i], prompts[prev[-1]]) if prev else 0
        cap = len(prompts[i]) - 1
        assert got[i] == (min(perfect, cap), min(consecutive, cap))
    assert any(p for p, _ in got) and any(c for _, c in got)


def test_the_trie_splits_edges_and_matches_partial_segments():
    trie = traffic.PrefixTrie()
    assert trie.add((Segment(1, 0, 100), Segment(2, 0, 50))) == 0
    assert trie.add((Segment(1, 0, 40), Segment(3, 0, 10))) == 40  # inside the first edge
    assert trie.add((Segment(1, 0, 40), Segment(1, 40, 60), Segment(2, 0, 20))) == 120


def test_materialised_traffic_fails_the_check_when_blocks_collide():
    requests = [Request(0, None, (Segment(1, 0, 5),)), Request(1, None, (Segment(2, 0, 5),))]
    m = traffic.Materialiser([7, 7], 0)  # every block starts with the same token
    with pytest.raises(TrafficError):
        traffic.check_materialised(requests, [m.prompt(r) for r in requests])


def test_mooncake_round_trip_has_exact_lengths_and_prefixes(tmp_path):
    rng = random.Random(3)
    requests, chains = [], [[rng.randrange(10**6)] for _ in range(20)]
    for i in range(300):
        chain = rng.choice(chains)
        if rng.random() < 0.7:
            chain.append(rng.randrange(10**6))
        n = 512 * (len(chain) - 1) + rng.randrange(1, 513)
        segs = tuple(traffic.Segment(h, 0, min(512, n - 512 * k)) for k, h in enumerate(chain))
        requests.append(Request(i * 0.25, f"s{chains.index(chain)}", segs, 3))
    path = tmp_path / "m.jsonl"
    traffic.write_mooncake(requests, path)
    loaded = traffic.read_mooncake(path)
    assert [r.prompt_tokens for r in loaded.requests] == [r.prompt_tokens for r in requests]
    assert [r.conversation for r in loaded.requests] == [r.conversation for r in requests]
    m = traffic.Materialiser(range(256), 1)
    prompts = [m.prompt(r) for r in loaded.requests[:60]]
    for i in range(1, 60):
        a, b = loaded.requests[i - 1], loaded.requests[i]
        assert lcp(prompts[i - 1], prompts[i]) == traffic.common_prefix(a.segments, b.segments)


def write(tmp_path, lines: list[str], name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(lines))
    return path


GOOD = '{"timestamp": 100, "input_length": 700, "output_length": 2, "hash_ids": [1, 2]}\n'


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 50, "input_length": 700, "output_length": 2, "hash_ids": [1, 2]}\n', "before the previous"),
    ('{"timestamp": -5, "input_length": 700, "output_length": 2, "hash_ids": [1, 2]}\n', "'timestamp' must be >= 0"),
    ('{"timestamp": 109, "input_length": -1, "output_length": 2, "hash_ids": []}\n', "'input_length' must be >= 1"),
    ('{"timestamp": 109, "input_length": 5, "output_length": -2, "hash_ids": [1]}\n', "'output_length' must be >= 0"),
    ('{"timestamp": 109, "input_length": 5, "hash_ids": [1], "colour": 1}\n', "unknown field(s) ['colour']"),
    ('{"timestamp": 109, "input_length": 5, "hash_\n', "not a JSON line: not valid JSON (Unterminated string "
                                                     "starting at: line 1 column 39"),
    ('{"timestamp": 109, "input_length": 5, "hash_ids": [1, 2]}\n', "cover more than input_length"),
    ('[1, 2]\n', "a line must be a JSON object"),
])
def test_a_bad_mooncake_line_is_named(tmp_path, line, message):
    path = write(tmp_path, [GOOD, line, GOOD.replace('"timestamp": 100', '"timestamp": 999')])
    with pytest.raises(TrafficError) as err:
        traffic.read_mooncake(path)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


def test_a_cut_last_line_and_messages_are_skipped_and_counted(tmp_path):
    path = write(tmp_path, [GOOD, '{"delay": 100, "session_id": "a", "messages": []}\n', '{"timestamp": 9, "inp'])
    loaded = traffic.read_mooncake(path)
    assert len(loaded.requests) == 1 and len(loaded.skipped) == 2


def test_aiperf_delay_is_after_the_sessions_previous_request(tmp_path):
    path = write(tmp_path, ['{"session_id": "a", "delay": 0, "input_length": 10, "hash_ids": [1]}\n',
                            '{"session_id": "a", "delay": 1500, "input_length": 20, "hash_ids": [1]}\n'])
    assert [r.time for r in traffic.read_mooncake(path).requests] == [0.0, 1.5]


TRACE_HEADER = '{"format": "shadowlab-trace", "version": 1, "time_unit": "s", "source": "shadowlab logs"}\n'


def trace_line(time, slot, prompt, shared, source="lcp") -> str:
    return json.dumps({"time": time, "server": "a.log", "slot": slot, "task": 0, "line": 1, "prompt_tokens": prompt,
                       "shared_prefix": shared, "shared_source": source, "reused": 0, "processed": prompt,
                       "outcome": "forced", "prefill_ms": 1.0, "checkpoints": {}, "failures": []}) + "\n"


def test_a_trace_request_shares_exactly_its_stated_prefix_with_its_slot_predecessor(tmp_path):
    rows = [(0.0, 0, 500, 0), (1.0, 1, 300, 0), (2.0, 0, 800, 420), (3.0, 0, 100, 3), (4.0, 1, 300, 299)]
    path = write(tmp_path, [TRACE_HEADER, *(trace_line(*r) for r in rows)])
    reqs = traffic.read_trace(path).requests
    assert [r.prompt_tokens for r in reqs] == [500, 300, 800, 100, 300]
    share = traffic.common_prefix
    assert share(reqs[0].segments, reqs[2].segments) == 420
    assert share(reqs[2].segments, reqs[3].segments) == 3
    assert share(reqs[1].segments, reqs[4].segments) == 299
    assert share(reqs[0].segments, reqs[1].segments) == 0  # different slots share nothing


@pytest.mark.parametrize("lines, message", [
    (['{"format": "shadowlab-trace", "version": 3}\n'], "version 3 is not known"),
    (['{"timestamp": 1}\n'], "not a shadowlab trace"),
    ([TRACE_HEADER, trace_line(5.0, 0, 10, 0), trace_line(4.0, 0, 10, 0)], "before the previous"),
])
def test_a_bad_trace_is_refused_naming_the_line(tmp_path, lines, message):
    with pytest.raises(TrafficError, match=message):
        traffic.read_trace(write(tmp_path, lines))


def test_a_bad_shape_is_refused():
    with pytest.raises(TrafficError, match="unknown key"):
        traffic.shape_from_dict({"conversation": 3})
    with pytest.raises(TrafficError, match="interloper_share"):
        traffic.shape_from_dict({"interloper_share": 1.5})
    with pytest.raises(TrafficError, match="arrival"):
        traffic.shape_from_dict({"arrival": "sometimes"})


# ------------------------------------------------------------------ user-message delimiters

DELIMITED = TrafficShape(**{**SHAPE.__dict__, "volatile_tokens": Dist("uniform", -50, 150, low=0),
                            "user_delimiter": True})
DELIMITER = (200, 201)  # stands for the engine's tokens of <|im_start|>user


def test_a_delimited_shape_opens_every_user_message_with_the_delimiter_and_nothing_else():
    from shadowlab.run.prompts import check_delimited

    requests = traffic.generate(DELIMITED)
    m = traffic.Materialiser([*range(32, 127), DELIMITER[0]], 0, delimiter=DELIMITER)
    prompts = [m.prompt(r) for r in requests]
    traffic.check_materialised(requests, prompts)
    for i, (r, p) in enumerate(zip(requests, prompts)):
        check_delimited(i, r, p, DELIMITER)  # the delimiter at the user starts, nowhere else
        assert all(tuple(p[s:s + 2]) == DELIMITER for s in r.user_starts)
    assert sum(len(r.user_starts) for r in requests if r.kind == "near_duplicate") > 0
    # The same draws as the raw shape: each user message is the delimiter's 8 tokens longer.
    raw = traffic.generate(TrafficShape(**{**DELIMITED.__dict__, "user_delimiter": False}))
    assert [r.prompt_tokens + traffic.DELIMITER_TOKENS * len(r.user_starts) for r in raw if r.kind == "turn"] \
        == [r.prompt_tokens for r in requests if r.kind == "turn"]


def test_the_delimiter_check_fails_where_the_delimiter_is_missing_or_elsewhere():
    from shadowlab.errors import ShadowlabError
    from shadowlab.run.prompts import check_delimited

    requests = traffic.generate(DELIMITED)
    plain = traffic.Materialiser(range(32, 127), 0)  # no delimiter tokens at the user starts
    turn = next(i for i, r in enumerate(requests) if len(r.user_starts) > 1)
    with pytest.raises(ShadowlabError, match="delimiter is at"):
        check_delimited(turn, requests[turn], plain.prompt(requests[turn]), DELIMITER)
    m = traffic.Materialiser(range(32, 127), 0, delimiter=DELIMITER)
    prompt = m.prompt(requests[turn])
    prompt[1:3] = DELIMITER  # inside the system block: a checkpoint the traffic does not know of
    with pytest.raises(ShadowlabError, match="delimiter is at"):
        check_delimited(turn, requests[turn], prompt, DELIMITER)


def test_user_delimiter_must_be_a_bool_and_a_long_delimiter_is_refused():
    with pytest.raises(TrafficError, match="user_delimiter must be true or false"):
        traffic.shape_from_dict({"user_delimiter": "yes"}, "m.yaml")
    with pytest.raises(TrafficError, match="delimiter is 9 tokens"):
        traffic.Materialiser(range(32, 127), 0, delimiter=range(300, 309))


def _v2_line(task, prompt, shared, shared_with, reused=0) -> str:
    return json.dumps({"time": float(task), "server": "s", "slot": 0, "task": task, "prompt_tokens": prompt,
                       "shared_prefix": shared, "shared_source": "lcp", "shared_with": shared_with,
                       "shared_exact": True, "reused": reused, "processed": prompt - reused}) + "\n"


@pytest.mark.parametrize("names_the_task", [True, False], ids=["v2-shared-with", "slot-previous"])
def test_a_v2_trace_shares_the_prefix_with_the_task_it_names(tmp_path, names_the_task):
    # A (1000) → B (100, shares nothing) → A again sharing 990 with task 0: its slot's previous
    # request is B, but the log says the cache held A's prompt (a prompt-cache load).
    path = tmp_path / "t.jsonl"
    header = TRACE_HEADER.replace('"version": 1', '"version": 2')
    third = _v2_line(2, 1000, 990, 0 if names_the_task else 1)
    path.write_text(header + _v2_line(0, 1000, 0, None) + _v2_line(1, 100, 0, 0) + third)
    a, b, again = traffic.read_trace(path).requests
    assert sum(s.length for s in again.segments) == 1000
    if names_the_task:  # built on A's prompt: its first 990 tokens are A's
        assert (again.segments[0].block, again.segments[0].length) == (a.segments[0].block, 990)
    else:  # the log names B (only 100 long): built on B's prompt, A's prefix is invisible
        assert again.segments[0].block == b.segments[0].block != a.segments[0].block


def test_the_real_cram_capture_never_gets_an_ideal_below_the_engines_reuse(tmp_path):
    from pathlib import Path
    import subprocess
    import sys

    log = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "llama-server" / "cram8192-A-B-A.log"
    trace = tmp_path / "cram.trace"
    subprocess.run([sys.executable, "-m", "shadowlab", "logs", "--trace", str(trace), str(log)], check=True,
                   capture_output=True)
    out = subprocess.run([sys.executable, "-m", "shadowlab", "simulate", "--policy", "llama-cram", "--json",
                          str(trace)], check=True, capture_output=True, text=True).stdout
    (policy,) = json.loads(out)["policies"]
    assert policy["reused_tokens"] >= 4556  # what llama-server reused from its RAM cache
    assert policy["ideal_tokens"] >= policy["reused_tokens"]
