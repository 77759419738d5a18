"""Fault injection with real processes: every scenario checks "nothing lost" against ground truth.

Fast scenarios run by default; long ones are marked `slow` (`pytest -m slow
tests/system/test_faults.py`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from crr.bus.connection import connect
from crr.bus.outbox import Outbox
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.producers.simulator import publish_round, simulated_hosts
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import SNAPSHOT_PROJECTOR, host_snapshot_subject, parse_event_subject
from crr.schemas.wire_time import format_time, parse_time
from tests.support.agent import write_script
from tests.support.faults import CrrProcess, caught_up, eventually, stored_events
from tests.support.projector import (
    FAST_CATALOG,
    publish_catalog,
    publish_report,
    running_projector,
    stored_host,
)

REPORTERS = ["scratch", "datasets"]


def assert_no_duplicate_events(events: list[Any]) -> int:
    """Each (subject, boot, seq) is stored once, and per subject seqs only increase."""
    seen: set[tuple[str, str, int]] = set()
    last: dict[str, tuple[str, int]] = {}
    for m in events:
        if not m.subject.startswith("crr.v1.report."):
            continue
        doc = json.loads(m.data)
        key = (m.subject, doc["boot"], doc["seq"])
        assert key not in seen, f"event stored twice: {key}"
        seen.add(key)
        prev = last.get(m.subject)
        if prev is not None and prev[0] == doc["boot"]:
            assert doc["seq"] > prev[1], f"older event stored after newer on {m.subject}"
        last[m.subject] = (doc["boot"], doc["seq"])
    return len(seen)


async def test_nats_server_killed_and_restarted_under_load(
    nats_server: NatsServer, nc: Client, tmp_path: Path
) -> None:
    """SIGKILL nats-server under load, restart it on the same store and port: the outbox
    resends, the projector process resumes, and the snapshot equals ground truth — nothing
    lost, nothing stored twice, a stale value not resurrected as fresh."""
    url = nats_server.url
    await publish_catalog(nc)
    await publish_report(nc, "blinker", "blinkhost", {"blink": 5.0})
    flips: list[str] = []

    async def on_blink(msg: Msg) -> None:
        flips.append(decode(msg.data, HostSnapshot).values["blink"].state)

    await nc.subscribe(host_snapshot_subject("blinkhost"), cb=on_blink)
    projector = CrrProcess(["projector", "--server", url], tmp_path / "projector.log").start()
    hosts = simulated_hosts([f"sim{i:03d}" for i in range(40)], seed=7)
    try:
        async with connect(url, name="sim-publisher") as pub:
            outbox = Outbox(pub, ack_timeout=1.0)
            await outbox.start()
            for rnd in range(30):
                publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
                if rnd == 10:
                    await outbox.flush(20)
                    nats_server.kill()
                if rnd == 20:
                    nats_server.start()
                await asyncio.sleep(0.02)  # pacing of the simulated load, not synchronisation
            await outbox.flush(30)
            assert outbox.stats.retried > 0 or outbox.stats.superseded > 0
            await outbox.close()
        snap = await caught_up(nc, 45)
    finally:
        projector.stop()
    for h in hosts:
        got = snap.hosts[h.host].values
        assert got["scratch_free"].value == h.state["scratch_free"], h.host
        assert got["datasets"].value == h.state["datasets"], h.host
        assert got["scratch_free"].state == "fresh"
    blink = snap.hosts["blinkhost"].values["blink"]
    assert (blink.state, blink.value, blink.last_value) == ("stale", None, 5.0)
    if "stale" in flips:
        assert "fresh" not in flips[flips.index("stale"):], flips
    stored = assert_no_duplicate_events(await stored_events(nc))
    assert stored >= len(hosts) * len(REPORTERS)


async def test_projector_killed_and_restarted(nc: Client, tmp_path: Path) -> None:
    """SIGKILL the projector and start another: the snapshot is byte-identical and no host,
    cluster or catalog record is rewritten (no stale flips, no deletions) on the way."""
    url = nc.connected_url
    assert url is not None
    server = f"nats://{url.hostname}:{url.port}"
    first = CrrProcess(["projector", "--server", server, "--id", "p1"],
                       tmp_path / "p1.log").start()
    second: CrrProcess | None = None
    try:
        await publish_catalog(nc)
        for i in range(20):
            await publish_report(nc, "scratch", f"h{i}", {"scratch_free": float(i)})
            await publish_report(nc, "datasets", f"h{i}", {"datasets": ["c4", f"d{i}"]})
        await publish_report(nc, "flexlm", None, {"matlab_free": 3.0})
        before = await caught_up(nc, 30, projector_id="p1")
        writes: list[str] = []

        async def on_write(msg: Msg) -> None:
            if msg.subject != SNAPSHOT_PROJECTOR:
                writes.append(msg.subject)

        sub = await nc.subscribe("crr.v1.snapshot.>", cb=on_write)
        first.kill()
        second = CrrProcess(["projector", "--server", server, "--id", "p2"],
                            tmp_path / "p2.log").start()
        after = await caught_up(nc, 30, projector_id="p2")
        await nc.flush()
        await sub.unsubscribe()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert writes == []
    assert after.hosts == before.hosts
    assert after.cluster == before.cluster
    assert after.catalog == before.catalog
    assert len(after.hosts) == 20


AGENT_CATALOG = load_catalog_text("""
version: 1
resources:
  tick: {kind: numeric, scope: host, reporter: ticker}
