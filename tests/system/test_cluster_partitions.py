"""Two projector partitions on a 3-node JetStream cluster (R3), under simulated load and node kills.

Slow (15-25 s on 2 cores): `pytest -m slow tests/system/test_cluster_partitions.py` (`-rP` also
shows the measured timings, the source of ops/deploy/SIZING.md's "partitions on a cluster").

The projectors are real `crr projector --partitions 2 --partition K` processes
connected with the comma-separated server list; the load comes from
`crr.producers.simulator` through `crr.bus.outbox.Outbox`.  First a node that no
projector is connected to is SIGKILLed and restarted, then the CRR_EVENTS
stream leader.  Waits are on positions: the view's `wait_until` on the last
CRR_EVENTS sequence (the minimum of the partitions' `covered_seq`, read from
their status records `crr.v1.snapshot.projector.<k>`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.outbox import Outbox
from crr.bus.streams import StreamSettings, provision
from crr.producers.simulator import SimulatedHost, publish_round, simulated_hosts
from crr.schemas.codec import decode, encode
from crr.schemas.errors import CrrTimeoutError
from crr.schemas.events import Report
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import (
    CATALOG,
    EVENTS_STREAM,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    event_subject,
    msg_id,
    untoken,
)
from crr.schemas.wire_time import format_time
from crr.view.scheduler_view import SchedulerView
from tests.support.cluster import NatsCluster, NodeIndex, all_replicas_current
from tests.support.faults import CrrProcess, eventually, stored_events
from tests.support.projector import FAST_CATALOG, publish_catalog
from tests.system.test_faults import REPORTERS, assert_no_duplicate_events

pytestmark = pytest.mark.slow

PARTITIONS = 2
SETTINGS = StreamSettings(replicas=3, partitions=PARTITIONS)
HOST_NAMES = [f"gpu{i:02d}.rack{i % 4}" for i in range(40)]
PROJECTOR_CONN = "crr-projector"
"""The connection name `crr projector` gives itself (seen in the servers' /connz)."""


def connz(port: int) -> list[dict[str, object]]:
    """Client connections of one node, from its monitoring endpoint (blocking)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/connz?limit=1024", timeout=2) as r:
        doc = json.load(r)
    return list(doc.get("connections") or [])


def cluster_with_monitoring(base: Path) -> tuple[NatsCluster, list[int]]:
    """A `NatsCluster` whose nodes also serve HTTP monitoring (/connz), and those ports.

    The monitoring ports stay bound while the cluster picks its own, so no port is
    handed out twice."""
    held = [socket.socket() for _ in range(3)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        monitor = [s.getsockname()[1] for s in held]
        cluster = NatsCluster(base)
    finally:
        for s in held:
            s.close()
    for node, port in zip(cluster.nodes, monitor, strict=True):
        node.extra_args += ["-m", str(port)]  # /connz: which node each projector is on
    return cluster, monitor


def node_states(cluster: NatsCluster) -> str:
    """Each node's liveness and the end of its log (for failure messages)."""
    out = []
    for name, node in zip(cluster.names, cluster.nodes, strict=True):
        alive = node.proc is not None and node.proc.poll() is None
        tail = "\n    ".join(list(node.log_tail)[-8:])
        out.append(f"{name} (:{node.port}) {'up' if alive else 'DOWN'}:\n    {tail}")
    return "\n".join(out)


def check_alive(procs: list[CrrProcess]) -> None:
    """Fail at once (not caught by `eventually`) when a projector process has exited."""
    for p in procs:
        if not p.alive():
            pytest.fail(f"projector {p.args} exited; its log ends:\n{p.output()[-3000:]}")


async def projector_nodes(cluster: NatsCluster, monitor: list[int]) -> list[int]:
    """Index of the node each projector process is connected to (one entry per connection)."""
    out: list[int] = []
    for i, port in enumerate(monitor):
        proc = cluster.nodes[i].proc
        if proc is None or proc.poll() is not None:
            continue
        conns = await asyncio.to_thread(connz, port)
        out += [i for c in conns if c.get("name") == PROJECTOR_CONN]
    return sorted(out)


async def stream_leader(cluster: NodeIndex, nc: Client, stream: str) -> int:
    """Index of the node leading `stream` (retried while an election or a restart is on)."""
    async def leader() -> int | None:
        info = await nc.jetstream(timeout=2.0).stream_info(stream)
        if info.cluster is None or not info.cluster.leader:
            return None
        return cluster.index(info.cluster.leader) + 1  # + 1: node 0 must be truthy

    found: int = await eventually(leader, 20, f"{stream} has a leader")
    return found - 1


async def lead_elsewhere(cluster: NatsCluster, nc: Client, avoid: int) -> None:
    """Move both streams' leaders off node `avoid` (JetStream leader step-down with a
    preferred peer), so killing `avoid` kills a pure follower."""
    preferred = cluster.names[(avoid + 1) % len(cluster.names)]
    for stream in (EVENTS_STREAM, SNAPSHOT_STREAM):

        async def moved(stream: str = stream) -> bool:
            if await stream_leader(cluster, nc, stream) != avoid:
                return True
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                             json.dumps({"placement": {"preferred": preferred}}).encode(),
                             timeout=2)
            return False

        await eventually(moved, 20, f"{stream} leader off node {avoid}", every=0.2)


