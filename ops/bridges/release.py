"""`crr bridge release DOOR [--for D]`: the admin event that lets a held bridge apply.

A release is a `BridgeRelease` published to `CRR_EVENTS` on
`crr.v1.admin.bridge.<door>.release` (docs/contract.md), so the history keeps who
released what and when (`crr events export`, `crr replay`).  The bridge of that door
listens to the subject (`listen_releases`); at start it also reads the newest release,
so a `--for` suspension still running survives a bridge restart (`running_suspension`).
The projector folds it as a no-op.
"""

from __future__ import annotations

import getpass
import logging
import socket
import time
import uuid
from collections.abc import Callable

from crr.bus import jetstream
from crr.bus.connection import Connection
from crr.bus.listen import Listening, listen
from crr.schemas.codec import decode, encode
from crr.schemas.errors import CrrError, NotFoundOnServerError, PayloadError
from crr.schemas.events import BridgeRelease
from crr.schemas.subjects import EVENTS_STREAM, MSG_ID_HEADER, release_msg_id, release_subject
from crr.schemas.wire_time import format_time, parse_time

log = logging.getLogger("crr.bridge.release")


def who() -> str | None:
    """`user@machine` of whoever runs the command, for the record."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return None


async def publish_release(nc: Connection, door: str, *, for_seconds: float = 0.0,
                          reason: str | None = None) -> tuple[int, BridgeRelease]:
    """Publish a release of `door`'s bridge; its CRR_EVENTS sequence and the event."""
    event = BridgeRelease(door=door, requested_at=format_time(time.time()), by=who(),
                          for_seconds=for_seconds, reason=reason)
    seq = await jetstream.publish(nc, release_subject(door), encode(event),
                                  headers={MSG_ID_HEADER: release_msg_id(door,
                                                                         uuid.uuid4().hex)})
    return seq, event


async def listen_releases(nc: Connection, door: str,
                          on_release: Callable[[BridgeRelease], object]) -> Listening:
    """Call `on_release` with each release of `door` published from now on."""

    async def handle(_subject: str, data: bytes) -> None:
        try:
            event = decode(data, BridgeRelease)
        except PayloadError as exc:
            log.warning("a release that does not decode, ignored: %s", exc)
            return
        if event.door == door:
            on_release(event)

    return await listen(nc, release_subject(door), handle)


async def running_suspension(nc: Connection, door: str, now: float) -> tuple[float, str | None]:
    """Seconds left of the newest `--for` release of `door` still running at `now` (0:
    none), and who gave it."""
    try:
        msg = await jetstream.get_last(nc, EVENTS_STREAM, release_subject(door))
        event = decode(msg.data, BridgeRelease)
        start = parse_time(event.requested_at)
    except (NotFoundOnServerError, ValueError):
        return 0.0, None
    except CrrError as exc:
        log.warning("could not read the last release of %s: %s", door, exc)
        return 0.0, None
    return max(0.0, start + event.for_seconds - now), event.by
