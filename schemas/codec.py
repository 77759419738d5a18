"""Encoders and decoders for every wire type, built once and reused.

`decode_event` is lenient in one way only: JSON that a careless reporter
wrote with `NaN`/`Infinity` (Python's `json.dumps` default) is still
decoded, so the fold can reject just that value and keep the rest.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

from schemas.catalog import Catalog
from schemas.errors import PayloadError
from schemas.events import DeadLetter, Forget, Health, Inventory, Report
from schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus

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
