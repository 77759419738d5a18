"""`PipelinePublisher` frames messages itself (`Framer`): the bytes nats-py would send, or
nats-py's own `publish` for anything unusual; end to end on a real server."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from crr.bus.natspy.framing import Framer, header_block
from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from crr.schemas.errors import NoRespondersError
from crr.schemas.subjects import SNAPSHOT_STREAM, event_subject, host_snapshot_subject
from tests.support.faults import eventually

_NAMES = st.one_of(st.sampled_from(["Crr-Columns", "Nats-Msg-Id", "traceparent"]),
                   st.text(min_size=0, max_size=6))
_VALUES = st.one_of(st.text(max_size=30), st.sampled_from(
    ['{"host":"h","v":{"a":1.5}}', " padded ", "a\r\nPUB x 1", "ünï\u2028", ""]))


def _frames(nc: Client, call: Any) -> tuple[list[bytes], str | None]:
    """The frames `call()` hands to the connection, and the error it raised (its type)."""
    sent: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        sent.append(bytes(cmd))

    nc._send_command = capture  # type: ignore[method-assign]
    nc._flush_queue = None
    try:
        asyncio.run(call())
    except Exception as exc:
        return sent, type(exc).__name__
    return sent, None


@settings(max_examples=300, deadline=None)
@given(subject=st.sampled_from(["crr.v1.snapshot.host.n1", "a b", "", "x\r\ny"]),
       payload=st.binary(max_size=64),
       headers=st.none() | st.dictionaries(_NAMES, _VALUES, max_size=3))
def test_frames_are_what_nats_py_sends(subject: str, payload: bytes,
                                       headers: dict[str, str] | None) -> None:
    """Any subject, payload and headers: the frame (or the error) is nats-py's own."""
    reply = "_INBOX.crrpipe.abc.7"
    with mock.patch.object(Client, "is_connected", new_callable=mock.PropertyMock,
                           return_value=True):
        ours = _frames(nc := Client(), lambda: Framer(nc).send(subject, payload, reply,
                                                               headers))
        theirs = _frames(nc := Client(), lambda: nc.publish(subject, payload, reply=reply,
                                                            headers=headers))
    assert ours == theirs


def test_header_block_leaves_what_nats_py_rewrites_to_it() -> None:
    assert header_block({"Crr-Columns": '{"a":1}'}) == b'NATS/1.0\r\nCrr-Columns: {"a":1}\r\n\r\n'
    assert header_block({}) == b"NATS/1.0\r\n\r\n"
    for odd in ({"A": " x"}, {"A": "x\n"}, {"A B": "x"}, {"": "x"}):
        assert header_block(odd) is None, odd


async def test_headers_arrive_as_published(nc: Client) -> None:
    """Through a real server: headers framed here and by nats-py (values it rewrites) are
    stored as a nats-py publish stores them.  (ASCII values: nats-py reads others back as
    `email.header.Header` objects, whoever framed them.)"""
    await provision(nc)
    cases: list[dict[str, str] | None] = [
        {"Crr-Columns": '{"host":"n0","v":{"a":"x"}}'}, {}, None, {"X-Odd": " padded "},
        {"Nats-Msg-Id": "m1", "Crr-Columns": "{}"}]
    async with PipelinePublisher(nc) as pipe:
        for i, headers in enumerate(cases):
            await pipe.publish(host_snapshot_subject(f"n{i}"), b"%d" % i, headers)
        await pipe.flush(10)
        assert pipe.stats.acked == len(cases)
    js = nc.jetstream()
    for i, headers in enumerate(cases):
        msg = await js.get_last_msg(SNAPSHOT_STREAM, host_snapshot_subject(f"n{i}"))
        assert msg.data == b"%d" % i
        expected = {k: v.strip() for k, v in (headers or {}).items()} or None
        assert msg.headers == expected, i


