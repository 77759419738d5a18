"""crr.bus.follower on a real server: last-per-subject load, live, regression → reload."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

import crr.bus.follower
import crr.bus.leader_floor
from crr.bus.connection import connect
from crr.bus.follower import Follower, load_compacted
from crr.bus.leader_floor import LeaderFloor, leader_last_seq
from crr.bus.ordered import StoredMessage
from crr.bus.server import NatsServer
from crr.schemas.errors import CrrError, CrrTimeoutError, StreamNotFoundError
from tests.support.faults import eventually

STREAM = "FOLLOW_TEST"


@dataclass
class Load:
    """One (re)load: subject → data, in arrival order."""

    records: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Sink:
    """What a follower's callbacks saw."""

    loads: list[Load] = field(default_factory=list)
    current: dict[str, bytes] | None = None
    live: list[tuple[str, bytes]] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def new_load(self) -> Load:
        load = Load()
        self.loads.append(load)
        return load

    def load(self, load: Load, m: StoredMessage) -> None:
        load.records[m.subject] = m.data

    def loaded(self, load: Load) -> None:
        self.current = dict(load.records)
        self.finished.set()

    def on_live(self, m: StoredMessage) -> None:
        assert self.current is not None
        self.current[m.subject] = m.data
        self.live.append((m.subject, m.data))

    def follower(self, nc: Client) -> Follower[Load]:
        return Follower(nc, stream=STREAM, subject="f.>", new_load=self.new_load,
                        load=self.load, loaded=self.loaded, live=self.on_live,
                        idle_heartbeat=0.5, name="test follower")


async def make_stream(nc: Client) -> None:
    """A compacted stream (last record per subject), as CRR_SNAPSHOT is."""
    await nc.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["f.>"],
                                                 max_msgs_per_subject=1))


async def put(nc: Client, records: list[tuple[str, bytes]]) -> int:
    """Publish (acked); the last sequence."""
    seq = 0
    for subject, data in records:
        seq = int((await nc.jetstream().publish(subject, data)).seq)
    return seq


@pytest.fixture
async def server_and_client(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Client]]:
    """A restartable server (same port and store) and a client that reconnects to it."""
    with NatsServer(tmp_path / "store") as server:
        async with connect(server.url, name="follower-test") as nc:
            await make_stream(nc)
            yield server, nc


async def test_load_then_live(nc: Client) -> None:
    """The load sees the last record per subject, `loaded` once, then live records in order."""
    await make_stream(nc)
    await put(nc, [("f.a", b"a1"), ("f.b", b"b1"), ("f.a", b"a2"), ("f.c", b"c1")])
    sink = Sink()
    follower = sink.follower(nc)
    try:
        await follower.start()
        await follower.wait_ready(10)
        assert follower.ready
        assert not follower.loading
        assert len(sink.loads) == 1
        assert sink.current == {"f.a": b"a2", "f.b": b"b1", "f.c": b"c1"}
        await put(nc, [("f.b", b"b2"), ("f.d", b"d1")])
        await eventually(lambda: len(sink.live) == 2, 10, "two live records")
        assert sink.live == [("f.b", b"b2"), ("f.d", b"d1")]
        assert sink.current == {"f.a": b"a2", "f.b": b"b2", "f.c": b"c1", "f.d": b"d1"}
        assert follower.last is not None
        assert follower.last.data == b"d1"
    finally:
        await follower.stop()


async def test_empty_stream_is_loaded_at_once(nc: Client) -> None:
    """An empty stream completes the load at start; the first record is live."""
    await make_stream(nc)
    sink = Sink()
    follower = sink.follower(nc)
    try:
        await follower.start()
        await follower.wait_ready(5)
        assert sink.current == {}
        await put(nc, [("f.x", b"x")])
        await eventually(lambda: sink.live == [("f.x", b"x")], 10, "the live record")
    finally:
        await follower.stop()


async def test_wait_ready_before_start_and_double_start(nc: Client) -> None:
    """Misuse is a clear CrrError, not a hang."""
    await make_stream(nc)
    follower = Sink().follower(nc)
    with pytest.raises(CrrError, match="not started"):
        await follower.wait_ready(1)
    await follower.start()
    try:
        with pytest.raises(CrrError, match="already started"):
            await follower.start()
    finally:
        await follower.stop()


