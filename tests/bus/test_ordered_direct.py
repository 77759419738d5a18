"""crr.bus.natspy.ordered_consumer on a real server: an ordered consumer's data messages taken as
read
keep nats-py's ordered-consumer guarantees — order, a gap reset, idle heartbeats, flow
control while the handler waits, a server restart."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.js.api import DeliverPolicy, StreamConfig

from crr.bus.connection import connect
from crr.bus.natspy.ordered_consumer import FLOW_WINDOW, Backlog
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.server import NatsServer
from tests.support.faults import eventually

pytestmark = pytest.mark.usefixtures("fast_paths_on")  # compares with nats-py itself

STREAM = "ODIRECT"


async def _stream(nc: Client, n: int, *, start: int = 0, size: int = 20) -> None:
    """`n` messages on `od.<k % 5>` (every third one without headers)."""
    js = nc.jetstream()
    if start == 0:
        await js.add_stream(StreamConfig(name=STREAM, subjects=["od.>"]))
    for k in range(start, start + n):
        body = b"%06d" % k + b"x" * size
        if k % 3 == 2:
            await js.publish(f"od.{k % 5}", body)
        else:
            await js.publish(f"od.{k % 5}", body, headers={"Nats-Msg-Id": f"m{k}"})


def _reader(nc: Client, out: list[StoredMessage], *, direct: bool = True,
            handler: Callable[[StoredMessage], Awaitable[None] | None] | None = None,
            idle_heartbeat: float = 2.0) -> OrderedReader:
    return OrderedReader(nc, stream=STREAM, subject="od.>", handler=handler or out.append,
                         deliver=DeliverPolicy.ALL, backpressure=True, direct=direct,
                         idle_heartbeat=idle_heartbeat)


def _sub(reader: OrderedReader) -> Any:
    """The nats-py subscription under the reader's push subscription."""
    return getattr(reader._sub, "_sub", None)


def _jsi(reader: OrderedReader) -> Any:
    return _sub(reader)._jsi


def _seqs(out: list[StoredMessage]) -> list[int]:
    return [m.seq for m in out]


async def test_the_same_messages_as_nats_pys_path(nc: Client) -> None:
    """Taken as read, every message arrives once, in order, with the same sequence, time,
    subject, data, headers and pending as through nats-py's Msg path."""
    await _stream(nc, 600)
    fast: list[StoredMessage] = []
    slow: list[StoredMessage] = []
    a, b = _reader(nc, fast), _reader(nc, slow, direct=False)
    await a.start()
    await b.start()
    await a.wait_ready(10)
    await b.wait_ready(10)
    assert fast == slow
    assert _seqs(fast) == list(range(1, 601))
    assert fast[0].headers == {"Nats-Msg-Id": "m0"}
    assert fast[2].headers is None
    assert a._direct is not None
    assert a._direct.direct == 600
    assert b._direct is None
    await a.stop()
    await b.stop()


async def test_a_gap_resets_the_consumer_and_the_route_follows(nc: Client) -> None:
    """A consumer sequence that skips (a lost message) is left to nats-py, which recreates
    the consumer from the last stream sequence; nothing is lost or repeated, and the new
    consumer's messages are taken as read again."""
    await _stream(nc, 100)
    out: list[StoredMessage] = []
    reader = _reader(nc, out)
    await reader.start()
    await reader.wait_ready(10)
    d = reader._direct
    assert d is not None
    sid = _sub(reader)._id
    _jsi(reader)._dseq += 1  # the next delivery looks like one after a lost message
    await _stream(nc, 100, start=100)
    await eventually(lambda: len(out) >= 200, 10, "all 200 messages after the reset")
    assert _seqs(out) == list(range(1, 201))
    assert _sub(reader)._id != sid  # (a new consumer)
    taken = d.direct
    await _stream(nc, 50, start=200)
    await eventually(lambda: len(out) >= 250, 10, "the messages after the reset")
    assert _seqs(out) == list(range(1, 251))
    assert d.direct == taken + 50
    await reader.stop()


async def test_idle_heartbeats_find_no_mismatch(nc: Client) -> None:
    """Heartbeats (nats-py's path) are checked against what was taken as read: no reset."""
    await _stream(nc, 30)
    out: list[StoredMessage] = []
    reader = _reader(nc, out, idle_heartbeat=0.1)
    await reader.start()
    await reader.wait_ready(10)
    jsi = _jsi(reader)
    checks: list[object] = []
    original = jsi.check_for_sequence_mismatch

    async def counted(msg: object) -> object:
        did = await original(msg)
        checks.append(did)
        return did

    jsi.check_for_sequence_mismatch = counted
    sid = _sub(reader)._id
    await eventually(lambda: len(checks) >= 3, 10, "three idle heartbeats")
    assert not any(checks)
    assert _sub(reader)._id == sid
    await _stream(nc, 10, start=30)
    await eventually(lambda: len(out) >= 40, 10, "the messages after the heartbeats")
    assert _seqs(out) == list(range(1, 41))
    assert reader._direct is not None
    assert reader._direct.direct == 40
    await reader.stop()


