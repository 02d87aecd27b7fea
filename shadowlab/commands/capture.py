"""``shadowlab capture``: production traffic recorded as a trace of hashed token blocks, never
the text (shadowlab/capture/: the proxy, the mirror sink, the recorder; docs/trace.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from shadowlab.bounds import Bounds
from shadowlab.exitcodes import EXIT_INFRASTRUCTURE, EXIT_QUALIFIED, EXIT_USAGE

EXITS = (
    (EXIT_QUALIFIED, "stopped cleanly (SIGINT/SIGTERM), or --nginx-config printed"),
    (EXIT_USAGE, "usage error (an option, a missing --upstream or --tokenizer)"),
    (EXIT_INFRASTRUCTURE, "cannot listen on --listen, or the trace cannot be written"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="directory for the trace pieces and status files")
    p.add_argument("--listen", default="127.0.0.1:8090", metavar="HOST:PORT", help="where clients (or nginx) connect")
    p.add_argument("--upstream", default=None, metavar="URL",
                   help="the server to forward to (proxy); with --mirror, the primary (for --nginx-config)")
    p.add_argument("--mirror", action="store_true", help="be a mirror target: answer 204, forward nothing")
    p.add_argument("--tokenizer", default=None, metavar="URL",
                   help="the llama-server whose /apply-template and /tokenize are used (default: --upstream)")
    p.add_argument("--block-tokens", type=Bounds(1, 512, integer=True).argument, default=16, metavar="N",
                   help="tokens per hashed block (1..512; default 16: a divergence is known to within 16)")
    p.add_argument("--conversation-header", default=None, metavar="NAME",
                   help="a request header that names the conversation (before prompt_cache_key, user, id_slot)")
    p.add_argument("--user-delimiter", default=None, metavar="TEXT",
                   help="the chat template's user-message marker (default: detected from the template)")
    p.add_argument("--rotate-mib", type=Bounds(0, 1 << 20, low_open=True).argument, default=256.0, help="start a new trace piece past this size")
    p.add_argument("--rotate-minutes", type=Bounds(0, 525600, low_open=True).argument, default=60.0, help="start a new trace piece past this age")
    p.add_argument("--queue-mib", type=Bounds(0, 1 << 16, low_open=True).argument, default=64.0,
                   help="bytes waiting for the recorder before exchanges are dropped (counted)")
    p.add_argument("--max-body-mib", type=Bounds(0, 1 << 12, low_open=True).argument, default=32.0,
                   help="a request body above this is forwarded but not recorded (counted)")
    p.add_argument("--salt-file", type=Path, default=None,
                   help="keep the salt in this file (created 0600) so ids compare across restarts")
    p.add_argument("--nginx-config", default=None, metavar="LISTEN",
                   help="with --mirror: print an nginx.conf serving LISTEN from --upstream, mirrored here; exit")


def main(args: argparse.Namespace) -> int:
    from shadowlab import capture

    return int(capture.run(args))
