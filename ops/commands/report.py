"""`crr report`: publish one report, as an external reporter or a cron job would.

By default it then waits (`--timeout`) for the projector to handle it and
says what became of it — applied, rejected (why), dead-lettered (why) — with
exit status 0 only when every value was applied (`crr.sdk.report_outcome`).
`--no-wait` only publishes and waits for the stream's acknowledgement.
A reporter the active catalog does not declare is refused before anything is
published (`crr.bus.catalog_watch.check_declared`): all its values would be rejected.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from typing import Any

from crr.bus import jetstream
from crr.bus.catalog_watch import check_declared
from crr.bus.connection import connect
from crr.schemas.codec import event_message
from crr.schemas.duration import parse_duration
from crr.schemas.errors import PayloadError
from crr.schemas.events import Report, check_finite
from crr.schemas.wire_time import format_time
from crr.sdk.report_outcome import outcome


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr report`."""
    p = sub.add_parser(
        "report", parents=[common], help="publish one report (name=value …) and say what "
        "became of it",
        epilog="exit status: 0 when every value was applied; 1 when any was rejected, the "
               "report\nwas dead-lettered, or no outcome came within --timeout; 1 before "
               "publishing\nanything for a reporter the active catalog does not declare, or for a "
               "host\n(--host) its resources' scope does not allow")
    p.add_argument("--reporter", required=True, help="reporter name (owner of the resources)")
    p.add_argument("--host", default=None, help="host for host-scope values (omit for cluster)")
    p.add_argument("values", nargs="+", metavar="NAME=VALUE",
                   help="JSON values: 812.5, true, '\"rhel9\"', '[\"a\",\"b\"]', null; "
                        "anything that is not JSON is taken as a string")
    p.add_argument("--no-wait", action="store_true",
                   help="only publish (exit 0 once the stream has stored it)")
    p.add_argument("--timeout", type=parse_duration, default=10.0, metavar="DURATION",
                   help="how long to wait for the projector's verdict (default 10s)")
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
    check_finite(out)
    return out


async def run(args: argparse.Namespace) -> int:
    """Publish and wait for the stream's acknowledgement."""
    values = parse_assignments(args.values)
    boot = "cli-" + secrets.token_hex(4)
    seq = time.time_ns() // 1000
    observed_at = format_time(time.time())
    report = Report(reporter=args.reporter, host=args.host, boot=boot, seq=seq,
                    observed_at=observed_at, values=values)
    msg = event_message(report)
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-report") as nc:
        catalog = await check_declared(nc, args.reporter)
        if catalog is not None:
            catalog.check_scope(args.reporter, args.host, where="active catalog")
        stored = await jetstream.publish(nc, msg.subject, msg.payload, headers=msg.headers)
        print(f"published {len(values)} value(s) on {msg.subject} (seq {stored})", flush=True)
        if args.no_wait:
            return 0
        verdict = await outcome(nc, seq=stored, reporter=args.reporter, host=args.host,
                                observed_at=observed_at, names=list(values),
                                timeout=args.timeout)
    for line in verdict.lines():  # what was applied on stdout, every problem on stderr
        print(line, file=sys.stdout if line.startswith("applied:") else sys.stderr)
    return 0 if verdict.ok else 1
