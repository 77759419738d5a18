"""`crr bench`: the end-to-end benchmark suite (tests/bench/suite.py) on an embedded server.

The benchmarks live in the source checkout, not in the installed package: `crr bench`
runs them from the checkout an editable install points at (`pip install -e '.[bench]'`),
and says so in one line anywhere else.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import crr
from crr.schemas.errors import CrrError

CHECKOUT = Path(crr.__file__).resolve().parents[1]
"""The source checkout when crr is installed editable (or run from it); else site-packages."""

NOT_A_CHECKOUT = ("the benchmarks are not part of the installed package: run `crr bench` from an "
                  "editable install of a source checkout (pip install -e '.[bench]'), or "
                  "`python -m tests.bench.suite` in the checkout")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `crr bench` / `python -m tests.bench.suite`."""
    p.add_argument("--quick", action="store_true", help="smaller sizes; under a minute")
    p.add_argument("--hosts", type=int, default=None, help="override the host count")
    p.add_argument("--out", default=".", help="directory for bench-results.json and the plot")
    p.add_argument("--skip", action="append",
                   choices=["latency", "ramp", "max", "cold", "relay", "select", "restart",
                            "rebuild"],
                   help="leave out a phase (repeatable); the others still run (the relay "
                        "runs the latency and ramp phases that crr ran)")
    p.add_argument("--rebuild-hosts", type=int, default=None, metavar="N",
                   help="hosts of the rebuild phase's history (default 50000; --quick 2000)")
    p.add_argument("--rebuild-events", type=int, default=None, metavar="N",
                   help="reports per host in the rebuild phase's history (default 40)")
    p.add_argument("--publishers", type=int, default=None, metavar="N",
                   help="publisher processes driving the ramp, for crr and the relay alike "
                        "(default 2)")
    p.add_argument("--no-pack", action="store_true",
                   help="the view keeps its records uncompressed (less CPU, more memory)")
    p.add_argument("--soak", default=None, metavar="DURATION",
                   help="soak mode: the fixed load for DURATION (e.g. 30m), RSS sampled")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr bench`."""
    p = sub.add_parser("bench", parents=[common],
                       help="benchmark the whole pipeline on this machine (--quick: < 1 min; "
                            "needs a source checkout)")
    add_arguments(p)
    p.set_defaults(func=run)


def suite_module() -> ModuleType:
    """`tests.bench.suite` from the checkout; its child processes find it too (PYTHONPATH)."""
    if not (CHECKOUT / "tests" / "bench" / "suite.py").is_file():
        raise CrrError(NOT_A_CHECKOUT)
    root = str(CHECKOUT)
    if root not in sys.path:
        sys.path.insert(0, root)
    paths = os.environ.get("PYTHONPATH", "")
    if root not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, paths) if p)
    return importlib.import_module("tests.bench.suite")


async def run(args: argparse.Namespace) -> int:
    """Run the suite."""
    code: int = await suite_module().bench(args)
    return code
