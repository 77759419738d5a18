"""The real-server fixture starts, serves JetStream, and stops cleanly."""

from __future__ import annotations

import os
import signal
from pathlib import Path

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


def test_an_embedded_server_says_how_it_ended(tmp_path: Path) -> None:
    """Killed, `wait_exit` names the signal (what `crr demo` prints when its server dies);
    stopped, an exit status; running, no status."""
    server = NatsServer(tmp_path / "store").start()
    try:
        assert server.exit_status() is None
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        assert server.wait_exit() == "killed by signal 9 (SIGKILL)"
    finally:
        server.stop()
    again = NatsServer(tmp_path / "store2").start()
    again.stop()
    status = again.exit_status()
    assert status is not None
    assert status.startswith(("exit status", "killed by signal 15"))