reporters:
  ticker: {type: script, command: [tick.sh], interval: 1s, timeout: 2s}
""")
TICK = """#!/bin/sh
printf '{"values": {"tick": 1}}\\n'
"""


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_agent_killed_values_stale_on_time_then_new_boot(
    nc: Client, tmp_path: Path
) -> None:
    """SIGKILL the agent: its value turns stale exactly at received_at + interval + grace
    (1 s + 0.5 s), not earlier and promptly; a restarted agent has a new boot and no event is
    stored twice."""
    url = nc.connected_url
    assert url is not None
    server = f"nats://{url.hostname}:{url.port}"
    write_script(tmp_path, "tick.sh", TICK)
    states: list[tuple[float, HostSnapshot]] = []

    async def on_snap(msg: Msg) -> None:
        states.append((time.time(), decode(msg.data, HostSnapshot)))

    async with running_projector(nc) as p:
        await p.wait_until(await publish_catalog(nc, AGENT_CATALOG))
        args = ["agent", "--server", server, "--host", "worker1",
                "--reporters-dir", str(tmp_path)]
        agent = CrrProcess(args, tmp_path / "agent1.log").start()
        restarted: CrrProcess | None = None
        try:
            async def fresh() -> HostSnapshot | None:
                _, snap = await stored_host(nc, "worker1")
                return snap if snap.values["tick"].state == "fresh" else None

            first = await eventually(fresh, 20, "agent's first report")
            boot1 = first.reporters["ticker"].boot
            await nc.subscribe(host_snapshot_subject("worker1"), cb=on_snap)
            agent.kill()
            killed_at = time.time()

            async def stale() -> HostSnapshot | None:
                _, snap = await stored_host(nc, "worker1")
                return snap if snap.values["tick"].state == "stale" else None

            gone = await eventually(stale, 10, "value stale after the agent died")
            entry = gone.values["tick"]
            expires = parse_time(entry.expires_at)
            assert expires - parse_time(entry.received_at) == 1.5
            assert entry.stale_since == entry.expires_at
            assert entry.last_value == 1
            assert expires > killed_at - 1.5  # the last report was from this agent's life
            first_stale = next(t for t, s in states if s.values["tick"].state == "stale")
            assert first_stale >= expires - 0.01, "flagged stale before interval + grace"
            assert first_stale - expires < 2.0, "flagged stale too late"
            assert all(s.values["tick"].state == "fresh" for t, s in states if t < first_stale)

            restarted = CrrProcess(args, tmp_path / "agent2.log").start()

            async def reborn() -> HostSnapshot | None:
                snap = await fresh()
                return snap if snap and snap.reporters["ticker"].boot != boot1 else None

            await eventually(reborn, 20, "restarted agent reporting with a new boot")
        finally:
            agent.stop()
            if restarted is not None:
                restarted.stop()
    events = await stored_events(nc)
    assert_no_duplicate_events(events)
    boots = {json.loads(m.data)["boot"] for m in events
             if m.subject.startswith("crr.v1.report.")
             and parse_event_subject(m.subject).host == "worker1"}
    assert len(boots) == 2


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (needs root); the test is skipped where it cannot be mounted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount",  # noqa: S607 - mount(8) from PATH, as root
                           "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # noqa: S607 - as above


def fill(mnt: Path, leave: int) -> Path:
    """Fill the file system up to `leave` free bytes with one file."""
    st = os.statvfs(mnt)
    filler = mnt / "filler"
    filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


@pytest.mark.slow  # several seconds of real waiting: `pytest -m slow`
async def test_disk_full_then_space_returns(small_disk: Path, tmp_path: Path) -> None:
    """The server's store runs out of space: publishers keep their values and say why, the
    projector keeps running, the server logs ENOSPC; once space returns and the
    server is restarted (nats-server keeps a store write error until then) everything
    flushes and the snapshot equals ground truth."""
    server = NatsServer(small_disk / "store").start()
    projector: CrrProcess | None = None
    try:
        async with connect(server.url, name="crr-test") as nc:
            await provision(nc)
            await publish_catalog(nc)
            projector = CrrProcess(["projector", "--server", server.url],
                                   tmp_path / "projector.log").start()
            await caught_up(nc, 30)
            filler = fill(small_disk, 64 * 1024)
            hosts = simulated_hosts([f"sim{i:03d}" for i in range(40)], seed=3)
            async with connect(server.url, name="sim-publisher") as pub:
                outbox = Outbox(pub, ack_timeout=0.5)
                await outbox.start()

                async def full() -> bool:
                    publish_round(outbox, hosts, FAST_CATALOG, REPORTERS,
                                  format_time(time.time()))
                    return outbox.stats.last_error is not None and outbox.pending > 0

                await eventually(full, 30, "publishes failing on a full disk", every=0.2)
                assert "no space left on device" in "\n".join(server.log_tail)
                # The projector may or may not hit the full disk itself (CRR_SNAPSHOT writes
                # can land in an already allocated block); either way it keeps running.
                assert projector.alive(), "projector died on a full disk"
                filler.unlink()
                server.stop()
                server.start()
                publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
                await outbox.flush(30)
                await outbox.close()
            snap = await caught_up(nc, 45)
    finally:
        if projector is not None:
            projector.stop()
        server.stop()
    for h in hosts:
        assert snap.hosts[h.host].values["scratch_free"].value == h.state["scratch_free"]
        assert snap.hosts[h.host].values["datasets"].value == h.state["datasets"]
