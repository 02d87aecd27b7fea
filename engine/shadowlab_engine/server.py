"""HTTP server: the llama-server-compatible subset (docs/DESIGN.md §1 "HTTP").

The socket is bound and answering before torch is imported: `/health` says 503 while a
background thread loads the model, 200 once the slots exist. Requests to one slot are
serialized by the `SlotPool`; bad input is rejected before a slot is touched, so no request can
crash the server or corrupt a slot.

Where it differs from llama-server, on purpose: `n_predict` defaults to 16 (not -1, unbounded)
and `temperature` to 0 (greedy, not 0.8), so a bare request is short and deterministic;
`tokens` is always returned; chat choices carry `tokens` too; task ids count accepted completion
tasks only; `print_timing` prints its three lines each with the slot prefix. A streamed
`/completion` (`"stream": true`) sends every token's id, where llama-server sends no event for a
token whose text ends inside a UTF-8 character (`TokenEvents`).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from . import slotlog
from .checkpoints import CacheConfig, PromptCache, Slot, SlotPool
from .faults import Faults
from .slotlog import ERROR, INFO, EngineLog
from .tokenizer import decode_bytes


def engine_version() -> str:
    try:
        from importlib.metadata import version

        return version("shadowlab")
    except Exception:  # not installed: running from a source tree
        return "0.0.0+src"


@dataclass(frozen=True)
class ServerOptions:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 8080
    n_parallel: int = 1
    cache_ram_mib: int = 8192
    threads: int | None = None
    device: str = "cpu"
    cache: CacheConfig = CacheConfig()
    slot_affinity: bool = False  # SHADOWLAB_SLOT_AFFINITY
    faults: Faults = Faults()


class RequestError(Exception):
    """A request the server refuses; becomes a 4xx JSON error."""

    def __init__(self, code: int, message: str, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.type = type


DEFAULT_N_PREDICT = 16


# --- request validation --------------------------------------------------------------------


def _int_field(body: dict, key: str, default: int, minimum: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'{key}' must be an integer")
    if minimum is not None and value < minimum:
        raise RequestError(400, f"'{key}' must be >= {minimum}, got {value}")
    if value >= 2**63:
        raise RequestError(400, f"'{key}' is out of range")
    return value


def _bool_field(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"'{key}' must be a boolean")
    return value


def _split_points(value: Any, n_prompt: int) -> tuple[int, ...] | None:
    """`split_points`: strictly increasing positions 0 < p < prompt length where the prefill's
    batches break (checkpoints.Slot.prefill); absent or null keeps the engine's own schedule."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(400, "'split_points' must be an array of positions")
    previous = 0
    for i, p in enumerate(value):
        if isinstance(p, bool) or not isinstance(p, int) or not previous < p < n_prompt:
            raise RequestError(
                400,
                f"'split_points'[{i}] must be an integer above {previous} and below the prompt "
                f"length {n_prompt}, strictly increasing",
            )
        previous = p
    return tuple(value)


