"""Encoders and decoders for every wire type, built once and reused.

`decode_event` is lenient in one way only: JSON that a careless reporter
wrote with `NaN`/`Infinity` (Python's `json.dumps` default) is still
decoded, so the fold can reject just that value and keep the rest.

`event_message` is an event as it goes on the bus — subject, canonical bytes and
`Nats-Msg-Id`, all derived from the event itself — for every publisher (the agent's
and external reporters' `ReporterPublisher`, `crr report`, the simulator).  It is
pure, so it lives here rather than in `bus/`, which only sends what it is given.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, TypeVar

import msgspec

from crr.schemas.catalog import Catalog
from crr.schemas.errors import PayloadError
from crr.schemas.events import DeadLetter, Forget, Health, Inventory, Report
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus
from crr.schemas.subjects import MSG_ID_HEADER, EventType, event_subject, msg_id

T = TypeVar("T")

# Sorted keys: equal state encodes to equal bytes (snapshot determinism).
_encoder = msgspec.json.Encoder(order="sorted")

DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (Report, Inventory, Health, Catalog, HostSnapshot, ClusterSnapshot,
              ProjectorStatus, DeadLetter, Forget)
}


def encode(obj: Any) -> bytes:
    """Canonical JSON bytes (sorted keys) of a wire object."""
    return _encoder.encode(obj)


def decode(data: bytes | str, type_: type[T]) -> T:
    """Decode `data` as `type_`, or raise PayloadError saying why."""
    dec = DECODERS.get(type_)
    try:
        if dec is not None:
            return dec.decode(data)  # type: ignore[no-any-return]
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        raise PayloadError(f"invalid {type_.__name__}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise PayloadError(f"not valid JSON for {type_.__name__}: {exc}") from exc


def decode_event(data: bytes, type_: type[T]) -> T:
    """Decode an event, accepting non-standard NaN/Infinity literals (see module doc)."""
    try:
        return decode(data, type_)
    except PayloadError as first:
        if b"NaN" not in data and b"Infinity" not in data:
            raise
        try:
            doc = json.loads(data)
            return msgspec.convert(doc, type_)
        except (ValueError, msgspec.ValidationError):
            raise first from None


class EventMessage(NamedTuple):
    """One event as it is published: where, what bytes, and its de-duplication id."""

    subject: str
    payload: bytes
    msg_id: str

    @property
    def headers(self) -> dict[str, str]:
        """The publish headers: `{"Nats-Msg-Id": msg_id}`."""
        return {MSG_ID_HEADER: self.msg_id}


def event_message(event: Report | Inventory | Health) -> EventMessage:
    """Subject (`crr.v1.<kind>.host.<host>.<reporter>` or `….cluster.<reporter>`), canonical
    JSON and `Nats-Msg-Id` (`<reporter>/<host or _cluster>/<boot>/<seq>`) of `event`."""
    kind: EventType
    match event:
        case Report():
            kind = "report"
        case Inventory():
            kind = "inventory"
        case Health():
            kind = "health"
    return EventMessage(event_subject(kind, event.reporter, event.host), _encoder.encode(event),
                        msg_id(event.reporter, event.host, event.boot, event.seq))
