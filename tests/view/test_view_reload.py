"""The scheduler view after the server lost acknowledged records: it reloads, atomically."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.schemas.codec import encode
from crr.schemas.subjects import SNAPSHOT_CATALOG, SNAPSHOT_STREAM, host_snapshot_subject
from crr.view.scheduler_view import SchedulerView
from tests.support.select import CATALOG, host_snapshot

OLD = [f"old{i:02d}" for i in range(10)]
NEW = ["new0", "new1", "new2"]


async def fill(nc: Client, hosts: list[str]) -> int:
    """The catalog and one snapshot per host, written as the projector would; the last seq."""
    js = nc.jetstream()
    ack = await js.publish(SNAPSHOT_CATALOG, encode(CATALOG))
    for i, host in enumerate(hosts):
        ack = await js.publish(host_snapshot_subject(host),
                               encode(host_snapshot(host, {"free": float(i)})))
    return int(ack.seq)


@pytest.fixture
async def server_and_client(tmp_path: Path) -> AsyncIterator[
        tuple[NatsServer, Client]]:
    """A restartable server (same port and store) and a client that reconnects to it."""
    with NatsServer(tmp_path / "store") as server:
        async with connect(server.url, name="view-reload-test") as nc:
            await provision(nc)
            yield server, nc


async def test_reload_when_stream_went_backwards(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """After a reconnect to a CRR_SNAPSHOT whose last_seq is below the view's position (as
    after a crash that lost acked records), the view reloads into a fresh table and swaps
    it in: readers only ever see the old complete table or the new one, and ready stays."""
    server, nc = server_and_client
    await fill(nc, OLD)
    view = SchedulerView(nc, idle_heartbeat=0.5)
    seen: list[tuple[bool, list[str]]] = []
    swapped = asyncio.Event()

    def listener(_subject: str) -> None:
        seen.append((view.ready, view.table.hosts()))
        if view.table.hosts() == NEW:
            swapped.set()

    try:
        await view.start()
        await view.wait_ready(10)
        old_table = view.table
        assert view.table.hosts() == OLD
        assert view.position == len(OLD) + 1
        view.subscribe(listener)
        # The same stream with fewer records: sequence numbers re-used below the position.
        await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
        await provision(nc)
        last = await fill(nc, NEW)
        assert last < view.position
        assert view.table.hosts() == OLD  # nothing told the view yet
        server.kill()
        server.start()  # the client reconnects; the view checks the stream
        await asyncio.wait_for(swapped.wait(), 30)
        assert view.reloads == 1
        assert view.table is not old_table
        assert view.position == last
        assert view.ready
        assert view.select("free >= 0") == NEW
        # Live updates now come through the new consumer.
        done = asyncio.Event()
        view.subscribe(lambda s: done.set() if s == host_snapshot_subject("new9") else None)
        await nc.jetstream().publish(host_snapshot_subject("new9"),
                                     encode(host_snapshot("new9", {"free": 9.0})))
        await asyncio.wait_for(done.wait(), 10)
        assert view.select("free > 5") == ["new9"]
    finally:
        await view.stop()
    assert all(ready for ready, _ in seen)
    assert all(hosts in (OLD, NEW, [*NEW, "new9"]) for _, hosts in seen)


async def test_no_reload_when_stream_is_intact(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """A reconnect to a stream that still holds the view's last record checks and keeps the
    table (no reload)."""
    server, nc = server_and_client
    await fill(nc, OLD)
    view = SchedulerView(nc, idle_heartbeat=0.5)
    try:
        await view.start()
        await view.wait_ready(10)
        table = view.table
        await nc.jetstream().publish(host_snapshot_subject(OLD[0]),  # supersedes seq 2
                                     encode(host_snapshot(OLD[0], {"free": 5.0})))
        reconnected = asyncio.Event()
        nc.options["crr_reconnect_listeners"].append(reconnected.set)
        await nc.flush()
        server.stop()  # a clean shutdown flushes the store: nothing is lost
        server.start()
        await asyncio.wait_for(reconnected.wait(), 30)
        check = view._check  # the reconnect check, awaited to be sure
        assert check is not None
        await asyncio.wait_for(check, 30)
        assert view.reloads == 0
        assert view.table is table
    finally:
        await view.stop()
