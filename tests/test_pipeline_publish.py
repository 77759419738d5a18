"""`PipelinePublisher` frames messages itself (`Framer`): the bytes nats-py would send, or
nats-py's own `publish` for anything unusual; end to end on a real server."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from bus.pipeline_publish import Framer, PipelinePublisher, header_block
from bus.streams import provision
from schemas.subjects import SNAPSHOT_STREAM, host_snapshot_subject

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
