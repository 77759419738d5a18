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
as they should.  Pure bookkeeping lives in the fold (`crr.projections.fold`);
this module is the IO.

`crr hosts forget HOST --reporter R` forgets one reporter's row on the host (a
reporter taken out of the catalog, a `rejecting` row of a name never declared):
the same event with `reporter` set; the projector drops that row, its values and
its inventory, and rewrites the record (or deletes it when nothing is left).
Nothing is purged: the reporter's events stay in CRR_EVENTS until retention, and a
rebuild folds the Forget after them, so it drops them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import socket
import time
import uuid
from dataclasses import dataclass

from crr.bus import jetstream
from crr.bus.connection import Connection
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.projections.coverage import Coverage
from crr.schemas.codec import decode, encode
from crr.schemas.errors import CrrError, CrrTimeoutError, JetStreamError, NotFoundOnServerError
from crr.schemas.events import Forget
from crr.schemas.snapshot import HostSnapshot, ProjectorStatus
from crr.schemas.subjects import (
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
from crr.schemas.wire_time import format_time


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
    reporter: str | None = None
    """Set when one reporter's row was forgotten: `had_record` and `record_removed` then
    say whether the record had that row, and whether it is gone now."""

    def describe(self) -> str:
        """One line for people."""
        if self.reporter is not None:
            row = ("row removed" if self.record_removed else "row NOT removed yet")
            return (f"forgot reporter {self.reporter} on host {self.host}: {row} (its "
                    f"values and inventory with it); forget recorded at {EVENTS_STREAM} seq "
                    f"{self.forget_seq}")
        record = ("snapshot record removed" if self.had_record and self.record_removed
                  else "no snapshot record" if not self.had_record
                  else "snapshot record NOT removed yet")
        return (f"forgot host {self.host}: {record}; {self.purged} event(s) purged from "
                f"{EVENTS_STREAM}; forget recorded at {EVENTS_STREAM} seq {self.forget_seq}")


def _host_filter(host: str) -> str:
    """Every stored event subject of `host`, in both layouts (and earlier Forgets)."""
    return host_history_filter(host)


async def _record(nc: Connection, host: str) -> HostSnapshot | None:
    """The host's snapshot record (None: no record, or its delete marker)."""
    try:
        msg = await jetstream.get_last(nc, SNAPSHOT_STREAM, host_snapshot_subject(host))
    except NotFoundOnServerError:
        return None
    return decode(msg.data, HostSnapshot) if msg.data else None


async def _has_record(nc: Connection, host: str) -> bool:
    return await _record(nc, host) is not None


async def _stored_events(nc: Connection, host: str) -> int:
    """Events of `host` in CRR_EVENTS (earlier Forgets not counted)."""
    state = await jetstream.stream_state(nc, EVENTS_STREAM, subjects=_host_filter(host))
    return sum(n for s, n in (state.subjects or {}).items()
               if not s.startswith(ADMIN_HOST_PREFIX))


async def _purge(nc: Connection, host: str, before_seq: int) -> int:
    """Purge the host's events stored before `before_seq`; how many were removed."""
    try:
        return await jetstream.purge(nc, EVENTS_STREAM, subject=_host_filter(host),
                                     before_seq=before_seq)
    except JetStreamError as exc:
        raise CrrError(f"cannot purge the events of {host!r} from {EVENTS_STREAM}: "
                       f"{exc.message}") from None


async def wait_for_position(nc: Connection, seq: int, timeout: float) -> int:
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


async def _publish(nc: Connection, event: Forget) -> int:
    """Publish `event` on its host's admin subject; its CRR_EVENTS sequence."""
    return await jetstream.publish(
        nc, forget_subject(event.host), encode(event),
        headers={MSG_ID_HEADER: forget_msg_id(event.host, uuid.uuid4().hex)})


def _who() -> str | None:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return None


async def forget_reporter(nc: Connection, host: str, reporter: str, *,
                          timeout: float = 10.0) -> ForgetOutcome:
    """Forget `reporter`'s row on `host` (see the module doc).  CrrError when the host's
    record has no such row (naming the rows it has)."""
    record = await _record(nc, host)
    if record is None:
        raise CrrError(f"unknown host {host!r}: no snapshot record")
    if reporter not in record.reporters and reporter not in record.inventory:
        rows = ", ".join(sorted(record.reporters)) or "none"
        raise CrrError(f"host {host!r} has no reporter {reporter!r} (its reporters: {rows})")
    seq = await _publish(nc, Forget(host=host, requested_at=format_time(time.time()),
                                    by=_who(), reporter=reporter))
    position = await wait_for_position(nc, seq, timeout)
    after = await _record(nc, host) if position >= seq else record
    removed = after is None or (reporter not in after.reporters
                                and reporter not in after.inventory)
    return ForgetOutcome(host=host, forget_seq=seq, purged=0, had_record=True,
                         record_removed=removed, projector_position=position,
                         reporter=reporter)


async def forget_host(nc: Connection, host: str, *, timeout: float = 10.0) -> ForgetOutcome:
    """Forget `host` (see the module doc).  CrrError for a host crr knows nothing of."""
    had_record = await _has_record(nc, host)
    if not had_record and not await _stored_events(nc, host):
        raise CrrError(f"unknown host {host!r}: no snapshot record and no stored event")
    seq = await _publish(nc, Forget(host=host, requested_at=format_time(time.time()),
                                    by=_who()))
    purged = await _purge(nc, host, seq)
    position = await wait_for_position(nc, seq, timeout)
    removed = position >= seq and not await _has_record(nc, host)
    return ForgetOutcome(host=host, forget_seq=seq, purged=purged, had_record=had_record,
                         record_removed=removed, projector_position=position)


def check(outcome: ForgetOutcome, timeout: float) -> None:
    """CrrTimeoutError unless the record (or the reporter's row) is gone (or there was none)."""
    if outcome.reporter is not None and not outcome.record_removed:
        raise CrrTimeoutError(
            f"forgot reporter {outcome.reporter} on host {outcome.host} in {EVENTS_STREAM} "
            f"(seq {outcome.forget_seq}) but no projector applied it within {timeout:g}s (it "
            f"is at seq {outcome.projector_position}): the row goes when a projector runs")
    if outcome.had_record and not outcome.record_removed:
        raise CrrTimeoutError(
            f"forgot host {outcome.host} in {EVENTS_STREAM} (seq {outcome.forget_seq}, "
            f"{outcome.purged} event(s) purged) but no projector applied it within "
            f"{timeout:g}s (it is at seq {outcome.projector_position}): the snapshot record "
            "goes when a projector runs")
