"""`shadowlab simulate` at scale (issue 25): the ideal computed once in a compact table that
agrees with the prefix tree, traces read as a stream, `--sweep` grids on local processes and on
a Dask cluster with the same JSON bit for bit, traces of several servers simulated per server;
and (issue 23) the ideal never below what an engine reused, "lower bound" where the source
cannot say more, prompts beyond n_ctx refused as the engines refuse them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import repo_scripts

from shadowlab import simulate, traffic
from shadowlab.simulate import parse_policy
from shadowlab.traffic import Dist, Request, Segment, TrafficShape

REPO = Path(__file__).resolve().parents[2]
ABA = REPO / "tests" / "fixtures" / "logs" / "llama.cpp-b11434" / "A-B-A.cram8192.log"


def run_cli(*argv: str) -> int:
    return simulate.main(list(argv))


def _trie_ideals(requests):
    """The ideals as the radix tree gives them (traffic.PrefixTrie: the reference for `Ideals`)."""
    trie, last, out = traffic.PrefixTrie(), {}, []
    for index, r in enumerate(requests):
        served = r.segments + ((Segment(traffic.output_block(index), 0, r.output_length - 1),)
                               if r.output_length > 1 else ())
        ideal = trie.add(served)
        prev = last.get(r.conversation) if r.conversation is not None else None
        consecutive = traffic.common_prefix(prev, r.segments) if prev is not None else 0
        if r.conversation is not None:
            last[r.conversation] = served
        out.append((min(ideal, r.prompt_tokens - 1), min(consecutive, r.prompt_tokens - 1)))
    return out


def _shapes():
    yield TrafficShape.case_study(seed=1)
    yield TrafficShape(conversations=6, turns=5, concurrent=3, interloper_share=0.4, output_tokens=3,
                       interloper_kinds=(("zero", 1.0), ("system", 1.0), ("near_duplicate", 2.0)),
                       volatile_tokens=Dist("uniform", 0, 80), arrival="random", seed=7)


def test_the_compact_ideal_equals_the_prefix_tree():
    for shape in _shapes():
        requests = traffic.generate(shape)
        assert list(traffic.ideals(requests)) == _trie_ideals(requests)


def test_the_compact_ideal_sees_equal_tokens_however_they_are_cut():
    """One block's tokens cut in two segments are the same tokens as in one: a table keyed on the
    segments as given (not merged) would find 300, not 500 + 40."""
    first = Request(0.0, None, (Segment(1, 0, 500), Segment(2, 0, 50)))
    second = Request(1.0, None, (Segment(1, 0, 300), Segment(1, 300, 200), Segment(2, 0, 40), Segment(3, 0, 9)))
    assert [i for i, _ in traffic.ideals([first, second])] == [0, 540]
    assert [i for i, _ in _trie_ideals([first, second])] == [0, 540]


def test_a_trace_is_read_as_a_stream(tmp_path):
    """Requests come out before the file is read to its end: a bad last line raises only once the
    requests before it were handed on."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 600, "output_length": 1,
                                        "hash_ids": [1, 2 + i], "session_id": "s"}) + "\n" for i in range(3))
                    + '{"timestamp": 9, "input_length": -1, "hash_ids": []}\n')
    stream = traffic.stream(path)
    got = []
    with pytest.raises(traffic.TrafficError, match=":4:"):
        for r in stream.requests:
            got.append(r)
    assert len(got) == 3


def _mooncake(tmp_path: Path, requests: int = 400) -> Path:
    """A generated Mooncake-shaped trace with session ids (scripts/make_mooncake_conversations.py)."""
    module = repo_scripts.load("make_mooncake_conversations")
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in module.generate(3, requests, live=12)))
    return path


def test_streamed_and_in_memory_give_the_same_figures(tmp_path):
    path = _mooncake(tmp_path)
    policies = [parse_policy(p) for p in ("baseline", "policy0", "llama-cram", "affinity")]
    streamed = simulate.run_policies(traffic.stream(path), policies, 2200.0)
    loaded = simulate.run_policies(traffic.load(path), policies, 2200.0)
    assert json.dumps(streamed) == json.dumps(loaded)
    assert list(traffic.ideals(traffic.load(path).requests)) == _trie_ideals(traffic.load(path).requests)


