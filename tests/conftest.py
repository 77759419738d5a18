"""Shared fixtures: a real nats-server per test on a free port with its own store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.server import NatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real `nats-server -js` on port 0 with a private store directory."""
    with NatsServer(tmp_path / "nats-store") as server:
        yield server


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """Client URL of the per-test server."""
    return nats_server.url
