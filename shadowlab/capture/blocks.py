"""Salted chained hashes of fixed token blocks, and the index of earlier prompts' ends.

A prompt of L tokens is cut into blocks of B tokens (the last one partial when B does not divide
L); block k's id is a 63-bit keyed BLAKE2b of (block k-1's id, block k's token ids), keyed by
the capture's salt. Equal ids mean equal prefixes up to the end of that block (Mooncake's
`hash_ids` meaning); without the salt an id cannot be recomputed from guessed text, and two
captures' ids cannot be compared. A partial last block hashes its r tokens: it equals no full
block, so a shared prefix is known to within B tokens, and exactly where one prompt extends the
whole of an earlier one (`PromptEnds`).

`PromptEnds` is a bounded LRU of the ends of earlier prompts (their last id, keyed by the id of
the last full block before their end and their tokens past it). `longest(tokens, ids)` finds
the longest earlier prompt that the new one extends whole: per block boundary of the new
prompt, one dict lookup, and one hash per earlier prompt that ended inside the next block.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

MASK = (1 << 63) - 1


def _hash(salt: bytes, parent: int, tokens: Sequence[int]) -> int:
    data = parent.to_bytes(8, "little") + array("i", tokens).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=salt).digest(), "little") & MASK


def chain(salt: bytes, tokens: Sequence[int], block: int) -> list[int]:
    """The chained ids of `tokens` cut into `block`-token blocks (the last one partial)."""
    ids, parent = [], 0
    for at in range(0, len(tokens), block):
        parent = _hash(salt, parent, tokens[at:at + block])
        ids.append(parent)
    return ids


def prefix_id(salt: bytes, tokens: Sequence[int], ids: Sequence[int], at: int, block: int) -> int | None:
    """The id of the prefix tokens[:at] (a partial block's id), None when `at` ends a block (its
    id is then `ids[at // block - 1]`). Trace lines name the prefixes up to their user-message
    starts this way, so a shared prefix that reaches a start is known to the token there."""
    q, r = divmod(at, block)
    if r == 0:
        return None
    return _hash(salt, ids[q - 1] if q else 0, tokens[q * block:at])


def salt_id(salt: bytes) -> str:
    """A name for the salt that reveals nothing of it: which lines can be compared."""
    return hashlib.blake2b(salt, digest_size=4, person=b"shadowlab-salt").hexdigest()


@dataclass(frozen=True)
class End:
    tokens: int  # the earlier prompt's length
    last_id: int  # its last block's id (the whole prompt's chained hash)


class PromptEnds:
    def __init__(self, salt: bytes, block: int, capacity: int) -> None:
        self.salt, self.block, self.capacity = salt, block, capacity
        self._ends: OrderedDict[int, tuple[int, int, int]] = OrderedDict()  # last id -> (parent, r, L)
        self._inside: dict[int, dict[int, int]] = {}  # parent id -> {r: how many ends}

    def add(self, tokens: Sequence[int], ids: Sequence[int]) -> None:
        if not ids:
            return
        L, B = len(tokens), self.block
        q, r = divmod(L, B)
        parent = ids[q - 1] if q else 0
        key = ids[-1]
        if key in self._ends:
            self._ends.move_to_end(key)
            return
        # r == 0: the end is the boundary after block q, and its key is `parent` itself.
        self._ends[key] = (parent, r, L)
        inside = self._inside.setdefault(parent, {})
        inside[r] = inside.get(r, 0) + 1
        while len(self._ends) > self.capacity:
            self._forget(*self._ends.popitem(last=False)[1][:2])

    def _forget(self, parent: int, r: int) -> None:
        inside = self._inside[parent]
        inside[r] -= 1
        if not inside[r]:
            del inside[r]
        if not inside:
            del self._inside[parent]

    def longest(self, tokens: Sequence[int], ids: Sequence[int]) -> End | None:
        """The longest earlier prompt (still in the index) that is a prefix of `tokens`."""
        B, best = self.block, None
        for q in range(len(ids) + 1):
            parent = ids[q - 1] if q else 0
            inside = self._inside.get(parent)
            if not inside:
                continue
            for r in inside:
                if r == 0:
                    key = parent
                elif q * B + r <= len(tokens):
                    key = _hash(self.salt, parent, tokens[q * B:q * B + r])
                else:
                    continue
                end = self._ends.get(key)
                if end is not None and end[2] == q * B + r and (best is None or end[2] > best.tokens):
                    best = End(end[2], key)
        if best is not None:
            self._ends.move_to_end(best.last_id)
        return best
