"""`crr bridge nfd|condor|elim …`: feed crr's snapshot to a scheduler's own node facts.

Each sub-command follows one host's records and keeps its target in line with
the catalog's `exports:` (docs/bridges.md).  Whole-cluster doors (Slurm) plug in
as modules `ops/commands/bridge_<door>.py` with `register_bridge(subparsers, common)`:
this command discovers and adds them under `crr bridge`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crr.commands
from crr.bridges.condor import condor_door
from crr.bridges.door import Door
from crr.bridges.elim import elim_door
from crr.bridges.host_source import HostSource
from crr.bridges.nfd import DEFAULT_MAX_TTL, DEFAULT_PREFIX, NfdDoor
from crr.bridges.run import HostBridgeOptions, run_host_bridge
from crr.bus.connection import connect
from crr.commands.agent import short_hostname
from crr.runtime.shutdown import stopping
from crr.schemas.errors import CrrError

BRIDGE_HELP = ("Feed crr's snapshot to a scheduler's own node facts: each door keeps its "
               "target in line with the active catalog's `exports:` (features, drain rules, "
               "values; docs/bridges.md).  nfd, condor and elim follow one host's record "
               "(--host, default: this host); slurm follows the whole cluster "
               "(docs/bridges-slurm.md).")
"""`crr bridge --help`'s description (the module doc is for developers)."""


def _host_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None,
                   help="the host whose record to follow (default: the short host name)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would change instead of changing it")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--rate", type=float, default=200.0, metavar="N",
                   help="node changes per second at most (default 200)")
    p.add_argument("--no-health", dest="health", action="store_false",
                   help="do not publish the bridge's health as reporter bridge-<door> "
                        "(--once and --dry-run never do: a trial leaves no health row)")
    p.add_argument("--quiet", action="store_true",
                   help="no line on stderr saying what was written")


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr bridge` and its doors."""
    p = sub.add_parser("bridge", help="feed a scheduler (NFD, HTCondor, LSF, Slurm) from crr",
                       description=BRIDGE_HELP)
    doors = p.add_subparsers(dest="door", metavar="DOOR")
    doors.required = True

    nfd = doors.add_parser("nfd", parents=[common], help="Kubernetes NFD local feature file",
                           description="Write DIR/crr in NFD's feature-file format "
                           "(labels expire by themselves if crr stops).")
    _host_options(nfd)
    nfd.add_argument("--dir", type=Path, required=True,
                     help="nfd-worker's features.d directory (e.g. "
                          "/etc/kubernetes/node-feature-discovery/features.d)")
    nfd.add_argument("--prefix", default=DEFAULT_PREFIX,
                     help=f"label namespace prefix (default {DEFAULT_PREFIX})")
    nfd.add_argument("--max-ttl", type=float, default=DEFAULT_MAX_TTL, metavar="S",
                     help="labels expire at most this long after the last write "
                          f"(default {DEFAULT_MAX_TTL:g} s)")
    nfd.set_defaults(func=_run_nfd)

    condor = doors.add_parser("condor", parents=[common],
                              help="HTCondor startd cron job (continuous mode)",
                              description="Print ClassAd attributes and a '-' line per update.")
    _host_options(condor)
    condor.set_defaults(func=_run_condor)

    elim = doors.add_parser("elim", parents=[common], help="LSF elim (elim.crr)",
                            description="Write LSF load update strings on every change and "
                            "at least every --interval seconds.")
    _host_options(elim)
    elim.add_argument("--interval", type=float, default=30.0, metavar="S",
                      help="write at least this often (default 30 s)")
    elim.set_defaults(func=_run_elim)

    # The hook for whole-cluster doors (`crr bridge slurm`): ops/commands/bridge_<door>.py.
    for mod in sorted(pkgutil.iter_modules(crr.commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("bridge_"):
            module = importlib.import_module(f"crr.commands.{mod.name}")
            hook = getattr(module, "register_bridge", None)
            if hook is not None:
                hook(doors, common)


async def _run(args: argparse.Namespace, make_door: Callable[[HostSource], Door], *,
               heartbeat: float | None) -> int:
    host = args.host or short_hostname()
    if args.rate <= 0:
        raise CrrError("--rate must be greater than zero", where=f"crr bridge {args.door}")
    options = HostBridgeOptions(host=host, dry_run=args.dry_run, once=args.once, rate=args.rate,
                                heartbeat=heartbeat, health=args.health, quiet=args.quiet)
    async with stopping() as stop, connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                                           name=f"crr-bridge-{args.door}-{host}",
                                           attempts=None) as nc:
        stop.serving()
        return await run_host_bridge(nc, make_door, options, stop, sys.stdout)
    return 0  # stopped (SIGTERM/SIGINT) before the bridge ended by itself


def _features_dir(directory: Path) -> Path:
    """`--dir`, which must be an existing directory (one line of error otherwise)."""
    if not os.path.isdir(directory):
        raise CrrError(f"{directory}: not a directory (nfd-worker's features.d)",
                       where="crr bridge nfd --dir")
    return directory


async def _run_nfd(args: argparse.Namespace) -> int:
    directory = _features_dir(args.dir)
    if args.max_ttl <= 0:
        raise CrrError("--max-ttl must be greater than zero", where="crr bridge nfd")
    return await _run(args, lambda _s: NfdDoor(directory, prefix=args.prefix,
                                               max_ttl=args.max_ttl),
                      heartbeat=args.max_ttl / 3)


async def _run_condor(args: argparse.Namespace) -> int:
    return await _run(args, lambda s: condor_door(sys.stdout, lambda: s.planner.exports),
                      heartbeat=None)


async def _run_elim(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CrrError("--interval must be greater than zero", where="crr bridge elim")
    return await _run(args, lambda s: elim_door(sys.stdout, lambda: s.planner.exports),
                      heartbeat=args.interval)
