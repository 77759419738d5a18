"""A running `crr api` for tests: nats-server, Projector, SchedulerView; uvicorn on port 0.

`running_api` runs its own projector; `served_api` only the API over a view (for tests
that start and stop the projector themselves)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from nats.aio.client import Client

from crr.projector.service import Projector
from crr.rest.app import Api, create_app
from crr.rest.server import bind, serve
from crr.view.scheduler_view import SchedulerView
from tests.support.projector import running_projector


@dataclass
class ApiRig:
    """Everything a REST test touches."""

    url: str
    projector: Projector
    view: SchedulerView
    api: Api

    async def settle(self, seq: int) -> None:
        """Wait until CRR_EVENTS `seq` is in the snapshot and in the API's view."""
        await self.projector.wait_until(seq, 10)
        await self.view.wait_until(seq, 10)


@asynccontextmanager
async def running_api(nc: Client, *, start_view: bool = True) -> AsyncIterator[ApiRig]:
    """Projector + view + the REST app served on 127.0.0.1:<free port> until the block ends.

    With `start_view=False` the view is left unstarted (so not ready) for the test to start.
    """
    async with running_projector(nc) as projector:
        view = SchedulerView(nc, idle_heartbeat=0.5)
        if start_view:
            await view.start()
            await view.wait_ready(10)
        app, api = create_app(view)
        sock = bind("127.0.0.1:0")
        port = sock.getsockname()[1]
        stop = asyncio.Event()
        server = asyncio.create_task(serve(app, api, sock, stop))
        try:
            yield ApiRig(f"http://127.0.0.1:{port}", projector, view, api)
        finally:
            stop.set()
            await asyncio.wait_for(server, 10)
            await view.stop()


@dataclass
class Served:
    """An API over a view, served on a free port (independent of any projector)."""

    url: str
    view: SchedulerView
    api: Api


@asynccontextmanager
async def served_api(nc: Client, *, silent_after: float) -> AsyncIterator[Served]:
    """The REST app over a loaded view (no projector of its own: tests stop theirs), with
    the projector counted silent after `silent_after` s, liveness events every 0.2 s."""
    view = SchedulerView(nc, idle_heartbeat=0.5)
    await view.start()
    await view.wait_ready(10)
    app, api = create_app(view, silent_after=silent_after, liveness_interval=0.2)
    sock = bind("127.0.0.1:0")
    stop = asyncio.Event()
    server = asyncio.create_task(serve(app, api, sock, stop))
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", view, api)
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)
        await view.stop()
