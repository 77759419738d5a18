"""The projector after the server lost acknowledged messages: it rebuilds, nothing is skipped.

A nats-server killed with SIGKILL can come back without its last acknowledged
messages and re-use their sequence numbers.  The loss itself is not
reproducible on demand, so these tests make it happen: the stream is deleted
and re-created holding only a prefix of what it held (while the server runs),
then the server is SIGKILLed and restarted, which is when the projector
checks.  Without the check its consumer would resume after its old position
and never see the new events that re-use the lost sequence numbers, and it
would never rewrite the snapshot records a lost CRR_SNAPSHOT tail took away.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.projector.service import Projector
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_STREAM
from crr.view.snapshot_reader import read_snapshot
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, publish_report, running_projector, stored_host

HOSTS = [f"h{i}" for i in range(10)]


async def publish_prefix(nc: Client) -> int:
    """The catalog and one report per host (value 1.0): what survives the "crash"."""
    await publish_catalog(nc)
    last = 0
    for host in HOSTS:
        last = await publish_report(nc, "scratch", host, {"scratch_free": 1.0})
    return last


async def values(nc: Client) -> dict[str, float]:
    """host -> scratch_free as CRR_SNAPSHOT holds it now."""
    snap = await read_snapshot(nc)
    return {h: s.values["scratch_free"].value for h, s in snap.hosts.items()
            if "scratch_free" in s.values}


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_rebuild_when_events_stream_went_backwards(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """CRR_EVENTS loses its tail (h0-h4 = 2.0) and new events re-use those sequence numbers
    (h5-h7 = 3.0): after the reconnect the projector rebuilds, so the snapshot is the fold of
    what the stream now holds — the lost values gone, the new ones there, none skipped."""
    server, nc = server_and_client
    await publish_prefix(nc)
    async with running_projector(nc, status_interval=3600) as projector:
        for i, host in enumerate(HOSTS[:5]):
            last = await publish_report(nc, "scratch", host, {"scratch_free": 2.0}, seq=2 + i)
        await projector.wait_until(last)
        assert (await values(nc))["h0"] == 2.0
        position = projector.position
        # The crash: CRR_EVENTS comes back with the prefix only.
        await nc.jetstream().delete_stream(EVENTS_STREAM)
        await provision(nc)
        assert await publish_prefix(nc) < position
        server.kill()
        server.start()
        # Retried until the restarted server's JetStream answers (Nats-Msg-Id dedups).
        reused: list[int] = []
        for host in HOSTS[5:8]:
            async def publish(h: str = host) -> int:
                return await publish_report(nc, "scratch", h, {"scratch_free": 3.0}, seq=9)

            reused.append(await eventually(publish, 30, "publish after the restart"))
        assert reused[0] <= position, "the new events re-use the lost sequence numbers"
        truth = {h: (3.0 if h in HOSTS[5:8] else 1.0) for h in HOSTS}

        async def rebuilt() -> bool:
            return projector.rebuilds == 1 and await values(nc) == truth

        await eventually(rebuilt, 30, "projector rebuilt from the shortened stream")
        await projector.wait_until(reused[-1])
        # Live events after the rebuild go through the new consumer.
        after = await publish_report(nc, "scratch", "h9", {"scratch_free": 4.0}, seq=10)
        await projector.wait_until(after)
        assert (await values(nc)) == {**truth, "h9": 4.0}
        assert projector.rebuilds == 1


async def test_rebuild_when_snapshot_stream_went_backwards(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """CRR_SNAPSHOT loses every record (the events are intact): after the reconnect the
    projector notices its last status is gone and rewrites every record, though none of
    them changed in its fold (before, it skipped them as already written)."""
    server, nc = server_and_client
    last = await publish_prefix(nc)
    async with running_projector(nc, status_interval=3600) as projector:
        await projector.wait_until(last)
        before = await values(nc)
        assert before == dict.fromkeys(HOSTS, 1.0)
        await nc.jetstream().delete_stream(SNAPSHOT_STREAM)
        await provision(nc)
        assert await values(nc) == {}
        server.kill()
        server.start()

        async def rewritten() -> bool:
            return projector.rebuilds == 1 and await values(nc) == before

        await eventually(rewritten, 30, "projector rewrote the lost records")
        snap = await read_snapshot(nc)
        assert snap.catalog is not None
        assert snap.projector is not None
        assert snap.projector.last_seq == last


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_no_rebuild_after_a_clean_restart(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """A clean server restart loses nothing: the projector checks and carries on (no
    rebuild, nothing rewritten) and follows new events."""
    server, nc = server_and_client
    last = await publish_prefix(nc)
    projector: Projector
    async with running_projector(nc, status_interval=3600) as projector:
        await projector.wait_until(last)
        stored = [(await stored_host(nc, h))[0] for h in HOSTS]
        reconnected: list[bool] = []
        nc.options["crr_reconnect_listeners"].append(lambda: reconnected.append(True))
        server.stop()
        server.start()
        await eventually(lambda: bool(reconnected) and projector._checks.task is not None
                         and projector._checks.task.done(), 30, "reconnect check done")
        assert projector.rebuilds == 0
        assert [(await stored_host(nc, h))[0] for h in HOSTS] == stored  # nothing rewritten
        after = await publish_report(nc, "scratch", "h1", {"scratch_free": 5.0}, seq=2)
        await projector.wait_until(after)
        assert (await values(nc))["h1"] == 5.0
        assert projector.rebuilds == 0
