"""The projector's restart from its checkpoint (docs/contract.md, "Payloads": the snapshot is the
checkpoint).

Given what CRR_SNAPSHOT holds (`crr.projector.checkpoint_read.load_checkpoint`), decide
whether this projector (or partition) can restore its fold state from its own
records, and build that state (`crr.projections.checkpoint`).  It cannot — and
the caller rebuilds from the retained history, saying why — when there
is no status of this projector or of another layout, the status is of an older
writer or says its rebuild did not finish, a record does not decode or restore, the catalog
it was folded with is no longer to be found, or the snapshot is ahead of
CRR_EVENTS (the events stream went backwards) or its position aged out of it.

Another layout (`--partitions` changed: 1→N, N→1, N→M) restores too
(`_restore_other_layout`): each new partition takes the host records it now
owns, whichever old partition wrote them, and folds CRR_EVENTS from the
oldest position those records need — the old partition's status where it is
still stored and agrees with the others, else the records' own `as_of`.

The restored state is the fold at the status's `last_seq`; the caller folds
CRR_EVENTS from the next sequence, placing the records written after the
status (`crr.projections.checkpoint.Deferred`) as the fold passes them.  The
records written before the status wait in `crr.projections.checkpoint.Lazy`
until first needed; with a status of checkpoint format 2 they are not even
read at start (the status's `next_due_ts` bounds their first deadlines), so
a restart costs little more than reading CRR_SNAPSHOT.  Such a record is
fully checked when it is placed; one that does not restore then makes the
projector rebuild from CRR_EVENTS (logged, and said in its status).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import msgspec

from crr.bus import jetstream
from crr.bus.jetstream import JetStream
from crr.projections.checkpoint import (
    CheckpointError,
    Deferred,
    Lazy,
    Restorable,
    decode_record,
    earliest_due,
    record_of,
    restore,
)
from crr.projections.state import ProjectionState
from crr.projector.checkpoint_read import RawRecords
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import catalog_from_wire
from crr.schemas.codec import DECODERS
from crr.schemas.errors import BusError, CatalogError, SubjectError
from crr.schemas.snapshot import CHECKPOINT_FORMAT, ProjectorStatus
from crr.schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    owner,
    snapshot_host,
    snapshot_kind,
    status_partition,
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
    """Host records restored when first needed (see `crr.projections.checkpoint.Lazy`)."""
    records: int
    """Records restored (host and cluster)."""
    note: str = ""
    """What the start note adds (another layout restored from: which, and from where)."""
    other_layout: bool = False
    """Restored from another layout's records: the events after `status.last_seq` may be
    stored under that layout's subjects (the caller reads every subject up to the end)."""


class NotRestorable(Exception):
    """Why the projector rebuilds from CRR_EVENTS instead (`str(exc)`)."""


def catalog_digest(data: bytes) -> str:
    """What a status's `catalog_digest` says of the catalog record's bytes."""
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


def mine(subject: str, partition: int | None, partitions: int | None) -> bool:
    """Whether a CRR_SNAPSHOT host/cluster record is this projector's to restore."""
    if snapshot_kind(subject) not in ("host", "cluster"):
        return False
    return partition is None or owner(subject, partitions or 1) == partition


async def _catalog(js: JetStream, raw: RawRecords, status: ProjectorStatus) -> Catalog:
    """The catalog the records were folded with: the catalog record if it is that one
    (its digest), else the catalog event at `catalog_seq` if CRR_EVENTS still holds it."""
    record = raw.get(SNAPSHOT_CATALOG)
    data: bytes | None = None
    if record is not None and catalog_digest(record[1]) == status.catalog_digest:
        data = record[1]
    else:
        try:
            msg = await jetstream.get(js, EVENTS_STREAM, status.catalog_seq)
        except BusError as exc:
            raise NotRestorable(f"the catalog the records were folded with (seq "
                                f"{status.catalog_seq}) is no longer stored ({exc!r})") from None
        if msg.subject != CATALOG or not msg.data:
            raise NotRestorable(f"{EVENTS_STREAM} seq {status.catalog_seq} is not the catalog "
                                "event the records were folded with") from None
        data = msg.data
    try:
        return catalog_from_wire(msgspec.json.decode(data))
    except (msgspec.DecodeError, CatalogError) as exc:
        raise NotRestorable(f"the catalog the records were folded with does not load: "
                            f"{exc}") from None


