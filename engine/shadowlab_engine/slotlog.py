"""llama.cpp-shaped log lines.

Every line the engine prints goes through `EngineLog`, which writes it to stderr and to the
`--log-file`, flushed per line, so a runner that waits for a turn's `prompt eval time` line sees
it as soon as the response is sent.

Line shape (llama.cpp b11434 `common_log` with prefix and timestamps):

    0.03.375.876 I slot create_check: id  0 | task 0 | created context checkpoint 1 of 64 (...)

The message texts below are llama.cpp's, character for character; the reference engine adds
the cost of creating and restoring a checkpoint (`, took %.2f ms`) inside the parentheses.
Checkpoint lifecycle lines other than `erasing old context checkpoint` are TRACE level in b11434
and need `-lv 4`; they print with the level letter `I` there, and do here.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TextIO

ERROR = 1
WARN = 2
INFO = 3
TRACE = 4
DEBUG = 5

_LEVEL_LETTER = {ERROR: "E", WARN: "W", INFO: "I", TRACE: "I", DEBUG: "D"}

FORCING_URL = "https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055"


def _mib(nbytes: int) -> float:
    return nbytes / (1024 * 1024)


# --- message texts (llama.cpp b11434, plus the reference engine's `took` field) -------------


def new_prompt(n_ctx_slot: int, n_keep: int, n_tokens: int) -> str:
    return f"new prompt, n_ctx_slot = {n_ctx_slot}, n_keep = {n_keep}, task.n_tokens = {n_tokens}"


def created_checkpoint(
    index: int, capacity: int, pos_min: int, pos_max: int, n_tokens: int, nbytes: int, ms: float
) -> str:
    return (
        f"created context checkpoint {index} of {capacity} (pos_min = {pos_min}, "
        f"pos_max = {pos_max}, n_tokens = {n_tokens}, size = {_mib(nbytes):.3f} MiB, "
        f"took {ms:.2f} ms)"
    )


def restored_checkpoint(
    pos_min: int, pos_max: int, n_tokens: int, n_past: int, nbytes: int, ms: float
) -> str:
    return (
        f"restored context checkpoint (pos_min = {pos_min}, pos_max = {pos_max}, "
        f"n_tokens = {n_tokens}, n_past = {n_past}, size = {_mib(nbytes):.3f} MiB, "
        f"took {ms:.2f} ms)"
    )


def erased_invalidated(
    pos_min: int, pos_max: int, n_tokens: int, n_swa: int, pos_next: int, nbytes: int
) -> str:
    return (
        f"erased invalidated context checkpoint (pos_min = {pos_min}, pos_max = {pos_max}, "
        f"n_tokens = {n_tokens}, n_swa = {n_swa}, pos_next = {pos_next}, "
        f"size = {_mib(nbytes):.3f} MiB)"
    )


def erasing_old(pos_min: int, pos_max: int, n_tokens: int, nbytes: int) -> str:
    return (
        f"erasing old context checkpoint (pos_min = {pos_min}, pos_max = {pos_max}, "
        f"n_tokens = {n_tokens}, size = {_mib(nbytes):.3f} MiB)"
    )


def forcing() -> str:
    return (
        "forcing full prompt re-processing due to lack of cache data (likely due to SWA or "
        f"hybrid/recurrent memory, see {FORCING_URL})"
    )


def cached_tokens(n_tokens: int) -> str:
    return f"cached n_tokens = {n_tokens}, memory_seq_rm [{n_tokens}, end)"


def prompt_eval_time(ms: float, n_tokens: int) -> str:
    per_token = ms / n_tokens if n_tokens else 0.0
    per_second = 1e3 * n_tokens / ms if ms > 0 else 0.0
    return (
        f"prompt eval time = {ms:10.2f} ms / {n_tokens:5d} tokens "
        f"({per_token:8.2f} ms per token, {per_second:8.2f} tokens per second)"
    )


def eval_time(ms: float, n_tokens: int) -> str:
    per_token = ms / n_tokens if n_tokens else 0.0
    per_second = 1e3 * n_tokens / ms if ms > 0 else 0.0
    return (
        f"       eval time = {ms:10.2f} ms / {n_tokens:5d} tokens "
        f"({per_token:8.2f} ms per token, {per_second:8.2f} tokens per second)"
    )


def total_time(ms: float, n_tokens: int) -> str:
    return f"      total time = {ms:10.2f} ms / {n_tokens:5d} tokens"


def stop_processing(n_tokens: int, truncated: bool) -> str:
    return f"stop processing: n_tokens = {n_tokens}, truncated = {int(truncated)}"


def prompt_cache_saved(n_tokens: int, n_checkpoints: int, nbytes: int, n_entries: int) -> str:
    return (
        f"prompt cache: saved n_tokens = {n_tokens}, checkpoints = {n_checkpoints}, "
        f"size = {_mib(nbytes):.3f} MiB, entries = {n_entries}"
    )


def prompt_cache_loaded(n_tokens: int, n_checkpoints: int, f_keep: float, sim: float) -> str:
    return (
        f"prompt cache: loaded n_tokens = {n_tokens}, checkpoints = {n_checkpoints}, "
        f"f_keep = {f_keep:.3f}, sim = {sim:.3f}"
    )


# Retention store evictions, in the words of llama.cpp's prompt cache (`server_prompt_cache::
# update`). They hold no word shadowlab's log parser treats as a checkpoint event ("checkpoint",
# "prompt cache"), so a parser that does not know them skips them rather than counting them
# as lines it does not understand.
def retained_evicted(n_tokens: int, nbytes: int) -> str:
    return f"- cache size limit reached, removing oldest entry (n_tokens = {n_tokens}, size = {_mib(nbytes):.3f} MiB)"


def retained_replaced(n_tokens: int, nbytes: int) -> str:
    return (
        f"- cache entry replaced by a newer one of the same length (n_tokens = {n_tokens}, "
        f"size = {_mib(nbytes):.3f} MiB)"
    )


# --- the writer -----------------------------------------------------------------------------


def _timestamp(elapsed_s: float) -> str:
    us = int(elapsed_s * 1e6)
    minutes, us = divmod(us, 60_000_000)
    seconds, us = divmod(us, 1_000_000)
    ms, us = divmod(us, 1000)
    return f"{minutes}.{seconds:02d}.{ms:03d}.{us:03d}"


class EngineLog:
    """Writes llama.cpp-shaped lines to a stream and an optional file, one flush per line."""

    def __init__(
        self,
        verbosity: int = INFO,
        log_file: str | Path | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.verbosity = verbosity
        self._stream = stream if stream is not None else sys.stderr
        self._file = open(log_file, "a", encoding="utf-8") if log_file else None
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def enabled(self, level: int) -> bool:
        return level <= self.verbosity

    def write(self, level: int, text: str) -> None:
        if not self.enabled(level):
            return
        line = f"{_timestamp(time.monotonic() - self._t0)} {_LEVEL_LETTER[level]} {text}\n"
        with self._lock:
            for out in (self._stream, self._file):
                if out is None:
                    continue
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):
                    pass  # a closed stderr must not take the server down

    def slot(self, level: int, func: str, id_slot: int, id_task: int, message: str) -> None:
        self.write(level, f"slot {func[:12]:>12}: id {id_slot:2d} | task {id_task} | {message}")

    def server(self, level: int, func: str, message: str) -> None:
        self.write(level, f"srv  {func[:12]:>12}: {message}")

    def main(self, level: int, message: str) -> None:
        self.write(level, f"main: {message}")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