def _shape_file(tmp_path: Path) -> Path:
    path = tmp_path / "shape.yaml"
    path.write_text("conversations: 6\nturns: 5\nconcurrent: 3\ninterloper_share: 0.3\nseed: 5\n"
                    "turn_tokens: [100, 2000]\n")
    return path


SWEEP = ("--policy", "llama-cram:n_batch=256,n_ubatch=64", "--sweep", "cram=0,64,8192", "--sweep", "np=1,2")


def test_a_sweep_gives_the_same_json_on_one_or_two_processes(tmp_path, capsys):
    source = str(_shape_file(tmp_path))
    assert run_cli(source, *SWEEP, "--json") == 0
    one = capsys.readouterr().out
    assert run_cli(source, *SWEEP, "--json", "--jobs", "2") == 0
    two = capsys.readouterr().out
    assert one == two
    doc = json.loads(one)
    points = doc["sweep"]["points"]
    assert [p["values"] for p in points][:2] == [{"cache_ram_mib": "0", "slots": "1"},
                                                 {"cache_ram_mib": "0", "slots": "2"}]
    assert len(points) == 6 and doc["sweep"]["knee"] is not None
    shares = [p["share_of_ideal"] for p in points]
    assert shares[doc["sweep"]["knee"]] >= 0.95 * max(shares)
    # each point is the policy simulated alone
    alone = simulate.run_policies(traffic.load(source), [parse_policy(points[3]["policy"])], 2200.0, per_turn=False)
    assert alone["policies"][0]["reused_tokens"] == points[3]["reused_tokens"]
    assert run_cli(source, *SWEEP, "--out", str(tmp_path / "o")) == 0
    table = capsys.readouterr().out
    assert "knee" in table and "cache_ram_mib" in table
    assert "Sweep: recovered share" in (tmp_path / "o" / "simulate.html").read_text()


def test_a_bad_sweep_is_refused(tmp_path, capsys):
    source = str(_shape_file(tmp_path))
    for bad, says in (("colour=1,2", "known key"), ("slots", "known key"), ("slots=0,1", "outside its bounds"),
                      ("cms=256,512,256", "256 given more than once")):
        assert run_cli(source, "--sweep", bad) == 2
        err = capsys.readouterr().err
        assert err.startswith("shadowlab simulate:") and says in err, err


def test_the_cluster_without_its_extra_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    assert run_cli(str(_shape_file(tmp_path)), *SWEEP, "--cluster", "tcp://127.0.0.1:1") == 2
    assert "pip install 'shadowlab[cluster]'" in capsys.readouterr().err


def test_a_dask_cluster_of_two_workers_gives_the_same_json(tmp_path, capsys):
    distributed = pytest.importorskip("distributed", reason="the `cluster` extra (Dask's distributed) is absent")
    source = str(_shape_file(tmp_path))
    assert run_cli(source, *SWEEP, "--json") == 0
    local = capsys.readouterr().out
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        assert run_cli(source, *SWEEP, "--json", "--cluster", c.scheduler_address) == 0
    assert capsys.readouterr().out == local


