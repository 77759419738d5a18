"""A port that is not NATS is known at once (bus/nats_probe.py), with real servers on loopback.

An HTTP server (as the REST API and the Prometheus metrics port are) says nothing until
asked; nats-py would wait for the INFO line attempt after attempt.  Given such a port,
a one-shot connect fails within 2 s with `… is not a NATS server (got …)`, and a
service's connect (retrying forever) logs that line within 2 s and keeps trying; a
refused port gets its first "cannot reach" line within 2 s; a server list with a real
NATS server in it still connects.
"""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from crr.bus.connection import open_connection
from crr.schemas.errors import NotConnectedError, NotNatsServerError


@pytest.fixture
def http_port() -> Iterator[int]:
    """A real HTTP server (`http.server`) on a free loopback port, in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def test_an_http_port_is_not_nats_within_two_seconds(http_port: int) -> None:
    """A one-shot connect to an HTTP server: NotNatsServerError within 2 s, not a 35 s
    `TimeoutError`."""
    started = time.monotonic()
    with pytest.raises(NotNatsServerError) as caught:
        await open_connection(f"nats://127.0.0.1:{http_port}", attempts=5)
    assert time.monotonic() - started < 2.0
    assert str(caught.value).startswith(
        f"nats://127.0.0.1:{http_port} is not a NATS server (got nothing within 1 s")
    assert not caught.value.retriable


async def _first_warning(url: str, caplog: pytest.LogCaptureFixture) -> tuple[str, float]:
    """Run a service's connect (forever) to `url` until it logs a WARNING; the line, when."""
    caplog.set_level(logging.WARNING, logger="crr.bus")
    said = asyncio.Event()

    class Signal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.set()

    handler = Signal(logging.WARNING)
    logging.getLogger("crr.bus").addHandler(handler)
    started = time.monotonic()
    task = asyncio.ensure_future(open_connection(url, attempts=None))
    try:
        await asyncio.wait_for(said.wait(), 10)
        return caplog.records[0].getMessage(), time.monotonic() - started
    finally:
        logging.getLogger("crr.bus").removeHandler(handler)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_service_says_not_nats_within_two_seconds_and_keeps_trying(
        http_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """A service retries (the port may be NATS again later), saying why at once."""
    line, took = await _first_warning(f"nats://127.0.0.1:{http_port}", caplog)
    assert took < 2.0, took
    assert f"nats://127.0.0.1:{http_port} is not a NATS server (got nothing" in line
    assert line.endswith("; retrying")


async def test_a_service_says_cannot_reach_within_two_seconds(
        caplog: pytest.LogCaptureFixture) -> None:
    """A refused port: the first "cannot reach" line comes at once, not after 15 s."""
    line, took = await _first_warning("nats://127.0.0.1:1", caplog)
    assert took < 2.0, took
    assert line.startswith("cannot reach NATS at nats://127.0.0.1:1")


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_a_list_with_a_nats_server_in_it_connects(http_port: int, nats_url: str) -> None:
    """The probe judges the list, not each entry: one real NATS server is enough."""
    nc = await open_connection(f"nats://127.0.0.1:{http_port},{nats_url}", attempts=5)
    try:
        assert nc.is_connected
    finally:
        await nc.close()


async def test_refused_everywhere_is_not_connected_and_retriable() -> None:
    """Nothing listening: `NotConnectedError` (retriable), never "not a NATS server"."""
    with pytest.raises(NotConnectedError) as caught:
        await open_connection("nats://127.0.0.1:1", attempts=1)
    assert not isinstance(caught.value, NotNatsServerError)
    assert caught.value.retriable
