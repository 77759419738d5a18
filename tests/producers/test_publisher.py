"""ReporterPublisher: subjects, one seq counter across types, message ids, keep policies."""

from __future__ import annotations

from crr.producers.publisher import ReporterPublisher
from crr.schemas.codec import decode
from crr.schemas.events import Device, Health, Inventory, Pool, Report
from tests.support.agent import MemorySink


def test_host_events_share_one_sequence_and_msg_id_scheme() -> None:
    """Report, Inventory and Health of one boot are numbered 1, 2, 3 with distinct msg ids."""
    sink = MemorySink()
    pub = ReporterPublisher(sink, reporter="scratch", host="node1.dc2", boot="b7")
    pub.report({"scratch_free": 1.0}, 1_700_000_000.0)
    pub.inventory(Pool(name="node1/gpus", generation=1), [Device(name="gpu0")], 1_700_000_000.0)
    pub.health("failed", "exit 3: boom", 3)
    assert [(s, m, k) for s, _, m, k in sink.puts] == [
        ("crr.v1.report.host.node1=2Edc2.scratch", "scratch/node1.dc2/b7/1", "latest"),
        ("crr.v1.inventory.host.node1=2Edc2.scratch", "scratch/node1.dc2/b7/2", "latest"),
        ("crr.v1.health.host.node1=2Edc2.scratch", "scratch/node1.dc2/b7/3", "all"),
    ]
    report = decode(sink.puts[0][1], Report)
    assert report.observed_at == "2023-11-14T22:13:20.000Z"
    assert (report.host, report.boot, report.seq) == ("node1.dc2", "b7", 1)
    assert decode(sink.puts[1][1], Inventory).devices == [Device(name="gpu0")]
    health = decode(sink.puts[2][1], Health)
    assert (health.state, health.detail, health.exit_code, health.seq) == (
        "failed", "exit 3: boom", 3, 3)


def test_cluster_scope_when_host_is_none() -> None:
    """host=None publishes on cluster subjects with `_cluster` in the message id."""
    sink = MemorySink()
    ReporterPublisher(sink, reporter="flexlm", host=None, boot="b").report({"x": 1}, 0.0)
    subject, payload, mid, _ = sink.puts[0]
    assert subject == "crr.v1.report.cluster.flexlm"
    assert mid == "flexlm/_cluster/b/1"
    assert decode(payload, Report).host is None
