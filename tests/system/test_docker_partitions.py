"""Real network partitions: a 3-node JetStream cluster in Docker, split while crr runs.

Run with `pytest -m docker tests/system/test_docker_partitions.py` (needs a Docker daemon;
skipped with the reason otherwise; about 3-4 minutes on 2 cores).  Each test gets its own
cluster (tests/support/docker_cluster.py) and checks the same ground truth as
tests/system/test_faults.py:
every host equals its last acknowledged report, nothing is stored twice, no older value
after a newer one, no stale value resurrected as fresh.  `-rP` prints the measured times
(the source of ops/deploy/PARTITIONS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from crr.bus.connection import connect
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.outbox import Outbox
from crr.bus.streams import StreamSettings, provision
from crr.producers.simulator import publish_round, simulated_hosts
from crr.schemas.codec import decode
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import (
    EVENTS_STREAM,
    LEASE,
    SNAPSHOT_STREAM,
    host_snapshot_subject,
    is_projector_status,
    parse_event_subject,
)
from crr.schemas.wire_time import format_time, parse_time
from crr.view.scheduler_view import SchedulerView
from tests.support.agent import write_script
from tests.support.docker_cluster import (
    DockerNatsCluster,
    DockerUnavailable,
    docker_client,
    leftovers,
    nats_image,
)
from tests.support.faults import CrrProcess, eventually, stored_events
from tests.support.projector import FAST_CATALOG, publish_catalog, publish_report
from tests.system.test_cluster_partitions import stream_leader
from tests.system.test_faults import AGENT_CATALOG, REPORTERS, assert_no_duplicate_events

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(240),
    # nats-py leaves the old connection's StreamWriter to the garbage collector after a
    # forced reconnect (Outbox leaving a server that acknowledges nothing): harmless.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

R3 = StreamSettings(replicas=3)
TTL = 2.0
BEHIND = 3.0
"""A view whose newest projector status is older than this says it is behind."""


@pytest.fixture
def cluster() -> Iterator[DockerNatsCluster]:
    """A started 3-node cluster; skipped with the reason when Docker cannot run one.

    Everything carrying the run's label is removed afterwards, and checked gone — also
    when the test run is terminated (SIGTERM is turned into an interrupt, so pytest
    tears the fixtures down)."""
    try:
        client = docker_client()
    except DockerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        image = nats_image(client)
        c = DockerNatsCluster(client, image)
        c.start()
    except DockerUnavailable as exc:
        client.close()
        pytest.skip(str(exc))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield c
    finally:
        signal.signal(signal.SIGTERM, previous)
        c.close()
        left = leftovers(client, c.run)
        client.close()
        assert not left, f"left behind: {left}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def procs() -> Iterator[list[CrrProcess]]:
    """crr processes a test started: stopped at teardown, whatever happened."""
    started: list[CrrProcess] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop()


def majority_url(cluster: DockerNatsCluster, minority: int) -> str:
    """Client URLs of every node but `minority`."""
    return ",".join(cluster.url_of(i) for i in range(cluster.size) if i != minority)


@dataclass
class Writes:
    """Who wrote CRR_SNAPSHOT, in stream order, as a majority-side reader saw it."""

    log: list[tuple[int, str, str]] = field(default_factory=list)
    """(seq, kind "status"/"lease", writer id)."""
    blink: list[str] = field(default_factory=list)
    """States of blinkhost's `blink` value, as stored."""
    reader: OrderedReader | None = None

    def on(self, m: StoredMessage) -> None:
        if not m.data:
            return
        if is_projector_status(m.subject):
            self.log.append((m.seq, "status", json.loads(m.data).get("projector_id", "")))
        elif m.subject == LEASE:
            self.log.append((m.seq, "lease", json.loads(m.data).get("holder") or ""))
        elif m.subject == host_snapshot_subject("blinkhost"):
            self.blink.append(decode(m.data, HostSnapshot).values["blink"].state)
            self.log.append((m.seq, "blinkhost", self.blink[-1]))

    def writers(self, kind: str = "status") -> list[str]:
        """Successive writers (runs collapsed): ["A", "B"] means one switch, never back."""
        out: list[str] = []
        for _, k, who in self.log:
            if k == kind and (not out or out[-1] != who):
                out.append(who)
        return out

    def first(self, who: str, kind: str = "status") -> int | None:
        return next((seq for seq, k, w in self.log if k == kind and w == who), None)


