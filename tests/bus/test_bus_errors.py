"""nats-py's errors become crr's at the bus boundary, on a real server (`crr.bus.errors`).

Each case provokes the real failure and checks the crr class, its `retriable`
flag (what `crr.bus.retry` reads) and that the nats-py error stays in `__cause__`.
"""

from __future__ import annotations

import asyncio
import socket
import time

import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from crr.bus.connection import connect, open_connection
from crr.bus.errors import NO_STREAMS, describe, from_nats, nats_errors
from crr.bus.outbox import Outbox
from crr.schemas import errors as tree
from crr.schemas.errors import NotNatsServerError


async def _stream(nc: Client, name: str) -> None:
    await nc.jetstream().add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))


async def test_publish_no_stream_captures_is_no_responders(nc: Client) -> None:
    """A JetStream publish to a subject no stream captures: NoRespondersError, retriable
    (a stream may be created), whose text says what to do."""
    with pytest.raises(tree.NoRespondersError) as caught, nats_errors():
        await nc.jetstream(timeout=2.0).publish("nobody.stores.this", b"x")
    assert caught.value.retriable
    assert isinstance(caught.value.__cause__, nats.errors.Error)
    assert str(caught.value).endswith(NO_STREAMS)


async def test_request_with_no_responders(nc: Client) -> None:
    """A core request nobody subscribes to: NoRespondersError, retriable."""
    with pytest.raises(tree.NoRespondersError) as caught, nats_errors():
        await nc.request("nobody.listens.here", b"?", timeout=2.0)
    assert caught.value.retriable
    assert isinstance(caught.value.__cause__, nats.errors.NoRespondersError)


async def test_request_without_an_answer_times_out(nc: Client) -> None:
    """A responder that never answers: BusTimeoutError, a TimeoutError, retriable."""
    async def mute(_msg: Msg) -> None:
        return None

    sub = await nc.subscribe("mute.service", cb=mute)
    try:
        with pytest.raises(tree.BusTimeoutError) as caught, nats_errors(where="mute.service"):
            await nc.request("mute.service", b"?", timeout=0.2)
    finally:
        await sub.unsubscribe()
    assert caught.value.retriable
    assert isinstance(caught.value, TimeoutError)
    assert str(caught.value).startswith("mute.service: ")


async def test_missing_stream_is_stream_not_found(nc: Client) -> None:
    """stream_info of a stream that does not exist: StreamNotFoundError (a LookupError),
    not retriable, said as "start the projector"."""
    with pytest.raises(tree.StreamNotFoundError) as caught, nats_errors():
        await nc.jetstream().stream_info("NO_SUCH_STREAM")
    err = caught.value
    assert not err.retriable
    assert isinstance(err, LookupError)
    assert (err.code, err.err_code) == (404, 10059)
    assert isinstance(err.__cause__, nats.js.errors.NotFoundError)
    assert describe(err) == describe(err.__cause__) == NO_STREAMS


async def test_missing_message_is_not_found_but_not_a_missing_stream(nc: Client) -> None:
    """No message on a subject of an existing stream: NotFoundOnServerError only."""
    await _stream(nc, "ERRS_MSG")
    with pytest.raises(tree.NotFoundOnServerError) as caught, nats_errors():
        await nc.jetstream().get_last_msg("ERRS_MSG", "errs_msg.none")
    assert not isinstance(caught.value, tree.StreamNotFoundError)
    assert not caught.value.retriable


async def test_wrong_expected_sequence_is_the_fence(nc: Client) -> None:
    """A write expecting another last subject sequence: WrongLastSequenceError, not
    retriable (someone wrote since: the projector's lease moved on)."""
    await _stream(nc, "ERRS_FENCE")
    js = nc.jetstream()
    await js.publish("errs_fence.a", b"1")
    with pytest.raises(tree.WrongLastSequenceError) as caught, nats_errors():
        await js.publish("errs_fence.a", b"2",
                         headers={"Nats-Expected-Last-Subject-Sequence": "7"})
    assert caught.value.err_code == 10071
    assert not caught.value.retriable


async def test_conflicting_stream_is_a_refusal(nc: Client) -> None:
    """A JetStream request the server refuses (a 400): JetStreamError, not retriable."""
    await _stream(nc, "ERRS_DUP")
    with pytest.raises(tree.JetStreamError) as caught, nats_errors():
        await nc.jetstream().add_stream(StreamConfig(name="ERRS_DUP", subjects=["other.>"]))
    assert caught.value.code == 400
    assert not caught.value.retriable
    assert type(caught.value) is tree.JetStreamError


