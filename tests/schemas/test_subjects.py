"""crr.schemas.subjects and codec.event_message: every subject crr builds or parses, and the
one form an event is published in (pure: no server)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crr.schemas.codec import decode, encode, event_message
from crr.schemas.errors import SubjectError
from crr.schemas.events import Health, Inventory, Pool, Report
from crr.schemas.subjects import (
    LEASE,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_PROJECTOR,
    STATUS_PARTITIONS,
    EventType,
    cluster_event_filter,
    destination_partitions,
    event_subject,
    host_event_filter,
    host_history_filter,
    host_snapshot_subject,
    lease_subject,
    msg_id,
    parse_event_subject,
    partition_destination,
    partition_event_filter,
    published_subject,
    snapshot_host,
    snapshot_kind,
    status_partition,
    status_subject,
    subject_template,
)

_NAMES = st.text(min_size=1, max_size=12)


@pytest.mark.parametrize("partition", [None, 0, 7, 12])
def test_status_subject_round_trip(partition: int | None) -> None:
    """The status subject a projector writes parses back to its partition."""
    subject = status_subject(partition)
    assert subject == (SNAPSHOT_PROJECTOR if partition is None
                       else f"crr.v1.snapshot.projector.{partition}")
    assert status_partition(subject) == partition


def test_status_partition_refuses_other_subjects() -> None:
    """A subject that is not a status record is an error, not partition None."""
    for subject in ("crr.v1.snapshot.projectorx", "crr.v1.snapshot.projector.a",
                    host_snapshot_subject("n1")):
        with pytest.raises(SubjectError):
            status_partition(subject)


def test_filters_spell_the_design_subjects() -> None:
    """The filters (permissions, consumers) are exactly the subjects docs/contract.md, "Subjects
    and streams" names."""
    assert host_event_filter() == "crr.v1.*.host.*.*"
    assert host_event_filter("report", "node1.dc2") == "crr.v1.report.host.node1=2Edc2.*"
    assert host_event_filter("health", reporter="dsindex") == "crr.v1.health.host.*.dsindex"
    assert host_event_filter(host="n1", reporter="r") == "crr.v1.*.host.n1.r"
    assert cluster_event_filter() == "crr.v1.*.cluster.*"
    assert cluster_event_filter("inventory", "flexlm") == "crr.v1.inventory.cluster.flexlm"
    assert host_history_filter("a.b") == "crr.v1.*.host.a=2Eb.>"
    assert partition_event_filter(3) == "crr.v1.*.host.*.*.3"
    assert STATUS_PARTITIONS == "crr.v1.snapshot.projector.*"
    assert lease_subject() == LEASE == "crr.v1.snapshot.lease"
    assert lease_subject(2) == "crr.v1.snapshot.lease.2"


def test_partition_transform_destination() -> None:
    """The stream transform's destination, and N read back from it."""
    dest = partition_destination(4)
    assert dest == ("crr.v1.{{wildcard(1)}}.host.{{wildcard(2)}}.{{wildcard(3)}}"
                    ".{{partition(4,2)}}")
    assert destination_partitions(dest) == 4
    assert destination_partitions("crr.v1.>") == 1


def test_published_subject_drops_only_a_partition_token() -> None:
    """A stored host event loses its partition token; nothing else is touched."""
    published = event_subject("report", "scratch", "n1")
    assert published_subject(published + ".3") == published
    assert published_subject(published) == published
    cluster = event_subject("report", "flexlm", None)
    assert published_subject(cluster) == cluster
    odd = "crr.v1.report.cluster.a.b.7"  # six dots, but no host event
    assert published_subject(odd) == odd
    assert parse_event_subject(published + ".3") == ("report", "scratch", "n1")


def test_snapshot_host() -> None:
    """A host record's subject gives its host back; other subjects are refused."""
    assert snapshot_host(host_snapshot_subject("node1.dc2")) == "node1.dc2"
    with pytest.raises(SubjectError):
        snapshot_host("crr.v1.snapshot.cluster")


@pytest.mark.parametrize(("subject", "kind"), [
    (host_snapshot_subject("node1.dc2"), "host"),
    (SNAPSHOT_CLUSTER, "cluster"),
    (SNAPSHOT_CATALOG, "catalog"),
    (status_subject(None), "projector"),
    (status_subject(3), "projector"),
    (LEASE, None),
    (lease_subject(2), None),
    (SNAPSHOT_PROJECTOR + ".x", None),
    ("crr.v1.snapshot.other", None),
])
def test_snapshot_kind(subject: str, kind: str | None) -> None:
    """Every CRR_SNAPSHOT subject routes to its record kind; the lease and unknown
    subjects to none."""
    assert snapshot_kind(subject) == kind


def test_subject_template() -> None:
    """Span names hide hosts and reporters, and keep everything else."""
    assert subject_template("crr.v1.report.host.n=2E1.scratch") == \
        "crr.v1.report.host.{host}.{reporter}"
    assert subject_template(host_snapshot_subject("n1")) == "crr.v1.snapshot.host.{host}"
    assert subject_template("crr.v1.catalog") == "crr.v1.catalog"


@given(_NAMES, st.one_of(st.none(), _NAMES), st.integers(min_value=0, max_value=2**53))
def test_event_message_is_subject_bytes_and_id_of_the_event(
        reporter: str, host: str | None, seq: int) -> None:
    """Report, Inventory and Health publish on their own kind's subject, as their canonical
    bytes, with the `Nats-Msg-Id` of docs/contract.md, "Subjects and streams"; the bytes decode
    back to the event."""
    at = "2026-12-02T14:00:00.123Z"
    events: list[tuple[EventType, Report | Inventory | Health]] = [
        ("report", Report(reporter=reporter, host=host, boot="b1", seq=seq, observed_at=at,
                          values={"x": 1})),
        ("inventory", Inventory(reporter=reporter, host=host, boot="b1", seq=seq,
                                observed_at=at, pool=Pool(name="p", generation=1),
                                devices=[])),
        ("health", Health(reporter=reporter, host=host, boot="b1", seq=seq, at=at,
                          state="ok")),
    ]
    for kind, event in events:
        msg = event_message(event)
        assert msg.subject == event_subject(kind, reporter, host)
        assert msg.payload == encode(event)
        assert decode(msg.payload, type(event)) == event
        assert msg.msg_id == msg_id(reporter, host, "b1", seq)
        assert msg.msg_id == f"{reporter}/{'_cluster' if host is None else host}/b1/{seq}"
        assert msg.headers == {"Nats-Msg-Id": msg.msg_id}