async def partition_status(nc: Client, k: int) -> tuple[int, ProjectorStatus]:
    """(CRR_SNAPSHOT seq, decoded) of partition `k`'s status record."""
    m = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, f"{SNAPSHOT_PROJECTOR}.{k}")
    assert m.data is not None
    assert m.seq is not None
    return m.seq, decode(m.data, ProjectorStatus)


async def partitions_caught_up(nc: Client, cluster: NatsCluster, view: SchedulerView,
                               load: Load, name: str, *, timeout: float = 40
                               ) -> list[ProjectorStatus]:
    """Wait until the view reflects every CRR_EVENTS event (each partition's `covered_seq`
    reaches the stream's last sequence); the partitions' statuses that say so."""
    async def events_last() -> int:
        return (await nc.jetstream(timeout=2.0).stream_info(EVENTS_STREAM)).state.last_seq

    last: int = await eventually(events_last, 20, f"{EVENTS_STREAM} last sequence")
    try:
        await view.wait_until(last, timeout)
    except CrrTimeoutError as exc:
        raise AssertionError(f"{name} phase: {exc}; statuses {view.projectors}\n"
                             f"{node_states(cluster)}") from exc
    load.stamp(f"{name}: view caught up")
    return view.projectors


@dataclass
class Load:
    """The simulated fleet plus one external cluster-scope reporter, and their ground truth."""

    hosts: list[SimulatedHost]
    boot: str = "clusterboot"
    cluster_seq: int = 0
    matlab_free: float = 0.0
    published: int = 0
    rounds: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds each step took (for the summary line and SIZING.md)."""
    _last: float = field(default_factory=time.monotonic)

    def stamp(self, step: str) -> None:
        """Record how long `step` took since the previous stamp."""
        now = time.monotonic()
        self.timings[step], self._last = now - self._last, now

    def round(self, outbox: Outbox) -> None:
        """Queue one round: every host's reports, then the cluster-scope license count."""
        now = format_time(time.time())
        self.published += publish_round(outbox, self.hosts, FAST_CATALOG, REPORTERS, now)
        self.cluster_seq += 1
        self.matlab_free = float(100 + self.cluster_seq % 17)
        rep = Report(reporter="flexlm", host=None, boot=self.boot, seq=self.cluster_seq,
                     observed_at=now, values={"matlab_free": self.matlab_free})
        outbox.put(event_subject("report", "flexlm", None), encode(rep),
                   msg_id=msg_id("flexlm", None, self.boot, self.cluster_seq))
        self.published += 1
        self.rounds += 1


async def phase(cluster: NatsCluster, outbox: Outbox, load: Load, victim: int,
                name: str) -> None:
    """Publish 30 rounds; SIGKILL node `victim` at round 8, restart it at round 22 (about
    0.7 s down plus its start-up); wait until the outbox has every message acknowledged."""
    for rnd in range(30):
        load.round(outbox)
        if rnd == 8:
            cluster.nodes[victim].kill()
        if rnd == 22:
            cluster.nodes[victim].start()
        await asyncio.sleep(0.05)  # pacing of the simulated load, not synchronisation
    load.stamp(f"{name}: load")
    try:
        await outbox.flush(30)
    except CrrTimeoutError as exc:
        raise AssertionError(f"{name} phase: {exc}\n{node_states(cluster)}") from exc
    load.stamp(f"{name}: acked")


