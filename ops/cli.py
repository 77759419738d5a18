"""The `crr` command line: the composition root for every process crr runs.

Sub-commands live in `ops/commands/<name>.py`, each with
`register(subparsers, common)` that adds its parser and sets
`func=<async def run(args) -> int>`.  Errors reach the operator as one line
on stderr that says what and where, with a non-zero exit status — never a
traceback for an expected failure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

import nats.errors
import nats.js.errors

import ops.commands
from ops.telemetry import configure_telemetry
from schemas.errors import CatalogError, CrrError, ExpressionError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Usage errors: one line, exit 2 (argparse's convention)."""
        self.exit(2, f"crr: error: {message} (see `{self.prog} --help`)\n")


def common_options() -> argparse.ArgumentParser:
    """Options every command takes (DESIGN §7)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--server", metavar="URL", default=None,
                   help="NATS server URL(s), comma-separated (default: $NATS_URL, "
                        "else nats://127.0.0.1:4222)")
    g.add_argument("--creds", metavar="FILE", default=os.environ.get("NATS_CREDS"),
                   help="NATS credentials file (default: $NATS_CREDS)")
    g.add_argument("--tls-ca", metavar="FILE", default=os.environ.get("NATS_CA"),
                   help="CA certificate for tls:// servers (default: $NATS_CA)")
    g.add_argument("--log-level", default=os.environ.get("CRR_LOG_LEVEL", "WARNING"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The full `crr` parser, with every sub-command discovered in `ops.commands`."""
    parser = _Parser(prog="crr", description="crr — custom resource reporting for "
                     "LSF-style schedulers, over NATS JetStream")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    common = common_options()
    for mod in sorted(pkgutil.iter_modules(ops.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"ops.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub, common)
    return parser


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, CatalogError):
        return str(exc)  # a catalog error lists every problem, one per line
    if isinstance(exc, ExpressionError):
        return exc.pretty()
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `crr` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # nats-py's TLS transport makes asyncio warn on every close; it is noise, not a fault.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    try:
        shutdown_telemetry = configure_telemetry(
            f"crr-{args.command}", serve_metrics=getattr(args, "serve_metrics", False))
        try:
            code: int = asyncio.run(args.func(args))
        finally:
            shutdown_telemetry()
    except KeyboardInterrupt:
        return 130
    except CrrError as exc:
        print(f"crr {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except (OSError, nats.errors.Error, nats.js.errors.Error) as exc:
        what = _one_line(exc)
        if isinstance(exc, nats.errors.MaxPayloadError):
            what = "message larger than the server's max_payload (1 MiB by default): " + what
        print(f"crr {args.command}: error: {what}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