async def test_flow_control_waits_for_a_waiting_handler(nc: Client) -> None:
    """While the handler waits, later messages wait in order in the backlog (not nats-py's
    queue) and the server's flow-control request stays unanswered (the rest stays in the
    stream); once it is done, everything arrives, once and in order."""
    await _stream(nc, 3000, size=2000)
    out: list[StoredMessage] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def handler(m: StoredMessage) -> Awaitable[None] | None:
        out.append(m)
        return gate if m.seq == 10 else None

    reader = _reader(nc, out, handler=handler)
    await reader.start()
    jsi = _jsi(reader)
    await eventually(lambda: jsi._fcr is not None, 20, "a flow-control request held")
    assert len(out) == 10
    assert _sub(reader)._pending_queue.qsize() == 0
    assert 0 < reader.waiting < 3000
    gate.set_result(None)
    await reader.wait_ready(30)
    assert _seqs(out) == list(range(1, 3001))
    d = reader._direct
    assert d is not None
    assert d.handled == 3000
    assert d.blocked is None
    await _stream(nc, 5, start=3000)
    await eventually(lambda: len(out) >= 3005, 10, "messages after the wait")
    assert d.direct > 10
    await reader.stop()


async def test_a_server_restart_resumes_after_the_last_message(nats_server: NatsServer) -> None:
    """The server restarts (its ephemeral consumer gone): nats-py reconnects, its missed
    heartbeats reset the consumer after the last message taken, and the messages stored
    after the restart arrive once, in order, taken as read."""
    async with connect(nats_server.url, name="od-test") as nc:
        await _stream(nc, 50)
        out: list[StoredMessage] = []
        reader = _reader(nc, out, idle_heartbeat=0.2)
        await reader.start()
        await reader.wait_ready(10)
        d = reader._direct
        assert d is not None
        assert d.direct == 50
        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)  # same port, same store
        await eventually(lambda: nc.is_connected, 30, "the client reconnected")
        await _stream(nc, 20, start=50)
        await eventually(lambda: len(out) >= 70, 30, "the messages after the restart")
        assert _seqs(out) == list(range(1, 71))
        assert d.direct > 50
        await reader.stop()


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_a_stalled_server_waits_until_the_backlog_is_handled(nc: Client) -> None:
    """A handler that waits long: the server stalls on its flow-control window and says so
    in its idle heartbeats; those are not answered while received messages wait, so no
    further window arrives (what the reader holds stays bounded, the rest waits in the
    stream), and nothing is lost or reordered once the handler goes on."""
    total = 5000
    await _stream(nc, total, size=2000)  # ~10 MB: more than the server's first window
    out: list[StoredMessage] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def handler(m: StoredMessage) -> Awaitable[None] | None:
        out.append(m)
        return gate if m.seq == 10 else None

    reader = _reader(nc, out, handler=handler, idle_heartbeat=0.2)
    await reader.start()
    d = reader._direct
    assert d is not None
    jsi = _jsi(reader)
    await eventually(lambda: d.stalls >= 1, 20, "a heartbeat saying the server is stalled")
    received = jsi._fciseq
    await eventually(lambda: d.stalls >= 3, 20, "two more of them")
    assert jsi._fciseq == received, "the server sent more while the backlog waited"
    assert received < total
    assert len(out) == 10
    assert reader.waiting == len(d.backlog) == received - 10
    assert _sub(reader)._pending_queue.qsize() == 0
    assert d.backlog.peak <= FLOW_WINDOW
    gate.set_result(None)
    await reader.wait_ready(30)
    assert _seqs(out) == list(range(1, total + 1))
    assert out[0].headers == {"Nats-Msg-Id": "m0"}
    assert out[2].headers is None
    assert (d.handled, len(d.backlog), d.blocked) == (total, 0, None)
    await reader.stop()


_entries = st.lists(st.tuples(
    st.integers(0, 2**63), st.integers(0, 2**63), st.integers(0, 2**63),
    st.binary(max_size=40), st.none() | st.binary(max_size=40), st.binary(max_size=300)),
    max_size=30)


@given(first=_entries, second=_entries, taken=st.integers(0, 30))
def test_the_backlog_gives_back_what_it_kept_in_order(
        first: list[tuple[int, int, int, bytes, bytes | None, bytes]],
        second: list[tuple[int, int, int, bytes, bytes | None, bytes]], taken: int) -> None:
    """Whatever is added, taken and compacted in between, `take` returns every entry
    exactly as added, in order, and an emptied backlog holds no bytes."""
    backlog = Backlog()
    for e in first:
        backlog.add(*e)
    got = [backlog.take() for _ in range(min(taken, len(first)))]
    backlog.compact()
    for e in second:
        backlog.add(*e)
    while backlog:
        got.append(backlog.take())
    assert got == first + second
    assert (len(backlog), backlog.size) == (0, 0)
