"""Partitioned projectors: a stream subject transform splits hosts, readers see one snapshot."""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.streams import StreamSettings, provision
from crr.history.replay import read_consistent_cut
from crr.schemas.codec import encode
from crr.schemas.errors import CrrTimeoutError
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import (
    EVENTS_STREAM,
    SNAPSHOT_PROJECTOR,
    host_snapshot_subject,
    is_projector_status,
)
from crr.view.scheduler_view import SchedulerView, loaded_view
from crr.view.snapshot_reader import read_snapshot
from tests.history.test_replay import cli
from tests.support.faults import eventually, projector_status, stored_events
from tests.support.projector import (
    publish_catalog,
    publish_report,
    running_partitions,
    stored_host,
)

HOSTS = [f"node{i}.dc{i % 3}" for i in range(24)]


async def test_two_partitions_one_snapshot(nats_url: str) -> None:
    """Two partition projectors fold disjoint host sets (the server's partition(2, host));
    partition 0 owns catalog and cluster; readers see every host in one CRR_SNAPSHOT."""
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2))
        async with running_partitions(nc, 2) as projectors:
            await publish_catalog(nc)
            for i, host in enumerate(HOSTS):
                await publish_report(nc, "scratch", host, {"scratch_free": float(i)})
            await publish_report(nc, "flexlm", None, {"matlab_free": 9.0})

            async def complete() -> object:
                snap = await read_snapshot(nc)
                ok = (len(snap.hosts) == len(HOSTS) and snap.cluster is not None
                      and "matlab_free" in snap.cluster.values)
                return snap if ok else None

            snap = await eventually(complete, 20, "both partitions written")
            statuses = [await projector_status(nc, f"{SNAPSHOT_PROJECTOR}.{k}") for k in (0, 1)]
        events = await stored_events(nc)
    for i, host in enumerate(HOSTS):
        assert snap.hosts[host].values["scratch_free"].value == float(i)
    assert snap.catalog is not None
    owned = [set(p.state.hosts) for p in projectors]
    assert owned[0], "partition 0 should get hosts"
    assert owned[1], "partition 1 should get hosts"
    assert owned[0].isdisjoint(owned[1])
    assert owned[0] | owned[1] == set(HOSTS)
    assert projectors[1].state.cluster.reporters == {}  # cluster subjects go to partition 0
    # The split is the server's: each stored host event's trailing token names its owner.
    for m in events:
        if m.subject.startswith("crr.v1.report.host."):
            k = int(m.subject.rsplit(".", 1)[1])
            assert any(h for h in owned[k] if m.subject.split(".")[4] in (h, h.replace(".", "=2E")))
    assert [s.partition for s in statuses] == [0, 1]


async def test_view_waits_on_every_partition(nats_url: str) -> None:
    """A view's `wait_until(<last CRR_EVENTS seq>)` returns once both partitions cover it
    (each partition's `covered_seq` spans the other's events), and the view then holds
    every host's latest value; `view.projectors` lists both partitions' statuses."""
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2))
        async with running_partitions(nc, 2) as projectors, loaded_view(nc, 10) as view:
            await publish_catalog(nc)
            for rnd in (1, 2):  # the second round is what the view must end with
                for i, host in enumerate(HOSTS):
                    await publish_report(nc, "scratch", host,
                                         {"scratch_free": float(100 * rnd + i)}, seq=rnd)
            last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
            await view.wait_until(last, 20)
            values = {h: view.table.get(h) for h in HOSTS}
            statuses = view.projectors
            position = view.projector_position
    owned = [set(p.state.hosts) for p in projectors]
    assert owned[0], "partition 0 should get hosts"
    assert owned[1], "partition 1 should get hosts"
    for i, host in enumerate(HOSTS):
        snap = values[host]
        assert snap is not None, host
        assert snap.values["scratch_free"].value == float(200 + i), host
    assert position >= last
    assert [(s.partition, s.partitions) for s in statuses] == [(0, 2), (1, 2)]
    assert [s.projector_id for s in statuses] == ["p0", "p1"]


def _status(seq: int, partition: int | None = None) -> ProjectorStatus:
    """A status record covering `seq`, as partition `partition` of 2 (None: one projector)."""
    return ProjectorStatus(last_seq=seq, stream_last_seq=seq, lag=0, covered_seq=seq,
                           last_tick="2027-01-15T08:00:00.000Z",
                           started_at="2027-01-15T07:00:00.000Z", partition=partition,
                           partitions=None if partition is None else 2)


