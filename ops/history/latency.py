"""Per reporter p50/p95/p99 of observed → stored → snapshot, from the streams alone.

What `crr latency` prints and `GET /v1/latency` answers.

No tracing backend needed: every figure comes from what JetStream holds.

- *observed*: the report's `observed_at` (the reporter's clock — skew shows here);
- *stored*: the JetStream timestamp of the report in CRR_EVENTS;
- *snapshot*: the JetStream timestamp of the first CRR_SNAPSHOT record of the
  report's host (or the cluster record) whose `as_of.seq` covers the report.

CRR_SNAPSHOT is compacted (one record per host), so history gives one
snapshot sample per host: the report whose sequence is exactly the record's
`as_of.seq`.  `--watch S` also follows both streams live for S seconds and
times every new report to the first record that covers it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from crr.bus.follower import Follower
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.projections.percentile import percentiles
from crr.schemas.errors import SubjectError
from crr.schemas.snapshot_views import SeqRecord
from crr.schemas.subjects import (
    EVENTS_STREAM,
    REPORTS,
    SNAPSHOT_ALL,
    SNAPSHOT_STREAM,
    parse_event_subject,
    snapshot_host,
    snapshot_kind,
)
from crr.schemas.wire_time import expires_seconds

HostKey = str | None
"""A host name, or None for the cluster record."""


class _Head(msgspec.Struct):
    observed_at: str | None = None


_head = msgspec.json.Decoder(_Head)
_record = msgspec.json.Decoder(SeqRecord)


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds at the 50th, 95th and 99th percentile of `n` samples (null when none)."""

    n: int
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    """The largest sample (the status page's slowest report of that leg, when it has one)."""


class ReporterLatency(msgspec.Struct, frozen=True, kw_only=True):
    """One reporter's latencies."""

    reporter: str
    reports: int
    observed_to_stored: Percentiles
    stored_to_snapshot: Percentiles
    observed_to_snapshot: Percentiles
    note: str | None = None
    """Why a leg has no samples although there are reports (n=0 is never unexplained)."""


class SlowReport(msgspec.Struct, frozen=True, kw_only=True):
    """One report among the slowest observed → snapshot (the status page's list)."""

    seq: int
    reporter: str
    host: str | None
    observed_to_stored: float
    stored_to_snapshot: float
    observed_to_snapshot: float
    trace_id: str | None = None
    """The W3C trace id when the report was traced (and sampled), else null."""


@dataclass
class _Event:
    seq: int
    reporter: str
    observed: float
    stored: float
    snapshot: float | None = None
    host: str | None = None
    trace_id: str | None = None


@dataclass
class _Collector:
    events: list[_Event] = field(default_factory=list)
    uncovered: dict[HostKey, list[_Event]] = field(default_factory=dict)
    by_seq: dict[int, tuple[HostKey, _Event]] = field(default_factory=dict)
    reporters: set[str] | None = None
    limit: int | None = None
    """Reports kept at most (the first ones of the window); more are counted in `dropped`."""
    dropped: int = 0

    def event(self, m: StoredMessage) -> None:
        if self.limit is not None and len(self.events) >= self.limit:
            self.dropped += 1
            return
        try:
            addr = parse_event_subject(m.subject)
            head = _head.decode(m.data)
        except (SubjectError, msgspec.DecodeError, msgspec.ValidationError):
            return
        if head.observed_at is None or (self.reporters and addr.reporter not in self.reporters):
            return
        ev = _Event(m.seq, addr.reporter, expires_seconds(head.observed_at), m.time,
                    host=addr.host, trace_id=_sampled_trace(m.headers))
        self.events.append(ev)
        self.uncovered.setdefault(addr.host, []).append(ev)
        self.by_seq[m.seq] = (addr.host, ev)

    def snapshot(self, m: StoredMessage, *, live: bool) -> None:
        kind = snapshot_kind(m.subject)
        if kind == "cluster":
            host: HostKey = None
        elif kind == "host":
            try:
                host = snapshot_host(m.subject)
            except SubjectError:
                return
        else:
            return
        try:
            seq = _record.decode(m.data).as_of.seq
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if not live:
            # A compacted record: only the report it was written for can be timed.
            found = self.by_seq.get(seq)
            if found is not None and found[0] == host and found[1].snapshot is None:
                found[1].snapshot = m.time
            return
        pending = self.uncovered.get(host, [])
        keep = []
        for ev in pending:
            if ev.seq <= seq:
                if ev.snapshot is None:
                    ev.snapshot = m.time
            else:
                keep.append(ev)
        self.uncovered[host] = keep


