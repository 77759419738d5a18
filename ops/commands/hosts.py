"""`crr hosts [HOST…] [-R REQ] [-l] [-w] [--json]`: the current snapshot of hosts.

Laid out as an LSF admin expects: `-R` filters like `lsload -R` (a select
expression or a whole requirement string), `-l` is the vertical per-host
view of `lsload -l` / `bhosts -l`, `-w` does not cut long values.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from bus.connection import connect
from ops.snapshot_reader import SnapshotContents, read_snapshot
from ops.table import legend, render_host_long, render_hosts
from projections.host_table import HostTable
from projections.select import compile_select
from schemas.errors import CrrError
from schemas.snapshot import HostSnapshot


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr hosts`."""
    p = sub.add_parser("hosts", parents=[common], help="show host snapshots")
    p.add_argument("hosts", nargs="*", metavar="HOST", help="only these hosts")
    p.add_argument("-R", dest="requirement", metavar="REQ",
                   help="only hosts matching this select[] expression or whole LSF "
                        "requirement string, as lsload -R (only its select section is "
                        "evaluated)")
    p.add_argument("-l", "--long", action="store_true",
                   help="one vertical block per host: every value with its state, age, "
                        "reporter and expiry, and the reporters' health (as lsload -l)")
    p.add_argument("-w", "--wide", action="store_true", help="do not cut long values")
    p.add_argument("--json", action="store_true", help="a JSON array of HostSnapshot, by host")
    p.set_defaults(func=run)


def _matching(contents: SnapshotContents, requirement: str, now: float) -> set[str]:
    """The hosts `requirement` selects at `now` (a stderr note names sections not evaluated)."""
    if contents.catalog is None:
        raise CrrError("no catalog in CRR_SNAPSHOT yet: apply one with `crr catalog apply` "
                       "(and is a projector running?)")
    compiled = compile_select(requirement, contents.catalog)
    if compiled.note:
        print(f"crr hosts: note: {compiled.note}", file=sys.stderr)
    table = HostTable(contents.catalog)
    table.load(contents.hosts.values())
    if contents.cluster is not None:
        table.set_cluster(contents.cluster)
    return set(compiled.select(table, now))


async def run(args: argparse.Namespace) -> int:
    """Print the table, the per-host blocks, or the JSON array."""
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-hosts") as nc:
        contents = await read_snapshot(nc)
    now = time.time()
    selected: list[HostSnapshot] = sorted(contents.hosts.values(), key=lambda h: h.host)
    if args.hosts:
        missing = [h for h in args.hosts if h not in contents.hosts]
        if missing:
            raise CrrError(f"no snapshot for host(s): {', '.join(missing)}")
        selected = [contents.hosts[h] for h in sorted(set(args.hosts))]
    if args.requirement is not None:
        keep = _matching(contents, args.requirement, now)
        selected = [h for h in selected if h.host in keep]
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(selected, order="sorted") + b"\n")
        return 0
    if not selected:
        if args.requirement is not None and contents.hosts:
            print("no host matches the requirement")
        else:
            print("no hosts in the snapshot yet (is a projector running, and a catalog "
                  "applied?)")
        return 0
    if args.long:
        print("\n\n".join(render_host_long(h, now, contents.catalog, wide=args.wide)
                          for h in selected))
        print()
        print(legend(status=True))
        return 0
    resources = sorted(contents.catalog.resources) if contents.catalog else None
    host_res = [r for r in (resources or []) if contents.catalog is not None
                and contents.catalog.resources[r].scope == "host"] or None
    print(render_hosts(selected, contents.cluster, host_res, now=now, wide=args.wide))
    print(legend(status=True))
    return 0
