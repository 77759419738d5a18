"""The projector's restart from its checkpoint (DESIGN §4: the snapshot is the checkpoint).

Given what CRR_SNAPSHOT holds (`ops.services.checkpoint_read.load_checkpoint`), decide
whether this projector (or partition) can restore its fold state from its own
records, and build that state (`projections.checkpoint`).  It cannot — and
the caller rebuilds from the last event per subject, saying why — when there
is no status of this projector, the status is of another layout (partition
count) or an older writer, a record does not decode or restore, the catalog
it was folded with is no longer to be found, or the snapshot is ahead of
CRR_EVENTS (the events stream went backwards) or its position aged out of it.

The restored state is the fold at the status's `last_seq`; the caller folds
CRR_EVENTS from the next sequence, placing the records written after the
status (`projections.checkpoint.Deferred`) as the fold passes them.  The
records written before the status wait in `projections.checkpoint.Lazy`
until first needed; with a status of checkpoint format 2 they are not even
read at start (the status's `next_due_ts` bounds their first deadlines), so
a restart costs little more than reading CRR_SNAPSHOT.  Such a record is
fully checked when it is placed; one that does not restore then makes the
projector rebuild from CRR_EVENTS (logged, and said in its status).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import msgspec
from nats.js.client import JetStreamContext

from bus.errors import nats_errors
from ops.services.checkpoint_read import RawRecords
from projections.checkpoint import (
    CheckpointError,
    Deferred,
    Lazy,
    Restorable,
    decode_record,
    earliest_due,
    record_of,
    restore,
)
from projections.state import ProjectionState
from schemas.catalog import Catalog
from schemas.catalog_loader import catalog_from_wire
from schemas.codec import DECODERS
from schemas.errors import BusError, CatalogError, SubjectError
from schemas.snapshot import CHECKPOINT_FORMAT, ProjectorStatus
from schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_HOST_PREFIX,
    owner,
    snapshot_host,
    status_subject,
)

_status: msgspec.json.Decoder[ProjectorStatus] = DECODERS[ProjectorStatus]

_RECORD_START = b'{"as_of":{"seq":'
"""How every host record starts (sorted keys: `as_of` first, `seq` first in it)."""


def _as_of_seq(subject: str, data: bytes) -> int:
    """A record's `as_of.seq`, read off its first bytes (the rest is read when placed)."""
    end = data.find(b",", len(_RECORD_START), 40)
    if not data.startswith(_RECORD_START) or end < 0 or not data.endswith(b"}"):
        raise NotRestorable(f"record {subject} does not decode: not a snapshot record")
    try:
        return int(data[len(_RECORD_START):end])
    except ValueError:
        raise NotRestorable(f"record {subject} does not decode: not a snapshot "
                            "record") from None


@dataclass
class Restored:
    """A fold state restored from CRR_SNAPSHOT, and where to go on from."""

    state: ProjectionState
    status: ProjectorStatus
    """The status record restored from (`last_seq`: the state's position)."""
    deferred: Deferred
    lazy: Lazy
    """Host records restored when first needed (see `projections.checkpoint.Lazy`)."""
    records: int
    """Records restored (host and cluster)."""


class NotRestorable(Exception):
    """Why the projector rebuilds from CRR_EVENTS instead (`str(exc)`)."""


def catalog_digest(data: bytes) -> str:
    """What a status's `catalog_digest` says of the catalog record's bytes."""
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


def mine(subject: str, partition: int | None, partitions: int | None) -> bool:
    """Whether a CRR_SNAPSHOT host/cluster record is this projector's to restore."""
    if not (subject.startswith(SNAPSHOT_HOST_PREFIX) or subject == SNAPSHOT_CLUSTER):
        return False
    return partition is None or owner(subject, partitions or 1) == partition


