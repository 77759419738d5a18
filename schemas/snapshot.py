"""What the projector writes to `CRR_SNAPSHOT` (docs/contract.md, "Payloads"): host, cluster and
projector records.

Readers (the scheduler view, CLI, REST, other languages) decode these.  They
are encoded with sorted keys so equal state gives equal bytes.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from crr.schemas.events import Device, Pool

ValueState = Literal["fresh", "stale", "unknown"]
ReporterState = Literal[
    "ok", "failed", "timeout", "bad_output", "crashed", "restarting", "quarantined",
    "not_applicable", "stopped", "silent", "rejecting", "held", "holding",
]


class AsOf(msgspec.Struct, frozen=True, kw_only=True):
    """The `CRR_EVENTS` sequence and the time of the last change to a record."""

    seq: int
    time: str
    ts: float | None = None
    """`time` as epoch seconds, exactly as the projector holds it (None: an older writer)."""


class ValueEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One resource's value on a host (or the cluster), with its freshness.

    A stale value has `value: null` and keeps what it was in `last_value`.
    """

    value: Any
    state: ValueState
    reporter: str
    observed_at: str
    received_at: str
    expires_at: str
    last_value: Any = None
    stale_since: str | None = None
    received_ts: float | None = None
    """`received_at` as epoch seconds (exact: the server timestamp; None: an older writer)."""
    expires_ts: float | None = None
    """`expires_at` as epoch seconds (for a stale value also its `stale_since`)."""


class InventoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A reporter's inventory on a host, with the same freshness as values."""

    pool: Pool
    devices: list[Device]
    state: ValueState
    reporter: str
    observed_at: str
    received_at: str
    expires_at: str
    stale_since: str | None = None
    received_ts: float | None = None
    """`received_at` as epoch seconds (None: an older writer)."""
    expires_ts: float | None = None
    """`expires_at` as epoch seconds."""


class ReporterStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A reporter's health on a host as the projector sees it.

    `state` is the last Health state, or the projector's own finding:
    `silent` (nothing within interval + grace), `rejecting` (the last report
    had invalid values).  `rejected` counts the values rejected in the last
    report, `rejections` says why; `rejected_total` counts every value
    rejected since the reporter's first event on that host (it survives
    projector restarts).  `missing` names the declared resources it has not
    reported within their interval + grace (stale, or never reported since
    the reporter was first seen): a reporter can say `ok` and still miss some.
    """

    state: ReporterState
    detail: str | None = None
    since: str | None = None
    last_report_at: str | None = None
    rejected: int = 0
    rejections: list[str] = msgspec.field(default_factory=list)
    exit_code: int | None = None
    boot: str | None = None
    health: str | None = None
    """The last Health state the reporter's runner published, whatever `state` says."""
    rejected_total: int = 0
    missing: list[str] = msgspec.field(default_factory=list)
    silent: bool = False
    """Nothing within interval + grace (also while a lifecycle `state` hides it)."""
    first_seen_ts: float | None = None
    """When the projector first saw an event of this reporter here (epoch seconds)."""
    since_ts: float | None = None
    """`since` as epoch seconds."""
    last_report_ts: float | None = None
    """`last_report_at` as epoch seconds."""


class HostSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of `crr.v1.snapshot.host.<host>`."""

    host: str
    as_of: AsOf
    values: dict[str, ValueEntry] = msgspec.field(default_factory=dict)
    inventory: dict[str, InventoryEntry] = msgspec.field(default_factory=dict)
    reporters: dict[str, ReporterStatus] = msgspec.field(default_factory=dict)


class ClusterSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of `crr.v1.snapshot.cluster`: cluster-scope values, same shape without `host`."""

    as_of: AsOf
    values: dict[str, ValueEntry] = msgspec.field(default_factory=dict)
    inventory: dict[str, InventoryEntry] = msgspec.field(default_factory=dict)
    reporters: dict[str, ReporterStatus] = msgspec.field(default_factory=dict)


