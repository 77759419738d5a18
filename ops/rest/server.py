"""Serving the REST app (`crr api`): the listening socket, and uvicorn run until a stop event
(event streams closed first, the whole stop within `crr.runtime.shutdown.STOP_WITHIN`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from litestar import Litestar

from crr.rest.app import Api
from crr.schemas.errors import CrrError


def bind(listen: str) -> socket.socket:
    """A listening TCP socket for `HOST:PORT` (port 0: any free port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise CrrError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise CrrError(f"--listen {listen}: cannot listen there: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn without signal handlers of its own: they would replace `crr api`'s (from
    `crr.runtime.shutdown.stopping`) while it serves, and re-raise the signal only after its own
    graceful shutdown; the stop event decides (`serve`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(app: Litestar, api: Api, sock: socket.socket, stop: asyncio.Event) -> None:
    """Serve `app` on `sock` until `stop` is set, then close event streams and shut down.

    Requests still running get a second (event streams end at once): the
    whole stop fits in `crr.runtime.shutdown.STOP_WITHIN`."""
    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=1)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        api.closing.set()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
