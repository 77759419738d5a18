"""Partial read views of the host record (`crr.schemas.snapshot.HostSnapshot`, and
`ClusterSnapshot`): what one reader decodes of it, and no more (a lean decode skips the rest).

Each view's field is a field of the full type with the same name and type (a view of a
record reads host and cluster records alike, so its `host` may be None); only defaults
may differ.  `tests/schemas/test_snapshot_views.py` holds every view here to that, so a
renamed or retyped field of the full type fails there instead of decoding to a default.
`VIEWS` lists each view with the full type it reads.
"""

from __future__ import annotations

from typing import Any

import msgspec

from crr.schemas.snapshot import (
    AsOf,
    HostSnapshot,
    InventoryEntry,
    ReporterState,
    ReporterStatus,
    ValueEntry,
    ValueState,
)

# -- what a restore reads of a record (`crr.projections.checkpoint`) ----------------------


class RestoreAsOf(msgspec.Struct, frozen=True, gc=False):
    seq: int
    ts: float | None = None


class RestoreValue(msgspec.Struct, frozen=True, gc=False):
    state: ValueState
    reporter: str
    observed_at: str
    value: Any = None
    last_value: Any = None
    received_ts: float | None = None
    expires_ts: float | None = None


class CheckpointRecord(msgspec.Struct, frozen=True):
    """What a restore needs of a HostSnapshot or ClusterSnapshot (`host` None: cluster)."""

    as_of: RestoreAsOf
    host: str | None = None
    values: dict[str, RestoreValue] = msgspec.field(default_factory=dict)
    inventory: dict[str, InventoryEntry] = msgspec.field(default_factory=dict)
    reporters: dict[str, ReporterStatus] = msgspec.field(default_factory=dict)


# -- what a lazy restore reads first: the times (`crr.projections.checkpoint.earliest_due`)


class DueValue(msgspec.Struct, frozen=True, gc=False):
    state: ValueState
    reporter: str
    expires_ts: float | None = None


class DueInventory(msgspec.Struct, frozen=True, gc=False):
    state: ValueState
    expires_ts: float | None = None


class DueReporter(msgspec.Struct, frozen=True):
    silent: bool = False
    first_seen_ts: float | None = None
    last_report_ts: float | None = None
    missing: list[str] = msgspec.field(default_factory=list)


class DueRecord(msgspec.Struct, frozen=True):
    as_of: RestoreAsOf
    host: str | None = None
    values: dict[str, DueValue] = msgspec.field(default_factory=dict)
    inventory: dict[str, DueInventory] = msgspec.field(default_factory=dict)
    reporters: dict[str, DueReporter] = msgspec.field(default_factory=dict)


# -- what the projector's metrics census counts (`crr.projector.metrics`) ------------------


class CensusValue(msgspec.Struct):
    state: ValueState = "fresh"


class CensusReporter(msgspec.Struct):
    state: ReporterState = "ok"
    rejected: int = 0


class CensusRecord(msgspec.Struct):
    values: dict[str, CensusValue] = msgspec.field(default_factory=dict)
    reporters: dict[str, CensusReporter] = msgspec.field(default_factory=dict)


# -- which event a record reflects (`crr.history.latency`) -------------------------------


class SeqAsOf(msgspec.Struct):
    seq: int = 0


class SeqRecord(msgspec.Struct):
    as_of: SeqAsOf = msgspec.field(default_factory=SeqAsOf)


VIEWS: dict[type[msgspec.Struct], type[msgspec.Struct]] = {
    RestoreAsOf: AsOf, RestoreValue: ValueEntry, CheckpointRecord: HostSnapshot,
    DueValue: ValueEntry, DueInventory: InventoryEntry, DueReporter: ReporterStatus,
    DueRecord: HostSnapshot,
    CensusValue: ValueEntry, CensusReporter: ReporterStatus, CensusRecord: HostSnapshot,
    SeqAsOf: AsOf, SeqRecord: HostSnapshot,
}
"""Each view, and the full type whose fields it reads."""