async def test_connect_to_a_closed_port(nats_url: str) -> None:
    """Nobody listens: NotConnectedError, retriable (a server may come up), after the
    bounded attempts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(tree.NotConnectedError) as caught:
        await open_connection(f"nats://127.0.0.1:{port}", attempts=1, connect_timeout=0.5)
    assert caught.value.retriable
    assert f"127.0.0.1:{port}" in str(caught.value)
    # The same failure from a raw socket maps the same way.
    refused = from_nats(ConnectionRefusedError(111, "Connection refused"))
    assert isinstance(refused, tree.NotConnectedError)
    assert refused.retriable


async def test_outbox_rejects_what_is_not_retriable(nc: Client) -> None:
    """The outbox reads `retriable`: a message over max_payload is rejected at once
    (MessageTooLargeError to on_error), never retried; the next one is published."""
    await _stream(nc, "ERRS_BIG")
    errors: list[Exception] = []
    outbox = Outbox(nc, on_error=lambda _subject, exc: errors.append(exc))
    await outbox.start()
    try:
        outbox.put("errs_big.a", b"x" * (nc.max_payload + 1), msg_id="big/1")
        outbox.put("errs_big.b", b"small", msg_id="small/1")
        await outbox.flush(10.0)
    finally:
        await outbox.close()
    assert [type(e) for e in errors] == [tree.MessageTooLargeError]
    assert isinstance(errors[0], tree.CrrError)
    assert not errors[0].retriable
    assert (outbox.stats.rejected, outbox.stats.retried) == (1, 0)
    info = await nc.jetstream().stream_info("ERRS_BIG")
    assert info.state.messages == 1


async def test_a_command_sees_crr_errors(nats_url: str) -> None:
    """What escapes `connect()`'s block is crr's error (the bus boundary of a command)."""
    with pytest.raises(tree.StreamNotFoundError):
        async with connect(nats_url, name="crr-test") as client:
            await client.jetstream().stream_info("NOT_THERE")


def test_every_nats_error_maps_into_the_tree() -> None:
    """No nats-py error class is left unmapped; each maps to a BusError or SubjectError."""
    classes = [c for mod in (nats.errors, nats.js.errors) for c in vars(mod).values()
               if isinstance(c, type) and issubclass(c, nats.errors.Error)]
    assert len(classes) > 30
    for cls in classes:
        try:
            exc = cls()
        except TypeError:
            continue  # needs arguments nats-py always gives; covered by the cases above
        mapped = from_nats(exc)
        assert isinstance(mapped, tree.CrrError), cls
        assert isinstance(mapped, tree.BusError) or not mapped.retriable, cls


@pytest.mark.parametrize(("code", "err_code", "cls", "retriable"), [
    (503, None, tree.JetStreamError, True),      # no leader during an election
    (500, None, tree.JetStreamError, True),
    (400, 10164, tree.SequenceCheckBusyError, True),   # another fenced write in flight
    (400, 10158, tree.DuplicateInProcessError, True),  # an earlier attempt still being stored
    (400, 10071, tree.WrongLastSequenceError, False),
    (404, 10059, tree.StreamNotFoundError, False),
    (404, 10037, tree.NotFoundOnServerError, False),
    (400, 10058, tree.JetStreamError, False),
])
def test_jetstream_api_errors_by_code(code: int, err_code: int | None,
                                      cls: type[tree.JetStreamError], retriable: bool) -> None:
    """JetStream API errors map by err_code, else by status; 5xx are retriable."""
    mapped = from_nats(nats.js.errors.APIError(code=code, err_code=err_code,
                                               description="x"))
    assert type(mapped) is cls
    assert mapped.retriable is retriable


async def _listener(answer: bytes | None) -> tuple[asyncio.Server, int]:
    """A TCP server on a free loopback port that says `answer` on accept (None: nothing)."""
    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if answer is not None:
            writer.write(answer)
            await writer.drain()
            writer.close()
        else:
            await reader.read()  # says nothing; waits for the client to give up

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(("answer", "said"), [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "got 'HTTP/1.1 400 Bad Request'"),
    (b"", "it closed the connection without a word"),
])
async def test_a_port_that_is_not_nats_is_said_as_such(answer: bytes, said: str) -> None:
    """A URL pointing at another kind of server (a typo'd port): one clear, non-retriable
    error naming what answered, after the first attempt — not a bare timeout after the
    whole retry budget (26 s)."""
    server, port = await _listener(answer)
    async with server:
        started = time.monotonic()
        with pytest.raises(NotNatsServerError) as caught:
            await open_connection(f"nats://127.0.0.1:{port}", attempts=5)
        assert time.monotonic() - started < 8.0
    assert f"nats://127.0.0.1:{port} is not a NATS server ({said}" in str(caught.value)
    assert not caught.value.retriable
