"""`crr hosts [HOST…] [--json]`: the current snapshot of hosts, as it is now.

Values past their `expires_at` show as stale (`projections.freshness`),
whether or not the projector wrote them so; a line says how alive the
projector is (on stderr with `--json`, whose stdout stays a HostSnapshot
array), and a warning when it is silent.

`crr hosts forget HOST…` (admin role): forget decommissioned hosts
(`ops.forget`): their snapshot records go, their stored events are purged,
and the projector drops them; exit 1 for a host crr knows nothing of.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from bus.connection import connect
from ops.liveness import liveness_now, warn_unless_live
from ops.snapshot_reader import read_snapshot
from ops.table import LEGEND, render_hosts
from projections.freshness import cluster_at, host_at
from schemas.errors import CrrError


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr hosts`."""
    p = sub.add_parser(
        "hosts", parents=[common], help="show host snapshots; `hosts forget HOST…` removes hosts",
        epilog="crr hosts forget HOST…  (admin credentials) forgets decommissioned hosts: "
               "removes their snapshot records, purges their events from CRR_EVENTS and makes "
               "the projector drop them; says what it removed, exit 1 for an unknown host. "
               "Stop the host's agent first: its next report brings the host back.")
    p.add_argument("hosts", nargs="*", metavar="HOST",
                   help="only these hosts (or: forget HOST…)")
    p.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                   help="forget: how long to wait for the projector to apply it (default 10)")
    p.add_argument("--json", action="store_true", help="a JSON array of HostSnapshot, by host")
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Print the table or the JSON array (or forget hosts)."""
    if args.hosts[:1] == ["forget"]:
        return await _forget(args, args.hosts[1:])
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-hosts") as nc:
        contents = await read_snapshot(nc)
    now = time.time()
    live = (warn_unless_live(contents.projectors, "hosts") if args.json
            else liveness_now(contents.projectors))
    contents.hosts = {name: host_at(snap, now) for name, snap in contents.hosts.items()}
    if contents.cluster is not None:
        contents.cluster = cluster_at(contents.cluster, now)
    selected = sorted(contents.hosts.values(), key=lambda h: h.host)
    if args.hosts:
        missing = [h for h in args.hosts if h not in contents.hosts]
        if missing:
            raise CrrError(f"no snapshot for host(s): {', '.join(missing)}")
        selected = [contents.hosts[h] for h in sorted(set(args.hosts))]
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(selected, order="sorted") + b"\n")
        return 0
    if not selected:
        print("no hosts in the snapshot yet (is a projector running, and a catalog applied?)")
        print(f"projector: {live.detail}")
        return 0
    resources = sorted(contents.catalog.resources) if contents.catalog else None
    host_res = [r for r in (resources or []) if contents.catalog is not None
                and contents.catalog.resources[r].scope == "host"] or None
    print(render_hosts(selected, contents.cluster, host_res))
    print(LEGEND)
    print(f"projector: {live.detail}")
    return 0


async def _forget(args: argparse.Namespace, hosts: list[str]) -> int:
    """`crr hosts forget HOST…`: one line per host saying what was removed."""
    from ops.forget import check, forget_host  # noqa: PLC0415 - only this sub-command needs it

    if not hosts:
        raise CrrError("hosts forget: name the host(s) to forget")
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-hosts-forget") as nc:
        for host in hosts:
            outcome = await forget_host(nc, host, timeout=args.wait)
            print(outcome.describe(), flush=True)
            check(outcome, args.wait)
    return 0
