"""Conversations inferred from prefix structure, for traffic that names none (public Mooncake
traces, logs): a request that extends an earlier request is its next turn.

The rule (docs/DESIGN.md §10 "Inferred conversations"): request r *extends* an earlier request
p when the prefix they share covers all of p's prompt but a volatile tail:

    shared(p, r) >= len(p) - slack(p),   slack(p) = max(len(p) mod block, min(max_tail, tail_share * len(p)))

and shared(p, r) >= min_shared, and r shares some of p's own content: more than the prefix p
shared with any request before it (a template or system prompt many conversations start with
links none of them to another). (`block`: the trace's resolution; on a hash-id trace p's partial
last block can never match, so a whole-prompt extension shows as len(p) rounded down to a block.)
Among the requests r extends it is linked to the one it shares the most with; ties go to one it
extends whole, then to the earliest (a copy comes after its original). A request that several
later ones extend keeps one as its next turn: the one that is itself extended later (its
conversation went on), then the one sharing the most, then the earliest; the others lose the
link, except exact repeats of its prompt (retries), which keep it. Linked requests form a
conversation; a request that nothing extends and that extends
nothing is an interloper.

Search: a radix tree over segments (as traffic.PrefixTrie) whose nodes keep the last `recent`
requests that passed through them. For r, the candidates are the recent passers of the nodes on
r's path, deepest first; the walk stops where a node is shallower than the best share found. So
the cost per request is its path in the tree and the passers on it, whatever the trace's length, and a conversation resumed after thousands of unrelated requests is found when its turns
share more than what other requests share with them (the deep nodes have few passers).

Failure modes (measured in tests/shadowlab/test_traffic_infer.py): a job that copies a
conversation's prompt but for a tail (a near-duplicate cut late) is taken for its next turn; a
turn that re-renders more than the allowed tail of its predecessor (or changes its system prompt)
starts a new conversation; two conversations that send the same prompt merge; a turn whose
predecessor fell out of every node's recent list on its path is not linked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from shadowlab.traffic.model import Loaded, Request, Segment, common_prefix

LABEL = "inferred"


@dataclass(frozen=True)
class Rule:
    # Of the earlier prompt, how much may be a volatile tail (re-rendered, replaced): measured best
    # at 0.9 on every lane of tests/shadowlab/test_traffic_infer.py (0.5 missed a third of the
    # case-study turns, whose re-rendered block is often most of the previous prompt).
    tail_share: float = 0.9
    max_tail: int = 65536  # tokens
    min_shared: int = 64  # tokens: below this a shared prefix is a template header, not a turn
    block: int = 1  # the trace's resolution (512 for Mooncake's hash ids)
    recent: int = 32  # passers remembered per tree node

    def slack(self, length: int) -> int:
        partial = length % self.block if self.block > 1 else 0
        return max(partial, min(self.max_tail, int(self.tail_share * length)))


class _Node:
    __slots__ = ("edges", "depth", "passers")

    def __init__(self, depth: int, recent: int) -> None:
        self.edges: dict[tuple[int, int], list[Any]] = {}  # (block, start) -> [length, node]
        self.depth = depth
        self.passers: deque[int] = deque(maxlen=recent)


class _Tree:
    def __init__(self, recent: int) -> None:
        self.recent = recent
        self.root = _Node(0, recent)

    def path(self, segments: Sequence[Segment]) -> tuple[list[_Node], int]:
        """The nodes r's prompt passes through (it is added: edges split and grown as needed),
        and how much of it was in the tree before (what it shares with any earlier prompt)."""
        node, out, known = self.root, [], None
        for block, start, length in segments:
            while length > 0:
                edge = node.edges.get((block, start))
                if edge is None:
                    known = node.depth if known is None else known
                    child = _Node(node.depth + length, self.recent)
                    node.edges[(block, start)] = [length, child]
                    out.append(child)
                    node = child
                    break
                elen, child = edge
                m = min(length, elen)
                if m < elen:  # split: the new node keeps the passers of what lies below it
                    known = node.depth + m if known is None else known
                    mid = _Node(node.depth + m, self.recent)
                    mid.passers.extend(child.passers)
                    mid.edges[(block, start + m)] = [elen - m, child]
                    edge[0], edge[1] = m, mid
                    child = mid
                out.append(child)
                node, start, length = child, start + m, length - m
        return out, node.depth if known is None else known


@dataclass(frozen=True)
class Inference:
    """Per request: the request it extends (None: none), its conversation label (None: interloper)."""

    links: tuple[int | None, ...]
    conversations: tuple[str | None, ...]
    rule: Rule

    def summary(self) -> dict[str, Any]:
        labels = [c for c in self.conversations if c is not None]
        return {"source": LABEL, "rule": dict(vars(self.rule)), "links": sum(x is not None for x in self.links),
                "conversations": len(set(labels)), "interlopers": len(self.conversations) - len(labels)}


def infer(requests: Sequence[Request], rule: Rule = Rule()) -> Inference:
    tree = _Tree(rule.recent)
    links: list[int | None] = []
    known: list[int] = []  # per request: the prefix it shared with some earlier request when it came
    for i, r in enumerate(requests):
        nodes, shared_before = tree.path(r.segments)
        known.append(shared_before)
        links.append(_best(requests, known, nodes, rule))
        for node in nodes:
            node.passers.append(i)
    links = _one_next_turn(requests, links)
    return Inference(tuple(links), _label(links), rule)


def _one_next_turn(requests: Sequence[Request], links: list[int | None]) -> list[int | None]:
    """A request extended by several later ones keeps one as its next turn: the one that is
    itself extended later (its conversation went on), then the one sharing the most with it,
    then the earliest; the others lose the link (a job copying the prompt). A request that repeats
    the prompt exactly (a retry) keeps its link: it joins the conversation without being its turn."""
    extended = {p for p in links if p is not None}
    successors: dict[int, list[int]] = {}
    for i, p in enumerate(links):
        if p is not None:
            successors.setdefault(p, []).append(i)
    out = list(links)
    for p, found in successors.items():
        rs = [i for i in found if requests[i].segments != requests[p].segments]  # a repeat joins, never competes
        if len(rs) < 2:
            continue
        keep = max(rs, key=lambda i: (i in extended, common_prefix(requests[p].segments, requests[i].segments), -i))
        for i in rs:
            if i != keep:
                out[i] = None
    return out


def _best(requests: Sequence[Request], known: list[int], nodes: list[_Node], rule: Rule) -> int | None:
    """The request r extends (the rule in the module docstring), from r's path in the tree: a
    passer first met at a node (going up from the deepest) left r's path there, so it shares
    exactly that node's depth with r; no token or segment is compared."""
    best: tuple[int, bool, int] | None = None
    seen: set[int] = set()
    for node in reversed(nodes):
        shared = node.depth
        if best is not None and shared < best[0]:
            break  # nobody first met from here up shares more than the best
        for p in reversed(node.passers):
            if p in seen:
                continue
            seen.add(p)
            length = requests[p].prompt_tokens
            if shared < rule.min_shared or shared < length - rule.slack(length) or shared <= known[p]:
                continue  # too little, not all but a tail, or only what p itself shared with others
            key = (shared, shared == length, -p)  # the most shared; a whole prompt; the earliest
            if best is None or key > best:
                best = key
    return None if best is None else -best[2]