async def test_reload_after_the_stream_went_backwards(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """A server restart that comes back with a stream below the follower's position (as
    after a crash that lost acknowledged records) makes it reload on a new consumer: a
    second load, swapped in whole; live records then come through the new consumer."""
    server, nc = server_and_client
    await put(nc, [(f"f.old{i}", b"old") for i in range(8)])
    sink = Sink()
    follower = sink.follower(nc)
    try:
        await follower.start()
        await follower.wait_ready(10)
        assert sink.current is not None
        assert len(sink.current) == 8
        sink.finished.clear()
        # The same stream with fewer records: sequence numbers re-used below the position.
        await nc.jetstream().delete_stream(STREAM)
        await make_stream(nc)
        await put(nc, [("f.new0", b"n0"), ("f.new1", b"n1")])
        server.kill()
        server.start()
        await asyncio.wait_for(sink.finished.wait(), 30)
        assert follower.reloads == 1
        assert len(sink.loads) == 2
        assert sink.current == {"f.new0": b"n0", "f.new1": b"n1"}
        await put(nc, [("f.new2", b"n2")])
        await eventually(lambda: sink.live[-1:] == [("f.new2", b"n2")], 10, "live after reload")
    finally:
        await follower.stop()


async def test_no_reload_when_the_stream_is_intact(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """A clean restart keeps the stream: the reconnect check passes and nothing reloads."""
    server, nc = server_and_client
    await put(nc, [("f.a", b"1"), ("f.b", b"2")])
    sink = Sink()
    follower = sink.follower(nc)
    try:
        await follower.start()
        await follower.wait_ready(10)
        reconnected = asyncio.Event()
        nc.options["crr_reconnect_listeners"].append(reconnected.set)
        await nc.flush()
        server.stop()
        server.start()
        await asyncio.wait_for(reconnected.wait(), 30)
        check = follower.check_task
        assert check is not None
        assert await asyncio.wait_for(check, 30) is True
        assert follower.reloads == 0
        assert len(sink.loads) == 1
    finally:
        await follower.stop()


async def test_load_compacted_reads_last_per_subject(nc: Client) -> None:
    """The load-only entry point: every subject's last record, then it stops."""
    await make_stream(nc)
    await put(nc, [("f.a", b"1"), ("f.a", b"2"), ("f.b", b"3")])
    got: dict[str, bytes] = {}
    count = await load_compacted(nc, stream=STREAM, subject="f.>",
                                 handler=lambda m: got.__setitem__(m.subject, m.data),
                                 timeout=10)
    assert count == 2
    assert got == {"f.a": b"2", "f.b": b"3"}


async def test_load_compacted_on_a_missing_stream_fails_clearly(nc: Client) -> None:
    """No such stream: StreamNotFoundError at once (the server's NotFoundError as its
    cause), not a hang."""
    with pytest.raises(StreamNotFoundError, match="NO_SUCH_STREAM: no crr streams") as caught:
        await load_compacted(nc, stream="NO_SUCH_STREAM", subject="zz.>",
                             handler=lambda _m: None, timeout=2)
    assert isinstance(caught.value.__cause__, nats.js.errors.NotFoundError)


async def test_a_stateless_follower_still_tells_load_from_live(nc: Client) -> None:
    """A follower whose load state is None (crr latency) still hands loaded records to `load`
    and later ones to `live`."""
    await make_stream(nc)
    await put(nc, [("f.a", b"1"), ("f.b", b"2")])
    loaded: list[bytes] = []
    live: list[bytes] = []
    follower: Follower[None] = Follower(
        nc, stream=STREAM, subject="f.>", new_load=lambda: None,
        load=lambda _, m: loaded.append(m.data), loaded=lambda _: None,
        live=lambda m: live.append(m.data))
    try:
        await follower.start()
        await follower.wait_ready(10)
        await put(nc, [("f.a", b"3")])
        await eventually(lambda: live == [b"3"], 10, "the live record")
        assert loaded == [b"1", b"2"]
    finally:
        await follower.stop()


# A replica behind the leader.  On one server the consumer always reads the leader's
# copy, so the leader's answer is replaced by a higher sequence: what a load from a
# replica that rejoined after a partition sees (the docker partition test meets the
# real thing: tests/system/test_docker_partitions.py, the view's node cut off).


async def test_leader_last_seq_asks_for_the_newest_of_a_wildcard(nc: Client) -> None:
    await make_stream(nc)
    assert await leader_last_seq(nc, STREAM, "f.>") == 0  # nothing stored: no floor to reach
    last = await put(nc, [("f.a", b"1"), ("f.b", b"2"), ("f.a", b"3")])
    assert await leader_last_seq(nc, STREAM, "f.>") == last
    assert await leader_last_seq(nc, STREAM, "f.b") == last - 1


def test_a_floor_only_comes_down() -> None:
    floor = LeaderFloor(10)
    assert not floor.reached(9)
    assert floor.reached(10)
    floor.lower(12)  # written after the load started: not waited for
    assert floor.floor == 10
    floor.lower(None)  # the leader could not be asked
    assert floor.floor == 10
    floor.lower(7)  # the floor record was purged
    assert floor.reached(7)
    assert LeaderFloor(None).reached(0)


def leader_ahead(monkeypatch: pytest.MonkeyPatch, ahead: list[int]) -> None:
    """The stream leader answers `ahead[0]` more than the server's newest sequence."""
    real = crr.bus.leader_floor.leader_last_seq

    async def ahead_of(nc: Client, stream: str, subject: str,
                       timeout: float = 2.0) -> int | None:
        seq = await real(nc, stream, subject, timeout)
        return None if seq is None else seq + ahead[0]

    monkeypatch.setattr(crr.bus.leader_floor, "leader_last_seq", ahead_of)
    monkeypatch.setattr(crr.bus.follower, "leader_last_seq", ahead_of)


async def test_a_follower_behind_the_leader_is_ready_only_once_caught_up(
        nc: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    await make_stream(nc)
    await put(nc, [("f.a", b"a1"), ("f.b", b"b1")])
    leader_ahead(monkeypatch, [2])
    sink = Sink()
    follower = sink.follower(nc)
    try:
        await follower.start()
        await sink.finished.wait()  # the load is complete (and serves) ...
        assert sink.current == {"f.a": b"a1", "f.b": b"b1"}
        assert not follower.ready  # ... but is not ready: the leader holds 2 more records
        assert "the stream leader's was at 4" in caplog.text
        with pytest.raises(CrrTimeoutError, match="copy is at seq 2, the stream leader's was at 4"):
            await follower.wait_ready(0.2)
        await put(nc, [("f.c", b"c1")])
        await eventually(lambda: sink.live == [("f.c", b"c1")], 10, "a live record")
        assert not follower.ready
        await put(nc, [("f.a", b"a2")])  # seq 4: caught up
        await follower.wait_ready(10)
        assert sink.current == {"f.a": b"a2", "f.b": b"b1", "f.c": b"c1"}
    finally:
        await follower.stop()


async def test_a_purged_floor_record_is_not_waited_for(
        nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's newest record was deleted while the follower caught up: the recheck
    brings the floor down and the follower becomes ready without it."""
    await make_stream(nc)
    await put(nc, [("f.a", b"a1"), ("f.b", b"b1")])
    ahead = [1]
    leader_ahead(monkeypatch, ahead)
    sink = Sink()
    follower = sink.follower(nc)
    try:
        await follower.start()
        await sink.finished.wait()
        assert not follower.ready
        ahead[0] = 0  # the leader's answer now: what this server holds
        await follower.wait_ready(10)
    finally:
        await follower.stop()


async def test_load_compacted_reads_on_until_caught_up(
        nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    await make_stream(nc)
    await put(nc, [("f.a", b"a1"), ("f.b", b"b1")])
    leader_ahead(monkeypatch, [1])
    got: dict[str, bytes] = {}
    task = asyncio.create_task(load_compacted(
        nc, stream=STREAM, subject="f.>", handler=lambda m: got.__setitem__(m.subject, m.data),
        timeout=20))
    await eventually(lambda: got == {"f.a": b"a1", "f.b": b"b1"}, 10, "the load")
    assert not task.done()
    await put(nc, [("f.a", b"a2")])
    assert await asyncio.wait_for(task, 10) == 3
    assert got == {"f.a": b"a2", "f.b": b"b1"}


async def test_load_compacted_behind_until_the_timeout_says_so(
        nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    await make_stream(nc)
    await put(nc, [("f.a", b"a1")])
    leader_ahead(monkeypatch, [5])
    with pytest.raises(CrrTimeoutError, match="copy is at seq 1, the stream leader's was at 6"):
        await load_compacted(nc, stream=STREAM, subject="f.>", handler=lambda m: None,
                             timeout=0.5)