async def test_two_partitions_on_cluster_survive_node_kills(tmp_path: Path) -> None:
    """Two partition projectors on an R3 cluster: kill a node without projectors, then the
    CRR_EVENTS leader, under load; one view sees every host and the cluster value as last
    reported, partitions split the hosts disjointly, nothing is lost or stored twice."""
    cluster, monitor = cluster_with_monitoring(tmp_path)
    procs: list[CrrProcess] = []
    started = time.monotonic()
    with cluster:
        async with connect(cluster.url, name="crr-test", attempts=None) as nc:
            await eventually(lambda: provision(nc, SETTINGS), 30, "R3 streams provisioned",
                             every=0.5)
            procs = [CrrProcess(["projector", "--server", cluster.url, "--replicas", "3",
                                 "--partitions", str(PARTITIONS), "--partition", str(k),
                                 "--id", f"part{k}", "--log-level", "INFO"],
                                tmp_path / f"part{k}.log").start() for k in range(PARTITIONS)]
            view = SchedulerView(nc)
            try:
                await view.start()
                await view.wait_ready(30)
                await publish_catalog(nc)

                async def both_up() -> bool:
                    check_alive(procs)
                    for k in range(PARTITIONS):
                        _, st = await partition_status(nc, k)
                        if st.last_seq == 0:
                            return False
                    return len(await projector_nodes(cluster, monitor)) == PARTITIONS

                await eventually(both_up, 30, "both partition projectors running")
                load = Load(simulated_hosts(HOST_NAMES, seed=9), _last=started)
                load.stamp("startup")

                async with connect(cluster.url, name="sim-publisher", attempts=None) as pub:
                    outbox = Outbox(pub, ack_timeout=2.0)
                    await outbox.start()
                    try:
                        # 1. A node no projector is connected to, made a pure follower.
                        busy = set(await projector_nodes(cluster, monitor))
                        first = min(i for i in range(3) if i not in busy)
                        await lead_elsewhere(cluster, nc, first)
                        await phase(cluster, outbox, load, first, "follower")
                        await partitions_caught_up(nc, cluster, view, load, "follower")
                        await eventually(lambda: all_replicas_current(nc), 30,
                                         "replicas caught up after the first kill", every=0.2)
                        load.stamp("follower: replicas current")
                        # 2. The CRR_EVENTS leader, whoever it is now.
                        leader = await stream_leader(cluster, nc, EVENTS_STREAM)
                        leader_had_projector = leader in await projector_nodes(cluster, monitor)
                        await phase(cluster, outbox, load, leader, "leader")
                        statuses = await partitions_caught_up(nc, cluster, view, load,
                                                              "leader")
                    finally:
                        await outbox.close()
                await eventually(lambda: all_replicas_current(nc), 30,
                                 "replicas caught up after the leader kill", every=0.2)
                load.stamp("leader: replicas current")
                check_alive(procs)
                events = await stored_events(nc)
                table = view.table
                matlab_hosts = view.select(f"matlab_free == {load.matlab_free}")
                fresh_hosts = view.select("defined(scratch_free) && count(datasets) >= 0")
            finally:
                await view.stop()
                for p in procs:
                    p.stop()
            stats = outbox.stats

    assert first not in busy
    # One CRR_SNAPSHOT: every host as last reported, the cluster value, one catalog.
    assert sorted(table.hosts()) == sorted(HOST_NAMES)
    for h in load.hosts:
        snap = table.get(h.host)
        assert snap is not None, h.host
        for name in ("scratch_free", "datasets"):
            entry = snap.values[name]
            assert (entry.state, entry.value) == ("fresh", h.state[name]), (h.host, name)
    cluster_snap = table.cluster()
    assert cluster_snap is not None
    assert cluster_snap.values["matlab_free"].value == load.matlab_free
    assert matlab_hosts == sorted(HOST_NAMES)  # the cluster value reaches every host
    assert fresh_hosts == sorted(HOST_NAMES)
    assert view.catalog == FAST_CATALOG
    # The split: each host's stored events carry one partition token; the partitions'
    # host sets are disjoint, cover the fleet, and match what each status says it folds.
    owners: dict[str, set[int]] = defaultdict(set)
    for m in events:
        parts = m.subject.split(".")
        if m.subject == CATALOG:
            continue
        if parts[3] == "host":
            assert len(parts) == 7, m.subject
            owners[untoken(parts[4])].add(int(parts[6]))
        else:  # cluster subjects are not transformed (partition 0 folds them)
            assert (parts[3], len(parts)) == ("cluster", 5), m.subject
    assert all(len(ks) == 1 for ks in owners.values()), owners
    by_partition = [{h for h, ks in owners.items() if k in ks} for k in range(PARTITIONS)]
    assert by_partition[0].isdisjoint(by_partition[1])
    assert by_partition[0] | by_partition[1] == set(HOST_NAMES)
    assert all(by_partition), "each partition should own hosts"
    assert [s.partition for s in statuses] == [0, 1]
    assert [s.projector_id for s in statuses] == ["part0", "part1"]
    assert [s.hosts for s in statuses] == [len(p) for p in by_partition]
    assert sum(s.deadletters for s in statuses) == 0
    # Every stored event folded exactly once by its partition (the catalog by each).
    assert sum(s.applied for s in statuses) == len(events) + PARTITIONS - 1
    assert_no_duplicate_events(events)
    assert stats.rejected == 0
    print(f"\ncluster partitions: {len(HOST_NAMES)} hosts, {load.rounds} rounds, "
          f"{load.published} queued, {len(events)} stored, outbox retried {stats.retried} "
          f"superseded {stats.superseded}; hosts per partition "
          f"{[len(p) for p in by_partition]}; applied {[s.applied for s in statuses]}; "
          f"leader kill hit a projector's node: {leader_had_projector}; "
          + ", ".join(f"{k} {v:.1f}s" for k, v in load.timings.items()))
