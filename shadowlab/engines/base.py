"""`EngineAdapterBase`: the defaults of a llama.cpp-shaped HTTP server (the reference engine speaks
the same API) that a kind's adapter subclasses: flag grammar, turn requests and answers, and the
defensive readers of engine output (`token_ids`, `top_logprobs`; engine output is data, and may
be malformed)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from shadowlab.engines.protocol import (MODEL_SOURCES, READY_PROBE_TEXT, EngineIdentity, LogFamily, MalformedAnswer,
                                        StarterRefused, TurnRequest, TurnResult)
from shadowlab.engines.registry import log_family


MAX_TOP_LOGPROBS = 64  # candidates kept per token: more than any matrix asks (n_probs <= 20)


def top_logprobs(value: Any) -> tuple[tuple[tuple[int, float], ...], ...] | None:
    """llama.cpp's `completion_probabilities` (one entry per generated token, each with its
    `top_logprobs` list of {id, logprob}) as (id, logprob) pairs per token. Evidence only: an
    answer without it, or in another shape (older builds' `probs`), gives None, never an error;
    a candidate that is no id or no finite number is left out."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for entry in value:
        top = entry.get("top_logprobs") if isinstance(entry, dict) else None
        if not isinstance(top, list):
            return None
        pairs = []
        for c in top[:MAX_TOP_LOGPROBS]:
            tok, lp = (c.get("id"), c.get("logprob")) if isinstance(c, dict) else (None, None)
            if (isinstance(tok, int) and not isinstance(tok, bool) and tok >= 0 and isinstance(lp, (int, float))
                    and not isinstance(lp, bool) and math.isfinite(lp)):
                pairs.append((tok, float(lp)))
        out.append(tuple(pairs))
    return tuple(out)


class EngineAdapterBase:
    """Defaults for llama.cpp-shaped HTTP servers (the reference engine speaks the same API).

    Subclasses set ``kind`` and the kind's facts below, and implement ``prepare``, ``command``
    and usually ``env``.
    """

    kind: str = ""
    log_family: str = "none"
    verbosity_flags: tuple[str, ...] = ()
    model_sources: tuple[str, ...] = MODEL_SOURCES
    model_required: bool = True
    model_hint: str = ""
    default_context: int | None = None
    tokenize_hint: str = ""
    build_override: bool = False
    binary_env: str | None = None
    # `shadowlab init --engine KIND`: how its starter matrix is worded and names the build and
    # model (starter_engine); None: init does not offer the kind. starter_default: init's default.
    starter_words: str | None = None
    starter_default: bool = False

    def starter_engine(self, binary: str | None, model: str | None) -> list[tuple[str, Any, str]]:
        """The starter matrix's engine keys as (key, value, comment): a value is text or a mapping
        of text (init writes and quotes them); StarterRefused when `binary`/`model` make none."""
        raise StarterRefused(f"shadowlab init writes no starter matrix for a {self.kind} engine")
    controlled_env: tuple[str, ...] = ()
    split_control: str = "none"
    # llama.cpp's flag grammar (the reference engine takes the same): context, batch, micro-batch.
    context_flags: tuple[str, ...] = ("-c", "--ctx-size")
    batch_flags: tuple[tuple[str, str], ...] = (("-b", "b"), ("--batch-size", "b"), ("-ub", "ub"),
                                                ("--ubatch-size", "ub"))
    default_batch: tuple[int, int] = (2048, 512)  # -b / -ub when the command gives none

    def presets(self) -> tuple[str, ...]:
        return ()

    def default_verbosity(self, family: str) -> tuple[str, ...]:
        return () if log_family(family).default_level else self.verbosity_flags

    def family(self) -> LogFamily:
        """The log family this adapter's engine is read with (after prepare(): the matrix's)."""
        return log_family(self.log_family)

    def context_size(self, args: Sequence[str]) -> tuple[int | None, str]:
        """The last -c/--ctx-size of `args` (the command, the engine's flags and the
        configuration's, in the order the engine sees them), else the kind's default."""
        value = None
        long_form = next((f for f in self.context_flags if f.startswith("--")), None)
        for index, arg in enumerate(args):
            if arg in self.context_flags and index + 1 < len(args):
                value = f"{arg} {args[index + 1]}"
            elif long_form and arg.startswith(f"{long_form}="):
                value = arg.replace("=", " ", 1)
        if value is None:
            return self.default_context, f"the {self.kind} engine's default {self.default_context}"
        try:
            size = int(value.split(" ", 1)[1])
        except ValueError:
            return None, value  # not a number: the engine itself will refuse it
        return (size if size > 0 else None), value  # llama.cpp's -c 0: the model's own, unknown here

    def batch_sizes(self, command: Sequence[str]) -> tuple[int, int]:
        """(-b, -ub) as the engine was started (the last occurrence wins, as in llama-server)."""
        found, names = dict(zip(("b", "ub"), self.default_batch)), dict(self.batch_flags)
        for flag, value in zip(command, command[1:]):
            if flag in names and value.isdigit():
                found[names[flag]] = int(value)
        return found["b"], found["ub"]

    def split_request_fields(self, split_points: Sequence[int]) -> dict[str, Any]:
        return {}

    def split_control_flags(self) -> tuple[str, ...]:
        return ()

    def faults(self) -> tuple[str, ...]:
        return ()

    def check_fault(self, text: str) -> None:
        raise ValueError(f"engine kind {self.kind!r} takes no faults")

    def read_streamed(self, content_type: str | None, chunks: Iterable[bytes], body: Mapping[str, Any], *,
                      max_bytes: int, deadline: float) -> Any:
        from shadowlab.engines import streamed

        if not (self.family().streams and streamed.is_event_stream(content_type)):
            return None
        n_predict = body.get("n_predict", body.get("max_tokens"))
        try:
            return streamed.read(chunks, n_predict=n_predict if isinstance(n_predict, int) else None,
                                 max_bytes=max_bytes, deadline=deadline)
        except streamed.MalformedStream as exc:
            raise MalformedAnswer(str(exc)) from None

    def prepare(self, spec: Any, cache_dir: Path) -> EngineIdentity:
        raise NotImplementedError

    def command(
        self, spec: Any, cell_flags: Sequence[str], port: int, threads: int, log_file: Path
    ) -> list[str]:
        raise NotImplementedError

    def env(self, spec: Any, cell_env: Mapping[str, str]) -> dict[str, str]:
        return dict(cell_env)

    def fault_flags(self, faults: Sequence[str]) -> list[str]:
        return []

    def ready_probe(self, client: httpx.Client) -> None:
        if not self.tokenize(client, READY_PROBE_TEXT):
            raise ValueError("/tokenize returned no tokens")

    def completion_request(self, turn: TurnRequest, generation: Any) -> tuple[str, dict]:
        if turn.is_chat:
            body: dict[str, Any] = {
                "messages": [dict(m) for m in turn.messages or ()],
                "max_tokens": generation.n_predict,
                "temperature": generation.temperature,
            }
            path = "/v1/chat/completions"
        else:
            body = {
                "prompt": list(turn.prompt_tokens or ()),
                "n_predict": generation.n_predict,
                "temperature": generation.temperature,
                "cache_prompt": True,
                "return_tokens": True,
            }
            if self.family().streams:
                # Streamed: the time to first token is then measured as such (read_streamed
                # reads the events back into this answer's usual body; engines/streamed.py).
                body["stream"] = True
            if getattr(generation, "n_probs", 0):  # top logprobs per token: a mismatch's evidence
                body["n_probs"] = generation.n_probs
            path = "/completion"
        body.update(request_fields(turn))
        body.update(turn.extra_body)
        return path, body

    def parse_response(self, body: Mapping[str, Any]) -> TurnResult:
        if "choices" in body:
            return _parse_chat(body)
        if not isinstance(body.get("content"), str):
            raise ValueError("no `content` text in the answer")
        timings = _mapping(body.get("timings"))
        return TurnResult(
            text=_text(body.get("content")),
            tokens=_int_tuple(body.get("tokens")),
            stop_type=_opt_str(body.get("stop_type")),
            reused_tokens=_opt_int(timings.get("cache_n")),
            processed_tokens=_opt_int(timings.get("prompt_n")),
            prompt_ms=_opt_float(timings.get("prompt_ms")),
            timings=timings,
            top_logprobs=top_logprobs(body.get("completion_probabilities")),
            slot=_opt_int(body.get("id_slot")),
            task=_opt_int(body.get("id_task")),
        )

    def tokenize(self, client: httpx.Client, text: str) -> list[int]:
        response = client.post("/tokenize", json={"content": text, "add_special": False})
        response.raise_for_status()
        body = response.json()
        return token_ids(body.get("tokens") if isinstance(body, dict) else None)

    def props(self, client: httpx.Client) -> dict[str, Any]:
        """The engine's self-description (``/props``), or {} when it has none."""
        response = client.get("/props")
        if response.status_code != 200:
            return {}
        body = response.json()
        return body if isinstance(body, dict) else {}

    def reported_device(self, props: Mapping[str, Any]) -> str | None:
        """The device the engine says it computes on, from its props; None if unknown."""
        device = props.get("device")
        return device if isinstance(device, str) else None


def request_fields(turn: TurnRequest) -> dict[str, Any]:
    """A turn's engine-neutral asks as llama.cpp's request fields (the reference engine and the
    OpenAI-compatible servers it is sent to read the same): only those the turn sets."""
    out: dict[str, Any] = {}
    if turn.conversation is not None:
        out["prompt_cache_key"] = turn.conversation  # the engines' affinity field
    if turn.slot is not None:
        out["id_slot"] = turn.slot
    if not turn.cache_prompt:
        out["cache_prompt"] = False
    if turn.message_delimiters:
        out["message_delimiters"] = [dict(d) for d in turn.message_delimiters]
    return out


def _parse_chat(body: Mapping[str, Any]) -> TurnResult:
    choices = body.get("choices") or [{}]
    choice = _mapping(choices[0] if isinstance(choices, list) and choices else {})
    message = _mapping(choice.get("message"))
    usage = _mapping(body.get("usage"))
    details = _mapping(usage.get("prompt_tokens_details"))
    timings = _mapping(body.get("timings"))
    cached = _opt_int(details.get("cached_tokens"))
    prompt_tokens = _opt_int(usage.get("prompt_tokens"))
    processed = _opt_int(timings.get("prompt_n"))
    if processed is None and cached is not None and prompt_tokens is not None:
        processed = prompt_tokens - cached
    reused = _opt_int(timings.get("cache_n"))
    return TurnResult(
        text=_text(message.get("content")),
        tokens=_int_tuple(body.get("tokens") or choice.get("tokens")),
        stop_type=_opt_str(choice.get("finish_reason")),
        reused_tokens=reused if reused is not None else cached,
        processed_tokens=processed,
        prompt_ms=_opt_float(timings.get("prompt_ms")),
        timings=timings,
    )


# -- defensive readers: engine output is data, and may be malformed ----------------


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


MAX_TOKEN_ID = 2**31 - 1  # token ids are stored as int32 (prompts.tokens_sha256)


def _opt_int(value: Any) -> int | None:
    """A count the engine reported: a non-negative int, else None (engine output is untrusted)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _int_tuple(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKEN_ID)


def token_ids(value: Any) -> list[int]:
    """A /tokenize answer's ids; ValueError unless every one is a token id (0 .. 2^31-1)."""
    if not isinstance(value, list):
        raise ValueError("/tokenize answered without a token list")
    bad = [v for v in value if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKEN_ID)]
    if bad:
        raise ValueError(f"/tokenize answered {len(bad)} value(s) that are not token ids, e.g. {bad[0]!r:.40}")
    return list(value)
