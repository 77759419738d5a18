"""`crr report`: publish one report, as an external reporter or a cron job would."""

from __future__ import annotations

import argparse
import json
import secrets
import time
from typing import Any

from bus.connection import connect
from bus.subjects import event_subject, msg_id
from schemas.codec import encode
from schemas.errors import PayloadError
from schemas.events import Report
from schemas.timestamps import format_time


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr report`."""
    p = sub.add_parser("report", parents=[common], help="publish one report (name=value …)")
    p.add_argument("--reporter", required=True, help="reporter name (owner of the resources)")
    p.add_argument("--host", default=None, help="host for host-scope values (omit for cluster)")
    p.add_argument("values", nargs="+", metavar="NAME=VALUE",
                   help="JSON values: 812.5, true, '\"rhel9\"', '[\"a\",\"b\"]', null; "
                        "anything that is not JSON is taken as a string")
    p.set_defaults(func=run)


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """`name=value` pairs → values (JSON where it parses, else the raw string)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise PayloadError(f"expected NAME=VALUE, got {item!r}")
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = raw
    return out


async def run(args: argparse.Namespace) -> int:
    """Publish and wait for the stream's acknowledgement."""
    values = parse_assignments(args.values)
    boot = "cli-" + secrets.token_hex(4)
    seq = time.time_ns() // 1000
    report = Report(reporter=args.reporter, host=args.host, boot=boot, seq=seq,
                    observed_at=format_time(time.time()), values=values)
    subject = event_subject("report", args.reporter, args.host)
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-report") as nc:
        ack = await nc.jetstream().publish(
            subject, encode(report),
            headers={"Nats-Msg-Id": msg_id(args.reporter, args.host, boot, seq)})
    print(f"published {len(values)} value(s) on {subject} (seq {ack.seq})")
    return 0