async def _catalog(js: JetStreamContext, raw: RawRecords, status: ProjectorStatus) -> Catalog:
    """The catalog the records were folded with: the catalog record if it is that one
    (its digest), else the catalog event at `catalog_seq` if CRR_EVENTS still holds it."""
    record = raw.get(SNAPSHOT_CATALOG)
    data: bytes | None = None
    if record is not None and catalog_digest(record[1]) == status.catalog_digest:
        data = record[1]
    else:
        try:
            with nats_errors():
                msg = await js.get_msg(EVENTS_STREAM, seq=status.catalog_seq)
        except BusError as exc:
            raise NotRestorable(f"the catalog the records were folded with (seq "
                                f"{status.catalog_seq}) is no longer stored ({exc!r})") from None
        if msg.subject != CATALOG or msg.data is None:
            raise NotRestorable(f"{EVENTS_STREAM} seq {status.catalog_seq} is not the catalog "
                                "event the records were folded with") from None
        data = msg.data
    try:
        return catalog_from_wire(msgspec.json.decode(data))
    except (msgspec.DecodeError, CatalogError) as exc:
        raise NotRestorable(f"the catalog the records were folded with does not load: "
                            f"{exc}") from None


async def restore_from(js: JetStreamContext, raw: RawRecords, *, partition: int | None,
                       partitions: int | None, events_first: int,
                       events_last: int) -> Restored:
    """This projector's fold state from CRR_SNAPSHOT (`raw`), or NotRestorable (why not).

    `events_first`/`events_last`: CRR_EVENTS's first and last sequence now."""
    subject = status_subject(partition)
    entry = raw.get(subject)
    if entry is None or not entry[1]:
        raise NotRestorable(f"{subject} is not in CRR_SNAPSHOT (first start, or the stream "
                            "was deleted)")
    try:
        status = _status.decode(entry[1])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise NotRestorable(f"{subject} does not decode: {exc}") from None
    if status.partitions != partitions:
        raise NotRestorable(f"the snapshot was written by {status.partitions or 1} projector "
                            f"partition(s), this projector is one of {partitions or 1}")
    if status.checkpoint not in (1, CHECKPOINT_FORMAT):
        raise NotRestorable(f"the snapshot's checkpoint format is {status.checkpoint} (an "
                            f"older projector), not {CHECKPOINT_FORMAT}")
    if status.catalog_seq == 0:
        raise NotRestorable("the snapshot was written before any catalog")
    seq = status.last_seq
    if seq > events_last:
        raise NotRestorable(f"the snapshot is at seq {seq}, past the end of {EVENTS_STREAM} "
                            f"({events_last}): the events stream went backwards")
    if events_first > seq + 1 and events_last >= events_first:
        raise NotRestorable(f"events after the snapshot's seq {seq} are no longer stored "
                            f"({EVENTS_STREAM} starts at {events_first})")
    catalog = await _catalog(js, raw, status)
    cluster = raw.get(SNAPSHOT_CLUSTER) if mine(SNAPSHOT_CLUSTER, partition, partitions) else None
    lazy = Lazy(upto=seq)
    later: list[Restorable] = []
    unread: list[tuple[str, bytes]] = []
    subj = SNAPSHOT_CLUSTER
    # Format 2: the status bounds every record's first deadline, so a record the status
    # covers is not read now (`Lazy`); one past it (a flush cut short) is read in full.
    bound = (None if status.checkpoint < 2 else
             math.inf if status.next_due_ts is None else status.next_due_ts)
    try:
        state = restore(catalog, status.catalog_seq, seq,
                        [decode_record(cluster[1])] if cluster and cluster[1] else [])
        everyone = partition is None  # (then every host record is this projector's)
        keep = unread.append
        for subj, (_, data) in raw.items():
            if not data or not subj.startswith(SNAPSHOT_HOST_PREFIX) or not (
                    everyone or mine(subj, partition, partitions)):
                continue  # (the cluster's record is restored above)
            if bound is not None and _as_of_seq(subj, data) <= seq:
                keep((snapshot_host(subj), data))
                continue
            host, as_of, due = earliest_due(state, data)
            if host is None:
                raise NotRestorable(f"record {subj} is not a host record")
            if as_of > seq:  # written after the status: placed as the fold passes it
                snap = decode_record(data)
                record_of(snap)  # refused now, not half-way
                later.append((host, snap))
            else:
                lazy.add(host, data, due)
        if bound is not None:
            lazy.add_bounded(unread, bound)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise NotRestorable(f"record {subj} does not decode: {exc}") from None
    except (CheckpointError, SubjectError) as exc:
        raise NotRestorable(f"record {subj} cannot be restored from: {exc.message}") from None
    return Restored(state=state, status=status, deferred=Deferred(later), lazy=lazy,
                    records=len(lazy) + len(later) + (1 if cluster else 0))
