"""The bus edge on a real server: tokens, provisioning, connecting, the outbox."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from crr.bus.connection import open_connection
from crr.bus.outbox import Outbox
from crr.bus.server import NatsServer
from crr.bus.streams import StreamSettings, ensure_stream, events_config, provision
from crr.schemas.errors import NotConnectedError, StreamConfigError
from crr.schemas.subjects import EVENTS_STREAM, event_subject, parse_event_subject, token, untoken
from tests.support.faults import eventually


def test_token_examples() -> None:
    """The example and the escape rule of docs/contract.md, "Subjects and streams"."""
    assert token("node1.dc2") == "node1=2Edc2"
    assert token("a_b-C9") == "a_b-C9"
    assert token("né") == "n=C3=A9"
    assert token("x=y") == "x=3Dy"


@given(st.text(min_size=1))
def test_token_roundtrip_and_charset(s: str) -> None:
    """token() is injective (it round-trips) and yields only subject-safe characters."""
    t = token(s)
    assert untoken(t) == s
    assert all(c.isascii() and (c.isalnum() or c in "_-=") for c in t)


def test_event_subject_roundtrip() -> None:
    """Host and cluster subjects parse back into what built them."""
    s = event_subject("report", "scratch", "node1.dc2")
    assert s == "crr.v1.report.host.node1=2Edc2.scratch"
    assert parse_event_subject(s) == ("report", "scratch", "node1.dc2")
    c = event_subject("health", "flexlm", None)
    assert parse_event_subject(c) == ("health", "flexlm", None)


async def test_provision_is_idempotent(nc: Client) -> None:
    """Provisioning twice changes nothing (the fixture already provisioned once)."""
    assert await provision(nc) == {"CRR_EVENTS": "unchanged", "CRR_SNAPSHOT": "unchanged"}


async def test_conflicting_stream_is_reported_not_changed(nc: Client) -> None:
    """An existing stream with other settings is reported, and left as it was."""
    want = events_config(StreamSettings(events_max_age=3600))
    with pytest.raises(StreamConfigError, match="max_age"):
        await ensure_stream(nc, want)
    info = await nc.jetstream().stream_info(EVENTS_STREAM)
    assert info.config.max_age == pytest.approx(24 * 3600)
    assert await ensure_stream(nc, want, update=True) == "updated"


async def test_connect_to_nothing_fails_with_the_url() -> None:
    """A server that is down gives a one-line error naming it, after bounded retries."""
    with pytest.raises(NotConnectedError, match=r"127\.0\.0\.1:1"):
        await open_connection("nats://127.0.0.1:1", attempts=2)


async def test_outbox_keeps_latest_across_outage(nats_server: NatsServer) -> None:
    """While the server is down the outbox keeps the newest report per subject and
    every health message, and delivers them once the server is back."""
    nc = await open_connection(nats_server.url)
    try:
        await provision(nc)
        outbox = Outbox(nc, ack_timeout=1.0)
        await outbox.start()
        await asyncio.to_thread(nats_server.kill)
        for i in range(5):
            outbox.put("crr.v1.report.host.n1.r", b'{"i": %d}' % i, msg_id=f"r/n1/b/{i}")
            outbox.put("crr.v1.health.host.n1.r", b'{"h": %d}' % i, msg_id=f"h/n1/b/{i}",
                       keep="all")
        assert outbox.pending >= 5
        await asyncio.to_thread(nats_server.start)  # same port, same store
        await outbox.flush(timeout=30)
        js = nc.jetstream()
        last = await js.get_last_msg(EVENTS_STREAM, "crr.v1.report.host.n1.r")
        assert last.data == b'{"i": 4}'
        info = await js.stream_info(EVENTS_STREAM, subjects_filter="crr.v1.health.>")
        assert info.state.subjects == {"crr.v1.health.host.n1.r": 5}
        reports = await js.stream_info(EVENTS_STREAM, subjects_filter="crr.v1.report.>")
        assert reports.state.subjects == {"crr.v1.report.host.n1.r": 1}
        await outbox.close()
    finally:
        await nc.close()


async def test_outbox_dedups_resends(nc: Client) -> None:
    """The same Nats-Msg-Id published twice is stored once."""
    outbox = Outbox(nc)
    await outbox.start()
    outbox.put("crr.v1.report.host.n1.r", b"{}", msg_id="r/n1/b/1")
    await outbox.flush()
    outbox.put("crr.v1.report.host.n1.r", b"{}", msg_id="r/n1/b/1")
    await outbox.flush()
    await outbox.close()
    info = await nc.jetstream().stream_info(EVENTS_STREAM)
    assert info.state.messages == 1
    assert isinstance(info.config, StreamConfig)


@pytest.mark.parametrize("failed_resend", [False, True])
async def test_outbox_resends_an_unanswered_message_before_a_newer_one(
        nc: Client, failed_resend: bool) -> None:
    """A publish that got no answer (an ack timeout: it may still be stored, e.g. by a server
    cut off from its cluster) is resent with its id before a newer value on its subject; a
    late copy of it is then a duplicate, and the stream ends with the newer value.

    `failed_resend`: a resend in between certainly was not stored (no responders: no
    stream yet) — the message stays first all the same, since the unanswered copy may still
    be stored late (before the fix, this interleaving let the newer value supersede it)."""
    got: list[bytes] = []

    async def silent(msg: Msg) -> None:  # interest but no ack: the publish times out
        got.append(msg.data)

    sub = await nc.subscribe("test.unsure.x", cb=silent)
    outbox = Outbox(nc, ack_timeout=0.3)
    await outbox.start()
    try:
        outbox.put("test.unsure.x", b"old", msg_id="x/1")
        await eventually(lambda: outbox.stats.retried > 0, 10, "the first publish timed out")
        outbox.put("test.unsure.x", b"new", msg_id="x/2")
        await sub.unsubscribe()
        if failed_resend:
            # Two more failed attempts: at most one was in flight (unanswered) when the
            # subscription went, so at least one failed for certain (no responders).
            retried = outbox.stats.retried
            await eventually(lambda: outbox.stats.retried >= retried + 2, 10,
                             "a resend failed for certain (no responders)")
        await nc.jetstream().add_stream(StreamConfig(name="UNSURE", subjects=["test.unsure.>"]))
        await outbox.flush(10)
    finally:
        await outbox.close()
    js = nc.jetstream()
    late = await js.publish("test.unsure.x", b"old", headers={"Nats-Msg-Id": "x/1"})
    assert late.duplicate  # the copy delivered late is dropped
    stored = [(await js.get_msg("UNSURE", seq)).data for seq in (1, 2)]
    assert stored == [b"old", b"new"]
    assert (await js.stream_info("UNSURE")).state.messages == 2
    assert got  # the first attempt was sent
    assert outbox.stats.superseded == 0