async def test_consistent_cut_of_one_projector_or_a_layout(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`read_consistent_cut` gives the current layout's statuses: the partitions' (the
    newest; an older unpartitioned one left behind is not among them); back on one
    projector, only its status, and the partitions' left-over records are neither its
    status nor compared."""
    js = nc.jetstream()
    await js.publish(SNAPSHOT_PROJECTOR, encode(_status(0)))
    for k in (0, 1):
        await js.publish(f"{SNAPSHOT_PROJECTOR}.{k}", encode(_status(0, k)))
    statuses, _ = await read_consistent_cut(nc)
    assert [s.partition for s in statuses] == [0, 1]
    one = _status(0)
    await js.publish(SNAPSHOT_PROJECTOR, encode(one))
    statuses, records = await read_consistent_cut(nc)
    assert statuses == [one]
    assert not any(is_projector_status(s) for s in records)


async def test_verify_each_partition(nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr replay --verify` on two partitions replays each one's own input (its hosts, the
    catalog, partition 0 the cluster) and finds every record byte-identical; a record
    tampered with in CRR_SNAPSHOT is reported under the partition that owns it, exit 1."""
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2))
        async with running_partitions(nc, 2) as projectors, loaded_view(nc, 10) as view:
            await publish_catalog(nc)
            for i, host in enumerate(HOSTS):
                await publish_report(nc, "scratch", host, {"scratch_free": float(i)})
            last = await publish_report(nc, "flexlm", None, {"matlab_free": 9.0})
            await view.wait_until(last, 20)
            code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
            assert code == 0, out + err
            lines = out.splitlines()
            assert [ln.split(" at seq")[0] for ln in lines] == [
                f"verified: {len(projectors[0].state.hosts) + 2} record(s) byte-identical",
                f"verified: {len(projectors[1].state.hosts)} record(s) byte-identical"]
            assert "(partition 0 of 2 p0" in lines[0]
            assert "(partition 1 of 2 p1" in lines[1]
            victim = sorted(projectors[1].state.hosts)[0]
            _, snap = await stored_host(nc, victim)
            forged = msgspec.structs.replace(snap, values={})
            await nc.jetstream().publish(host_snapshot_subject(victim), encode(forged))
            code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 1, out + err
    assert f"{host_snapshot_subject(victim)}:" in out
    assert "partition 1 of 2" in out.split("replay differs")[1].splitlines()[0]


async def test_view_follows_the_status_layout(nc: Client) -> None:
    """The view's position is the current layout's minimum `covered_seq`: loaded with an old
    unpartitioned record behind two partitions', then live: a partition moves on, one is
    deleted (the position does not go back), one projector takes over again."""
    js = nc.jetstream()
    await js.publish(SNAPSHOT_PROJECTOR, encode(_status(5)))
    p0, p1 = _status(10, 0), _status(12, 1)
    await js.publish(f"{SNAPSHOT_PROJECTOR}.0", encode(p0))
    await js.publish(f"{SNAPSHOT_PROJECTOR}.1", encode(p1))
    view = SchedulerView(nc)
    await view.start()
    try:
        await view.wait_ready(10)
        assert (view.projectors, view.projector, view.projector_position) == ([p0, p1], p1, 10)

        async def live(subject: str, data: bytes) -> None:
            seq = (await js.publish(subject, data)).seq
            await eventually(lambda: view.position >= seq, 10, f"view at {seq}")

        p0 = _status(20, 0)
        await live(f"{SNAPSHOT_PROJECTOR}.0", encode(p0))
        assert (view.projectors, view.projector_position) == ([p0, p1], 12)
        await live(f"{SNAPSHOT_PROJECTOR}.1", b"")  # a delete marker
        assert (view.projectors, view.projector, view.projector_position) == ([p0], p0, 12)
        one = _status(30)
        await live(SNAPSHOT_PROJECTOR, encode(one))
        assert (view.projectors, view.projector, view.projector_position) == ([one], one, 30)
        await view.wait_until(30, 1)
        with pytest.raises(CrrTimeoutError):
            await view.wait_until(31, 0.2)
    finally:
        await view.stop()
