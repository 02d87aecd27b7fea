"""shadowlab's exit codes, their help text, and how an internal error ends: the one home of each.

  0  qualified
  1  a check failed (the run completed; the gate said no)
  2  usage or matrix error (nothing was started)
  3  infrastructure failure (an engine never started; a cell could not run)
  4  shadowlab logs: a log without checkpoint lifecycle lines (start llama-server with -lv 4)
  130 / 143  interrupted by SIGINT / SIGTERM (engines stopped, run resumable)

cli.py maps exceptions to them and gate.py decides 0/1/3 for a run directory; both import them
from here (the gate never imports the command line).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path  # imported where a traceback is written: ~5% of every start otherwise

EXIT_QUALIFIED = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INFRASTRUCTURE = 3
EXIT_NOT_VERBOSE = 4  # shadowlab logs: a log without the lifecycle lines (llama-server without -lv 4)

EXIT_SIGINT = 130
EXIT_SIGTERM = 143

# `shadowlab --help`: what the codes mean across commands. Each subcommand's help lists only the
# codes that command returns, with its own words (`epilog(exits)`, the command module's EXITS).
EPILOG = """exit codes:
  0  qualified            1  a check failed
  2  usage/matrix error   3  infrastructure failure (engine never started)
  130/143 interrupted (engines stopped; rerun with --resume)"""


def epilog(exits: tuple[tuple[int, str], ...]) -> str:
    """A subcommand's `exit codes:` block from its (code, meaning) pairs."""
    width = max(len(str(code)) for code, _ in exits)
    return "exit codes:\n" + "\n".join(f"  {str(code).rjust(width)}  {meaning}" for code, meaning in exits)

# What `shadowlab gate` decides, in full (README's table says the same).
GATE_HELP = """\
shadowlab gate RUN_DIR — decide whether a run qualifies; prints a compact summary.

exit codes:
  0  qualified: every cell ran and every check passed
  1  a check failed: a matrix expectation (outcome, min_reused, min_saved_fraction,
     max_forced, checkpoints_created_at, identity, cascade), byte identity of a warm turn
     that reused cache vs its cold run, a cold-vs-cold control mismatch (identity
     inconclusive), a cascade that kept stale checkpoints, or a turn answered with an error
  2  usage or matrix error: not a run directory, matrix.yaml unreadable or invalid
  3  infrastructure failure: an engine never started, a cell could not run to the end, an
     engine reported impossible figures (it cannot be believed), or a check's evidence is
     missing (a cell's engine.log); takes precedence over 1
"""

TRACEBACK_NAME = "shadowlab-error.txt"


def write_traceback(run_dir: Path | str | None) -> Path:
    """The current exception's traceback in ``run_dir/shadowlab-error.txt`` (else a temp file):
    an internal error is exit 3 with its traceback kept, never Python's exit 1 ("a check failed")."""
    import pathlib  # here, not at the top, as tempfile: needed only after a bug
    import tempfile  # ~6 ms of every start
    import traceback

    text = traceback.format_exc()
    if run_dir is not None:
        with contextlib.suppress(OSError):
            if pathlib.Path(run_dir).is_dir():
                path = pathlib.Path(run_dir, TRACEBACK_NAME)
                path.write_text(text, encoding="utf-8")
                return path
    fd, name = tempfile.mkstemp(prefix="shadowlab-error-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return pathlib.Path(name)


__all__ = ["EPILOG", "EXIT_CHECK_FAILED", "EXIT_INFRASTRUCTURE", "EXIT_NOT_VERBOSE", "EXIT_QUALIFIED", "EXIT_SIGINT", "EXIT_SIGTERM",
           "EXIT_USAGE", "GATE_HELP", "epilog",
           "TRACEBACK_NAME", "write_traceback"]
