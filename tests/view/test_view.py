"""The scheduler view on a real nats-server fed by a real Projector: load, live, restart."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import tenacity
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.errors import CrrTimeoutError, ExpressionError, NotReadyError
from crr.schemas.subjects import event_subject, host_snapshot_subject
from crr.view.scheduler_view import SchedulerView
from tests.support.projector import (
    FAST_CATALOG_YAML,
    publish_catalog,
    publish_report,
    running_projector,
)

HOSTS = [f"node{i:02d}" for i in range(40)]


async def populate(nc: Client, hosts: list[str] = HOSTS) -> int:
    """Catalog + one scratch report per host (node i has i*10 GiB); returns the last seq."""
    seq = await publish_catalog(nc)
    for i, h in enumerate(hosts):
        seq = await publish_report(nc, "scratch", h, {"scratch_free": float(i * 10)})
    return seq


@pytest.fixture
async def view(nc: Client) -> AsyncIterator[SchedulerView]:
    """A started view (not necessarily ready) with a short heartbeat; stopped afterwards."""
    v = SchedulerView(nc, idle_heartbeat=0.5)
    yield v
    await v.stop()


async def test_ready_only_after_initial_load(nc: Client, view: SchedulerView) -> None:
    """A view started on a populated snapshot has every host the moment it turns ready."""
    async with running_projector(nc) as p:
        await p.wait_until(await populate(nc))
        seen: list[tuple[bool, int]] = []
        view.subscribe(lambda _s: seen.append((view.ready, len(view.table))))
        with pytest.raises(NotReadyError):
            view.select("scratch_free > 0")
        await view.start()
        await view.wait_ready(10)
    first_ready = next(i for i, (ready, _) in enumerate(seen) if ready)
    assert seen[first_ready][1] == len(HOSTS)
    assert all(ready for ready, _ in seen[first_ready:])  # ready stays set
    assert view.catalog is not None
    assert "scratch_free" in view.catalog.resources
    assert view.select("scratch_free >= 200") == HOSTS[20:]


async def test_empty_stream_is_ready_at_once(nc: Client, view: SchedulerView) -> None:
    """An empty CRR_SNAPSHOT is a complete (empty) load, not a hang."""
    await view.start()
    await view.wait_ready(5)
    assert view.ready
    assert len(view.table) == 0
    assert view.position == 0


async def test_live_updates_and_wait_until(nc: Client, view: SchedulerView) -> None:
    """Reports published after the view is ready show up once view.wait_until(seq) returns."""
    async with running_projector(nc):
        await view.start()
        await view.wait_ready(10)
        seq = await populate(nc, HOSTS[:5])
        await view.wait_until(seq)
        assert view.select("scratch_free > 15") == ["node02", "node03", "node04"]
        seq = await publish_report(nc, "scratch", "node00", {"scratch_free": 999.0}, seq=2)
        await view.wait_until(seq)
        assert view.select("scratch_free > 500") == ["node00"]
        assert view.projector_position >= seq
        assert view.projector is not None
        assert view.projector.last_seq >= seq
        assert view.position > 0


async def test_catalog_change_is_followed(nc: Client, view: SchedulerView) -> None:
    """A new catalog re-shapes the view: a new resource compiles, a removed one fails to."""
    async with running_projector(nc):
        await view.start()
        seq = await populate(nc, HOSTS[:3])
        await view.wait_until(seq)
        assert view.select("scratch_free >= 0") == HOSTS[:3]
        yaml = FAST_CATALOG_YAML.replace(
            "  blink:", "  gpu_ok: {kind: boolean, scope: host, reporter: scratch}\n  blink:"
        ).replace("  datasets:     {kind: string_set, scope: host, reporter: datasets, "
                  "interval: 60s}\n", "")
        seq = await publish_catalog(nc, load_catalog_text(yaml))
        seq = await publish_report(nc, "scratch", "node01", {"gpu_ok": True}, seq=5)
        await view.wait_until(seq)
    assert view.catalog is not None
    assert "gpu_ok" in view.catalog.resources
    assert view.select("gpu_ok") == ["node01"]
    assert view.select("scratch_free >= 0") == HOSTS[:3]
    with pytest.raises(ExpressionError, match="datasets"):
        view.select('datasets has "c4"')


async def test_cluster_values_shared_by_every_host(nc: Client, view: SchedulerView) -> None:
    """A cluster-scope value is the same on every host and reaches `cluster`."""
    async with running_projector(nc):
        await view.start()
        await populate(nc, HOSTS[:4])
        seq = await publish_report(nc, "flexlm", None, {"matlab_free": 5})
        await view.wait_until(seq)
        assert view.cluster is not None
        assert view.cluster.values["matlab_free"].value == 5
        assert view.select("matlab_free > 3") == HOSTS[:4]
        assert view.select("matlab_free > 3 && scratch_free > 15") == HOSTS[2:4]
        seq = await publish_report(nc, "flexlm", None, {"matlab_free": 1}, seq=2)
        await view.wait_until(seq)
        assert view.select("matlab_free > 3") == []
        why = view.explain("matlab_free > 3", "node01")
    assert not why.selected
    assert why.resources[0].scope == "cluster"


async def test_explain_and_compile_cache(nc: Client, view: SchedulerView) -> None:
    """explain answers per host; the same text compiles once per catalog."""
    async with running_projector(nc):
        await view.start()
        await view.wait_until(await populate(nc, HOSTS[:3]))
    why = view.explain("scratch_free > 15", "node01")
    assert (why.selected, why.truth) == (False, "false")
    assert view.explain("scratch_free > 15", "node02").selected
    assert view.compile("scratch_free > 15") is view.compile("scratch_free > 15")
    compiled = view.compile("scratch_free > 5")
    assert view.select(compiled) == ["node01", "node02"]


async def test_subscribe_and_unsubscribe(nc: Client, view: SchedulerView) -> None:
    """Listeners get each applied subject until they unsubscribe; a failing one is ignored."""
    got: list[str] = []

    def broken(_subject: str) -> None:
        raise RuntimeError("listener bug")

    view.subscribe(broken)
    unsubscribe = view.subscribe(got.append)
    async with running_projector(nc):
        await view.start()
        await view.wait_until(await populate(nc, HOSTS[:2]))
        assert host_snapshot_subject("node01") in got
        unsubscribe()
        n = len(got)
        await view.wait_until(await publish_report(nc, "scratch", "node00", {"scratch_free": 7},
                                                   seq=9))
    assert len(got) == n


async def test_undecodable_record_is_skipped(nc: Client, view: SchedulerView) -> None:
    """Garbage in CRR_SNAPSHOT is counted and skipped; the load still completes."""
    js = nc.jetstream()
    await js.publish(host_snapshot_subject("bad"), b"{not json")
    await js.publish(host_snapshot_subject("worse"), b'{"host": 3}')
    async with running_projector(nc):
        await view.start()
        await view.wait_until(await populate(nc, HOSTS[:2]))
    assert view.rejected == 2
    assert view.table.hosts() == HOSTS[:2]


async def test_wait_until_times_out(nc: Client, view: SchedulerView) -> None:
    """wait_until on a sequence nobody writes is a CrrTimeoutError, not a hang."""
    await view.start()
    await view.wait_ready(5)
    with pytest.raises(CrrTimeoutError, match="not 1000"):
        await view.wait_until(1000, timeout=0.2)


@pytest.fixture
def durable_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A server that writes every stored message to disk before acking it.

    With the default (asynchronous) flush a SIGKILL can lose the last acked
    messages, and the restarted stream then re-uses their sequence numbers —
    a different failure from the one this test is about (see the report).
    """
    conf = tmp_path / "js.conf"
    conf.write_text("jetstream {\n  sync_interval: always\n}\n")
    with NatsServer(tmp_path / "store", config_file=conf) as server:
        yield server


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_converges_after_server_restart(durable_server: NatsServer) -> None:
    """After a SIGKILL and restart of the server (same port and store) the view follows
    changes made after the restart, without being restarted itself."""
    nats_server = durable_server
    async with (connect(nats_server.url, name="view-test") as nc,
                connect(nats_server.url, name="view-test-projector") as pnc):
        await provision(nc)
        view = SchedulerView(nc, idle_heartbeat=0.5)
        try:
            async with running_projector(pnc):
                await view.start()
                await view.wait_until(await populate(nc, HOSTS[:3]))
                before = view.position
                nats_server.kill()
                nats_server.start()
                seq = await _publish_when_back(nc, "node09", 909.0)
                await view.wait_until(seq, timeout=30)
            assert view.select("scratch_free > 900") == ["node09"]
            assert view.table.hosts() == [*HOSTS[:3], "node09"]
            assert view.position > before
        finally:
            await view.stop()


