"""Changing the number of projector partitions (1 → 2 → 3 → 1) keeps every host's state.

Events stored before a change keep the old layout's subjects.  Each phase
re-reports only one of the two reporters; the other reporter's values must
come through from before the change (in-flight state carried), and exactly
one partition must own each host (`partition(N, host)`, as the server
computes it).
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from crr.bus.follower import read_snapshot_bytes
from crr.bus.streams import StreamSettings, provision
from crr.history.replay import run_replay
from crr.projections.history import CapturePoint, Replay
from crr.projector.service import Projector
from crr.schemas.errors import StreamConfigError
from crr.schemas.subjects import EVENTS_STREAM, host_snapshot_subject, partition_of, token
from crr.view.snapshot_reader import SnapshotContents, read_snapshot
from tests.support.faults import eventually, stored_events
from tests.support.projector import (
    publish_catalog,
    publish_report,
    running_partitions,
    stored_host,
)

HOSTS = [f"gpu-{i:03d}.dc{i % 3}" for i in range(16)] + ["ünïcode host", "x"]


async def settled(nc: Client, want: dict[str, tuple[float, list[str]]]) -> SnapshotContents:
    """The snapshot once it covers the last event and every host is as `want` says."""
    async def check() -> SnapshotContents | None:
        last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
        snap = await read_snapshot(nc)
        if snap.projector_position < last:
            return None
        have = {h: (s.values["scratch_free"].value, s.values["datasets"].value)
                for h, s in snap.hosts.items()}
        return snap if have == want else None

    found: SnapshotContents = await eventually(check, 20, f"snapshot = {want}")
    return found


async def report_all(nc: Client, reporter: str, phase: int) -> None:
    """One report from `reporter` for every host (value by phase)."""
    for i, host in enumerate(HOSTS):
        values = ({"scratch_free": float(100 * phase + i)} if reporter == "scratch"
                  else {"datasets": [f"d{phase}"]})
        await publish_report(nc, reporter, host, values, seq=phase, boot="b")


async def assert_replay_matches(nc: Client) -> None:
    """A replay of the whole CRR_EVENTS (whatever layouts stored it) gives every live host
    record byte for byte (`crr replay` reads partition-stored subjects as published)."""
    last = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.last_seq
    replay = Replay([CapturePoint(seq=last)])
    await run_replay(replay, nc=nc, file=None, stop_seq=last, label="test")
    mine = replay.captures[0].records()
    live = await read_snapshot_bytes(nc)
    hosts = [host_snapshot_subject(h) for h in HOSTS]
    assert [mine.get(s) for s in hosts] == [live[s][1] for s in hosts]


def assert_one_owner(running: list[Projector], n: int) -> None:
    """Each host is folded by exactly the partition the server's hash gives it."""
    if n == 1:
        assert set(running[0].state.hosts) == set(HOSTS)
        return
    owned = [set(p.state.hosts) for p in running]
    for k, hosts in enumerate(owned):
        assert hosts == {h for h in HOSTS if partition_of(token(h), n) == k}, k


async def test_partition_of_is_the_servers_partition(nc: Client) -> None:
    """`partition_of` gives the partition token nats-server's transform stores, for plain,
    dotted-escaped and non-ASCII host tokens."""
    await provision(nc, StreamSettings(partitions=5), update=True)
    hosts = [*HOSTS, *(f"n{i}" for i in range(200))]
    for host in hosts:
        await publish_report(nc, "scratch", host, {"scratch_free": 1.0})
    stored = {m.subject.split(".")[4]: int(m.subject.rsplit(".", 1)[1])
              for m in await stored_events(nc)}
    assert len(stored) == len(hosts)
    assert {t: partition_of(t, 5) for t in stored} == stored
    assert set(stored.values()) == set(range(5))


async def test_repartition_carries_state_and_keeps_one_writer(nc: Client) -> None:
    """1 → 2 → 3 → 1 projectors, each change with `--update`: after each, the reporter not
    re-reported keeps its values (loaded from events stored under the old layout), every
    host is owned by one partition only, nothing is dead-lettered, a restart without a
    layout change rewrites nothing, and a replay of the mixed-layout stream gives the live
    records."""
    await provision(nc)
    await publish_catalog(nc)
    await report_all(nc, "scratch", 1)
    await report_all(nc, "datasets", 1)
    want = {h: (100.0 + i, ["d1"]) for i, h in enumerate(HOSTS)}
    async with running_partitions(nc, 1, status_interval=0.2):
        await settled(nc, want)
        written = [(await stored_host(nc, h))[0] for h in HOSTS]
    scratch = 1
    for phase, (n, reporter) in enumerate([(2, "scratch"), (3, "datasets"), (1, "scratch")],
                                          start=2):
        await provision(nc, StreamSettings(partitions=n), update=True)
        async with running_partitions(nc, n, status_interval=0.2) as running:
            # Loaded across the change: nothing differs, so nothing is rewritten.
            await settled(nc, want)
            assert [(await stored_host(nc, h))[0] for h in HOSTS] == written
            await report_all(nc, reporter, phase)
            if reporter == "scratch":
                scratch = phase
            want = {h: (100.0 * scratch + i, want[h][1] if reporter == "scratch"
                        else [f"d{phase}"]) for i, h in enumerate(HOSTS)}
            before = await settled(nc, want)
            written = [(await stored_host(nc, h))[0] for h in HOSTS]
            assert_one_owner(running, n)
            await assert_replay_matches(nc)
            assert sum(p.deadletter_count for p in running) == 0
            assert len(before.projectors) == n
            assert {s.partitions for s in before.projectors} == {None if n == 1 else n}


async def test_projector_refuses_another_layout(nc: Client) -> None:
    """A projector whose partition count differs from the stream's stops at once, saying
    how to run it — an unpartitioned one beside partitions would write hosts twice."""
    await provision(nc, StreamSettings(partitions=2), update=True)
    with pytest.raises(StreamConfigError, match=r"stored for 2 .* this projector for 1"):
        await asyncio.wait_for(Projector(nc).run(), 10)
    with pytest.raises(StreamConfigError, match=r"--update"):
        await asyncio.wait_for(
            Projector(nc, settings=StreamSettings(partitions=3), partition=0).run(), 10)


async def test_events_stored_under_the_old_layout_after_it_stopped_are_folded(
        nc: Client) -> None:
    """Reports stored after the old layout's projectors stopped and before the change
    (under the old layout's subjects, past every old status) reach the new partitions:
    their restore folds on from the old position over every subject, not only the new
    layout's (the chaos run, seed 2 on an R3 cluster, lost such a report on 1 → 2)."""
    await provision(nc)
    await publish_catalog(nc)
    await report_all(nc, "scratch", 1)
    await report_all(nc, "datasets", 1)
    want = {h: (100.0 + i, ["d1"]) for i, h in enumerate(HOSTS)}
    async with running_partitions(nc, 1, status_interval=0.2):
        await settled(nc, want)
    for phase, n in enumerate([2, 3, 1], start=2):
        await report_all(nc, "scratch", phase)  # nobody folds it yet: stored, old layout
        want = {h: (100.0 * phase + i, ["d1"]) for i, h in enumerate(HOSTS)}
        await provision(nc, StreamSettings(partitions=n), update=True)
        async with running_partitions(nc, n, status_interval=0.2) as running:
            await settled(nc, want)
            assert_one_owner(running, n)
            await assert_replay_matches(nc)
