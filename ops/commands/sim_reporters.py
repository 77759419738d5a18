"""`crr sim reporters`: thousands of simulated hosts publishing through the real bus.

    crr sim reporters --hosts 50000 --resources 20 --interval 10 --seed 1 \
        --apply-catalog --duration 300 --faults silent=0.001,invalid=0.0005,failing=0.0005

One process, many hosts (`crr.producers.simulator.Fleet`): each host has its own
subjects, `boot` and `seq` and publishes what a real agent would, spread
evenly over the interval (offered rate = hosts × reporters / interval).
Publishing goes through `crr.bus.pipeline_publish.PipelinePublisher`: acked, but
pipelined, because the per-message `Outbox` tops out well below 20k/s.

The catalog: `--apply-catalog` publishes a generated one with `--resources`
resources (`crr.producers.simulator.sim_catalog`); without it the active
catalog (`crr.v1.snapshot.catalog`) is used and `--resources` is ignored.
Progress and the achieved rate go to stderr: redrawn in place on a
terminal, one line every 10 s otherwise.  The summary goes to stdout
(`--json` for machines).  `ops/commands/sim.py` registers `crr sim reporters`
with `add_arguments` and `run_reporters` (a CLI command: it lives with the others,
not in `producers/`, which the commands build on).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
import time

from crr.bus import jetstream
from crr.bus.catalog_watch import fetch_catalog
from crr.bus.connection import Connection, connect
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.streams import provision
from crr.producers.simulator import Faults, Fleet, RunStats, run_fleet, sim_catalog
from crr.runtime.shutdown import stop_on_signals
from crr.schemas.catalog import Catalog
from crr.schemas.codec import encode
from crr.schemas.errors import CrrError
from crr.schemas.subjects import (
    CATALOG,
    MSG_ID_HEADER,
    catalog_msg_id,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `crr sim reporters`."""
    parser.add_argument("--hosts", type=int, default=1000, metavar="N",
                        help="simulated hosts (default 1000)")
    parser.add_argument("--resources", type=int, default=20, metavar="M",
                        help="resources in the generated catalog (default 20; "
                             "with --apply-catalog)")
    parser.add_argument("--reporters", type=int, default=1, metavar="R",
                        help="reporters per host in the generated catalog (default 1)")
    parser.add_argument("--interval", type=float, default=10.0, metavar="S",
                        help="seconds between two reports of a host (default 10)")
    parser.add_argument("--seed", type=int, default=0, metavar="K",
                        help="random seed: the same seed gives the same values (default 0)")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: until Ctrl-C)")
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="stop after N rounds (every host reported N times)")
    parser.add_argument("--faults", default="", metavar="SPEC",
                        help="injected faults, e.g. silent=0.01,invalid=0.001,failing=0.001,"
                             "burst=60 (fractions of hosts / probability per report / "
                             "seconds between bursts)")
    parser.add_argument("--apply-catalog", action="store_true",
                        help="publish a generated catalog with M resources first "
                             "(default: use the active catalog)")
    parser.add_argument("--host-prefix", default="sim", help="host name prefix (default sim)")
    parser.add_argument("--max-in-flight", type=int, default=4096, metavar="N",
                        help="unacknowledged publishes allowed at once (default 4096)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _check(args: argparse.Namespace) -> None:
    if args.hosts < 1:
        raise CrrError("--hosts must be at least 1")
    if args.resources < 1 or args.reporters < 1:
        raise CrrError("--resources and --reporters must be at least 1")
    if args.interval <= 0:
        raise CrrError("--interval must be positive")
    if args.duration is not None and args.duration <= 0:
        raise CrrError("--duration must be positive")


async def _catalog(nc: Connection, args: argparse.Namespace) -> Catalog:
    if args.apply_catalog:
        catalog = sim_catalog(args.resources, args.interval, args.reporters)
        await jetstream.publish(
            nc, CATALOG, encode(catalog),
            headers={MSG_ID_HEADER: catalog_msg_id(secrets.token_hex(8))})
        return catalog
    active = await fetch_catalog(nc)
    if active is None or not any(s.scope == "host" for s in active.resources.values()):
        raise CrrError("no active catalog with host-scope resources: pass --apply-catalog "
                       "(and make sure a projector is running)")
    return active


class _Meter:
    """Progress on stderr: in place on a terminal, a line every 10 s otherwise."""

    def __init__(self, pipe: PipelinePublisher) -> None:
        self.pipe = pipe
        self.tty = sys.stderr.isatty()
        self._next_line = time.monotonic() + 10.0

    def __call__(self, s: RunStats) -> None:
        text = (f"crr sim: {s.events} events  {s.rate:,.0f}/s (offered {s.offered_rate:,.0f}/s)"
                f"  acked {self.pipe.stats.acked}  in flight {self.pipe.in_flight}"
                + (f"  behind {s.behind:.1f}s" if s.behind > 0.5 else ""))
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
            sys.stderr.flush()
        elif time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + 10.0
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


async def run_reporters(args: argparse.Namespace) -> int:
    """Run the fleet until --duration, --rounds or Ctrl-C; print what was published."""
    _check(args)
    faults = Faults.parse(args.faults)
    stop = stop_on_signals()
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-sim-reporters") as nc:
        await provision(nc)
        catalog = await _catalog(nc, args)
        fleet = Fleet(catalog, args.hosts, seed=args.seed, faults=faults,
                      host_prefix=args.host_prefix)
        pipe = PipelinePublisher(nc, max_in_flight=args.max_in_flight)
        await pipe.start()
        meter = _Meter(pipe)
        try:
            stats = await run_fleet(fleet, pipe.publish, interval=args.interval,
                                    duration=args.duration, rounds=args.rounds, stop=stop,
                                    progress=meter)
            with contextlib.suppress(CrrError):
                await pipe.flush(30.0)
        finally:
            meter.close()
            await pipe.close()
    summary = {
        "hosts": args.hosts, "reporters": len(fleet.reporters),
        "resources": len(catalog.resources), "interval": args.interval, "seed": args.seed,
        "offered_rate": round(stats.offered_rate, 1), "events": stats.events,
        "elapsed": round(stats.elapsed, 3), "rate": round(stats.rate, 1),
        "acked": pipe.stats.acked, "duplicates": pipe.stats.duplicates,
        "rejected": pipe.stats.rejected, "failed": pipe.stats.failed,
        "resent": pipe.stats.resent, "invalid_values": fleet.invalid_sent,
        "health_events": fleet.health_sent, "bursts": stats.bursts,
        "last_seq": pipe.stats.last_seq,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"crr sim reporters: {stats.events} events from {args.hosts} hosts in "
              f"{stats.elapsed:.1f}s = {stats.rate:,.0f}/s (offered {stats.offered_rate:,.0f}/s);"
              f" acked {pipe.stats.acked}, rejected {pipe.stats.rejected}, "
              f"failed {pipe.stats.failed}; {fleet.invalid_sent} invalid values, "
              f"{fleet.health_sent} health events, {stats.bursts} bursts")
    unacked = stats.events - pipe.stats.acked - pipe.stats.rejected
    return 1 if pipe.stats.failed or unacked > 0 else 0
