"""The active catalog from `crr.v1.snapshot.catalog`: read once, or followed (agents, views)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from nats.aio.client import Client

from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.retry import FOLLOW
from crr.schemas.catalog import Catalog
from crr.schemas.codec import decode
from crr.schemas.errors import NotFoundOnServerError, PayloadError, UnknownReporterError
from crr.schemas.subjects import SNAPSHOT_CATALOG, SNAPSHOT_STREAM

log = logging.getLogger("crr.bus.catalog")

_FIRST_LOAD = 5.0
"""How long the initial read may take before "waiting for the catalog" is logged anyway."""


async def fetch_catalog(nc: Client, timeout: float = 10.0) -> Catalog | None:
    """The active catalog (one read of CRR_SNAPSHOT), or None when none is active yet.

    Read with an ordered consumer on the catalog subject, which every crr identity
    may create (`crr.admin.nats_auth.FOLLOW_CATALOG`), not with a direct get, which host and
    reporter credentials may not do.
    """
    found: list[bytes] = []
    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_CATALOG,
                           handler=lambda m: found.append(m.data))
    try:
        await reader.start()
    except NotFoundOnServerError:
        return None
    try:
        await reader.wait_ready(timeout)
    finally:
        await reader.stop()
    return decode(found[-1], Catalog) if found and found[-1] else None


async def check_declared(nc: Client, reporter: str) -> Catalog | None:
    """The active catalog, once it is known to declare `reporter`.

    UnknownReporterError (saying nothing was published) when it does not: every
    value of such a report would be rejected, and it would leave a `rejecting` row.
    None when no catalog is active yet: nothing can be checked, and the projector
    holds reports until one is.
    """
    catalog = await fetch_catalog(nc)
    if catalog is not None:
        try:
            catalog.reporter_spec(reporter, where="active catalog")
        except UnknownReporterError as exc:
            raise UnknownReporterError(f"{exc.message}; nothing published",
                                       where=exc.where) from None
    return catalog


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
