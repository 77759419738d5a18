"""crr.bus.natspy.parser: a pipelined publisher's acks handled as read, a status the usual way."""

from __future__ import annotations

import asyncio
import contextlib

import nats.js.errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.js.api import StreamConfig
from nats.protocol.parser import Parser

from crr.bus.natspy import parser as direct
from crr.bus.pipeline_publish import PipelinePublisher

pytestmark = pytest.mark.usefixtures("fast_paths_on")  # compares with nats-py itself


async def test_acks_are_handled_as_read_and_counted(nc: Client) -> None:
    """Every ack reaches the publisher directly (none through the subscription's queue);
    a refusal is still counted; the connection's message counters still move."""
    js = nc.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream("DIRECT_T")
    await js.add_stream(StreamConfig(name="DIRECT_T", subjects=["direct.>"], max_msgs=1000,
                                     max_msg_size=64))
    before = nc.stats["in_msgs"]
    async with PipelinePublisher(nc) as pipe:
        assert pipe._sub is not None
        assert direct.route(nc, pipe._sub, pipe._on_ack_bytes)  # (already routed: idempotent)
        for k in range(200):
            await pipe.publish(f"direct.{k % 7}", b"x" * 10)
        await pipe.publish("direct.big", b"y" * 100)  # over max_msg_size: refused
        await pipe.flush(10)
        assert pipe.stats.acked == 200
        assert pipe.stats.rejected == 1
        assert pipe._sub._received == 0  # nothing went through nats-py's queue
        assert pipe.stats.last_seq == 200
    assert nc.stats["in_msgs"] - before >= 201


async def test_a_status_takes_the_usual_path(nc: Client) -> None:
    """A publish with no stream behind it gets a 503 status (a header block): it reaches the
    subscription's callback, which leaves it to the publisher's guard (re-send, give up)."""
    async with PipelinePublisher(nc, ack_timeout=0.2, max_attempts=2) as pipe:
        assert pipe._sub is not None
        await pipe.publish("nostream.here", b"x")
        with contextlib.suppress(TimeoutError):
            await pipe.flush(5)
        assert pipe._sub._received >= 1
        assert pipe.stats.acked == 0
        assert pipe.stats.failed == 1


# -- the parser: the same calls as nats-py's for any chunking of the input -------------------

class Recorder:
    """What a parser calls on its client (the client methods the parsers call)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.stats = {"in_msgs": 0, "in_bytes": 0}

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), bytes(data),
                           None if headers is None else bytes(headers)))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_info(self, info: object) -> None:
        self.calls.append(("info", info))

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))


TOKEN = st.text(alphabet="abcXYZ019._$>*-", min_size=1, max_size=12)
PAYLOAD = st.binary(max_size=40)
HEADERS = st.sampled_from([b"NATS/1.0\r\nNats-Msg-Id: a/b/c/1\r\n\r\n",
                           b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", b"NATS/1.0\r\n\r\n"])
SPACE = st.sampled_from([" ", " ", "\t", "  "])


@st.composite
def operation(draw: st.DrawFn) -> bytes:
    """One server operation as nats-server writes it (and a few unusual spacings)."""
    kind = draw(st.sampled_from(["msg", "msg", "hmsg", "hmsg", "ping", "pong", "ok", "info",
                                 "err"]))
    sp = draw(SPACE)
    if kind in ("msg", "hmsg"):
        subject, sid = draw(TOKEN), draw(st.integers(1, 4))
        reply = draw(st.none() | TOKEN)
        data = draw(PAYLOAD)
        head = f"{subject}{sp}{sid}" + ("" if reply is None else f"{sp}{reply}")
        if kind == "msg":
            return f"MSG {head}{sp}{len(data)}\r\n".encode() + data + b"\r\n"
        hdr = draw(HEADERS)
        return (f"HMSG {head}{sp}{len(hdr)}{sp}{len(hdr) + len(data)}\r\n".encode()
                + hdr + data + b"\r\n")
    return {"ping": b"PING\r\n", "pong": b"PONG\r\n", "ok": b"+OK\r\n",
            "info": b'INFO {"server_id":"x","max_payload":1048576}\r\n',
            "err": b"-ERR 'Stale Connection'\r\n"}[kind]


async def _feed(parser: Parser, stream: bytes, cuts: list[int]) -> None:
    at = 0
    for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        if cut >= at:
            await parser.parse(stream[at:cut])
            at = cut


@settings(max_examples=300, deadline=None)
@given(st.lists(operation(), max_size=12), st.lists(st.integers(0, 10_000), max_size=8),
       st.booleans())
def test_the_reader_calls_what_nats_py_calls(ops: list[bytes], cuts: list[int],
                                             routed: bool) -> None:
    """For any operations cut anywhere into reads, `Reader` makes nats-py's calls in
    nats-py's order; with routes, routed messages go to their handler instead (in order)
    and everything else is unchanged."""
    stream = b"".join(ops)
    theirs, ours = Recorder(), Recorder()
    reader = direct.Reader(ours, None)  # type: ignore[arg-type]
    taken: list[int] = []
    if routed:
        def plain(s: bytes, d: bytes) -> None:
            taken.append(2)
            ours.calls.append(("msg", 2, s, b"", d, None))

        def full(s: bytes, r: bytes, d: bytes, h: bytes | None) -> bool:
            if h is not None and b" 100 " in h:
                return False  # (a status: the usual path)
            taken.append(3)
            ours.calls.append(("msg", 3, s, r, d, h))
            return True

        reader.plain[2] = plain
        reader.full[3] = full

    async def both() -> None:
        await _feed(Parser(theirs), stream, cuts)
        await _feed(reader, stream, cuts)

    asyncio.run(both())
    assert _without_plain_replies(ours.calls) == _without_plain_replies(theirs.calls)
    assert ours.stats["in_msgs"] == len(taken)  # (nats-py's _process_msg counts the rest)
    if routed:
        routable = [c for c in theirs.calls if c[0] == "msg" and (
            (c[1] == 3 and not (isinstance(c[5], bytes) and b" 100 " in c[5]))
            or (c[1] == 2 and c[5] is None))]
        assert len(taken) == len(routable)


def _without_plain_replies(calls: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """A plain route's handler gets (subject, data) only: compare without the reply."""
    return [("msg", 2, c[2], b"", c[4], None) if c[0] == "msg" and c[1] == 2 and c[5] is None
            else c for c in calls]


async def test_the_reader_takes_over_a_half_read_message() -> None:
    """Installed between two reads of one message, it continues where nats-py stopped."""
    old, new = Recorder(), Recorder()
    parser = Parser(old)
    await parser.parse(b"HMSG a.b 1 r 12 15\r\nNATS/1.0\r\n")
    reader = direct.Reader(new, parser)  # type: ignore[arg-type]
    await reader.parse(b"\r\nxyz\r\nPING\r\n")
    assert old.calls == []
    assert new.calls == [("msg", 1, b"a.b", b"r", b"xyz", b"NATS/1.0\r\n\r\n"), ("ping",)]