def _statuses(raw: RawRecords) -> dict[str, ProjectorStatus | str]:
    """Every status record in `raw`: subject -> the status, or why it does not decode."""
    out: dict[str, ProjectorStatus | str] = {}
    for subject, (_, data) in raw.items():
        if not data or snapshot_kind(subject) != "projector":
            continue
        try:
            out[subject] = _status.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            out[subject] = f"{subject} does not decode: {exc}"
    return out


def _unusable(subject: str, status: ProjectorStatus) -> str | None:
    """Why `status` cannot be restored from (None: it can, as far as it alone says)."""
    if status_partition(subject) != status.partition or (
            (status.partition is None) != (status.partitions is None)):
        return (f"{subject} says it is partition {status.partition} of "
                f"{status.partitions}: not a status that subject holds")
    if status.phase == "rebuilding":
        return (f"{subject} says a rebuild was under way and did not finish (stopped or "
                "killed): rebuilding again")
    if status.checkpoint not in (1, CHECKPOINT_FORMAT):
        return (f"the snapshot's checkpoint format is {status.checkpoint} (an older "
                f"projector), not {CHECKPOINT_FORMAT}")
    if status.catalog_seq == 0:
        return "the snapshot was written before any catalog"
    return None


def _position_check(seq: int, events_first: int, events_last: int) -> None:
    """NotRestorable unless CRR_EVENTS still holds every event after `seq`."""
    if seq > events_last:
        raise NotRestorable(f"the snapshot is at seq {seq}, past the end of {EVENTS_STREAM} "
                            f"({events_last}): the events stream went backwards")
    if events_first > seq + 1 and events_last >= events_first:
        raise NotRestorable(f"events after the snapshot's seq {seq} are no longer stored "
                            f"({EVENTS_STREAM} starts at {events_first})")


async def restore_from(js: JetStream, raw: RawRecords, *, partition: int | None,
                       partitions: int | None, events_first: int,
                       events_last: int) -> Restored:
    """This projector's fold state from CRR_SNAPSHOT (`raw`), or NotRestorable (why not).

    `events_first`/`events_last`: CRR_EVENTS's first and last sequence now."""
    subject = status_subject(partition)
    statuses = _statuses(raw)
    found = statuses.get(subject)
    if isinstance(found, str):
        raise NotRestorable(found)
    newer = found is not None and any(  # a later layout wrote after this status (N→M→N)
        isinstance(st, ProjectorStatus) and st.partitions != partitions
        and st.last_seq > found.last_seq for st in statuses.values())
    if found is None or found.partitions != partitions or newer:
        return await _restore_other_layout(js, raw, partition=partition, partitions=partitions,
                                           events_first=events_first, events_last=events_last)
    status = found
    why = _unusable(subject, status)
    if why is not None:
        raise NotRestorable(why)
    seq = status.last_seq
    _position_check(seq, events_first, events_last)
    catalog = await _catalog(js, raw, status)
    # Format 2: the status bounds every record's first deadline, so a record the status
    # covers is not read now (`Lazy`); one past it (a flush cut short) is read in full.
    bound = (None if status.checkpoint < 2 else
             math.inf if status.next_due_ts is None else status.next_due_ts)
    return _build(raw, status, catalog, seq, partition=partition, partitions=partitions,
                  bound=bound)


