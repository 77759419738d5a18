"""The active catalog from `crr.v1.snapshot.catalog`: read once, or followed (agents, views)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from nats.aio.client import Client

from bus.errors import nats_errors
from bus.ordered import OrderedReader, StoredMessage
from bus.retry import FOLLOW
from schemas.catalog import Catalog
from schemas.codec import decode
from schemas.errors import NotFoundOnServerError, PayloadError
from schemas.subjects import SNAPSHOT_CATALOG, SNAPSHOT_STREAM

log = logging.getLogger("crr.bus.catalog")

_FIRST_LOAD = 5.0
"""How long the initial read may take before "waiting for the catalog" is logged anyway."""


async def fetch_catalog(nc: Client) -> Catalog | None:
    """The active catalog (one read of CRR_SNAPSHOT), or None when none is active yet."""
    try:
        with nats_errors():
            msg = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, SNAPSHOT_CATALOG)
    except NotFoundOnServerError:
        return None
    return decode(msg.data, Catalog) if msg.data else None


async def watch_catalog(nc: Client) -> AsyncIterator[Catalog]:
    """Yield the active catalog, then every change, until the caller stops iterating.

    Nothing is yielded until a catalog has been applied (`crr catalog apply`)
    and the projector has published it.
    """
    queue: asyncio.Queue[Catalog] = asyncio.Queue()

    def on_msg(m: StoredMessage) -> None:
        try:
            queue.put_nowait(decode(m.data, Catalog))
        except PayloadError as exc:
            log.warning("ignoring undecodable catalog at seq %d: %s", m.seq, exc)

    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_CATALOG, handler=on_msg)
    await reader.start()
    try:
        with contextlib.suppress(TimeoutError):
            await reader.wait_ready(_FIRST_LOAD)
        if queue.empty():
            log.info("waiting for the active catalog on %s (apply one with `crr catalog "
                     "apply FILE`; a running projector makes it active)", SNAPSHOT_CATALOG)
        while True:
            yield await queue.get()
    finally:
        await reader.stop()


async def follow_catalog(nc: Client, apply: Callable[[Catalog], Awaitable[None]]) -> None:
    """Call `apply` with the active catalog and every change, for good.

    For long-running followers (agents, central runners): a missing stream
    or a NATS error is retried with jittered back-off (tenacity), so a
    follower may start before the streams exist or while the server is away
    and keeps what it runs meanwhile.
    """
    retrying = FOLLOW.retrying(also=(NotFoundOnServerError,), log=log,
                               what="cannot follow the catalog")
    async for attempt in retrying:
        with attempt:
            async for catalog in watch_catalog(nc):
                await apply(catalog)
