"""Adapter for any OpenAI-compatible server (vLLM, SGLang, llama-server, the reference engine).

When no log format is known (`log_family: none`, the default for this kind) the API is the
only witness of reuse: `usage.prompt_tokens_details.cached_tokens` (vLLM needs
`--enable-prompt-tokens-details`, SGLang `--enable-cache-report`). Reused = cached_tokens,
processed = prompt_tokens - cached_tokens. Nothing engine-specific is read (no `timings`),
so the figures are the ones every such server reports.

The server is started from the matrix's `command` template (placeholders `{binary}`,
`{model}`, `{port}`, `{threads}`, `{host}`); `binary` defaults to the template's first word.
Chat turns go to `/v1/chat/completions`; token prompts to `/v1/completions` (a list of token
ids is a valid OpenAI `prompt`). Token ids of a chat reply are not part of the OpenAI answer:
identity is judged on text there.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from shadowlab.engines.llama_server import gguf_model
from shadowlab.engines import reference
from shadowlab.engines import (
    EngineAdapterBase,
    EngineIdentity,
    TurnRequest,
    TurnResult,
    register,
    request_fields,
    sha256_file,
    token_ids,
)


def cached_tokens(body: Mapping[str, Any]) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, or None when the server does not say."""
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _prompt_tokens(body: Mapping[str, Any]) -> int | None:
    usage = body.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class OpenAIAdapter(EngineAdapterBase):
    kind = "openai"
    log_family = "none"
    verbosity_flags = ()
    model_required = False  # the command template may name the model itself
    tokenize_hint = "token prompts need the server's /tokenize; use chat prompts"

    def presets(self) -> tuple[str, ...]:
        return reference.presets()  # a `preset` model is the reference engine's generated one

    def __init__(self) -> None:
        self._model_path: str = ""
        self._binary: str = ""
        self._banned_tokens: tuple[int, ...] = ()

    def prepare(self, spec: Any, cache_dir: Path) -> EngineIdentity:
        if not spec.command:
            raise ValueError(f"engine {spec.name!r}: kind openai needs a `command` template that "
                             "starts the server, e.g. [vllm, serve, '{model}', --port, '{port}']")
        self.log_family = getattr(spec, "log_family", None) or "none"
        model_path = self._locate_model(spec.model, cache_dir)
        self._model_path = str(model_path) if model_path is not None else ""
        binary = spec.binary if spec.binary and spec.binary != "auto" else spec.command[0]
        resolved = shutil.which(binary) if "{" not in binary else None
        self._binary = resolved or binary
        return EngineIdentity(
            kind=self.kind,
            binary_path=self._binary,
            binary_sha256=sha256_file(Path(self._binary)) if Path(self._binary).is_file() else "",
            version="",  # the runner records /props (or nothing) from the running server
            model_path=self._model_path,
            model_sha256=sha256_file(model_path) if model_path is not None and model_path.is_file() else "",
            extra={"reuse_source": "usage.prompt_tokens_details.cached_tokens",
                   "banned_tokens": gguf_model.describe_token_ids(self._banned_tokens)},
        )

    def _locate_model(self, model: Any, cache_dir: Path) -> Path | None:
        if model is None:
            return None
        if model.source == "gguf":
            self._banned_tokens = tuple(gguf_model.invalid_utf8_token_ids())
            return gguf_model.ensure_gguf(model.preset, model.seed or 0, cache_dir).resolve()
        if model.source == "preset":
            from shadowlab_engine import weights

            return Path(weights.ensure_model(model.preset, model.seed or 0, cache_dir)).resolve()
        return Path(model.path).resolve()

    def command(self, spec: Any, cell_flags: Sequence[str], port: int, threads: int,
                log_file: Path) -> list[str]:
        values = {"binary": self._binary, "model": self._model_path, "port": port,
                  "threads": threads, "host": "127.0.0.1", "log_file": log_file}
        argv = [part.format(**values) for part in spec.command]
        return [*argv, *cell_flags]

    def completion_request(self, turn: TurnRequest, generation: Any) -> tuple[str, dict]:
        common: dict[str, Any] = {"max_tokens": generation.n_predict,
                                  "temperature": generation.temperature}
        if self._banned_tokens:
            # OpenAI's form: token id (as a string) → bias in [-100, 100].
            common["logit_bias"] = {str(t): -100 for t in self._banned_tokens}
        if turn.is_chat:
            path, body = "/v1/chat/completions", {"messages": [dict(m) for m in turn.messages or ()]}
        else:
            path, body = "/v1/completions", {"prompt": list(turn.prompt_tokens or ())}
        body.update(common)
        body.update(request_fields(turn))
        body.update(turn.extra_body)
        return path, body

    def parse_response(self, body: Mapping[str, Any]) -> TurnResult:
        choices = body.get("choices")
        if not (isinstance(choices, list) and choices and isinstance(choices[0], Mapping)):
            raise ValueError("no `choices` list in the answer")
        choice = choices[0]
        message = choice.get("message")
        text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
        if not isinstance(text, str):
            raise ValueError("the answer's choice has no text")
        cached, prompt = cached_tokens(body), _prompt_tokens(body)
        processed = prompt - cached if cached is not None and prompt is not None and cached <= prompt else None
        reason = choice.get("finish_reason")
        return TurnResult(
            text=text if isinstance(text, str) else "",
            tokens=(),
            stop_type=reason if isinstance(reason, str) else None,
            reused_tokens=cached,
            processed_tokens=processed,
            prompt_ms=None,
            timings={},
        )

    def tokenize(self, client: httpx.Client, text: str) -> list[int]:
        # llama-server and the reference engine read `content`, vLLM reads `prompt`.
        response = client.post("/tokenize", json={"content": text, "prompt": text,
                                                  "add_special": False, "add_special_tokens": False})
        response.raise_for_status()
        body = response.json()
        return token_ids(body.get("tokens") if isinstance(body, dict) else None)

    def ready_probe(self, client: httpx.Client) -> None:
        """Ready = /health 200 (the runner's poll) and one real answer that touches no cache:
        the model list. Many OpenAI-compatible servers have no /tokenize."""
        for path in ("/v1/models", "/props"):  # the reference engine has /props only
            response = client.get(path, timeout=10.0)
            if response.status_code == 404:
                continue
            response.raise_for_status()
            if not isinstance(response.json(), dict):
                raise ValueError(f"{path} answered something other than a JSON object")
            return
        raise ValueError("neither /v1/models nor /props answered")

    def props(self, client: httpx.Client) -> dict[str, Any]:
        # Not every OpenAI server has /props; the model list identifies what it serves.
        for path in ("/props", "/v1/models"):
            try:
                response = client.get(path)
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                body = response.json()
                if isinstance(body, dict):
                    return body if path == "/props" else {"models": body}
        return {}


register(OpenAIAdapter.kind, OpenAIAdapter)
