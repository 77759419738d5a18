"""`crr hosts [HOST…] [-R REQ] [-l] [-w] [--json]`: the current snapshot of hosts.

Laid out as an LSF admin expects: `-R` filters like `lsload -R` (a select
expression or a whole requirement string), `-l` is the vertical per-host
view of `lsload -l` / `bhosts -l`, `-w` does not cut long values.

Values past their `expires_at` show as stale (`crr.projections.freshness`),
whether or not the projector wrote them so; a line says how alive the
projector is (with `--json`, whose stdout stays a HostSnapshot array, a
warning on stderr when it is not live).

`crr hosts forget HOST…` (admin role): forget decommissioned hosts
(`crr.admin.forget`): their snapshot records go, their stored events are purged,
and the projector drops them; exit 1 for a host crr knows nothing of.
`crr hosts forget HOST… --reporter R` forgets only R's row (values, inventory) on them.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from crr.admin.liveness import judgement, liveness_now, warn_if_holding, warn_unless_live
from crr.bus.connection import connect
from crr.host_listing import legend, render_host_long, render_hosts
from crr.projections.freshness import cluster_at, host_at
from crr.projections.host_table import HostTable
from crr.projections.select import compile_select
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import HostSnapshot
from crr.view.snapshot_reader import SnapshotContents, read_snapshot


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr hosts`."""
    p = sub.add_parser(
        "hosts", parents=[common], help="show host snapshots; `hosts forget HOST…` removes hosts",
        epilog="crr hosts forget HOST…  (admin credentials) forgets decommissioned hosts: "
               "removes their snapshot records, purges their events from CRR_EVENTS and makes "
               "the projector drop them; says what it removed, exit 1 for an unknown host. "
               "Stop the host's agent first: its next report brings the host back. "
               "With --reporter R only R's row (its values and inventory) goes: a reporter "
               "taken out of the catalog, or a name that was never declared.")
    p.add_argument("hosts", nargs="*", metavar="HOST",
                   help="only these hosts (or: forget HOST…)")
    p.add_argument("-R", dest="requirement", metavar="REQ",
                   help="only hosts matching this select[] expression or whole LSF "
                        "requirement string, as lsload -R (only its select section is "
                        "evaluated)")
    p.add_argument("-l", "--long", action="store_true",
                   help="one vertical block per host: every value with its state, age, "
                        "reporter and expiry, and the reporters' health (as lsload -l)")
    p.add_argument("-w", "--wide", action="store_true", help="do not cut long values")
    p.add_argument("--json", action="store_true", help="a JSON array of HostSnapshot, by host")
    p.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                   help="forget: how long to wait for the projector to apply it (default 10)")
    p.add_argument("--reporter", metavar="R", default=None,
                   help="forget: only this reporter's row on the host(s), not the whole host")
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
    """Print the table, the per-host blocks, or the JSON array (or forget hosts)."""
    if args.hosts[:1] == ["forget"]:
        return await _forget(args, args.hosts[1:])
    if args.reporter is not None:
        raise CrrError("--reporter goes with `crr hosts forget HOST… --reporter R`")
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-hosts") as nc:
        contents = await read_snapshot(nc)
    # Every value judged at the projector's watermark (at most outage_hold back).
    judged = judgement(contents.projectors, contents.catalog, time.time())
    now = judged.judged_at
    live = (warn_unless_live(contents.projectors, "hosts") if args.json
            else liveness_now(contents.projectors))
    warn_if_holding(judged, "hosts")
    contents.hosts = {name: host_at(snap, now) for name, snap in contents.hosts.items()}
    if contents.cluster is not None:
        contents.cluster = cluster_at(contents.cluster, now)
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
        print(f"projector: {live.detail}")
        return 0
    if args.long:
        print("\n\n".join(render_host_long(h, now, contents.catalog, wide=args.wide)
                          for h in selected))
        print()
        print(legend(status=True))
        print(f"projector: {live.detail}")
        return 0
    resources = sorted(contents.catalog.resources) if contents.catalog else None
    host_res = [r for r in (resources or []) if contents.catalog is not None
                and contents.catalog.resources[r].scope == "host"] or None
    print(render_hosts(selected, contents.cluster, host_res, now=now, wide=args.wide))
    print(legend(status=True))
    print(f"projector: {live.detail}")
    return 0


async def _forget(args: argparse.Namespace, hosts: list[str]) -> int:
    """`crr hosts forget HOST…`: one line per host saying what was removed."""
    from crr.admin.forget import (  # noqa: PLC0415 - only this sub-command needs it
        check,
        forget_host,
        forget_reporter,
    )

    if not hosts:
        raise CrrError("hosts forget: name the host(s) to forget")
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-hosts-forget") as nc:
        for host in hosts:
            outcome = (await forget_host(nc, host, timeout=args.wait) if args.reporter is None
                       else await forget_reporter(nc, host, args.reporter, timeout=args.wait))
            print(outcome.describe(), flush=True)
            check(outcome, args.wait)
    return 0
