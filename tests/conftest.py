"""Shared fixtures: a real nats-server per test on a free port with its own store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from bus.connection import connect
from bus.server import NatsServer
from bus.streams import provision


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real `nats-server -js` on port 0 with a private store directory."""
    with NatsServer(tmp_path / "nats-store") as server:
        yield server


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """Client URL of the per-test server."""
    return nats_server.url


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A connected client with the crr streams provisioned."""
    async with connect(nats_url, name="crr-test") as client:
        await provision(client)
        yield client


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow`, `docker` and `packaging` tests run only when selected (`pytest -m slow`,
    `-m docker`, `-m packaging`); the default run stays fast."""
    selected = config.getoption("markexpr", "") or ""
    for marker in ("slow", "docker", "packaging"):
        if marker in selected:
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with `pytest -m {marker}`")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
