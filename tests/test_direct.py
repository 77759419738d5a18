"""bus.direct: a pipelined publisher's acks handled as read, a status through nats-py's path."""

from __future__ import annotations

import contextlib

import nats.js.errors
from nats.aio.client import Client
from nats.js.api import StreamConfig

from bus import direct
from bus.pipeline_publish import PipelinePublisher


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