@asynccontextmanager
async def watching(nc: Client) -> AsyncIterator[Writes]:
    """Record every CRR_SNAPSHOT status and lease write from here on."""
    w = Writes()
    w.reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>",
                             handler=w.on, deliver=DeliverPolicy.NEW)
    await w.reader.start()
    try:
        yield w
    finally:
        await w.reader.stop()


def projector(cluster: DockerNatsCluster, node: int, pid: str, tmp_path: Path) -> CrrProcess:
    """An HA `crr projector` connected to node `node` only."""
    return CrrProcess(["projector", "--server", cluster.url_of(node), "--replicas", "3",
                       "--ha", "--lease-ttl", f"{TTL:g}s", "--id", pid,
                       "--log-level", "INFO"], tmp_path / f"{pid}.log").start()


def standby(holder: CrrProcess, other: CrrProcess) -> bool:
    """Whether `other` has loaded and waits for the lease (it says so in its log)."""
    check_alive(holder, other)
    return "standby for" in other.output()


def check_alive(*procs: CrrProcess) -> None:
    for p in procs:
        if not p.alive():
            pytest.fail(f"{p.args} exited; its log ends:\n{p.output()[-3000:]}")


@pytest.mark.parametrize("fault", ["isolate", "pause"])
async def test_leader_and_projector_on_the_minority(
        cluster: DockerNatsCluster, procs: list[CrrProcess], tmp_path: Path,
        fault: str) -> None:
    """The node leading CRR_EVENTS and CRR_SNAPSHOT, with the lease-holding projector A on it,
    is cut off (`isolate`) or frozen past the lease TTL (`pause`) while reports flow: nothing
    from A is stored after the standby B's first write, B takes over within its bound, the
    reporters' outbox fails over to the majority, the view keeps up; after the heal A stays
    fenced and the snapshot equals ground truth."""
    timings: dict[str, float] = {}
    async with connect(cluster.url, name="crr-test", attempts=None) as setup:
        await eventually(lambda: provision(setup, R3), 30, "R3 streams", every=0.5)
        await publish_catalog(setup)
        lead = await stream_leader(cluster, setup, EVENTS_STREAM)
        await eventually(lambda: lead_both(cluster, setup, lead), 40,
                         "both streams led by the node to cut off", every=0.5)
    other = (lead + 1) % 3
    a = projector(cluster, lead, "A", tmp_path)
    procs.append(a)
    b: CrrProcess | None = None
    hosts = simulated_hosts([f"h{i:02d}" for i in range(20)], seed=5)
    try:
        async with connect(majority_url(cluster, lead), name="crr-test", attempts=None) as nc, \
                connect(cluster.url_of(lead), name="crr-test-minority") as near, \
                watching(nc) as writes:
            await eventually(lambda: "A" in writes.writers(), 30, "A writing")
            b = projector(cluster, other, "B", tmp_path)
            procs.append(b)
            # B is a warm standby (it writes nothing while A holds the lease; it says so).
            await eventually(lambda: standby(a, b), 30, "B a warm standby")
            await publish_report(near, "blinker", "blinkhost", {"blink": 5.0})
            # (What is *stored*, in stream order: a core subscription would also see
            # fenced writes the stream refused.)
            flips = writes.blink
            publishes: list[str] = []

            async def on_blink(msg: Msg) -> None:
                snap = decode(msg.data, HostSnapshot)
                publishes.append(f"{snap.values['blink'].state}@{snap.as_of.seq}")

            await nc.subscribe(host_snapshot_subject("blinkhost"), cb=on_blink)
            view = SchedulerView(nc)
            await view.start()
            await view.wait_ready(30)
            async with connect(cluster.url, name="sim-publisher", attempts=None) as pub:
                outbox = Outbox(pub, ack_timeout=1.0, switch_after=3.0)
                await outbox.start()
                for _ in range(3):
                    publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
                await outbox.flush(30)
                check_alive(a, b)
                t0 = time.monotonic()
                if fault == "isolate":
                    cluster.isolate(lead)
                else:
                    cluster.pause(lead)

                async def b_writes() -> bool:
                    check_alive(a, b)
                    publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
                    return "B" in writes.writers()

                await eventually(b_writes, 40, f"standby B writing\n{cluster.describe()}",
                                 every=0.3)
                timings["takeover"] = time.monotonic() - t0
                # Reports keep flowing during the cut, through the majority.
                for _ in range(5):
                    publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
                    await asyncio.sleep(0.1)  # pacing of the simulated load, not synchronisation
                await outbox.flush(40)
                timings["flushed during the cut"] = time.monotonic() - t0
                last = (await nc.jetstream(timeout=3).stream_info(EVENTS_STREAM)).state.last_seq
                await view.wait_until(last, 30)
                timings["view caught up during the cut"] = time.monotonic() - t0
                cut_for = max(3 * TTL, time.monotonic() - t0)
                if fault == "isolate":
                    cluster.rejoin(lead)
                else:
                    cluster.unpause(lead)
                t1 = time.monotonic()
                await asyncio.to_thread(cluster.wait_formed, 60)
                timings["cluster formed after the heal"] = time.monotonic() - t1
                # The healed node's client (A's side) can write again: the old writer is
                # back in the game and must stay fenced.
                await eventually(lambda: publish_report(near, "blinker", "probe", {"blink": 1.0}),
                                 60, "minority-side client acknowledged after the heal",
                                 every=0.5)
                timings["minority side acked after the heal"] = time.monotonic() - t1
                renewals = len([1 for _, k, w in writes.log if k == "lease" and w == "B"])
                await eventually(lambda: len([1 for _, k, w in writes.log
                                              if k == "lease" and w == "B"]) >= renewals + 6,
                                 30, "B renewing after the heal (A had time to misbehave)")
                publish_round(outbox, hosts, FAST_CATALOG, REPORTERS, format_time(time.time()))
                await outbox.flush(30)
                stats = outbox.stats
                await outbox.close()
            last = (await nc.jetstream(timeout=3).stream_info(EVENTS_STREAM)).state.last_seq
            await view.wait_until(last, 30)
            check_alive(a, b)
            table = view.table
            await view.stop()
            events = await eventually(  # (a consumer create may time out while leaders settle)
                lambda: stored_events(nc), 60, "history readable after the heal", every=0.5)
    finally:
        a.stop()
        if b is not None:
            b.stop()
    # Never two writers: A until B's first write, then only B (statuses and lease records).
    assert writes.writers("status") == ["A", "B"], writes.log
    assert writes.writers("lease") == ["A", "B"], writes.log
    # Every host as last reported, fresh; the blink value stale and never fresh again.
    for h in hosts:
        snap = table.get(h.host)
        assert snap is not None, h.host
        for name in ("scratch_free", "datasets"):
            assert (snap.values[name].state, snap.values[name].value) == (
                "fresh", h.state[name]), (h.host, name)
    if "stale" in flips:
        assert "fresh" not in flips[flips.index("stale"):], (flips, publishes, writes.log)
    assert flips, "blinkhost never written"
    assert flips[-1] == "stale", flips
    assert_no_duplicate_events(events)
    assert stats.rejected == 0
    print(f"\n{fault}: node n{lead} for {cut_for:.1f}s; outbox switched {stats.switched}, "
          f"retried {stats.retried}; " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
          + f"; blinkhost stored {flips}, published {publishes}")
    # B took over within TTL + a JetStream leader election (see ops/deploy/PARTITIONS.md).
    assert timings["takeover"] < TTL + 15, timings


