"""IO for a host's timeline: read its events from CRR_EVENTS and replay them (`crr replay`'s fold).

One ordered consumer with three filters (the catalog, the host's own subjects, host name
encoded as a subject token: docs/contract.md, "Subjects and streams", and the bridge
releases, `crr bridge release`, which the timeline lists as happenings) reads the whole
retained history in stream order; `crr.projections.history.Replay` folds it
with cuts at the window's start, after each of the host's events inside
the window and at its end; `crr.projections.timeline` turns the captures into
spans.
"""

from __future__ import annotations

import asyncio
import math
from typing import Final

from crr.bus import jetstream
from crr.bus.connection import Connection
from crr.bus.jetstream import stream_range
from crr.bus.ordered import Delivery, OrderedReader, StoredMessage
from crr.projections.envelope import Envelope
from crr.projections.timeline import HostTimeline, replay_timeline
from crr.schemas.errors import CrrError, NotFoundOnServerError
from crr.schemas.subjects import (
    ADMIN_BRIDGE_ALL,
    CATALOG,
    EVENTS_STREAM,
    EVERYTHING,
    host_history_filter,
    published_subject,
)
from crr.schemas.wire_time import format_time

MAX_WINDOW_EVENTS: Final = 50_000
"""Most events of one host inside a window (beyond that: ask for a shorter window)."""
READ_TIMEOUT: Final = 30.0


async def retention(nc: Connection) -> float:
    """CRR_EVENTS' `max_age` in seconds (+inf when unlimited); CrrError without the stream."""
    try:
        state = await jetstream.stream_state(nc, EVENTS_STREAM)
    except NotFoundOnServerError:
        raise CrrError(f"stream {EVENTS_STREAM} does not exist (is a projector running?)"
                       ) from None
    return state.max_age if state.max_age else math.inf


async def host_events(nc: Connection, host: str) -> list[StoredMessage]:
    """Every retained catalog event, event of `host` and bridge release (`crr bridge
    release`: a host's timeline says who released a bridge, and when), in stream order."""
    out: list[StoredMessage] = []
    reader = OrderedReader(nc, stream=EVENTS_STREAM, subject=EVERYTHING, handler=out.append,
                           deliver=Delivery.ALL,
                           filter_subjects=[CATALOG, host_history_filter(host),
                                            ADMIN_BRIDGE_ALL])
    await reader.start()
    try:
        await reader.wait_ready(READ_TIMEOUT)
    finally:
        await reader.stop()
    return out


async def read_timeline(nc: Connection, host: str, since: float, until: float) -> HostTimeline:
    """The timeline of `host` over `[since, until]` (CrrError: outside retention, too many)."""
    keep = await retention(nc)
    if since < until - keep:
        raise CrrError(f"window starts {format_time(since)}, before what {EVENTS_STREAM} "
                       f"keeps ({keep:g} s of history): choose a shorter window")
    rng = await stream_range(nc)
    events = [Envelope(seq=m.seq, subject=published_subject(m.subject), received_at=m.time,
                       data=m.data) for m in await host_events(nc, host)]
    inside = sum(1 for e in events if since < e.received_at <= until and e.subject != CATALOG)
    if inside > MAX_WINDOW_EVENTS:
        raise CrrError(f"{inside} events of {host!r} in the window (at most "
                       f"{MAX_WINDOW_EVENTS}): choose a shorter window")
    history_from = None
    if rng.first_seq > 1 and rng.first_time is not None and rng.first_time > since:
        history_from = rng.first_time
    # Pure and CPU-bound (a second or more for a day of history): off the event loop, so
    # the API and its event streams keep answering meanwhile.
    return await asyncio.to_thread(replay_timeline, host, events, since, until,
                                   history_from=history_from)
