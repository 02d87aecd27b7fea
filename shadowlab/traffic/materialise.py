"""Exact token ids for segments (`Materialiser`), and the proof that a materialised traffic's
prompts share exactly the tokens their segments say (`check_materialised`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from shadowlab.errors import TrafficError
from shadowlab.traffic.model import DELIMITER_BLOCK, DELIMITER_TOKENS, Request, Segment


class _Branch:
    """A node of the materialiser's prefix tree: the edges leaving it, keyed by (block, start) as
    in PrefixTrie, and the first token of each (two continuations of one prefix must differ
    there, or their prompts would share more than their segments say)."""

    __slots__ = ("edges", "firsts")

    def __init__(self) -> None:
        self.edges: dict[tuple[int, int], list[Any]] = {}  # (block, start) -> [length, node]
        self.firsts: dict[int, tuple[int, int]] = {}  # first token -> the edge that starts with it


class Materialiser:
    """Exact token ids for segments. A block's tokens come from a seeded stream keyed by (seed,
    block id), so equal ids give equal tokens and a shorter use of a block is a prefix of a longer
    one. Two prompts can share more than their segments say only where they part ways, so a
    block's first token is chosen there: `prompt` walks the prefix tree of the requests seen so
    far, and a block met for the first time takes a token that no other continuation of that
    prefix starts with. Distinct blocks are unlimited; what is bounded is the number of different
    continuations of ONE prefix (len(vocabulary)), and a block reused after another prefix must
    not collide there (both a TrafficError naming the request).

    `delimiter` (token ids, at most DELIMITER_TOKENS): the first tokens of DELIMITER_BLOCK (the
    rest drawn as for any block). Its first token leaves the vocabulary, so no other block can
    contain the delimiter: it occurs exactly at the requests' user starts."""

    def __init__(self, vocabulary: Sequence[int], seed: int = 0, delimiter: Sequence[int] = ()) -> None:
        if len(delimiter) > DELIMITER_TOKENS:
            raise TrafficError(f"the user-message delimiter is {len(delimiter)} tokens; a traffic holds "
                               f"{DELIMITER_TOKENS} for it", hint="a tokenizer that knows ChatML's <|im_start|>")
        vocabulary = [v for v in vocabulary if not delimiter or v != delimiter[0]]
        if len(vocabulary) < 2:
            raise TrafficError("materialising needs a vocabulary of at least 2 token ids")
        self.vocabulary = list(vocabulary)
        self.seed = seed
        self._tokens: dict[int, list[int]] = {}
        self._rngs: dict[int, random.Random] = {}
        if delimiter:
            self._rngs[DELIMITER_BLOCK] = random.Random(f"shadowlab-block:{seed}:{DELIMITER_BLOCK}")
            self._tokens[DELIMITER_BLOCK] = [int(t) for t in delimiter]
        self._root = _Branch()
        self._count = 0  # requests placed

    def block(self, block: int, n: int) -> list[int]:
        tokens = self._tokens.get(block)
        if tokens is None:
            rng = self._rngs[block] = random.Random(f"shadowlab-block:{self.seed}:{block}")
            tokens = self._tokens[block] = [rng.choice(self.vocabulary)]
        if len(tokens) < n:
            tokens.extend(self._rngs[block].choices(self.vocabulary, k=n - len(tokens)))
        return tokens

    def prompt(self, request: Request) -> list[int]:
        self._place(request.segments)
        self._count += 1
        out: list[int] = []
        for s in request.segments:
            out.extend(self.block(s.block, s.start + s.length)[s.start:s.start + s.length])
        return out

    def _place(self, segments: Sequence[Segment]) -> None:
        """Walk (and grow) the prefix tree, claiming a distinct first token for every new edge."""
        node = self._root
        for block, start, length in segments:
            while length > 0:
                edge = node.edges.get((block, start))
                if edge is None:
                    self._claim(node, block, start)
                    child = _Branch()
                    node.edges[(block, start)] = [length, child]
                    node = child
                    break
                elen, child = edge
                m = min(length, elen)
                if m < elen:  # split the edge at m: the rest of it is the new node's one edge
                    mid = _Branch()
                    mid.edges[(block, start + m)] = [elen - m, child]
                    mid.firsts[self.block(block, start + m + 1)[start + m]] = (block, start + m)
                    edge[0], edge[1] = m, mid
                    child = mid
                node, start, length = child, start + m, length - m

    def _claim(self, node: _Branch, block: int, start: int) -> None:
        if block not in self._tokens and start == 0:
            free = [v for v in self.vocabulary if v not in node.firsts]
            if not free:
                raise TrafficError(
                    f"request {self._count}: more than {len(self.vocabulary)} different continuations of one "
                    "prefix, but only that many distinct tokens to start them with",
                    hint="a tokenizer with a larger vocabulary, or fewer requests that part ways at one point")
            rng = self._rngs[block] = random.Random(f"shadowlab-block:{self.seed}:{block}")
            self._tokens[block] = [rng.choice(free)]
        token = self.block(block, start + 1)[start]
        other = node.firsts.setdefault(token, (block, start))
        if other != (block, start):
            raise TrafficError(
                f"request {self._count}: block {block} (offset {start}) follows a prefix that block {other[0]} "
                f"(offset {other[1]}) already follows, and both start with token {token}",
                hint="a block id reused after another prefix; give it its own id")


def check_materialised(requests: Sequence[Request], prompts: Sequence[Sequence[int]]) -> None:
    """Every pair of prompts shares exactly the tokens their segments say (raises otherwise).

    Linear, not pairwise: over the prefix tree of the segments, (1) every request that follows an
    edge has the same tokens along it, and (2) the edges leaving one node start with different
    tokens. Then two prompts share tokens exactly as far as their paths share edges, which is
    their segments' common prefix."""
    root = _Branch()
    for index, (request, prompt) in enumerate(zip(requests, prompts, strict=True)):
        if len(prompt) != request.prompt_tokens:
            raise TrafficError(f"materialised request {index} has {len(prompt)} tokens, its segments say "
                               f"{request.prompt_tokens}")
        node, pos = root, 0
        for block, start, length in request.segments:
            while length > 0:
                edge = node.edges.get((block, start))
                if edge is None:
                    token = prompt[pos]
                    other = node.firsts.setdefault(token, (block, start))
                    if other != (block, start):
                        raise TrafficError(f"materialised request {index} shares token {token} at position {pos} "
                                           "with a request whose segments part from it there")
                    child = _Branch()
                    node.edges[(block, start)] = [length, child, list(prompt[pos:pos + length])]
                    node, pos = child, pos + length
                    break
                elen, child, tokens = edge
                m = min(length, elen)
                if list(prompt[pos:pos + m]) != tokens[:m]:
                    raise TrafficError(f"materialised request {index}: block {block} at offset {start} has "
                                       "other tokens than an earlier use of it")
                if m < elen:
                    mid = _Branch()
                    mid.edges[(block, start + m)] = [elen - m, child, tokens[m:]]
                    mid.firsts[tokens[m]] = (block, start + m)
                    edge[0], edge[1], edge[2] = m, mid, tokens[:m]
                    child = mid
                node, start, length, pos = child, start + m, length - m, pos + m
