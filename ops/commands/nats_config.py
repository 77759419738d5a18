"""`crr nats-config`: NATS server authorization and per-identity credentials (see
crr.admin.nats_auth).

    crr nats-config --catalog resources.yaml --hosts-file hosts.txt --out /etc/crr/nats
    crr nats-config --host node1 --host node2 --out DIR          # the active catalog

Writes `DIR/auth.conf` (include it from nats-server.conf) and
`DIR/creds/<identity>.nk` (or `.userpass`), mode 0600.  Prints what it wrote,
never a secret.  Existing credential files are kept, so adding hosts does
not invalidate the keys already deployed.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from crr.admin.nats_auth import DEFAULT_BCRYPT_COST, generate
from crr.bus.catalog_watch import fetch_catalog
from crr.bus.connection import connect
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.errors import CrrError


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr nats-config`."""
    p = sub.add_parser("nats-config", parents=[common],
                       help="generate NATS authorization and credentials for hosts, "
                            "reporters and roles")
    p.add_argument("--catalog", metavar="FILE", default=None,
                   help="resources.yaml (default: the active catalog, read with --creds)")
    p.add_argument("--hosts-file", metavar="FILE", default=None,
                   help="host names, one per line (# comments allowed)")
    p.add_argument("--host", action="append", default=[], metavar="HOST",
                   help="a host name (repeatable)")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="output directory (auth.conf, creds/)")
    p.add_argument("--auth", choices=["nkey", "password"], default="nkey",
                   help="nkeys (default; the server holds only public keys) or users with "
                        "bcrypt-hashed passwords")
    p.add_argument("--bcrypt-cost", type=int, default=DEFAULT_BCRYPT_COST,
                   help=f"bcrypt cost for --auth password (default {DEFAULT_BCRYPT_COST})")
    p.set_defaults(func=run)


def read_hosts(path: str | None, extra: list[str]) -> list[str]:
    """Hosts from the file (one per line, `#` comments) and the `--host` options."""
    hosts = list(extra)
    if path is not None:
        for line in Path(path).read_text().splitlines():
            name = line.split("#", 1)[0].strip()
            if name:
                hosts.append(name)
    return sorted(set(hosts))


async def _catalog(args: argparse.Namespace) -> Catalog:
    if args.catalog:
        return load_catalog(args.catalog)
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-nats-config") as nc:
        catalog = await fetch_catalog(nc)
    if catalog is None:
        raise CrrError("no active catalog: pass --catalog resources.yaml")
    return catalog


async def run(args: argparse.Namespace) -> int:
    """Generate and print a summary (paths and counts only)."""
    hosts = read_hosts(args.hosts_file, args.host)
    catalog = await _catalog(args)
    bundle = await asyncio.to_thread(generate, catalog, hosts, args.out, mode=args.auth,
                                     bcrypt_cost=args.bcrypt_cost)
    roles = sorted(n for n in bundle.creds if "." not in n)
    reporters = sorted(n for n in bundle.creds if n.startswith("reporter."))
    print(f"wrote {bundle.config} ({args.auth}): {len(hosts)} host(s), "
          f"{len(reporters)} external reporter(s), roles {', '.join(roles)}")
    print(f"credentials (mode 0600) in {bundle.config.parent / 'creds'}/; give each host "
          "only its own file (crr agent --creds FILE)")
    print(f'add to nats-server.conf:  include "{bundle.config.resolve()}"')
    return 0