def _float_field(body: dict, key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(400, f"'{key}' must be a finite number")
    return float(value)


@dataclass(frozen=True)
class Generation:
    n_predict: int
    stop: tuple[str, ...]
    n_probs: int
    temperature: float
    seed: int
    cache_prompt: bool
    id_slot: int
    conversation: str | None  # `prompt_cache_key`: what affinity routes by
    split_points: tuple[int, ...] | None = None  # /completion only: an explicit batch schedule
    # A streamed /completion: called with (slot id, token, tokens decoded) per generated token.
    on_token: Callable[[int, int, int], None] | None = field(default=None, compare=False)


@dataclass
class Completion:
    """What generation produced; the stop token (EOS/<|im_end|>) is counted, not returned."""

    tokens: list[int] = field(default_factory=list)
    stop_type: str = "limit"
    stopping_word: str = ""
    text: str | None = None  # the content, when a stop word cut it short
    truncated: bool = False
    n_decoded: int = 0
    probs: list[dict] = field(default_factory=list)


class TokenEvents:
    """A streamed /completion's events in llama-server's shape: one per generated token
    (`content` = the text that token completes; bytes that end inside a UTF-8 character wait
    for the token that ends them, and with stop words all text waits for the end, which decides
    where it is cut), then the final answer with `content` "" and `tokens` [] since they went in
    the events. A text left over at the end (a cut stop word, an unfinished character's U+FFFD)
    goes in one more event without tokens, so the events' text adds up to the answer's exactly."""

    def __init__(self, emit: Callable[[dict], None], n_prompt: int, hold_text: bool) -> None:
        self.emit, self.n_prompt, self.hold_text = emit, n_prompt, hold_text
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.sent: list[str] = []
        self.id_slot = -1

    def token(self, id_slot: int, token: int, n_decoded: int) -> None:
        piece = "" if self.hold_text else self.decoder.decode(decode_bytes([token]))
        self.id_slot = id_slot
        self._event(piece, [token], n_decoded)

    def final(self, answer: dict) -> dict:
        sent, content = "".join(self.sent), answer["content"]
        if not content.startswith(sent):  # cannot happen: incremental decoding = whole decoding
            raise RuntimeError("streamed text is not a prefix of the completion")
        if len(content) > len(sent):
            self._event(content[len(sent):], [], answer["tokens_predicted"])
        return {**answer, "content": "", "tokens": []}

    def _event(self, content: str, tokens: list[int], n_decoded: int) -> None:
        self.sent.append(content)
        self.emit({"index": 0, "content": content, "tokens": tokens, "stop": False, "id_slot": self.id_slot,
                   "tokens_predicted": n_decoded, "tokens_evaluated": self.n_prompt})


# --- the engine ------------------------------------------------------------------------------


class Engine:
    """Model, tokenizer and slots behind the HTTP handler; loads in the background."""

    def __init__(self, options: ServerOptions, log: EngineLog) -> None:
        self.options = options
        self.log = log
        self.faults = options.faults
        self.ready = threading.Event()
        self.model: Any = None
        self.tokenizer: Any = None
        self.model_sha256 = ""
        self.device = options.device
        self.pool: SlotPool | None = None
        self.checkpoint_bytes = 0
        self._lock = threading.Lock()
        self._next_task = 0
        self._completions_seen = 0
        self._completions_answered = 0

    # -- loading ---------------------------------------------------------------------------

    def load(self) -> None:
        if self.faults.slow_start:
            self.log.main(INFO, f"fault slow-start: sleeping {self.faults.slow_start:g} s")
            time.sleep(self.faults.slow_start)
        import torch  # here, not at import time: /health must answer while torch loads

        from . import tokenizer
        from .model import HybridModel

        if self.options.threads and self.options.threads > 0:
            torch.set_num_threads(self.options.threads)
        if self.options.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda given but torch sees no CUDA device")
        path = Path(self.options.model_path)
        self.log.main(INFO, f"loading model '{path}'")
        self.model = HybridModel.load(path, device=self.options.device)
        self.model_sha256 = getattr(self.model, "weights_sha256", "") or _model_sha256(path)
        self.tokenizer = tokenizer
        self.device = _device_name(self.model.device)
        cfg = self.options.cache
        slots = [Slot(i, self.model, cfg, self.log, self.faults) for i in range(self.options.n_parallel)]
        cache = PromptCache(self.options.cache_ram_mib, self.log) if self.options.cache_ram_mib > 0 else None
        self.pool = SlotPool(slots, cache, self.log, affinity=self.options.slot_affinity)
        self.checkpoint_bytes = int(self.model.snapshot(self.model.new_state(1)).nbytes)
        self.log.main(
            INFO,
            f"model loaded: sha256 = {self.model_sha256}, device = {self.device}, "
            f"threads = {torch.get_num_threads()}, n_ctx = {cfg.n_ctx}, slots = {len(slots)}",
        )
        self.ready.set()
        self.log.main(
            INFO,
            f"server is listening on http://{self.options.host}:{self.options.port} - "
            "starting the main loop",
        )

    # -- read-only endpoints ---------------------------------------------------------------

    def props(self) -> dict:
        cfg = self.options.cache
        config = self.model.config
        return {
            "build_info": f"shadowlab-engine {engine_version()}",
            "model_path": str(self.options.model_path),
            "model_sha256": self.model_sha256,
            "model_config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(vars(config)),
            "device": self.device,
            "total_slots": self.options.n_parallel,
            "n_ctx": cfg.n_ctx,
            "n_batch": cfg.n_batch,
            "n_ubatch": cfg.n_ubatch,
            "ctx_checkpoints": cfg.ctx_checkpoints,
            "checkpoint_min_step": cfg.checkpoint_min_step,
            "cache_ram_mib": self.options.cache_ram_mib,
            "ckpt_prompt_policy": cfg.prompt_policy,
            "ckpt_prompt_end": cfg.prompt_end,
            "slot_affinity": int(self.options.slot_affinity),
            "ckpt_retain_mib": cfg.retain_mib,
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "checkpoint_bytes": self.checkpoint_bytes,
            "faults": self.faults.names(),
            "pid": os.getpid(),
        }

    def slots(self) -> list[dict]:
        assert self.pool is not None
        return [slot.describe() for slot in self.pool.slots]

    def tokenize(self, body: dict) -> dict:
        content = body.get("content")
        if not isinstance(content, str):
            raise RequestError(400, "'content' must be a string")
        add_special = _bool_field(body, "add_special", False)
        bos = [self.tokenizer.BOS] if add_special else []
        return {"tokens": bos + self.tokenizer.encode(content)}

    def detokenize(self, body: dict) -> dict:
        tokens = self._token_ids(body.get("tokens"), "tokens", allow_empty=True)
        return {"content": self.tokenizer.decode(tokens)}

    # -- completions -----------------------------------------------------------------------

    def complete(self, body: dict, emit: Callable[[dict], None] | None = None) -> dict:
        """The answer; with `emit` (a streamed request) each token's event goes to it first and
        the answer returned is the stream's final event."""
        prompt = self._prompt(body.get("prompt"))
        gen = self._generation(body, n_predict_keys=("n_predict",))
        gen = dataclasses.replace(gen, split_points=_split_points(body.get("split_points"), len(prompt)))
        events = TokenEvents(emit, len(prompt), hold_text=bool(gen.stop)) if emit is not None else None
        if events is not None:
            gen = dataclasses.replace(gen, on_token=events.token)
        result = self._run_task(prompt, gen, user_starts=())
        answer = {
            "index": 0,
            "content": result["content"],
            "tokens": result["tokens"],
            "id_slot": result["id_slot"],
            "id_task": result["id_task"],  # not llama-server's: the task its log lines name
            "stop": True,
            "model": str(self.options.model_path),
            "tokens_predicted": result["timings"]["predicted_n"],
            "tokens_evaluated": len(prompt),
            "stop_type": result["stop_type"],
            "stopping_word": result["stopping_word"],
            "tokens_cached": result["tokens_cached"],
            "truncated": result["truncated"],
            "timings": result["timings"],
            **({"completion_probabilities": result["probs"]} if result["probs"] else {}),
        }
        return answer if events is None else events.final(answer)

    def chat(self, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty array")
        clean = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise RequestError(400, f"messages[{i}] must be an object with a string 'role'")
            clean.append({"role": msg["role"], "content": _message_text(msg.get("content"), i)})
        prompt, user_starts = self._render_chat(clean)
        self._check_prompt_length(prompt)
        gen = self._generation(body, n_predict_keys=("max_tokens", "max_completion_tokens", "n_predict"))
        if _bool_field(body, "logprobs", False):  # OpenAI: logprobs + top_logprobs
            gen = dataclasses.replace(gen, n_probs=max(1, _int_field(body, "top_logprobs", 1, minimum=0)))
        result = self._run_task(prompt, gen, user_starts=user_starts)
        timings = result["timings"]
        return {
            "id": f"chatcmpl-{result['id_task']}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(self.options.model_path),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result["content"]},
                    "finish_reason": "length" if result["stop_type"] == "limit" else "stop",
                    "tokens": result["tokens"],  # not OpenAI's: exact ids for identity checks
                    "logprobs": {"content": result["probs"]} if result["probs"] else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": timings["predicted_n"],
                "total_tokens": len(prompt) + timings["predicted_n"],
                "prompt_tokens_details": {"cached_tokens": timings["cache_n"]},
            },
            "timings": timings,
        }

    def _render_chat(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """ChatML tokens plus the position of each user message's `<|im_start|>`."""
        return self.tokenizer.render_chatml(messages), self.tokenizer.message_starts(messages, "user")

    def _generation(self, body: dict, n_predict_keys: tuple[str, ...]) -> Generation:
        n_predict = DEFAULT_N_PREDICT
        for key in n_predict_keys:
            if key in body and body[key] is not None:
                n_predict = _int_field(body, key, DEFAULT_N_PREDICT, minimum=0)
                break
        id_slot = _int_field(body, "id_slot", -1, minimum=-1)
        if id_slot >= self.options.n_parallel:
            raise RequestError(400, f"'id_slot' {id_slot} out of range (total_slots = {self.options.n_parallel})")
        return Generation(
            n_predict=n_predict,
            stop=_stop_words(body.get("stop")),
            n_probs=_int_field(body, "n_probs", 0, minimum=0),
            temperature=_float_field(body, "temperature", 0.0),
            seed=_int_field(body, "seed", 0, minimum=0),
            cache_prompt=_bool_field(body, "cache_prompt", True),
            id_slot=id_slot,
            conversation=_conversation_key(body),
        )

    def _prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            tokens = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list):
            tokens = self._token_ids(prompt, "prompt")
        else:
            raise RequestError(400, "'prompt' must be a string or an array of token ids")
        if not tokens:
            raise RequestError(400, "'prompt' is empty")
        self._check_prompt_length(tokens)
        return tokens

    def _check_prompt_length(self, tokens: list[int]) -> None:
        n_ctx = self.options.cache.n_ctx
        if len(tokens) >= n_ctx:
            raise RequestError(
                400,
                f"the request exceeds the available context size: prompt has {len(tokens)} "
                f"tokens, n_ctx = {n_ctx}",
                type="exceed_context_size_error",
            )

    def _token_ids(self, value: Any, key: str, allow_empty: bool = False) -> list[int]:
        if not isinstance(value, list):
            raise RequestError(400, f"'{key}' must be an array of token ids")
        n_vocab = self.model.config.vocab_size
        for i, tok in enumerate(value):
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise RequestError(400, f"'{key}'[{i}] is not an integer token id")
            if not 0 <= tok < n_vocab:
                raise RequestError(400, f"'{key}'[{i}] = {tok} is not a token id (n_vocab = {n_vocab})")
        if not value and not allow_empty:
            raise RequestError(400, f"'{key}' is empty")
        return list(value)

    def _new_task_id(self) -> int:
        with self._lock:
            task, self._next_task = self._next_task, self._next_task + 1
        return task

    def _run_task(self, prompt: list[int], gen: Generation, user_starts) -> dict:
        assert self.pool is not None
        task = self._new_task_id()
        slot = self.pool.acquire(prompt, gen.id_slot, task, gen.conversation)
        try:
            slot.log.slot(INFO, "launch_slot_", slot.id, task, "processing task")
            result = self._process(slot, task, prompt, gen, user_starts)
        except BaseException:
            # an unexpected failure mid-task leaves the state unknown: start the slot over
            slot.tokens, slot.checkpoints = [], []
            slot.state = slot.model.new_state(slot.cfg.n_ctx)
            self.pool.release(slot)
            raise
        # The `stop processing` line is written as the slot becomes free (under the pool's
        # lock): a log read in order never shows a slot free that a request found busy.
        self.pool.release(slot, task, bool(result["truncated"]))
        return result

    def _process(self, slot: Slot, task: int, prompt: list[int], gen: Generation, user_starts) -> dict:
        t0 = time.perf_counter()
        reuse = slot.begin(task, prompt, cache_prompt=gen.cache_prompt)
        logits = slot.prefill(task, prompt, reuse, user_starts, gen.split_points)
        t1 = time.perf_counter()
        out = self._generate(slot, logits, gen)
        n_decoded = out.n_decoded
        t2 = time.perf_counter()
        prompt_ms, predicted_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        prompt_n = len(prompt) - reuse.re_entry
        logged_ms = prompt_ms + 1.0 if self.faults.log_timing_skew else prompt_ms
        slot.log.slot(INFO, "print_timing", slot.id, task, slotlog.prompt_eval_time(logged_ms, prompt_n))
        slot.log.slot(INFO, "print_timing", slot.id, task, slotlog.eval_time(predicted_ms, n_decoded))
        slot.log.slot(INFO, "print_timing", slot.id, task, slotlog.total_time(prompt_ms + predicted_ms, prompt_n + n_decoded))
        return {
            "id_task": task + 1 if self.faults.wrong_task_id else task,
            "id_slot": slot.id,
            "content": out.text if out.text is not None else self.tokenizer.decode(out.tokens),
            "stopping_word": out.stopping_word,
            "tokens": out.tokens,
            "stop_type": out.stop_type,
            "truncated": out.truncated,
            "probs": out.probs,
            "tokens_cached": len(slot.tokens),
            "timings": {
                "cache_n": reuse.re_entry,
                "prompt_n": prompt_n,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
                "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
                "predicted_n": n_decoded,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / n_decoded if n_decoded else 0.0,
                "predicted_per_second": 1e3 * n_decoded / predicted_ms if predicted_ms > 0 else 0.0,
            },
        }

    def _generate(self, slot: Slot, logits: Any, gen: Generation) -> "Completion":
        """Greedy (temperature <= 0) or seeded sampling of up to n_predict tokens.

        The last sampled token is not evaluated, like llama-server: the slot caches the prompt
        plus the generated tokens that went through the model."""
        pick = _sampler(gen)
        out = Completion()
        while out.n_decoded < gen.n_predict:
            token = pick(logits)
            out.n_decoded += 1
            if gen.n_probs:
                out.probs.append(self._probabilities(logits, token, gen.n_probs))
            if token in self.tokenizer.STOP_TOKENS:
                out.stop_type = "eos"
                break
            out.tokens.append(token)
            if gen.on_token is not None:
                gen.on_token(slot.id, token, out.n_decoded)
            if gen.stop and self._stop_word(out, gen.stop):
                break
            if out.n_decoded == gen.n_predict:
                break
            if len(slot.tokens) >= slot.cfg.n_ctx:
                out.truncated = True
                break
            logits = slot.evaluate(token)
        return out

    def _stop_word(self, out: "Completion", stop: tuple[str, ...]) -> bool:
        """Cut the content before the first stop word it contains, like llama-server."""
        text = self.tokenizer.decode(out.tokens)
        hits = [(text.find(word), word) for word in stop if word and word in text]
        if not hits:
            return False
        at, word = min(hits)
        out.stop_type, out.stopping_word, out.text = "word", word, text[:at]
        return True

    def _probabilities(self, logits: Any, token: int, n_probs: int) -> dict:
        """llama-server's `completion_probabilities` entry: the sampled token's logprob and the
        top n_probs, computed from the float32 logits (exact: compared bit for bit)."""
        import torch

        logprobs = torch.log_softmax(logits.float().cpu(), dim=-1)
        top = torch.topk(logprobs, min(n_probs, logprobs.numel()))

        def entry(tok: int) -> dict:
            return {
                "id": tok,
                "token": self.tokenizer.decode([tok]),
                "bytes": list(self.tokenizer.decode_bytes([tok])),
                "logprob": float(logprobs[tok]),
            }

        return {**entry(token), "top_logprobs": [entry(int(t)) for t in top.indices]}

    # -- fault hooks -----------------------------------------------------------------------

    def completion_arrived(self) -> int:
        with self._lock:
            self._completions_seen += 1
            return self._completions_seen

    def completion_answered(self) -> int:
        with self._lock:
            self._completions_answered += 1
            return self._completions_answered


def _sampler(gen: Generation) -> Callable[[Any], int]:
    import torch

    if gen.temperature <= 0:
        return lambda logits: int(torch.argmax(logits).item())
    rng = torch.Generator().manual_seed(gen.seed)

    def sample(logits: Any) -> int:
        probs = torch.softmax(logits.float().cpu() / gen.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=rng).item())

    return sample


