"""`crr` sub-commands: each module has `register(subparsers, common)`; `crr.cli` finds them."""

from __future__ import annotations

import argparse
import os


def log_options() -> argparse.ArgumentParser:
    """The parent parser of `--log-level` alone: for commands that connect to no NATS server
    of the operator's (`crr server`, `crr demo` run their own), which must not offer
    `--server`/`--creds` only to ignore them."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--log-level", default=os.environ.get("CRR_LOG_LEVEL", "WARNING"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity")
    return p
