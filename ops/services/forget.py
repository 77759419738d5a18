"""Forgetting a host (`crr hosts forget HOST`): a decommissioned host leaves every surface.

A host's snapshot record is derived from its events, and a running projector
holds it in memory; deleting the record alone would be undone at its next
write (or the next projector start).  So forgetting is an *event*, folded
like every other:

1. publish a `Forget` on `crr.v1.admin.host.<host>.forget` (captured by
   CRR_EVENTS; admin role) — its stream sequence is S;
2. purge the host's events stored before S: one purge by subject,
   `crr.v1.*.host.<host>.>` up to S, which covers both layouts (published
   subjects, and subjects stored with a partition token);
3. every projector folding CRR_EVENTS — the writer, HA standbys, the
   partition that owns the host, a projector started later, `crr replay` —
   applies the Forget: the host leaves its state, and the writer replaces
   the record with an empty one (a delete marker; the stream keeps one
   message per subject, so only the marker remains).  Views and
   `crr hosts` drop the host when they read the marker;
4. wait (bounded) until the projector's position covers S, then check that
   the record is gone.

Events of the host published after S (its agent still running) bring it back,
as they should.  Pure bookkeeping lives in the fold (`projections.fold`);
this module is the IO.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import socket
import time
import uuid
from dataclasses import dataclass

from nats.aio.client import Client

from bus.errors import nats_errors
from bus.ordered import OrderedReader, StoredMessage
from projections.coverage import Coverage
from schemas.codec import decode, encode
from schemas.errors import CrrError, CrrTimeoutError, NotFoundOnServerError
from schemas.events import Forget
from schemas.snapshot import ProjectorStatus
from schemas.subjects import (
    ADMIN_HOST_PREFIX,
    EVENTS_STREAM,
    MSG_ID_HEADER,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    STATUS_PARTITIONS,
    forget_msg_id,
    forget_subject,
    host_history_filter,
    host_snapshot_subject,
)
from schemas.wire_time import format_time


@dataclass(frozen=True)
class ForgetOutcome:
    """What `forget_host` did."""

    host: str
    forget_seq: int
    """CRR_EVENTS sequence of the Forget event."""
    purged: int
    """Events of the host removed from CRR_EVENTS."""
    had_record: bool
    """Whether CRR_SNAPSHOT held a record of the host before."""
    record_removed: bool
    """Whether the record is gone now (False: no projector applied the Forget in time)."""
    projector_position: int

    def describe(self) -> str:
        """One line for people."""
        record = ("snapshot record removed" if self.had_record and self.record_removed
                  else "no snapshot record" if not self.had_record
                  else "snapshot record NOT removed yet")
        return (f"forgot host {self.host}: {record}; {self.purged} event(s) purged from "
                f"{EVENTS_STREAM}; forget recorded at {EVENTS_STREAM} seq {self.forget_seq}")


def _host_filter(host: str) -> str:
    """Every stored event subject of `host`, in both layouts (and earlier Forgets)."""
    return host_history_filter(host)


async def _has_record(nc: Client, host: str) -> bool:
    try:
        with nats_errors():
            msg = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM,
                                                    host_snapshot_subject(host))
    except NotFoundOnServerError:
        return False
    return bool(msg.data)


async def _stored_events(nc: Client, host: str) -> int:
    """Events of `host` in CRR_EVENTS (earlier Forgets not counted)."""
    info = await nc.jetstream().stream_info(EVENTS_STREAM, subjects_filter=_host_filter(host))
    return sum(n for s, n in (info.state.subjects or {}).items()
               if not s.startswith(ADMIN_HOST_PREFIX))


async def _purge(nc: Client, host: str, before_seq: int) -> int:
    """Purge the host's events stored before `before_seq`; how many were removed."""
    req = json.dumps({"filter": _host_filter(host), "seq": before_seq}).encode()
    reply = await nc.request(f"$JS.API.STREAM.PURGE.{EVENTS_STREAM}", req, timeout=10)
    body = json.loads(reply.data)
    if "error" in body:
        raise CrrError(f"cannot purge the events of {host!r} from {EVENTS_STREAM}: "
                       f"{body['error'].get('description', body['error'])}")
    return int(body.get("purged", 0))


async def wait_for_position(nc: Client, seq: int, timeout: float) -> int:
    """Follow the projector status records until CRR_SNAPSHOT covers CRR_EVENTS `seq` (or
    `timeout` passes); the position reached (0: not known)."""
    coverage = Coverage()
    reached = asyncio.Event()

    def keep(m: StoredMessage) -> None:
        if not m.data:
            coverage.remove(m.subject)
            return
        coverage.add(m.subject, m.seq, decode(m.data, ProjectorStatus))
        if coverage.position >= seq:
            reached.set()

    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_PROJECTOR,
                           filter_subjects=[SNAPSHOT_PROJECTOR, STATUS_PARTITIONS],
                           handler=keep)
    await reader.start()
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reached.wait(), timeout)
    finally:
        await reader.stop()
    return coverage.position


async def forget_host(nc: Client, host: str, *, timeout: float = 10.0) -> ForgetOutcome:
    """Forget `host` (see the module doc).  CrrError for a host crr knows nothing of."""
    had_record = await _has_record(nc, host)
    if not had_record and not await _stored_events(nc, host):
        raise CrrError(f"unknown host {host!r}: no snapshot record and no stored event")
    try:
        who = f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        who = None
    event = Forget(host=host, requested_at=format_time(time.time()), by=who)
    ack = await nc.jetstream().publish(
        forget_subject(host), encode(event),
        headers={MSG_ID_HEADER: forget_msg_id(host, uuid.uuid4().hex)})
    seq = int(ack.seq)
    purged = await _purge(nc, host, seq)
    position = await wait_for_position(nc, seq, timeout)
    removed = position >= seq and not await _has_record(nc, host)
    return ForgetOutcome(host=host, forget_seq=seq, purged=purged, had_record=had_record,
                         record_removed=removed, projector_position=position)


def check(outcome: ForgetOutcome, timeout: float) -> None:
    """CrrTimeoutError unless the record is gone (or there was none)."""
    if outcome.had_record and not outcome.record_removed:
        raise CrrTimeoutError(
            f"forgot host {outcome.host} in {EVENTS_STREAM} (seq {outcome.forget_seq}, "
            f"{outcome.purged} event(s) purged) but no projector applied it within "
            f"{timeout:g}s (it is at seq {outcome.projector_position}): the snapshot record "
            "goes when a projector runs")
