"""`crr events export`: CRR_EVENTS history as JSON lines (format: `crr.history.replay`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from crr.bus.connection import connect
from crr.bus.jetstream import stream_range
from crr.bus.ordered import StoredMessage
from crr.history.replay import (
    When,
    export_line,
    host_filter,
    parse_when,
    read_stream,
)
from crr.progress import Progress
from crr.schemas.errors import CrrError
from crr.schemas.subjects import EVERYTHING
from crr.schemas.wire_time import format_time


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `crr events export`."""
    p = sub.add_parser("events", parents=[common], help="CRR_EVENTS history tools")
    events = p.add_subparsers(dest="events_command", metavar="ACTION")
    events.required = True
    e = events.add_parser("export", parents=[common],
                          help="export stored events as JSON lines (replayable)")
    e.add_argument("--since", metavar="T", help="first event: RFC 3339 time, relative (-15m) "
                   "or a stream sequence (default: the oldest retained)")
    e.add_argument("--until", metavar="T", help="last event: same forms (default: the newest "
                   "when the export started)")
    e.add_argument("--subject", metavar="FILTER", default=EVERYTHING,
                   help=f"NATS subject filter (default {EVERYTHING})")
    e.add_argument("--host", metavar="H",
                   help="only events of host H (and catalog changes, so the file replays)")
    e.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default stdout)")
    e.set_defaults(func=run_export)


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[BinaryIO]:
    if path is None or path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with open(path, "wb") as f:
        yield f


async def run_export(args: argparse.Namespace) -> int:
    """Stream the selected events to the output, with a progress bar on a TTY."""
    now = time.time()
    since = parse_when(args.since, now) if args.since else When()
    until = parse_when(args.until, now) if args.until else When()
    keep = host_filter(args.host) if args.host else None
    async with connect(args.server, creds=args.creds, tls_ca=args.tls_ca,
                       name="crr-events-export") as nc:
        rng = await stream_range(nc)
        _check_retention(since, until, rng.first_seq, rng.first_time, rng.empty)
        total = max(rng.last_seq - max(since.seq or rng.first_seq, rng.first_seq) + 1, 0)
        written = 0
        bar = Progress("export", total=total or None, unit="events")
        with _output(args.output) as out, bar:
            def on_message(m: StoredMessage) -> bool:
                nonlocal written
                if (until.seq is not None and m.seq > until.seq) or (
                        until.time is not None and m.time > until.time):
                    return False
                if keep is None or keep(m.subject):
                    out.write(export_line(m))
                    written += 1
                bar.update(m.seq - (since.seq or rng.first_seq) + 1)
                return True

            await read_stream(nc, on_message, subject=args.subject, start_seq=since.seq,
                              start_time=since.time, stop_seq=until.seq)
    print(f"exported {written} event(s)" + (f" to {args.output}" if args.output else ""),
          file=sys.stderr)
    return 0


def _check_retention(since: When, until: When, first_seq: int, first_time: float | None,
                     empty: bool) -> None:
    """A clear error when the range asks for history the stream no longer holds.

    An explicit `--since SEQ` below the first retained sequence, or a range
    that ends before the first retained event, is an error; a `--since TIME`
    older than the first retained event only warns (events before it aged
    out, or there were none).
    """
    where = f"CRR_EVENTS starts at seq {first_seq}" + (
        f" ({format_time(first_time)})" if first_time is not None else "")
    if empty:
        return
    if since.seq is not None and since.seq < first_seq:
        raise CrrError(f"--since {since.text}: outside retention; {where}")
    if (until.seq is not None and until.seq < first_seq) or (
            until.time is not None and first_time is not None and until.time < first_time):
        raise CrrError(f"--until {until.text}: the whole range is outside retention; {where}")
    if since.time is not None and first_time is not None and since.time < first_time \
            and first_seq > 1:
        print(f"crr events export: note: history before seq {first_seq} has aged out; "
              f"{where}", file=sys.stderr)