def _sampled_trace(headers: dict[str, str] | None) -> str | None:
    """The trace id of a sampled W3C `traceparent` (`00-<trace>-<span>-01`), else None."""
    parent = (headers or {}).get("traceparent")
    if not parent:
        return None
    parts = parent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    try:
        sampled = int(parts[3], 16) & 1
    except ValueError:
        return None
    return parts[1] if sampled else None


def slowest(events: list[_Event], n: int = 10) -> list[SlowReport]:
    """The `n` reports with the longest observed → snapshot, slowest first."""
    done = [e for e in events if e.snapshot is not None]
    done.sort(key=lambda e: (e.snapshot or 0.0) - e.observed, reverse=True)
    return [SlowReport(seq=e.seq, reporter=e.reporter, host=e.host,
                       observed_to_stored=round(e.stored - e.observed, 6),
                       stored_to_snapshot=round((e.snapshot or 0.0) - e.stored, 6),
                       observed_to_snapshot=round((e.snapshot or 0.0) - e.observed, 6),
                       trace_id=e.trace_id) for e in done[:n]]


def _percentiles(samples: list[float]) -> Percentiles:
    if not samples:
        return Percentiles(n=0)
    p50, p95, p99 = percentiles(samples, (50, 95, 99))
    return Percentiles(n=len(samples), p50=round(p50, 6), p95=round(p95, 6), p99=round(p99, 6),
                       max=round(max(samples), 6))


NO_SNAPSHOT_SAMPLE = (
    "no snapshot sample: CRR_SNAPSHOT keeps one record per host, covering only the newest "
    "event of that host (here another reporter's or a later one); `--watch S` times new "
    "reports live")
NO_LIVE_SAMPLE = ("no snapshot sample: no snapshot record covered its reports while watching "
                  "(is the projector running?)")


def summarize(events: list[_Event], *, watched: bool = False) -> list[ReporterLatency]:
    """Per reporter, sorted by name; `watched`: the streams were also followed live."""
    by: dict[str, list[_Event]] = {}
    for ev in events:
        by.setdefault(ev.reporter, []).append(ev)
    out = []
    for name in sorted(by):
        evs = by[name]
        done = [e for e in evs if e.snapshot is not None]
        out.append(ReporterLatency(
            reporter=name, reports=len(evs),
            observed_to_stored=_percentiles([e.stored - e.observed for e in evs]),
            stored_to_snapshot=_percentiles([e.snapshot - e.stored for e in done
                                             if e.snapshot is not None]),
            observed_to_snapshot=_percentiles([e.snapshot - e.observed for e in done
                                               if e.snapshot is not None]),
            note=None if done else NO_LIVE_SAMPLE if watched else NO_SNAPSHOT_SAMPLE,
        ))
    return out


async def measure(nc: Any, *, since: float, watch: float = 0.0,
                  reporters: set[str] | None = None) -> list[ReporterLatency]:
    """Read the streams (and follow them `watch` seconds) and summarize."""
    events, _ = await collect(nc, since=since, watch=watch, reporters=reporters)
    return summarize(events, watched=watch > 0)


async def collect(nc: Any, *, since: float, watch: float = 0.0,
                  reporters: set[str] | None = None, limit: int | None = None,
                  ) -> tuple[list[_Event], int]:
    """Every report stored within `since` seconds, timed (see the module doc): at most
    `limit` (the first ones), and how many more were left out."""
    col = _Collector(reporters=reporters, limit=limit)
    events = OrderedReader(nc, stream=EVENTS_STREAM, subject=REPORTS,
                           handler=col.event, start_time=time.time() - since)
    await events.start()
    snaps: Follower[None] | None = None
    try:
        await events.wait_ready(60.0)
        # Reports before the snapshot load: a compacted record can only be matched exactly.
        for evs in col.uncovered.values():
            evs.clear()
        snaps = Follower(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL,
                         new_load=lambda: None,
                         load=lambda _, m: col.snapshot(m, live=False),
                         loaded=lambda _: None,
                         live=lambda m: col.snapshot(m, live=True), name="crr latency")
        await snaps.start()
        await snaps.wait_ready(60.0)
        if watch > 0:
            await asyncio.sleep(watch)  # the operator asked to follow the streams this long
    finally:
        await events.stop()
        if snaps is not None:
            await snaps.stop()
    return col.events, col.dropped
