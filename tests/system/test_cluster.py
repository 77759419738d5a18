"""3-node JetStream cluster, streams at R3: kill a node / the stream leader under load.

Slow (about 30-60 s): `pytest -m slow tests/system/test_cluster.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.outbox import Outbox
from crr.bus.streams import StreamSettings, provision
from crr.producers.simulator import SimulatedHost, publish_round, simulated_hosts
from crr.projector.service import Projector
from crr.schemas.subjects import EVENTS_STREAM
from crr.schemas.wire_time import format_time
from tests.support.cluster import NatsCluster, all_replicas_current
from tests.support.faults import caught_up, eventually, stored_events
from tests.support.projector import FAST_CATALOG, publish_catalog
from tests.system.test_faults import REPORTERS, assert_no_duplicate_events

pytestmark = pytest.mark.slow

R3 = StreamSettings(replicas=3)


async def events_leader(cluster: NatsCluster, nc: Client) -> int:
    """Index of the node leading CRR_EVENTS."""
    info = await nc.jetstream().stream_info(EVENTS_STREAM)
    assert info.cluster is not None
    assert info.cluster.leader is not None
    return cluster.index(info.cluster.leader)


async def load_through(cluster: NatsCluster, nc: Client, kill: int | None,
                       hosts: list[SimulatedHost]) -> tuple[int, int]:
    """Publish rounds from a simulated fleet; SIGKILL node `kill` mid-way, restart it later.

    Returns (killed node index, the CRR_EVENTS leader index before the kill)."""
    leader = await events_leader(cluster, nc)
    victim = leader if kill is None else kill
    async with connect(cluster.url, name="sim-publisher") as pub:
        outbox = Outbox(pub, ack_timeout=2.0)
        await outbox.start()
        for rnd in range(40):
            publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
            if rnd == 10:
                cluster.nodes[victim].kill()
            if rnd == 30:
                cluster.nodes[victim].start()
            await asyncio.sleep(0.05)  # pacing of the simulated load, not synchronisation
        await outbox.flush(60)
        await outbox.close()
    return victim, leader


@pytest.mark.parametrize("target", ["follower", "leader"])
async def test_cluster_node_killed_under_load(tmp_path: Path, target: str) -> None:
    """Kill a follower node, or the CRR_EVENTS stream leader, under load and restart it:
    clients fail over, nothing is lost or stored twice, the node catches up."""
    with NatsCluster(tmp_path) as cluster:
        async with connect(cluster.url, name="crr-test", attempts=None) as nc:
            await eventually(lambda: provision(nc, R3), 30, "R3 streams provisioned", every=0.5)
            stop = asyncio.Event()
            projector = Projector(nc, settings=R3, status_interval=0.5)
            task = asyncio.create_task(projector.run(stop))
            try:
                await asyncio.wait_for(projector.ready.wait(), 30)
                await publish_catalog(nc)
                hosts = simulated_hosts([f"sim{i:03d}" for i in range(50)], seed=11)
                leader = await events_leader(cluster, nc)
                kill = None if target == "leader" else (leader + 1) % 3
                victim, was_leader = await load_through(cluster, nc, kill, hosts)
                assert (victim == was_leader) == (target == "leader")
                snap = await caught_up(nc, 60)
                await eventually(lambda: all_replicas_current(nc), 60, "replicas caught up",
                                 every=0.5)
            finally:
                stop.set()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(task, 15)
            for h in hosts:
                got = snap.hosts[h.host].values
                assert got["scratch_free"].value == h.state["scratch_free"], h.host
                assert got["datasets"].value == h.state["datasets"], h.host
            assert_no_duplicate_events(await stored_events(nc))
