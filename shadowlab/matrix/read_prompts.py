"""The matrix's `prompts` and `sequences` sections: each prompt of its kind, each sequence's turns
(a traffic sequence is read by `read_traffic`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shadowlab.errors import MatrixError
from shadowlab.matrix import sequences
from shadowlab.matrix.schema import (CHAT_ROLES, ENDPOINTS, MAX_PROMPT_TOKENS, PROMPT_KINDS, TOKENS,
                                     default, default_endpoint)
from shadowlab.matrix.specs import (AppendPrompt, ChatMessage, ChatPrompt, DivergePrompt, PromptSpec, RandomPrompt,
                                    SequenceSpec, UnrelatedPrompt)
from shadowlab.matrix.values import (_At, _Context, _Errors, _Skipped, _bool, _choice, _closest_hint, _describe,
                                     _fields, _given, _int, _list, _named_map, _num, _str, _text)
from shadowlab.matrix.yamlpos import LineMap


def _prompts(value: Any, at: _At, errors: _Errors | None = None) -> dict[str, PromptSpec]:
    """Every prompt, in order. With `errors`, a prompt that fails is recorded there and left out,
    and a prompt built from it is left out silently (its error would only repeat the source's)."""
    entries = _named_map(value, at, "prompt", nonempty=False)  # a traffic-only matrix needs none
    names = [n for n, _, _ in entries]
    raw: dict[str, tuple[Any, _At]] = {n: (b, a) for n, b, a in entries}
    kinds = {n: b.get("kind") if isinstance(b, dict) else None for n, b, _ in entries}
    prompts: dict[str, PromptSpec] = {}
    failed: set[str] = set()
    # Build in dependency order so lengths of sources are known; cycles are reported.
    visiting: list[str] = []

    def build(pid: str) -> PromptSpec:
        if pid in prompts:
            return prompts[pid]
        if pid in failed:
            raise _Skipped(pid)
        if pid in visiting:
            cycle = " → ".join(visiting[visiting.index(pid):] + [pid])
            raw[pid][1].fail(f"prompts depend on each other in a cycle: {cycle}")
        visiting.append(pid)
        try:
            prompts[pid] = _prompt(pid, *raw[pid], names, kinds, build)
        except MatrixError:
            failed.add(pid)
            raise
        finally:
            visiting.remove(pid)
        return prompts[pid]

    for pid in names:
        if errors is None:
            build(pid)
            continue
        with errors.item():
            build(pid)
    if errors is not None:  # sequences naming them are not judged again
        errors.failed_prompts |= {pid for pid in names if pid not in prompts}
    return {pid: prompts[pid] for pid in names if pid in prompts}


def _prompt(pid: str, body: Any, at: _At, names: list[str], kinds: Mapping[str, Any],
            build: Callable[[str], PromptSpec]) -> PromptSpec:
    if not isinstance(body, LineMap):
        at.fail(f"expected a prompt definition (a mapping with `kind`), got {_describe(body)}")
    if "kind" not in body:
        at.fail("missing required key 'kind'", "one of: " + ", ".join(PROMPT_KINDS), line=body.line)
    kind = _choice(body["kind"], at.key("kind", body.value_lines["kind"]), PROMPT_KINDS)
    f = _fields(body, at, f"prompt.{kind}")
    endpoint = _choice(*f["endpoint"], ENDPOINTS) if "endpoint" in f else default_endpoint(kind)
    if kind != "chat" and endpoint == "chat":
        f["endpoint"][1].fail("a token prompt cannot go to the chat endpoint",
                              "token prompts are sent as token ids to /completion; use kind: chat for messages")
    delimiters = _given(f, "prompt", "message_delimiters", _bool)
    if delimiters and endpoint != "completion":
        f["message_delimiters"][1].fail("message_delimiters only applies to the completion endpoint")
    common = dict(id=pid, kind=kind, endpoint=endpoint, message_delimiters=delimiters,
                  description=_given(f, "prompt", "description", _text))

    def source() -> PromptSpec:
        src_at = f["from"][1]
        src = _str(*f["from"])
        if src == pid:
            src_at.fail("a prompt cannot be built from itself")
        if src not in names:
            src_at.fail(f"unknown prompt {src!r}", _closest_hint(src, names, "prompts"))
        spec = build(src)
        if spec.length is None:
            src_at.fail(f"prompt {src!r} is a chat prompt; only token prompts can be a source")
        return spec

    def num(key: str) -> int:
        return _num(f, f"prompt.{kind}", key)

    if kind == "random":
        return RandomPrompt(**common, tokens=num("tokens"), seed=num("seed"))
    if kind == "diverge":
        src = source()
        tokens, shared = num("tokens"), num("shared")
        if shared >= src.length:
            f["shared"][1].fail(f"shared {shared} must be below the length of {src.id!r} ({src.length} tokens)",
                                "token `shared` is where the prompts differ; to continue all of it use kind: append")
        if shared >= tokens:
            f["shared"][1].fail(f"shared {shared} must be below tokens {tokens}",
                                "the prompt needs at least one token after the divergence point")
        return DivergePrompt(**common, source=src.id, shared=shared, tokens=tokens, seed=num("seed"))
    if kind == "append":
        src = source()
        extra = num("extra")
        if src.length + extra > MAX_PROMPT_TOKENS:
            f["extra"][1].fail(f"{src.id!r} ({src.length} tokens) + extra {extra} is longer than "
                               f"{MAX_PROMPT_TOKENS} tokens", TOKENS.hint)
        return AppendPrompt(**common, source=src.id, extra=extra, seed=num("seed"), source_length=src.length)
    if kind == "unrelated":
        return UnrelatedPrompt(**common, tokens=num("tokens"), seed=num("seed"),
                               unrelated_to=_unrelated_to(pid, f, names, kinds, build))
    return ChatPrompt(**common, messages=_messages(*f["messages"]))


def _unrelated_to(pid: str, f: dict[str, tuple[Any, _At]], names: list[str], kinds: Mapping[str, Any],
                  build: Callable[[str], PromptSpec]) -> tuple[str, ...]:
    if "unrelated_to" not in f:
        # Every random prompt and every earlier unrelated one: each other token prompt starts like
        # one of those (later unrelated prompts avoid this one in turn).
        earlier = names[: names.index(pid)]
        return tuple(n for n in names if n != pid and (
            kinds[n] == "random" or (kinds[n] == "unrelated" and n in earlier)))
    out = []
    for v, a in _list(*f["unrelated_to"]):
        other = _str(v, a)
        if other == pid:
            a.fail("a prompt cannot be unrelated to itself")
        if other not in names:
            a.fail(f"unknown prompt {other!r}", _closest_hint(other, names, "prompts"))
        if build(other).length is None:
            a.fail(f"prompt {other!r} is a chat prompt; unrelated_to names token prompts")
        out.append(other)
    return tuple(out)


def _messages(value: Any, at: _At) -> tuple[ChatMessage, ...]:
    items = _list(value, at)
    if not items:
        at.fail("a chat prompt needs at least one message")
    out = []
    for v, a in items:
        f = _fields(v, a, "message")
        role = _choice(*f["role"], CHAT_ROLES)
        content, c_at = f["content"]
        if isinstance(content, LineMap):
            if role != "assistant":
                c_at.fail("only an assistant message can take a reply from an earlier turn")
            if set(content) != {"from_turn"}:
                c_at.fail("expected {from_turn: <turn index>}",
                          _closest_hint(str(next(iter(content), "")), ("from_turn",), "keys"))
            turn = _int(content["from_turn"], c_at.key("from_turn", content.value_lines["from_turn"]))
            out.append(ChatMessage(role, from_turn=turn))
        else:
            out.append(ChatMessage(role, content=_str(content, c_at, nonempty=False)))
    if out[-1].role == "assistant":
        items[-1][1].fail("the last message is the assistant's; the turn would have nothing to answer",
                          "end the conversation with a user message")
    return tuple(out)


def _sequences(value: Any, at: _At, prompts: Mapping[str, PromptSpec], ctx: _Context,
               errors: _Errors | None = None) -> dict[str, SequenceSpec]:
    """Every sequence; with `errors`, each one's error recorded there and the sequence left out."""
    mine = errors if errors is not None else _Errors()
    out: dict[str, SequenceSpec] = {}
    for name, body, s_at in _named_map(value, at, "sequence"):
        with mine.item():
            out[name] = _sequence(name, body, s_at, prompts, ctx, mine.failed_prompts)
    if errors is None:
        mine.check()
    return out


def _sequence(name: str, body: Any, s_at: _At, prompts: Mapping[str, PromptSpec], ctx: _Context,
              failed: set[str]) -> SequenceSpec:
    given = sequences.SequenceInput(name, body, s_at, prompts, ctx, frozenset(failed))
    if not isinstance(body, LineMap):  # a plain list: the default kind's short form
        return _ordered_ids(given, body, s_at)
    kind = sequences.get(body.get("kind", default("sequence", "kind")))
    if kind is None:  # not a registered kind: that is the error (its other keys are its own)
        _given(_fields(body, s_at, "sequence", _Errors()), "sequence", "kind", _choice, sequences.known())
        raise AssertionError("unreachable: _choice refused the kind")
    return kind.read(given)


def _read_ordered(given: sequences.SequenceInput) -> SequenceSpec:
    """The mapping form `{kind: ordered, prompts: [...]}`."""
    f = _fields(given.body, given.at, "sequence")
    body, at = f["prompts"]
    return _ordered_ids(given, body, at)


def _ordered_ids(given: sequences.SequenceInput, body: Any, at: _At) -> SequenceSpec:
    items = _list(body, at)
    if not items:
        at.fail("a sequence needs at least one prompt")
    return SequenceSpec(given.name, sequences.prompt_ids(items, given), "ordered")


sequences.register(sequences.SequenceKind("ordered", _read_ordered, dump=lambda s: list(s.prompts)))