MAX_KEY_CHARS = 256


def _conversation_key(body: dict) -> str | None:
    """`prompt_cache_key` (OpenAI's name for "requests that share a prefix"): the conversation."""
    value = body.get("prompt_cache_key")
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_CHARS:
        raise RequestError(400, f"'prompt_cache_key' must be a string of 1 to {MAX_KEY_CHARS} characters")
    return value


def _stop_words(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise RequestError(400, "'stop' must be a string or an array of strings")


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: text only
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(400, f"messages[{index}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, f"messages[{index}].content must be a string")


def _device_name(device: Any) -> str:
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


# --- HTTP ------------------------------------------------------------------------------------


class EngineHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        super().__init__(address, Handler)
        self.engine = engine

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (reset, broken pipe) is no server error: socketserver would
        print a traceback into the log, which llama-server never does and which moves every
        later line of the log the harness reads."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            self.engine.log.server(slotlog.DEBUG, "handle_error",
                                   f"client {client_address[0]}:{client_address[1]} hung up ({type(exc).__name__})")
            return
        super().handle_error(request, client_address)


_LOADING = (503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
_MAX_BODY = 64 * 1024 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Keep-alive responses go out as header + body writes; with Nagle on, the body waits for
    # the client's delayed ACK (~40 ms per request on Linux loopback).
    disable_nagle_algorithm = True
    server: EngineHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        self.server.engine.log.server(slotlog.DEBUG, "log_server_r", format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        is_completion = method == "POST" and path in ("/completion", "/completions", "/v1/chat/completions", "/chat/completions")
        if is_completion and engine.ready.is_set():
            n = engine.completion_arrived()
            if engine.faults.hang_on_request == n:
                engine.log.server(ERROR, "handle_compl", f"fault hang-on-request: request {n} never answers")
                threading.Event().wait()
        stream: EventStream | None = None
        try:
            body = self._read_body(parse=method in ("POST", "PUT"))
            if path == "/health" and method == "GET":
                status, payload = (200, {"status": "ok"}) if engine.ready.is_set() else _LOADING
            elif not engine.ready.is_set() and path in _ROUTES:
                status, payload = _LOADING
            elif path in _STREAMED and method == "POST" and isinstance(body, dict) \
                    and _bool_field(body, "stream", False):
                stream = EventStream(self)
                status, payload = 200, engine.complete(body, emit=stream.event)
            else:
                status, payload = self._route(engine, method, path, body)
        except RequestError as err:
            status, payload = err.code, {"error": {"code": err.code, "message": err.message, "type": err.type}}
        except Exception as err:  # a bug, not bad input: answer 500 and keep serving
            engine.log.server(ERROR, "handle_reque", f"internal error: {err!r}")
            status, payload = 500, {"error": {"code": 500, "message": f"internal error: {err}", "type": "server_error"}}
        if stream is not None and (stream.started or status == 200):
            # Like llama-server: an error before the first event is a JSON answer; one after it,
            # an error event ending the stream.
            stream.end(payload if status == 200 else {"error": payload["error"]})
        else:
            self._send(status, payload)
        if is_completion and engine.ready.is_set():
            self._after_completion(engine)

    def _route(self, engine: Engine, method: str, path: str, body: Any) -> tuple[int, Any]:
        route = _ROUTES.get(path)
        if route is None:
            raise RequestError(404, f"File Not Found: {path}", type="not_found_error")
        want_method, action = route
        if method != want_method:
            raise RequestError(405, f"{path} expects {want_method}, got {method}")
        if want_method == "POST" and not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return 200, action(engine, body)

    def _after_completion(self, engine: Engine) -> None:
        n = engine.completion_answered()
        limit = engine.faults.crash_after_requests
        if limit is not None and n >= limit:
            engine.log.server(ERROR, "handle_compl", f"fault crash-after-requests: exiting after {n} completion requests")
            os._exit(134)

    def _read_body(self, parse: bool) -> Any:
        """The JSON body. A body is always consumed (or the connection closed), so that a
        kept-alive connection never reads leftover bytes as the next request."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(411, "chunked request bodies are not supported: send Content-Length")
        length = self.headers.get("Content-Length")
        try:
            n = int(length) if length is not None else 0
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length") from None
        if n < 0 or n > _MAX_BODY:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise RequestError(413, "request body too large")
        raw = self.rfile.read(n) if n else b""
        if not raw or not parse:
            return {}
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise RequestError(400, f"malformed JSON: {err!s:.200}") from None

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer


class EventStream:
    """llama-server's streamed answer: `data: <json>` events (server-sent events) in a chunked
    body. The headers go out with the first event: llama-server, too, waits for the first result
    before it answers. A client that went away ends the writing, not the task."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self.handler, self.started, self.gone = handler, False, False

    def event(self, payload: dict) -> None:
        self._chunk(b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n")

    def end(self, payload: dict) -> None:
        self.event(payload)
        self._chunk(b"")  # the last chunk: the answer is complete

    def _chunk(self, data: bytes) -> None:
        if self.gone:
            return
        h = self.handler
        try:
            if not self.started:
                self.started = True
                h.send_response(200)
                h.send_header("Content-Type", "text/event-stream")
                h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            h.close_connection = True


_STREAMED = ("/completion", "/completions")
_ROUTES: dict[str, tuple[str, Callable[[Engine, Any], Any]]] = {
    "/props": ("GET", lambda e, b: e.props()),
    "/slots": ("GET", lambda e, b: e.slots()),
    "/tokenize": ("POST", lambda e, b: e.tokenize(b)),
    "/detokenize": ("POST", lambda e, b: e.detokenize(b)),
    "/completion": ("POST", lambda e, b: e.complete(b)),
    "/completions": ("POST", lambda e, b: e.complete(b)),
    "/v1/chat/completions": ("POST", lambda e, b: e.chat(b)),
    "/chat/completions": ("POST", lambda e, b: e.chat(b)),
}


def serve(options: ServerOptions, log: EngineLog) -> int:
    """Bind, start loading in the background, serve until killed. Returns an exit code."""
    engine = Engine(options, log)
    try:
        httpd = EngineHTTPServer((options.host, options.port), engine)
    except OSError as err:
        log.main(ERROR, f"error: cannot listen on {options.host}:{options.port}: {err}")
        return 1
    port = httpd.server_address[1]
    engine.options = dataclasses.replace(options, port=port)
    log.server(INFO, "init", f"HTTP server is listening, hostname: {options.host}, port: {port}")

    def load() -> None:
        try:
            engine.load()
        except BaseException as err:
            log.main(ERROR, f"error: failed to load model '{options.model_path}': {err}")
            os._exit(1)

    threading.Thread(target=load, name="load-model", daemon=True).start()
    try:
        httpd.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


def _model_sha256(path: Path) -> str:
    from .modelfile import sha256_file  # the engine's one file hash

    return sha256_file(path)
