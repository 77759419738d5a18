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
import contextlib
import importlib
import logging
import os
import pkgutil
import re
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import crr
import crr.commands
from crr.bus.errors import BUS_FAILURES, as_crr_error, describe
from crr.runtime.telemetry import configure_telemetry
from crr.schemas.errors import CatalogError, CrrError, ExpressionError

# A relative time (`-15m`, `-1h30m`, `-250ms`) or a negative number is a value, not an
# option: `--since -15m` works as the README writes it.  argparse decides this with
# its negative-number pattern, per parser; every crr parser uses this one.
RELATIVE_OR_NEGATIVE = re.compile(r"^-(\d+(\.\d+)?(ms|s|m|h|d)?)+$|^-\.\d+$")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = RELATIVE_OR_NEGATIVE

    def error(self, message: str) -> None:  # type: ignore[override]
        """Usage errors: one line, exit 2 (argparse's convention)."""
        self.exit(2, f"crr: error: {message} (see `{self.prog} --help`)\n")


def common_options() -> argparse.ArgumentParser:
    """Options every command takes (docs/contract.md, "CLI")."""
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


# `--help` examples per command (shown under "examples:"); tests/system/test_doc_examples.py parses
# every one with this parser and runs the one-shot ones against a real server.
HELP_EXAMPLES: dict[str, list[str]] = {
    "hosts": ["crr hosts", "crr hosts demo-node --json"],
    "select": ["crr select 'select[datasets has \"imagenet\" && scratch_free > 50]' --json",
               "crr select 'scratch_free > 1'"],
    "explain": ["crr explain 'scratch_free > 1' --host demo-node"],
    "health": ["crr health", "crr health --json --reporter scratch",
               "crr health --deadletters-since 15m"],
    "latency": ["crr latency --since -15m", "crr latency --since 15m --json"],
    "events export": ["crr events export --since -15m --host demo-node"],
    "replay": ["crr replay --at now --host demo-node", "crr replay --diff -15m now"],
    "catalog apply": ["crr catalog apply ops/examples/resources.yaml"],
    "catalog show": ["crr catalog show | head"],
    "report": ["crr report --reporter flexlm matlab_free=12",
               "crr report --reporter site_health --host node1 site_ok=true site_state=ok",
               "crr report --reporter flexlm --no-wait matlab_free=12"],
    "demo": ["crr demo --duration 30", "crr demo --secure --tls"],
    "server": ["crr server --port 4222 --store /var/lib/crr/nats"],
    "agent": ["crr agent --host node1 --reporters-dir /etc/crr"],
    "projector": ["crr projector", "crr projector --ha --partitions 2 --partition 0 --update"],
    "api": ["crr api --listen 127.0.0.1:8080"],
}


def _subparsers(parser: argparse.ArgumentParser, path: str = "") -> dict[str, Any]:
    """Every sub-command parser by its path (`catalog show`)."""
    out: dict[str, Any] = {}
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                full = f"{path} {name}".strip()
                out[full] = sp
                out.update(_subparsers(sp, full))
    return out


def _add_examples(parser: argparse.ArgumentParser) -> None:
    for path, sp in _subparsers(parser).items():
        examples = HELP_EXAMPLES.get(path)
        if examples:
            sp.formatter_class = argparse.RawDescriptionHelpFormatter
            sp.epilog = "\n".join(["examples:", *(f"  {e}" for e in examples),
                                    *([sp.epilog] if sp.epilog else [])])


def build_parser() -> argparse.ArgumentParser:
    """The full `crr` parser, with every sub-command discovered in `crr.commands`."""
    parser = _Parser(prog="crr", description="crr — custom resource reporting for "
                     "LSF-style schedulers, over NATS JetStream")
    parser.add_argument("--version", action="version", version=f"crr {crr.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = common_options()
    for mod in sorted(pkgutil.iter_modules(crr.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"crr.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub, common)
    _add_examples(parser)
    return parser


_REPORTED: tuple[type[BaseException], ...] = (CrrError, *BUS_FAILURES)
"""What a command's failure may be (said in one line): crr's errors, and nats-py's or the
OS's that escaped a command's `connect()`."""


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, CatalogError):
        return str(exc)  # a catalog error lists every problem, one per line
    if isinstance(exc, ExpressionError):
        return exc.pretty()
    # A nats-py error that escaped a command's `connect()` says it in crr's words
    # (e.g. a JetStream publish no stream captured: "no crr streams on this server").
    return describe(as_crr_error(exc))


def _quiet_broken_pipe() -> int:
    """`crr … | head`: the reader went away.  Exit like a process killed by SIGPIPE, quietly.

    stdout is pointed at /dev/null so the interpreter's final flush does not
    complain a second time.
    """
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `crr` console script."""
    try:
        return _main(argv)
    except BrokenPipeError:  # also while printing --help or a usage error
        return _quiet_broken_pipe()


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `crr`: what there is to run
        parser.print_help()
        return 0
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
    except BrokenPipeError:
        raise
    except _REPORTED as exc:
        if getattr(args, "log_level", "") == "DEBUG":  # the whole story, for a bug report
            traceback.print_exception(exc, file=sys.stderr)
        print(f"crr {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
