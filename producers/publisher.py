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

from schemas.codec import encode
from schemas.events import Device, Health, HealthState, Inventory, Pool, Report
from schemas.subjects import event_subject, msg_id
from schemas.wire_time import format_time

Keep = Literal["latest", "all"]


class EventSink(Protocol):
    """Where encoded events go: `bus.outbox.Outbox.put` has this signature."""

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
        self._subjects = {
            kind: event_subject(kind, reporter, host)
            for kind in ("report", "inventory", "health")
        }

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def report(self, values: Mapping[str, Any], observed_at: float) -> Report:
        """Publish the measured `values` (observed at `observed_at`, epoch seconds)."""
        seq = self._next()
        event = Report(reporter=self.reporter, host=self.host, boot=self.boot, seq=seq,
                       observed_at=format_time(observed_at), values=dict(values))
        self.sink.put(self._subjects["report"], encode(event),
                      msg_id=msg_id(self.reporter, self.host, self.boot, seq), keep="latest")
        return event

    def inventory(self, pool: Pool, devices: Sequence[Device], observed_at: float) -> Inventory:
        """Publish the device inventory of `pool`."""
        seq = self._next()
        event = Inventory(reporter=self.reporter, host=self.host, boot=self.boot, seq=seq,
                          observed_at=format_time(observed_at), pool=pool,
                          devices=list(devices))
        self.sink.put(self._subjects["inventory"], encode(event),
                      msg_id=msg_id(self.reporter, self.host, self.boot, seq), keep="latest")
        return event

    def health(
        self, state: HealthState, detail: str | None = None, exit_code: int | None = None
    ) -> Health:
        """Publish a lifecycle change of the reporter (kept even while NATS is away)."""
        seq = self._next()
        event = Health(reporter=self.reporter, host=self.host, boot=self.boot, seq=seq,
                       at=format_time(time.time()), state=state, detail=detail,
                       exit_code=exit_code)
        self.sink.put(self._subjects["health"], encode(event),
                      msg_id=msg_id(self.reporter, self.host, self.boot, seq), keep="all")
        return event
