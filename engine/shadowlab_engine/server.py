"""The reference engine's server: the llama-server-compatible subset (docs/DESIGN.md §1 "HTTP");
`Engine` does the work, httpd.py speaks HTTP, requests.py reads the request fields.

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

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import slotlog
from .checkpoints import CacheConfig, PromptCache, Slot
from .slots import SlotPool
from .faults import Faults
from .requests import (DEFAULT_N_PREDICT, Completion, Generation, RequestError, TokenEvents,  # noqa: F401 - re-exported
                       _bool_field, _float_field, _int_field, _split_points)
from .slotlog import INFO, EngineLog


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


def _model_sha256(path: Path) -> str:
    from .modelfile import sha256_file  # the engine's one file hash

    return sha256_file(path)