def _trace(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / "t.jsonl"
    head = {"format": "shadowlab-trace", "version": 1, "time_unit": "s", "source": "shadowlab logs"}
    path.write_text("".join(json.dumps(x) + "\n" for x in [head, *lines]))
    return path


def _line(t, server, prompt, shared, reused, **extra):
    return {"time": t, "server": server, "slot": 0, "task": t, "line": 1, "prompt_tokens": prompt,
            "shared_prefix": shared, "shared_source": "lcp", "reused": reused, "processed": prompt - reused,
            "outcome": "extended", "prefill_ms": 1.0, "checkpoints": None, "failures": [], **extra}


def test_servers_are_simulated_apart_and_summed(tmp_path, capsys):
    """Two servers' A, A' interleaved: on one model server B's request would sit between A and A'
    on the one slot; per server each A' follows its own A."""
    both = _trace(tmp_path, [_line(0, "a", 3000, 0, 0), _line(1, "b", 2000, 0, 0),
                             _line(2, "a", 3100, 3000, 2999), _line(3, "b", 2100, 2000, 1999)])
    assert run_cli(str(both), "--policy", "baseline", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policies"][0]["reused_tokens"] == 3000 + 2000
    assert doc["shape"]["ideal_tokens"] == 3000 + 2000


def test_the_ideal_is_never_below_what_the_engine_reused(tmp_path, capsys):
    """A hand-written line: the log says the engine reused 700 tokens of a request whose stated
    shared prefix is 0 (what it shared with is not in the trace). The ideal is 700, and every
    output says it is a lower bound."""
    path = _trace(tmp_path, [_line(0, "s", 1000, 0, 0), _line(1, "s", 800, 0, 700)])
    assert run_cli(str(path), "--policy", "baseline", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ideal"]["perfect"] == [0, 700]
    assert doc["ideal_bound"]["exact"] is False and doc["ideal_bound"]["raised_by_engine_reuse"] == 1
    assert doc["policies"][0]["versus_reported"]["first_difference"] == {"turn": 1, "measured": 700, "predicted": 0}
    assert run_cli(str(path), "--policy", "baseline") == 0
    assert "(a lower bound:" in capsys.readouterr().out


def test_the_cram_capture_ideal_covers_the_engines_reuse(tmp_path, capsys):
    """The real `-cram 8192` A→B→A capture: llama-server loaded A's prompt-cache entry for the
    last request and reused 4,556 tokens. The trace's ideal for it is at least that, and the
    llama-cram policy predicts what the server reused, turn by turn."""
    trace = tmp_path / "aba.jsonl"
    proc = subprocess.run([sys.executable, "-m", "shadowlab", "logs", "--trace", str(trace), str(ABA)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    said = [json.loads(x)["reused"] for x in trace.read_text().splitlines()[1:]]
    assert said[-1] == 4556
    assert run_cli(str(trace), "--policy", "llama-cram", "--policy", "baseline", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(i >= r for i, r in zip(doc["ideal"]["perfect"], said)) and doc["ideal"]["perfect"][-1] >= 4556
    cram, base = doc["policies"]
    assert cram["turns"]["reused"] == said
    assert base["turns"]["reused"] == [0, 0, 0]  # B and A share nothing: nothing to extend


def test_prompts_beyond_the_context_are_refused_and_counted(capsys, tmp_path):
    """llama-server b11434 refuses a prompt of n_ctx tokens or more (HTTP 400) after its slot was
    chosen; the reference engine while reading the request. Neither computes anything for it."""
    a, big = (Segment(1, 0, 900),), (Segment(2, 0, 5000),)
    requests = [Request(0.0, None, a), Request(1.0, None, big), Request(2.0, None, a + (Segment(3, 0, 50),))]
    for text in ("llama-1slot:n_ctx=4096", "baseline:n_ctx=4096"):
        turns = simulate.simulate(requests, parse_policy(text))
        assert [t.outcome for t in turns] == ["cold", "refused", "extended"]
        assert (turns[1].reused, turns[1].processed, turns[1].created) == (0, 0, 0)
        assert turns[2].reused == 900  # the refused prompt left the slot as it was
    path = tmp_path / "m.jsonl"
    traffic.write_mooncake(requests, path)
    assert run_cli(str(path), "--policy", "llama-1slot:n_ctx=4096") == 0
    assert "refused (llama-1slot:n_ctx=4096): 1 request(s), 5,000 prompt tokens" in capsys.readouterr().out


def test_the_harness_does_not_import_the_engine_under_test():
    """The simulator and the split controls take the cache rules from the neutral shadowlab_cache,
    which the reference engine imports too (issue 22 step 4)."""
    code = ("import shadowlab_cache, shadowlab_engine.checkpoints as c; "
            "assert c.plan_checkpoints is shadowlab_cache.plan_checkpoints; "
            "assert c.choose_entry is shadowlab_cache.choose_entry and c.CacheConfig is shadowlab_cache.CacheConfig")
    first = subprocess.run([sys.executable, "-c", "import sys, shadowlab.simulate, shadowlab.judge.splits; "
                            "print(sorted(m for m in sys.modules if m.startswith('shadowlab_engine')))"],
                           capture_output=True, text=True, cwd=REPO)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "[]"
    both = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert both.returncode == 0, both.stderr