def _label(links: list[int | None]) -> tuple[str | None, ...]:
    """Conversation = a chain of links, named after its first request; alone = interloper."""
    root: list[int] = []
    extended = set(x for x in links if x is not None)
    for i, p in enumerate(links):
        root.append(i if p is None else root[p])
    return tuple(None if links[i] is None and i not in extended else f"{LABEL}-{root[i]}" for i in range(len(links)))


def apply(loaded: Loaded, rule: Rule = Rule()) -> tuple[Loaded, Inference]:
    """The traffic with its conversations replaced by the inferred ones."""
    inference = infer(loaded.requests, rule)
    requests = tuple(replace(r, conversation=c) for r, c in zip(loaded.requests, inference.conversations))
    return replace(loaded, requests=requests), inference


def needs_inference(loaded: Loaded) -> bool:
    """A traffic of several requests where none names a conversation."""
    return len(loaded.requests) > 1 and all(r.conversation is None for r in loaded.requests)


def scores(truth: Sequence[Request], inference: Inference) -> dict[str, Any]:
    """Link precision and recall against the true conversations: a true link joins a request to
    the previous request of its own conversation."""
    last: dict[str, int] = {}
    true_links: dict[int, int] = {}
    for i, r in enumerate(truth):
        if r.conversation is not None:
            if r.conversation in last:
                true_links[i] = last[r.conversation]
            last[r.conversation] = i
    predicted = {i: p for i, p in enumerate(inference.links) if p is not None}
    correct = sum(true_links.get(i) == p for i, p in predicted.items())
    return {"true_links": len(true_links), "predicted_links": len(predicted), "correct_links": correct,
            "precision": correct / len(predicted) if predicted else None,
            "recall": correct / len(true_links) if true_links else None}
