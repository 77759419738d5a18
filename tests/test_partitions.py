"""Partitioned projectors: a stream subject transform splits hosts, readers see one snapshot."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.client import Client

from bus.connection import connect
from bus.streams import StreamSettings, provision
from bus.subjects import SNAPSHOT_PROJECTOR
from ops.projector import Projector
from ops.snapshot_reader import read_snapshot
from tests.fault_support import eventually, projector_status, stored_events
from tests.projector_support import publish_catalog, publish_report

HOSTS = [f"node{i}.dc{i % 3}" for i in range(24)]


async def run_partitions(nc: Client, n: int) -> tuple[list[Projector], asyncio.Event,
                                                       list[asyncio.Task[None]]]:
    """Start `n` partition projectors in this process; each ready on return."""
    stop = asyncio.Event()
    projectors = [Projector(nc, status_interval=0.5, partition=k, projector_id=f"part{k}",
                            settings=StreamSettings(partitions=n)) for k in range(n)]
    tasks = [asyncio.create_task(p.run(stop)) for p in projectors]
    await asyncio.wait_for(asyncio.gather(*(p.ready.wait() for p in projectors)), 20)
    return projectors, stop, tasks


async def test_two_partitions_one_snapshot(nats_url: str) -> None:
    """Two partition projectors fold disjoint host sets (the server's partition(2, host));
    partition 0 owns catalog and cluster; readers see every host in one CRR_SNAPSHOT."""
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2))
        projectors, stop, tasks = await run_partitions(nc, 2)
        try:
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
        finally:
            stop.set()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(t, 10)
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