class RebuildProgress(msgspec.Struct, frozen=True, kw_only=True):
    """How far a rebuild (the fold of the retained `CRR_EVENTS` history) has come."""

    folded: int
    """Events read so far (a partition counts the other partitions' events it skips too)."""
    to_fold: int
    """Events to read in all: `folded` + what the stream holds after the last one read."""
    rate: float
    """Events read per second since the rebuild began."""
    eta_s: float | None = None
    """Seconds left at that rate (None: not known yet)."""
    from_seq: int = 0
    """The first `CRR_EVENTS` sequence the rebuild read (the first retained event)."""


class ProjectorStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of `crr.v1.snapshot.projector`: how far the projector got."""

    last_seq: int
    """Last `CRR_EVENTS` sequence applied (for a partition: among its own subjects)."""
    stream_last_seq: int
    """Last sequence in `CRR_EVENTS` when this status was written (as far as known:
    an unpartitioned projector counts it as `last_seq + lag`; a partition reads the
    stream's own last sequence, so it is not limited to the partition's subjects)."""
    lag: int
    """Events of this projector's subjects stored but not yet applied."""
    last_tick: str
    started_at: str
    applied: int = 0
    deadletters: int = 0
    hosts: int = 0
    projector_id: str = ""
    partition: int | None = None
    start_seq: int = 0
    """Where an older projector's last-event-per-subject load ended (0: none).

    A projector that rebuilds folds the whole retained history, so it writes 0
    (its state is the fold of every retained event).  A projector that restored
    keeps the value of the status it restored from: an older writer's state was
    the fold of the last event per subject up to `start_seq`, then of every later
    event, and `crr replay --verify` replays exactly that input.
    """
    covered_seq: int = 0
    """Every `CRR_EVENTS` event up to this sequence that this projector folds is
    reflected in CRR_SNAPSHOT (0: not said — an older writer; use `last_seq`).

    Unpartitioned it equals `last_seq`.  A partition's `last_seq` is the last of
    *its* events, so it would hold readers back at other partitions' events; its
    `covered_seq` also spans the other partitions' events after that (see
    `crr.projector.service`).  Readers take the minimum over the partitions
    (`crr.projections.coverage`)."""
    partitions: int | None = None
    """N for one of N partitions (`partition` is then 0..N-1); None: unpartitioned."""
    checkpoint: int = 0
    """The checkpoint format of this projector's records (`CHECKPOINT_FORMAT`); 0: an
    older writer whose records cannot be restored from (a restart rebuilds)."""
    catalog_seq: int = 0
    """`CRR_EVENTS` sequence of the catalog event the records were folded with (0: none)."""
    catalog_digest: str = ""
    """SHA-1 (hex) of that catalog as `crr.v1.snapshot.catalog` holds it."""
    start: str = ""
    """How this projector started: `restored from CRR_SNAPSHOT at seq N` or `rebuilt from
    CRR_EVENTS: <why>` (empty: an older writer)."""
    phase: str = ""
    """`rebuilding` while the projector folds the retained history after a start that
    could not restore (its records are not written yet: readers keep the old ones,
    and `last_seq`/`covered_seq` claim nothing); empty once it writes its records."""
    progress: RebuildProgress | None = None
    """With `phase: rebuilding`: events folded of events to fold, rate, ETA."""
    retained_from: str | None = None
    """When this projector last rebuilt: the time of the first event `CRR_EVENTS` still
    held (values reported only before it were gone; None: it restored, or the stream
    was empty)."""
    next_due_ts: float | None = None
    """No deadline pending in the records this status covers comes before this (epoch
    seconds; None: nothing pending, or `checkpoint` < 2).  A restart places a restored
    record no later than this without reading it first (see `crr.projections.checkpoint.Lazy`)."""
    watermark: str = ""
    """The projector's watermark (RFC 3339): it had folded every event `CRR_EVENTS` stored
    before this time, and judged its own deadlines at it (docs/contract.md, "Freshness at
    the watermark").  Empty: an older writer (readers then use `last_tick`)."""
    watermark_ts: float | None = None
    """`watermark` as epoch seconds (None: an older writer)."""


CHECKPOINT_FORMAT = 2
"""Bumped whenever what a restore needs from the records changes (2: the status carries
`next_due_ts`; a status of format 1 still restores, reading each record's deadlines)."""
