"""The traffic sources `shadowlab simulate` streams (a sweep's workers open them again)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from shadowlab import traffic


def open_source(path: Path | str) -> tuple[traffic.Loaded | traffic.Stream, Any]:
    """A traffic source as a stream, and the conversation inference when it needed one. A traffic
    that names no conversation (a public hash-id trace, a logs trace) gets inferred ones
    (shadowlab/traffic/infer.py): the by-turn-class figures and the affinity key then use them,
    and every output says "inferred". The inference needs the whole traffic, so such a traffic
    is held in memory; one that names a conversation streams from its first such request on."""
    from shadowlab.traffic import infer as traffic_infer

    stream = traffic.stream(path)
    rest = iter(stream.requests)
    head = []
    for r in rest:
        head.append(r)
        if r.conversation is not None:
            stream.requests = itertools.chain(head, rest)
            return stream, None
    stream.requests = iter(head)
    loaded = stream.loaded()
    if not traffic_infer.needs_inference(loaded):
        return loaded, None
    return traffic_infer.apply(loaded, traffic_infer.Rule(block=loaded.block_size))
