"""Conversation inference (shadowlab/traffic/infer.py) against traffic whose true conversations
are known: the generator's lanes, and a generated trace shaped like Mooncake's public FAST'25
conversation trace (scripts/make_mooncake_conversations.py; the public file cannot be fetched
here). Floors are the measured precision and recall rounded down (docs/DESIGN.md §10 states them)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import repo_scripts

from shadowlab import simulate, traffic
from shadowlab.traffic import infer as traffic_infer
from shadowlab.traffic import Dist, Request, Segment, TrafficShape

REPO = Path(__file__).resolve().parents[2]
MIXED = (("zero", 1.0), ("system", 1.0), ("near_duplicate", 1.0))

LANES = {  # name: (shape, precision floor, recall floor); measured 2026-12-01
    "interlopers": (TrafficShape(conversations=30, turns=8, concurrent=6, interloper_share=0.3,
                                 interloper_kinds=MIXED, arrival="random", seed=1), 1.0, 1.0),
    "volatile": (TrafficShape(conversations=30, turns=8, concurrent=6, volatile_tokens=Dist("uniform", 100, 800),
                              interloper_share=0.2, interloper_kinds=MIXED, arrival="random", seed=2), 0.99, 0.99),
    "case-study": (TrafficShape.case_study(seed=0), 0.98, 0.96),  # measured 0.986, 0.968
    "case-study-interleaved": (TrafficShape.case_study_interleaved(seed=0), 0.99, 0.98),  # 0.994, 0.983
}


@pytest.mark.parametrize("lane", list(LANES))
def test_inferred_links_are_the_true_next_turns(lane):
    shape, precision, recall = LANES[lane]
    requests = traffic.generate(shape)
    scores = traffic_infer.scores(requests, traffic_infer.infer(requests))
    assert scores["precision"] >= precision and scores["recall"] >= recall, scores


def _generator():
    return repo_scripts.load("make_mooncake_conversations")


@pytest.fixture(scope="module")
def public_shaped(tmp_path_factory) -> tuple[Path, Path]:
    """The generated FAST'25-shaped trace (no session ids) and its truth (with them)."""
    tmp = tmp_path_factory.mktemp("mooncake")
    trace, truth = tmp / "trace.jsonl", tmp / "truth.jsonl"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_mooncake_conversations.py"), "--out", str(trace),
                    "--truth", str(truth)], check=True, capture_output=True, timeout=300)
    return trace, truth


def test_a_public_shaped_trace_without_session_ids_gets_its_conversations_back(public_shaped):
    trace, truth = public_shaped
    known = traffic.read_mooncake(truth)
    blind = traffic.read_mooncake(trace)
    assert all(r.conversation is None for r in blind.requests) and blind.block_size == 512
    shape = traffic.realised_shape(known.requests)
    assert shape["requests"] == 12_031 and 0.3 < shape["ideal_tokens"] / shape["prompt_tokens"] < 0.45
    scores = traffic_infer.scores(known.requests, traffic_infer.infer(blind.requests, traffic_infer.Rule(block=512)))
    assert scores["precision"] >= 0.99 and scores["recall"] >= 0.97, scores  # measured 0.9925, 0.9717


def test_simulate_labels_inferred_conversations_in_every_output_and_affinity_uses_them(public_shaped, tmp_path):
    trace, _ = public_shaped
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(trace.read_text().splitlines(keepends=True)[:1500]))
    out = subprocess.run([sys.executable, "-m", "shadowlab", "simulate", str(cut), "--policy", "baseline",
                          "--policy", "affinity", "--out", str(tmp_path / "sim")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "conversations (inferred from shared prefixes" in out and "conversations inferred" in out
    doc = json.loads((tmp_path / "sim" / "simulate.json").read_text())
    assert doc["conversations"]["source"] == "inferred" and doc["conversations"]["conversations"] > 0
    assert "(inferred)" in (tmp_path / "sim" / "simulate.html").read_text()
    baseline, affinity = doc["policies"]
    assert affinity["by_turn_class"]["after_other_request"]["turns"] > 0
    # affinity keeps a conversation's slot by its (inferred) key: without keys it cannot
    loaded = traffic.read_mooncake(cut)
    blind = [simulate.parse_policy("affinity")]
    without = simulate.run_policies(loaded, blind, 2200.0, per_turn=False)["policies"][0]["reused_tokens"]
    assert affinity["reused_tokens"] > without


def test_what_the_rule_cannot_tell_apart():
    """The failure modes DESIGN §10 states, shown: two conversations that send the same prompt
    are one; a turn that replaces more than the allowed tail of its predecessor starts anew; the
    first two conversations on a template are one."""
    def req(t: int, *segments: Segment) -> Request:
        return Request(float(t), None, segments, 1, (), "mooncake")

    system, a, b, c = Segment(1, 0, 400), Segment(2, 0, 100), Segment(3, 0, 100), Segment(4, 0, 100)
    same = [req(0, system, a), req(1, system, a), req(2, system, a, b)]
    links = traffic_infer.infer(same).links
    assert links == (None, 0, 0)  # a repeat joins the conversation; the next turn follows the original
    rewritten = [req(0, Segment(5, 0, 100), Segment(6, 0, 2000)), req(1, Segment(5, 0, 100), c)]
    assert traffic_infer.infer(rewritten).links == (None, None)  # shares 100 of 2,100: under the 10 % kept
    shared_template = [req(0, system, a), req(1, system, b), req(2, system, c)]
    assert traffic_infer.infer(shared_template).links == (None, 0, None)  # only the template's first user


def test_a_trace_with_conversations_keeps_them():
    requests = traffic.generate(LANES["interlopers"][0])
    loaded = traffic.Loaded(tuple(requests), (), "x", "shape")
    assert not traffic_infer.needs_inference(loaded)
    blind = replace(loaded, requests=tuple(replace(r, conversation=None) for r in requests))
    assert traffic_infer.needs_inference(blind)