async def lead_both(cluster: DockerNatsCluster, nc: Client, node: int) -> bool:
    """One step towards both streams being led by `node` (leader step-down with a preferred
    peer); True once they are."""
    for stream in (EVENTS_STREAM, SNAPSHOT_STREAM):
        if await stream_leader(cluster, nc, stream) != node:
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", json.dumps(
                {"placement": {"preferred": cluster.names[node]}}).encode(), timeout=2)
            return False
    return True


TICK = """#!/bin/sh
if [ -f "$(dirname "$0")/fail" ]; then echo 'broken' >&2; exit 3; fi
printf '{"values": {"tick": 1}}\\n'
"""
AGENT_CONN = "crr-agent-worker1"


async def test_agent_and_view_nodes_cut_off(cluster: DockerNatsCluster,
                                            procs: list[CrrProcess], tmp_path: Path) -> None:
    """The agent's node is cut off: its value goes stale on time, the agent keeps its health
    transitions, leaves the node for the majority and flushes, and the value is fresh again.
    Then the view's node is cut off: the view says it is behind (status age) instead of
    serving a silently frozen snapshot, and catches up after the heal."""
    async with connect(cluster.url, name="crr-test", attempts=None) as setup:
        await eventually(lambda: provision(setup, R3), 30, "R3 streams", every=0.5)
        await publish_catalog(setup, AGENT_CATALOG)
    write_script(tmp_path, "tick.sh", TICK)
    agent = CrrProcess(["agent", "--server", cluster.url, "--host", "worker1",
                        "--reporters-dir", str(tmp_path), "--log-level", "INFO"],
                       tmp_path / "agent.log").start()
    procs.append(agent)
    proj: CrrProcess | None = None
    timings: dict[str, float] = {}
    try:
        def agent_node() -> int | None:
            check_alive(agent)
            on = [i for i in range(3) if i not in cluster.isolated
                  and cluster.connections(i, AGENT_CONN)]
            return on[0] + 1 if on else None  # + 1: node 0 must be truthy

        g = await eventually(lambda: asyncio.to_thread(agent_node), 30, "agent connected") - 1
        p = (g + 1) % 3
        v = (g + 2) % 3
        proj = CrrProcess(["projector", "--server", cluster.url_of(p), "--replicas", "3"],
                          tmp_path / "projector.log").start()
        procs.append(proj)
        async with connect(majority_url(cluster, g), name="crr-test", attempts=None) as nc:
            states: list[tuple[float, HostSnapshot]] = []

            async def on_snap(msg: Msg) -> None:
                states.append((time.time(), decode(msg.data, HostSnapshot)))

            await nc.subscribe(host_snapshot_subject("worker1"), cb=on_snap)

            def tick_state() -> str | None:
                return states[-1][1].values["tick"].state if states else None

            await eventually(lambda: tick_state() == "fresh", 30, "agent's first report")
            sched = SchedulerView(nc)
            await sched.start()
            await sched.wait_ready(30)
            await eventually(lambda: sched.select("defined(tick)") == ["worker1"], 10,
                             "scheduler sees the value")
            # 1. The agent's node cut off.
            cluster.isolate(g)
            cut_at = time.time()
            # The scheduler stops trusting the value once its judged_at passes the expiry
            # (docs/contract.md, "Freshness at the watermark"): at the expiry while the
            # projector's statuses keep coming, later while the cut stalls CRR_SNAPSHOT
            # (a leader election: crr's own outage, during which readers hold).
            await eventually(lambda: not sched.select("defined(tick)"), 20,
                             "scheduler no longer selects the value", every=0.02)
            t_sched = time.time()
            await eventually(lambda: tick_state() == "stale", 20, "value stale during the cut")
            timings["stale after"] = time.time() - cut_at
            (tmp_path / "fail").write_text("")
            await eventually(lambda: "reporter ticker: failed" in agent.output(), 20,
                             "script failing")
            (tmp_path / "fail").unlink()
            await eventually(lambda: asyncio.to_thread(lambda: bool(
                [i for i in range(3) if i != g and cluster.connections(i, AGENT_CONN)])),
                60, "agent reconnected to the majority")
            timings["agent on the majority after"] = time.time() - cut_at
            await eventually(lambda: tick_state() == "fresh", 30, "value fresh again")
            timings["fresh again after"] = time.time() - cut_at
            cluster.rejoin(g)
            await asyncio.to_thread(cluster.wait_formed, 60)
            # Stale exactly on time: at received_at + interval + grace, not before.
            first_stale = next(i for i, (_, s) in enumerate(states)
                               if s.values["tick"].state == "stale")
            t_stale, stale = states[first_stale]
            entry = stale.values["tick"]
            expires = parse_time(entry.expires_at)
            assert expires - parse_time(entry.received_at) == 1.5
            assert t_sched >= expires - 0.01, "scheduler dropped the value before its expiry"
            assert t_sched - expires < 20, "scheduler held the value past the stall"
            timings["scheduler dropped it after its expiry"] = t_sched - expires
            assert t_stale >= expires - 0.01, "flagged stale before interval + grace"
            # The stored flag waits for a writable CRR_SNAPSHOT (a leader election).
            assert t_stale - expires < 15.0, "flagged stale too late"
            timings["stale flag written after expiry"] = t_stale - expires
            assert all(s.values["tick"].state == "fresh" for _, s in states[:first_stale])
            await eventually(lambda: sched.select("defined(tick)") == ["worker1"], 30,
                             "the scheduler trusts the value again")
            await sched.stop()

            # 2. The view's node cut off (the projector is on another one).
            async with connect(cluster.url_of(v), name="crr-view") as vc:
                async def started() -> SchedulerView:
                    # Right after the rejoin CRR_SNAPSHOT may still be electing its leader:
                    # a view's start then times out (retriable), so it is tried again.
                    attempt = SchedulerView(vc)
                    try:
                        await attempt.start()
                    except CrrError:
                        with contextlib.suppress(Exception):
                            await attempt.stop()
                        raise
                    return attempt

                view = await eventually(started, 30, "the view to start after the rejoin")
                await view.wait_ready(30)
                age = view.status_age()
                assert age is not None
                assert age < BEHIND, age
                cluster.isolate(v)
                cut_at = time.time()
                await eventually(lambda: (view.status_age() or 0) > BEHIND, 20,
                                 "view says it is behind")
                timings["view behind after"] = time.time() - cut_at
                frozen = view.position
                async with connect(cluster.url_of(p), name="crr-test-majority") as maj:
                    # (Retried while the majority elects leaders; the same Nats-Msg-Id.)
                    events_during = await eventually(lambda: publish_report(
                        maj, "ticker", "worker1", {"tick": 2.0}, seq=10**6, boot="probe"),
                        30, "a report stored on the majority during the cut", every=0.5)
                cluster.rejoin(v)
                healed = time.time()
                await view.wait_until(events_during, 60)
                await eventually(lambda: (view.status_age() or BEHIND) < BEHIND, 20,
                                 "view current again")
                timings["view caught up after the heal"] = time.time() - healed
                assert view.position > frozen
                await view.stop()
        async with connect(cluster.url, name="crr-test", attempts=None) as nc:
            events = await eventually(  # (a consumer create may time out while leaders settle)
                lambda: stored_events(nc), 60, "history readable after the heal", every=0.5)
    finally:
        agent.stop()
        if proj is not None:
            proj.stop()
    assert_no_duplicate_events(events)
    health = [json.loads(m.data)["state"] for m in events
              if m.subject.startswith("crr.v1.health.")
              and parse_event_subject(m.subject).host == "worker1"]
    # Every transition the agent saw during the cut reached the stream, in order.
    i = health.index("failed")
    assert "ok" in health[i:], health
    print("\nagent/view cut off: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
