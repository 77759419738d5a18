"""`crr.projector.restore.restore_from` on its own: CRR_SNAPSHOT's records, built in memory
from a fold, in; the restored state (or why not) out.

Given the records a projector would have written (its status, the catalog record, the
cluster and host records), when `restore_from` reads them, then the state it builds folds
on exactly as the original did; and each reason not to restore is said.  The catalog
record's digest matches the status, so the restore asks the server nothing; the
JetStream handle is a real connection's (the `nc` fixture) all the same.
"""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client

from crr.bus.jetstream import jetstream
from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire, fold, next_deadline
from crr.projections.record.snapshot import cluster_snapshot, host_snapshot
from crr.projections.state import ProjectionState
from crr.projector.checkpoint_read import RawRecords
from crr.projector.restore import NotRestorable, Restored, catalog_digest, restore_from
from crr.schemas.codec import encode
from crr.schemas.snapshot import CHECKPOINT_FORMAT, ProjectorStatus
from crr.schemas.subjects import (
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    host_snapshot_subject,
    status_subject,
)
from tests.projections.test_fold_properties import snapshot_bytes
from tests.support.fold import T0, catalog_env, report_env

SCRATCH = {"scratch_free": 1, "scratch_total": 2}


def _history() -> list[Envelope]:
    return [catalog_env(1, T0),
            report_env(2, T0 + 1, "scratch", "n1", SCRATCH),
            report_env(3, T0 + 2, "flexlm", None, {"matlab_free": 4}),
            report_env(4, T0 + 3, "site", "n2", {"site_ok": True})]


def _records(state: ProjectionState, **status: object) -> RawRecords:
    """What CRR_SNAPSHOT holds after `state` was flushed: (stream seq, bytes) per subject."""
    catalog = encode(state.catalog)
    fields: dict[str, object] = {
        "last_seq": state.seq, "stream_last_seq": state.seq, "lag": 0,
        "last_tick": "2027-01-15T08:00:05.000Z", "started_at": "2027-01-15T08:00:00.000Z",
        "checkpoint": CHECKPOINT_FORMAT, "catalog_seq": state.catalog_seq,
        "catalog_digest": catalog_digest(catalog), "next_due_ts": next_deadline(state),
        "covered_seq": state.seq}
    fields.update(status)
    raw: RawRecords = {SNAPSHOT_CATALOG: (1, catalog),
                       SNAPSHOT_CLUSTER: (2, encode(cluster_snapshot(state)))}
    for i, host in enumerate(sorted(state.hosts)):
        raw[host_snapshot_subject(host)] = (3 + i, encode(host_snapshot(state, host)))
    raw[status_subject(None)] = (99, encode(ProjectorStatus(**fields)))  # type: ignore[arg-type]
    return raw


async def _restore(nc: Client, raw: RawRecords, *, first: int = 1,
                   last: int = 4) -> Restored:
    return await restore_from(jetstream(nc), raw, partition=None, partitions=None,
                              events_first=first, events_last=last)


async def test_a_restored_state_folds_on_as_the_original(nc: Client) -> None:
    """Given the records of a fold at seq 4, when restored, then the state is at seq 4 with
    the host records waiting (not read: the status bounds their deadlines), and after
    placing them and folding the same next events, the bytes are the original's."""
    state = fold(_history())
    restored = await _restore(nc, _records(state))
    assert restored.state.seq == 4
    assert restored.records == 3  # two hosts and the cluster
    assert len(restored.lazy) == 2
    assert restored.state.hosts == {}  # placed when first needed
    assert len(restored.deferred) == 0
    again = restored.state
    restored.lazy.everything(again)
    more = [report_env(5, T0 + 10, "scratch", "n1", {"scratch_free": 3})]
    for env in more:
        apply(state, env)
        apply(again, env)
    expire(state, T0 + 60)
    expire(again, T0 + 60)
    assert snapshot_bytes(again) == snapshot_bytes(state)


async def test_a_record_written_after_the_status_waits_for_the_fold_to_pass_it(
        nc: Client) -> None:
    """Given a status at seq 3 and n1's record of seq 4 (a flush cut short before its
    status), when restored, then that record is deferred to seq 4, not lazy."""
    state = fold(_history())
    raw = _records(state, last_seq=3, covered_seq=3)
    restored = await _restore(nc, raw)
    assert restored.state.seq == 3
    assert restored.deferred.next_seq == 4
    assert len(restored.lazy) == 1  # n1 (as of seq 2); n2 (as of seq 4) is deferred
    assert restored.deferred.place_before(restored.state, 4) == []
    assert restored.deferred.place_before(restored.state, 5) == ["n2"]
    assert "n2" in restored.state.hosts


@pytest.mark.parametrize(("status", "first", "last", "says"), [
    ({"phase": "rebuilding"}, 1, 4, "a rebuild was under way"),
    ({"checkpoint": 0}, 1, 4, "checkpoint format is 0"),
    ({}, 1, 3, "past the end of CRR_EVENTS"),
    ({}, 6, 9, "no longer stored"),
])
async def test_each_reason_not_to_restore_is_said(
        nc: Client, status: dict[str, object], first: int, last: int, says: str) -> None:
    """A status that says a rebuild did not finish, a records format of an older writer,
    events behind the snapshot or aged out after it: NotRestorable, saying which."""
    raw = _records(fold(_history()), **status)
    with pytest.raises(NotRestorable, match=says):
        await _restore(nc, raw, first=first, last=last)


async def test_a_record_that_does_not_decode_is_refused_at_once(nc: Client) -> None:
    """A host record that is not a snapshot record: NotRestorable naming its subject."""
    raw = _records(fold(_history()))
    subject = host_snapshot_subject("n1")
    raw[subject] = (raw[subject][0], b'{"not": "a record"}')
    with pytest.raises(NotRestorable, match=f"record {subject} does not decode"):
        await _restore(nc, raw)


async def test_a_status_that_does_not_decode_is_said(nc: Client) -> None:
    """A status record that is not one: NotRestorable with the decode error."""
    raw = _records(fold(_history()))
    raw[status_subject(None)] = (99, msgspec.json.encode({"last_seq": "x"}))
    with pytest.raises(NotRestorable, match="does not decode"):
        await _restore(nc, raw)