async def _restore_other_layout(js: JetStream, raw: RawRecords, *, partition: int | None,
                                partitions: int | None, events_first: int,
                                events_last: int) -> Restored:
    """Restore after `--partitions` changed: from the host records of the old layout.

    The old layout is that of the newest status of another layout.  A record written by
    old partition `j` reflects every event of its host up to `max(as_of, j's last_seq)`
    (a record is stamped by every event that changes it; the status follows the records
    it covers), so folding from `m` = the least such position over the old partitions is
    exact: a record with `as_of <= m` is the state at `m`, a later one is placed when the
    fold passes its `as_of` (`Deferred`, replacing what the events up to there rebuilt).
    An old partition whose status is gone (a new partition of the same number already
    overwrote it) or unusable bounds `m` by the oldest `as_of` of its records instead."""
    mine_subject = status_subject(partition)
    statuses = _statuses(raw)
    other = [(subj, st) for subj, st in statuses.items()
             if isinstance(st, ProjectorStatus) and st.partitions != partitions]
    if not other:
        raise NotRestorable(f"{mine_subject} is not in CRR_SNAPSHOT (first start, or the "
                            "stream was deleted)")
    newest = max(other, key=lambda e: e[1].last_seq)[1]
    old_n = newest.partitions
    layout = [(subj, st) for subj, st in other if st.partitions == old_n]
    known: dict[int | None, ProjectorStatus] = {}
    skipped: list[str] = []
    for subj, st in layout:
        why = _unusable(subj, st)
        if why is None:
            known[st.partition] = st
        else:
            skipped.append(why)
    layout_note = (f"the snapshot was written by {old_n or 1} projector partition(s), this "
                   f"projector is one of {partitions or 1}")
    if not known:
        raise NotRestorable(f"{layout_note}, and no status of that layout restores: "
                            f"{'; '.join(skipped)}")
    base = known[min(known, key=lambda k: -1 if k is None else k)]
    if len({st.catalog_digest for st in known.values()}) > 1:
        raise NotRestorable(f"the old layout's {old_n or 1} partition(s) were folded with "
                            "different catalogs")

    def old_owner(subject: str) -> int | None:
        return None if old_n is None else owner(subject, old_n)

    olds: list[int | None] = [None] if old_n is None else list(range(old_n))
    floor: dict[int | None, int] = {}
    for subj, (_, data) in raw.items():
        if data and snapshot_kind(subj) == "host":
            j = old_owner(subj)
            if j not in known:
                as_of = _as_of_seq(subj, data)
                floor[j] = min(floor.get(j, as_of), as_of)
    positions: list[int] = []
    unknown: list[str] = []
    for j in olds:
        if j in known:
            positions.append(known[j].last_seq)
        elif j in floor:
            positions.append(floor[j])
            unknown.append("the unpartitioned projector" if j is None else f"partition {j}")
        else:
            which = "projector" if j is None else f"partition {j}"
            raise NotRestorable(f"{layout_note}, and its {which} left neither a usable "
                                "status nor records")
    seq = min(positions)
    _position_check(seq, events_first, events_last)
    catalog = await _catalog(js, raw, base)
    status = msgspec.structs.replace(
        base, last_seq=seq, covered_seq=seq, stream_last_seq=seq, applied=0, deadletters=0,
        partition=partition, partitions=partitions,
        start_seq=max(st.start_seq for st in known.values()))
    note = (f"; repartitioned from {old_n or 1} to {partitions or 1} partition(s): the old "
            f"layout's records, folding on from seq {seq}")
    if unknown:
        note += (f" ({', '.join(unknown)} of the old layout left no usable status: from its "
                 "records' own positions)")
    restored = _build(raw, status, catalog, seq, partition=partition, partitions=partitions,
                      bound=None, defer_cluster=True, note=note)
    return dataclasses.replace(restored, other_layout=True)


def _build(raw: RawRecords, status: ProjectorStatus, catalog: Catalog, seq: int, *,
           partition: int | None, partitions: int | None, bound: float | None,
           defer_cluster: bool = False, note: str = "") -> Restored:
    """The fold state at `seq` from the records of `raw` that are this projector's.

    `bound`: no record covered by `seq` has a deadline before it (records not read now);
    None: read each one's first deadline.  `defer_cluster`: the cluster record may be
    past `seq` too (another layout's), and is then placed as the fold passes it."""
    cluster = raw.get(SNAPSHOT_CLUSTER) if mine(SNAPSHOT_CLUSTER, partition, partitions) else None
    lazy = Lazy(upto=seq)
    later: list[Restorable] = []
    unread: list[tuple[str, bytes]] = []
    subj = SNAPSHOT_CLUSTER
    try:
        placed = []
        if cluster and cluster[1]:
            snap = decode_record(cluster[1])
            if defer_cluster and snap.as_of.seq > seq:
                record_of(snap)  # refused now, not half-way
                later.append((None, snap))
            else:
                placed.append(snap)
        state = restore(catalog, status.catalog_seq, seq, placed)
        everyone = partition is None  # (then every host record is this projector's)
        keep = unread.append
        for subj, (_, data) in raw.items():
            if not data or snapshot_kind(subj) != "host" or not (
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
                    records=len(lazy) + len(later) + (1 if cluster and cluster[1] else 0),
                    note=note)