@pytest.mark.parametrize("size", [0, 1])
async def test_oversized_payloads_get_nats_pys_error(nc: Client, size: int) -> None:
    """A payload past max_payload (by `size`) raises nats-py's MaxPayloadError; at the limit
    it is sent."""
    framer = Framer(nc)
    payload = b"x" * (nc.max_payload + size)
    if size:
        with pytest.raises(Exception, match="payload") as err:
            await framer.send("crr.test.big", payload, "", None)
        assert type(err.value).__name__ == "MaxPayloadError"
    else:
        await framer.send("crr.test.big", payload, "", None)
        await nc.flush()


async def test_a_deleted_stream_ends_a_failing_flush_at_once(nc: Client) -> None:
    """`flush(fail_unanswered=True)` on subjects no stream captures (a deleted stream): a
    NoRespondersError at the first 503, well before the ack timeout, with what was in
    flight given up (counted failed, nothing left to re-send after the stream is back)."""
    async with PipelinePublisher(nc, ack_timeout=30.0) as pipe:
        for i in range(20):
            await pipe.publish(f"nostream.{i}", b"x")
        started = time.monotonic()
        with pytest.raises(NoRespondersError, match="no responders"):
            await pipe.flush(60.0, fail_unanswered=True)
        assert time.monotonic() - started < 10.0  # not the 30 s ack timeout
        assert pipe.stats.no_responders >= 1
        assert pipe.stats.failed == 20
        await pipe.flush(1.0)  # nothing in flight any more


async def test_abandon_gives_up_what_is_in_flight_and_sends_no_more(nc: Client) -> None:
    """A writer whose flush failed writes newer data next: `abandon()` gives up what is in
    flight (counted failed) and no re-send of it follows — an old record re-sent after
    the new write would be left last.  (The witness: a second pipeline with the same ack
    timeout re-sends its own unanswered message meanwhile, twice.)"""
    seen: list[str] = []

    async def count(msg: Any) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe("nostream.>", cb=count)
    witness = PipelinePublisher(nc, ack_timeout=0.2)
    await witness.start()
    try:
        async with PipelinePublisher(nc, ack_timeout=0.2) as pipe:
            for i in range(5):
                await pipe.publish(f"nostream.old.{i}", b"old")
            await nc.flush()
            assert await pipe.abandon() == 5
            assert pipe.in_flight == 0
            assert pipe.stats.failed == 5
            sent = pipe.stats.resent  # re-sends made before it was abandoned (if any)

            def old_copies() -> int:
                return sum(s.startswith("nostream.old.") for s in seen)

            await eventually(lambda: old_copies() == 5 + sent, 10,
                             "every copy sent before abandon() delivered", every=0.02)
            await witness.publish("nostream.witness", b"w")

            await eventually(lambda: witness.stats.resent >= 2, 10,
                             "the witness re-sent twice", every=0.02)
            await nc.flush()
            assert pipe.stats.resent == sent
            assert old_copies() == 5 + sent
    finally:
        await witness.abandon()
        await sub.unsubscribe()


async def test_a_flush_across_a_server_restart_waits_on_the_acks_not_the_lost_pong(
        server_and_client: tuple[NatsServer, Client]) -> None:
    """The server is killed (`kill -9`) with a publish in flight and a flush waiting, and
    comes back: the flush ends once the message is stored, within the ack timeout and
    PONG_WAIT — not after the whole flush timeout waiting for the PONG of a PING the
    dead server never answered (the projector stalled 60 s so after a server's kill)."""
    server, nc = server_and_client
    subject = event_subject("report", "r", "h1")
    async with PipelinePublisher(nc, ack_timeout=1.0) as pipe:
        await pipe.publish(subject, b"{}")
        await pipe.flush(10.0)
        server.kill()
        await pipe.publish(subject, b"{}")
        started = time.monotonic()
        flush = asyncio.create_task(pipe.flush(30.0))
        server.start()
        await flush
        assert time.monotonic() - started < 15.0  # not the 30 s flush timeout
        assert pipe.stats.failed == 0
        assert pipe.stats.last_seq == 2  # stored, once
