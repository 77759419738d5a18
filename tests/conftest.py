"""Shared fixtures: a real nats-server per test on a free port with its own store."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.bus import natspy
from crr.bus.connection import connect
from crr.bus.server import NatsServer
from crr.bus.streams import provision
from tests.support.slurm import SlurmCluster, slurm_cluster


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
    """`slow`, `docker`, `packaging` and `slurm` tests run only when selected (`pytest -m
    slow`, `-m docker`, `-m packaging`, `-m slurm`); the default run stays fast.  A test
    that uses the `slurm` fixture (real slurmctld daemons, ~4 s each to start) is `slurm`."""
    for item in items:
        if "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
    selected = config.getoption("markexpr", "") or ""
    for marker in ("slow", "docker", "packaging", "slurm"):
        if marker in selected:
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with `pytest -m {marker}`")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fast_paths_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The nats-py fast paths on, whatever `CRR_NATS_FAST` says: for the tests that compare
    a fast path with nats-py's own (they run both themselves, in either mode of the suite)."""
    monkeypatch.delenv(natspy.FAST_ENV, raising=False)
    natspy.reset()
    yield
    natspy.reset()


PUBLIC_PATHS_FORCED = os.environ.get("CRR_NATS_FAST", "").strip() == "0"
"""The suite runs with every nats-py fast path off (`CRR_NATS_FAST=0`)."""


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    """A real munged + slurmctld + slurmd with 20 nodes on loopback (skips, with the
    reason, where Slurm is not installed)."""
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture
async def server_and_client(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Client]]:
    """A restartable server (same port and store) and a client that reconnects to it."""
    with NatsServer(tmp_path / "store") as server:
        async with connect(server.url, name="restartable-server-test") as nc:
            await provision(nc)
            yield server, nc
