"""`crr catalog apply FILE` / `crr catalog show`."""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import sys
from typing import Any

import msgspec
import yaml

from crr.bus import jetstream
from crr.bus.catalog_watch import fetch_catalog
from crr.bus.connection import connect
from crr.bus.streams import provision
from crr.projections.exports import export_problems
from crr.schemas.catalog_loader import elim_mode_notes, load_catalog
from crr.schemas.codec import encode
from crr.schemas.errors import CrrError, StreamConfigError
from crr.schemas.subjects import (
    CATALOG,
    MSG_ID_HEADER,
    catalog_msg_id,
)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr catalog apply|show`."""
    p = sub.add_parser("catalog", help="validate and publish resources.yaml; show the active one")
    csub = p.add_subparsers(dest="catalog_command", metavar="ACTION", parser_class=type(p))
    csub.required = True
    a = csub.add_parser("apply", parents=[common], help="validate FILE and publish it")
    a.add_argument("file", metavar="FILE", help="resources.yaml")
    a.add_argument("--dry-run", action="store_true", help="only validate")
    a.set_defaults(func=apply_cmd)
    s = csub.add_parser("show", parents=[common], help="print the active catalog")
    s.add_argument("--json", action="store_true", help="JSON instead of YAML-like text")
    s.set_defaults(func=show_cmd)


async def apply_cmd(args: argparse.Namespace) -> int:
    """Validate the file (every error at once), then publish it on crr.v1.catalog."""
    catalog = load_catalog(args.file, exports_check=export_problems)
    for note in elim_mode_notes(args.file):
        print(f"crr catalog: note: {note}", file=sys.stderr)
    if args.dry_run:
        print(f"{args.file}: valid ({len(catalog.resources)} resources, "
              f"{len(catalog.reporters)} reporters)")
        return 0
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-catalog") as nc:
        # Streams that exist as the projector set them up (`--replicas 3` on a cluster,
        # another `--retention`) are published into as they are.
        with contextlib.suppress(StreamConfigError):
            await provision(nc)
        seq = await jetstream.publish(
            nc, CATALOG, encode(catalog),
            headers={MSG_ID_HEADER: catalog_msg_id(secrets.token_hex(8))})
    print(f"published {args.file}: {len(catalog.resources)} resources, "
          f"{len(catalog.reporters)} reporters (seq {seq})")
    return 0


async def show_cmd(args: argparse.Namespace) -> int:
    """Print the catalog the projector made active."""
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-catalog") as nc:
        catalog = await fetch_catalog(nc)
    if catalog is None:
        raise CrrError("no active catalog: run `crr catalog apply resources.yaml` "
                       "(and make sure a projector is running)")
    doc = msgspec.to_builtins(catalog)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    yaml.safe_dump(doc, sys.stdout, sort_keys=True, default_flow_style=None)
    return 0
