"""The real-server fixture starts, serves JetStream, and stops cleanly."""

from __future__ import annotations

import nats

from crr.bus.server import NatsServer


async def test_fixture_serves_jetstream(nats_server: NatsServer) -> None:
    """A client can connect and JetStream answers account info."""
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().account_info()
        assert info.streams == 0
    finally:
        await nc.close()
    assert nats_server.port != 0
