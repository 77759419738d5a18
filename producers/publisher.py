"""Turning one reporter's observations into crr events on the bus.

`ReporterPublisher` builds Report / Inventory / Health Structs for one
(reporter, host, boot), numbers them with one shared `seq` counter (so the
`Nats-Msg-Id` `<reporter>/<host or _cluster>/<boot>/<seq>` is unique across
the three types) and hands the encoded bytes to an `EventSink` — the bus
`Outbox` in production.  Reports and inventories are `keep="latest"` (an
older value is worthless once a newer one exists); health transitions are
`keep="all"` (every lifecycle change matters).  Host-agnostic: `host=None`
publishes on cluster subjects, so the external-reporter SDK can reuse it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from crr.schemas.codec import event_message
from crr.schemas.events import Device, Health, HealthState, Inventory, Pool, Report
from crr.schemas.subjects import event_subject
from crr.schemas.wire_time import format_time

Keep = Literal["latest", "all"]


class EventSink(Protocol):
    """Where encoded events go: `crr.bus.outbox.Outbox.put` has this signature."""

    def put(self, subject: str, payload: bytes, *, msg_id: str, keep: Keep = "latest") -> None:
        """Queue `payload` for `subject`; must not block."""


class ReporterPublisher:
    """Publishes the events of one reporter on one host (or the cluster) for one boot."""

    def __init__(self, sink: EventSink, *, reporter: str, host: str | None, boot: str) -> None:
        self.sink = sink
        self.reporter = reporter
        self.host = host
        self.boot = boot
        self.seq = 0
        event_subject("report", reporter, host)  # SubjectError now for a name that is no token

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _put(self, event: Report | Inventory | Health, *, keep: Keep) -> None:
        subject, payload, msg_id = event_message(event)
        self.sink.put(subject, payload, msg_id=msg_id, keep=keep)

    def next_report(self, values: Mapping[str, Any], observed_at: float) -> Report:
        """The next Report of these `values`, numbered but not published (for a caller
        that publishes it itself and waits for its outcome: the SDK's `submit`)."""
        return Report(reporter=self.reporter, host=self.host, boot=self.boot,
                      seq=self._next(), observed_at=format_time(observed_at),
                      values=dict(values))

    def report(self, values: Mapping[str, Any], observed_at: float) -> Report:
        """Publish the measured `values` (observed at `observed_at`, epoch seconds)."""
        event = self.next_report(values, observed_at)
        self._put(event, keep="latest")
        return event

    def inventory(self, pool: Pool, devices: Sequence[Device], observed_at: float) -> Inventory:
        """Publish the device inventory of `pool`."""
        seq = self._next()
        event = Inventory(reporter=self.reporter, host=self.host, boot=self.boot, seq=seq,
                          observed_at=format_time(observed_at), pool=pool,
                          devices=list(devices))
        self._put(event, keep="latest")
        return event

    def health(
        self, state: HealthState, detail: str | None = None, exit_code: int | None = None
    ) -> Health:
        """Publish a lifecycle change of the reporter (kept even while NATS is away)."""
        seq = self._next()
        event = Health(reporter=self.reporter, host=self.host, boot=self.boot, seq=seq,
                       at=format_time(time.time()), state=state, detail=detail,
                       exit_code=exit_code)
        self._put(event, keep="all")
        return event