async def _publish_when_back(nc: Client, host: str, free: float) -> int:
    """Publish a report, retrying (bounded, short ack timeout) while the client reconnects."""
    body = json.dumps({"reporter": "scratch", "host": host, "boot": "b2", "seq": 1,
                       "observed_at": "2026-12-02T14:00:00.000Z",
                       "values": {"scratch_free": free}}).encode()
    js = nc.jetstream(timeout=0.5)
    async for attempt in tenacity.AsyncRetrying(
        stop=tenacity.stop_after_delay(20),
        wait=tenacity.wait_exponential(multiplier=0.01, max=0.2) + tenacity.wait_random(0, 0.01),
        reraise=True,
    ):
        with attempt:
            ack = await js.publish(event_subject("report", "scratch", host), body)
    return int(ack.seq)


async def test_status_age_says_when_the_view_is_behind(nc: Client, view: SchedulerView) -> None:
    """status_age: None before any projector status; small while the projector rewrites its
    status every interval; the time since its last status once nothing new arrives (a
    stopped projector, or a view cut off from the stream, serves a frozen snapshot)."""
    await view.start()
    await view.wait_ready(5)
    assert view.status_age() is None
    async with running_projector(nc) as p:
        seq = await populate(nc, HOSTS[:2])
        await p.wait_until(seq)
        await view.wait_until(seq)
        age = view.status_age()
        assert age is not None
        assert -1.0 < age < 3.0
    now = time.time()
    frozen = view.status_age(now)
    assert frozen is not None
    assert view.status_age(now + 30.0) == pytest.approx(frozen + 30.0)
