"""A whole-cluster door (as `crr bridge slurm` runs it) over the real scheduler view.

Given a projector, a catalog with exports and reports for several hosts, when
the engine follows a `ViewSource` into a door holding node facts in memory, then
every node's features and drain follow the reports, and a forgotten value
going stale takes its feature away by expiry.
"""

from __future__ import annotations

import asyncio
import io

from nats.aio.client import Client

from crr.bridges.engine import Engine
from crr.bridges.run import HostBridgeOptions, run_cluster_bridge
from crr.bridges.view_source import ViewSource
from crr.schemas.codec import decode
from crr.schemas.snapshot import ClusterSnapshot
from crr.schemas.subjects import SNAPSHOT_CLUSTER
from crr.view.scheduler_view import SchedulerView
from tests.bridges.test_bridge_cli import CATALOG
from tests.bridges.test_bridge_engine import MemoryDoor
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, publish_report, running_projector


async def test_view_source_drives_a_whole_cluster_door(nc: Client) -> None:
    """Three hosts: features and drains as reported; a blinking value's feature expires."""
    async with running_projector(nc) as projector:
        seq = await publish_catalog(nc, CATALOG)
        await publish_report(nc, "ext", "n1", {"scratch_free": 900.0, "fs_healthy": True})
        await publish_report(nc, "ext", "n2", {"scratch_free": 10.0, "fs_healthy": False})
        last = await publish_report(nc, "blinker", "n3", {"blink": 1.0})
        await projector.wait_until(max(seq, last), 10)
        view = SchedulerView(nc)
        await view.start()
        await view.wait_ready()
        source = ViewSource(view)
        door = MemoryDoor(nodes={n: (frozenset(), None) for n in ("n1", "n2", "n3")})
        engine = Engine(door)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(source, stop))
        try:
            await eventually(lambda: door.nodes["n1"][0] == {"big_scratch"}, 10, "n1 features")
            assert door.nodes["n2"] == (frozenset(), "scratch file system unhealthy")
            # n3's blink (1 s, no grace) goes stale by itself: its feature goes by expiry.
            await eventually(lambda: "blinking" not in door.nodes["n3"][0]
                             and engine.stats.applied >= 3, 10, "n3 feature expired")
            await publish_report(nc, "ext", "n2", {"fs_healthy": True}, seq=2)
            await eventually(lambda: door.nodes["n2"][1] is None, 10, "n2 resumed")
        finally:
            stop.set()
            await asyncio.wait_for(task, 2)
            source.close()
            await view.stop()


async def test_run_cluster_bridge_once_and_health(nc: Client) -> None:
    """`run_cluster_bridge --once` applies every node's want and says its health on the
    cluster subject (reporter bridge-memory in the cluster record)."""
    async with running_projector(nc) as projector:
        await publish_catalog(nc, CATALOG)
        last = await publish_report(nc, "ext", "n1", {"scratch_free": 900.0, "fs_healthy": True})
        await projector.wait_until(last, 10)
        door = MemoryDoor(nodes={"n1": (frozenset(), None)})
        code = await run_cluster_bridge(nc, lambda _s: door, HostBridgeOptions(host=None,
                                                                                once=True),
                                        asyncio.Event(), io.StringIO())
        assert code == 0
        assert door.nodes["n1"] == (frozenset({"big_scratch"}), None)

        async def health() -> bool:
            msg = await nc.jetstream().get_last_msg("CRR_SNAPSHOT", SNAPSHOT_CLUSTER)
            cluster = decode(msg.data or b"", ClusterSnapshot)
            status = cluster.reporters.get("bridge-memory")
            return status is not None and status.health == "ok"

        await eventually(health, 10, "bridge-memory health in the cluster record")
