"""Recent dead letters per reporter and host (`crr health`).

The projector copies every event it cannot apply to `crr.v1.deadletter`
(captured by `CRR_EVENTS`) with the reason.  Health reads only that
subject, from a start time on (one ordered consumer, `DeliverByStartTime`):
dead letters are rare, so this costs next to nothing however many hosts
there are, and needs no new state in the projector or the snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec

from crr.bus import jetstream
from crr.bus.connection import Connection
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.schemas.codec import decode
from crr.schemas.errors import (
    CrrTimeoutError,
    NotFoundOnServerError,
    PayloadError,
    StreamNotFoundError,
    SubjectError,
)
from crr.schemas.events import DeadLetter
from crr.schemas.subjects import DEADLETTER, EVENTS_STREAM, parse_event_subject, published_subject


class DeadLetterCount(msgspec.Struct, frozen=True, kw_only=True):
    """The dead letters of one (reporter, host) in a time window."""

    count: int
    last_reason: str
    first_at: str
    last_at: str


def owner(letter: DeadLetter) -> tuple[str, str | None]:
    """(reporter, host) whose event `letter` holds; (subject, None) for a non-event subject."""
    try:
        addr = parse_event_subject(published_subject(letter.subject))
    except SubjectError:
        return letter.subject, None
    return addr.reporter, addr.host


def count_deadletters(letters: Iterable[DeadLetter]) -> dict[tuple[str, str | None],
                                                              DeadLetterCount]:
    """Count `letters` (oldest first) per (reporter, host), keeping the newest reason."""
    out: dict[tuple[str, str | None], DeadLetterCount] = {}
    for dl in letters:
        key = owner(dl)
        prev = out.get(key)
        out[key] = DeadLetterCount(count=1 + (prev.count if prev else 0), last_reason=dl.reason,
                                   first_at=prev.first_at if prev else dl.received_at,
                                   last_at=dl.received_at)
    return out


async def read_deadletters(nc: Connection, since: float, timeout: float = 30.0) -> list[DeadLetter]:
    """The dead letters stored at or after `since` (epoch seconds), oldest first.

    Reads up to the newest dead letter at the time of the call (found first
    with one direct get), so an empty window costs one request.
    """
    try:
        newest = await jetstream.get_last(nc, EVENTS_STREAM, DEADLETTER)
    except NotFoundOnServerError as exc:
        if isinstance(exc, StreamNotFoundError):
            raise
        return []  # no dead letter at all
    if not newest.seq or newest.time < since:
        return []
    letters: list[DeadLetter] = []
    done = asyncio.Event()

    def on_msg(m: StoredMessage) -> None:
        try:
            letters.append(decode(m.data, DeadLetter))
        except PayloadError:
            letters.append(DeadLetter(seq=0, subject=m.subject, reason="undecodable dead letter",
                                      payload="", received_at=""))
        if m.seq >= newest.seq:
            done.set()

    reader = OrderedReader(nc, stream=EVENTS_STREAM, subject=DEADLETTER, handler=on_msg,
                           start_time=since)
    await reader.start()
    try:
        async with asyncio.timeout(timeout):
            await done.wait()
    except TimeoutError:
        raise CrrTimeoutError(f"reading {DEADLETTER} from {EVENTS_STREAM}: not done after "
                              f"{timeout:g}s ({len(letters)} read)") from None
    finally:
        await reader.stop()
    return letters
