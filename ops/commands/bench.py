"""`crr bench`: the end-to-end benchmark suite (ops/bench/suite.py) on an embedded server."""

from __future__ import annotations

import argparse
from typing import Any

from ops.bench.suite import add_arguments, bench


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr bench`."""
    p = sub.add_parser("bench", parents=[common],
                       help="benchmark the whole pipeline on this machine (--quick: < 1 min)")
    add_arguments(p)
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Run the suite."""
    return await bench(args)
