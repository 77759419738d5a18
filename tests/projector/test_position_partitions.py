"""A partition's `covered_seq` spans the other partitions' events, so readers can follow N
partitioned projectors with one position (the minimum)."""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.streams import StreamSettings, provision
from crr.projections.coverage import Coverage
from crr.projector.service import Projector
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_PROJECTOR
from crr.view.scheduler_view import loaded_view
from tests.support.faults import eventually, projector_status
from tests.support.projector import publish_catalog, publish_report, running_partitions


async def partition_of(nc: Client, seq: int) -> int:
    """The partition the server assigned the stored host event at `seq` (its last token)."""
    m = await nc.jetstream().get_msg(EVENTS_STREAM, seq=seq)
    assert m.subject is not None
    return int(m.subject.rsplit(".", 1)[1])


async def test_idle_partition_covers_the_other_partitions_events(nats_url: str) -> None:
    """Given two partition projectors and a stream whose last events all belong to partition 1,
    when both are caught up, then partition 0's `covered_seq` reaches the stream's last
    sequence although its own `last_seq` is older, and the readers' minimum is that last
    sequence."""
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2))
        async with running_partitions(nc, 2, status_interval=0.2):
            await publish_catalog(nc)
            # Hosts until one lands in each partition, then more of partition 1's only.
            owner: dict[str, int] = {}
            i = 0
            while set(owner.values()) != {0, 1}:
                host = f"node{i}"
                owner[host] = await partition_of(
                    nc, await publish_report(nc, "scratch", host, {"scratch_free": 1.0}))
                i += 1
            in_one = next(h for h, k in owner.items() if k == 1)
            for seq in range(2, 6):
                last = await publish_report(nc, "scratch", in_one, {"scratch_free": float(seq)},
                                            seq=seq)
            own_last = 0  # partition 0's last event: its last host event or the catalog
            for s in range(1, last + 1):
                if await partition_of_or_none(nc, s) in (0, None):
                    own_last = s

            async def both_cover() -> list[ProjectorStatus] | None:
                st = [await projector_status(nc, f"{SNAPSHOT_PROJECTOR}.{k}") for k in (0, 1)]
                return st if all(s.covered_seq >= last for s in st) else None

            statuses: list[ProjectorStatus] = await eventually(both_cover, 10,
                                                               "both partitions cover")
    zero, one = statuses
    assert zero.last_seq == own_last < last  # its own events end earlier...
    assert zero.covered_seq == last  # ...but nothing of its own comes before `last`
    assert zero.stream_last_seq == last  # the whole stream's, not its filter's
    assert one.last_seq == one.covered_seq == last
    assert (zero.partitions, one.partitions) == (2, 2)
    coverage = Coverage()
    for seq, (k, st) in enumerate(((0, zero), (1, one))):
        coverage.add(f"{SNAPSHOT_PROJECTOR}.{k}", seq + 1, st)
    assert coverage.position == last


async def partition_of_or_none(nc: Client, seq: int) -> int | None:
    """`partition_of` for host events; None for the catalog (which every partition takes)."""
    m = await nc.jetstream().get_msg(EVENTS_STREAM, seq=seq)
    assert m.subject is not None
    return int(m.subject.rsplit(".", 1)[1]) if ".host." in m.subject else None


def test_partition_needs_partitioned_settings() -> None:
    """A partition number without (or beyond) the stream's partition count is refused at once,
    with the reason."""
    with pytest.raises(CrrError, match="needs StreamSettings"):
        Projector(None, partition=0)  # type: ignore[arg-type]  # never connects
    with pytest.raises(CrrError, match=r"N > max\(1, 2\)"):
        Projector(None, partition=2, settings=StreamSettings(partitions=2))  # type: ignore[arg-type]


async def test_wait_until_does_not_wait_for_an_idle_partitions_status_interval(
        nats_url: str) -> None:
    """Given two partitions whose periodic status is an hour apart, when reports land in one
    partition at a time, then a view's `wait_until` on each returns at once: the idle
    partition hears the other's status and writes its own (its `covered_seq` moves past)."""
    async with connect(nats_url, name="crr-test") as nc:
        await provision(nc, StreamSettings(partitions=2), update=True)
        async with (running_partitions(nc, 2, status_interval=3600),
                    loaded_view(nc, 10) as view):
            await publish_catalog(nc)
            seen: set[int] = set()
            i = 0
            while seen != {0, 1} or i < 8:
                host = f"node{i}"
                seq = await publish_report(nc, "scratch", host, {"scratch_free": float(i)})
                seen.add(await partition_of(nc, seq))
                await view.wait_until(seq, timeout=5)
                record = view.table.get(host)
                assert record is not None
                assert record.values["scratch_free"].value == float(i)
                i += 1
