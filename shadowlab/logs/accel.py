"""What the log parser's C accelerator and its Python specification share, in one place.

The C code (``_logscan.c``: the module, ``_logscan_scan.c``: the line scanner, ``_logscan_fold.c``:
``shadowlab logs``' replay) reads these through ``_logscan_constants.h``, which
``scripts/gen_logscan_constants.py`` writes from this module and the event classes of parse.py
(their field positions); ``--check`` fails when the header disagrees, and
tests/shadowlab/test_logscan_constants.py runs it. parse.py, lifecycle.py and analysis.py take
their copies of these facts from here. A change to anything here changes the C code's view of
it: bump ``ABI`` with it (parse.py then refuses a build left over from before).
"""

from __future__ import annotations

ABI = 12  # bump when scan()'s or fold_*'s arguments, results or any fact below change

# The events the C code builds, in its `enum kind` order (parse._ACCEL_CLASSES), with the C names.
KINDS = (
    ("created", "K_CREATED"), ("restored", "K_RESTORED"), ("erased_invalidated", "K_ERASED"),
    ("erased_old", "K_ERASED_OLD"), ("erased_too_close", "K_TOO_CLOSE"), ("erased_superseded", "K_SUPERSEDED"),
    ("forced", "K_FORCED"), ("new_prompt", "K_NEW_PROMPT"), ("cache_trim", "K_TRIM"), ("prompt_eval", "K_EVAL"),
    ("slot_selected", "K_SELECTED"), ("cache_saved", "K_SAVED"), ("cache_loaded", "K_LOADED"),
    ("prompt_cleared", "K_CLEARED"), ("server_start", "K_STARTED"),
)
KIND_NAMES = tuple(k for k, _ in KINDS)

# The scan words (one literal search each finds every candidate line), in `enum word` order.
SCAN_WORDS = (
    (b"checkpoint", "W_CK"), (b"prompt", "W_PROMPT"), (b"memory_seq_rm", "W_TRIM"), (b"kv cache rm", "W_KV"),
    (b"selected slot by", "W_SELECTED"), (b"model loaded", "W_STARTED"),
)
# SlotSelected.method values the C code writes (scan()'s `strings` argument), in order.
METHODS = ("lru", "lcp", "id")

MAX_LINE = 1 << 20  # a longer line is cut: its head judged, the rest skipped
# A number of 10**MAX_DIGITS or more (no engine counts tokens, positions, ids, MiB or ms that
# high), or an inf or NaN float, is impossible: its line is not understood, never believed. The C
# scanner reads up to MAX_DIGITS digits (before a decimal point) and hands a longer number back
# to Python, which decides by its value.
MAX_DIGITS = 18
LOOK_BACK = 1 << 16  # how far `found better prompt` looks back for its prompt-cache candidate

# lifecycle.py
OUTCOMES = ("cold", "extended", "restored", "forced", "silent_reset")
ERASE_KINDS = ("erased_invalidated", "erased_old", "erased_too_close", "erased_superseded")
SHARED_SOURCES = ("lcp", "n_past", "re_entry")  # Request.shared_source (None: not known)
BASELINE_TOKENS = 512  # baseline loss: a request that shared fewer tokens with the slot's cache
MAX_SAVED = 4096  # prompt-cache entries one slot's ring keeps (the oldest saved goes first)
MAX_NOTES = 20  # Ring's notes per slot, and Replay's own
PENDING_CHECKS = 4096  # `checking checkpoint` notes of tasks not closed yet (a hostile log: dropped)

# analysis.py: the event counts of a scope's figures, and the fold's request rows
EVENT_COUNT_KINDS = (
    "created", "restored", "erased_invalidated", "erased_old", "erased_too_close", "erased_superseded",
    "forced", "cache_saved", "cache_loaded",
)
FOLD_ROW = ("time", "slot", "task", "line", "offset", "prompt_tokens", "shared_prefix", "shared_source", "reused",
            "processed", "outcome", "prefill_ms", "alive_before", "created", "restored", "erase_counts", "forced",
            "cache_saved", "cache_loaded", "placement", "retention", "baseline_loss", "shared_with")
