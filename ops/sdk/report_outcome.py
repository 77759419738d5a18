"""What became of one published report: applied, rejected, dead-lettered (`crr report`,
the SDK's `submit`, `crr external run`'s cycle lines).

`crr report` publishes, then waits — on the projector's position, never on
time — until the snapshot covers the report's `CRR_EVENTS` sequence, and
reads the outcome from what the projector wrote:

* the host's (or cluster's) record: each value the report set carries its
  `observed_at`; a value it did not set was rejected, with the reason from
  the reporter status's `rejections` (`"name: why"`);
* `crr.v1.deadletter` (in `CRR_EVENTS`, written before the status that
  covers the event): a report the projector could not apply at all (wrong
  kind of subject for every value, payload and subject disagree).

The wait follows only the subjects it needs (one ordered consumer on the
projector status records, the catalog and the one snapshot record), so it
costs the same on 10 hosts as on 50,000.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from crr.bus import jetstream
from crr.bus.connection import Connection
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.schemas.codec import decode
from crr.schemas.errors import (
    BusError,
    CrrTimeoutError,
    NotFoundOnServerError,
    PayloadError,
    ReportRejectedError,
)
from crr.schemas.events import DeadLetter
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot
from crr.schemas.subjects import (
    DEADLETTER,
    EVENTS_STREAM,
    SNAPSHOT_ALL,
    SNAPSHOT_CATALOG,
    SNAPSHOT_CLUSTER,
    SNAPSHOT_PROJECTOR,
    SNAPSHOT_STREAM,
    STATUS_PARTITIONS,
    host_snapshot_subject,
)
from crr.view.snapshot_reader import SnapshotContents, absorb

OutcomeState = Literal["applied", "rejected", "deadlettered", "pending", "not_applied"]

_DEADLETTER_SCAN = 1000
"""Dead letters looked at after the report's sequence before giving up the search."""


@dataclass(frozen=True)
class ReportOutcome:
    """The projector's verdict on one report."""

    state: OutcomeState
    applied: list[str] = field(default_factory=list)
    """Names whose value the report set."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Name → why it was rejected."""
    reason: str | None = None
    """For dead-lettered, pending or not-applied reports: why."""

    @property
    def ok(self) -> bool:
        """Every value was applied."""
        return self.state == "applied"

    def lines(self) -> list[str]:
        """One line per finding, for the operator."""
        if self.state in ("applied", "rejected"):
            out = []
            if self.applied:
                out.append(f"applied: {', '.join(self.applied)}")
            out += [f"rejected: {why}" for why in self.rejected.values()]
            return out
        label = {"deadlettered": "dead-lettered", "pending": "pending",
                 "not_applied": "not applied"}[self.state]
        return [f"{label}: {self.reason}"]

    def error(self) -> ReportRejectedError:
        """The error the SDK's `submit` raises for a report not wholly applied: its lines."""
        return ReportRejectedError("; ".join(self.lines()), state=self.state,
                                   applied=self.applied, rejected=self.rejected,
                                   reason=self.reason)


def _filters(host: str | None) -> list[str]:
    record = SNAPSHOT_CLUSTER if host is None else host_snapshot_subject(host)
    return [SNAPSHOT_PROJECTOR, STATUS_PARTITIONS, SNAPSHOT_CATALOG, record]


async def wait_covered(
    nc: Connection, seq: int, host: str | None, timeout: float,
) -> SnapshotContents:
    """The snapshot subjects of `host` (None: the cluster) once the projector covers `seq`.

    Stream order makes this exact: a projector writes its status after the
    records of the events it covers, so when a status covering `seq` has
    been read, the record read before it reflects the report.
    """
    contents = SnapshotContents()
    covered = asyncio.Event()
    reader: OrderedReader | None = None

    def on_msg(m: StoredMessage) -> None:
        absorb(contents, m)
        if reader is not None and reader.ready.is_set() and contents.projector_position >= seq:
            covered.set()

    reader = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL,
                           handler=on_msg, filter_subjects=_filters(host))
    await reader.start()
    try:
        async with asyncio.timeout(timeout):
            await reader.ready.wait()  # the load delivers last-per-subject, then live
            if contents.projector_position < seq:
                await covered.wait()
    except TimeoutError:
        where = ("no projector status on this server: is `crr projector` running?"
                 if not contents.coverage.current else
                 f"the projector has covered events up to seq {contents.projector_position}")
        raise CrrTimeoutError(f"no outcome for event seq {seq} within {timeout:g}s ({where}); "
                              "the report is stored and will be applied when the projector "
                              "catches up") from None
    finally:
        await reader.stop()
    return contents


async def find_deadletter(nc: Connection, seq: int) -> DeadLetter | None:
    """The dead letter of `CRR_EVENTS` event `seq`, if the projector wrote one.

    Looked up with the stream's next-by-subject get, from `seq` on (a dead
    letter is stored after its event), so only dead letters are read.
    """
    js = jetstream.jetstream(nc, timeout=2.0)  # a refusal (reporter credentials) ends in a timeout
    at = seq
    for _ in range(_DEADLETTER_SCAN):
        try:
            msg = await jetstream.get(js, EVENTS_STREAM, at, subject=DEADLETTER, next=True)
        except NotFoundOnServerError:
            return None
        if not msg.data or not msg.seq:
            return None
        try:
            letter = decode(msg.data, DeadLetter)
        except PayloadError:
            letter = None
        if letter is not None and letter.seq == seq:
            return letter
        at = msg.seq + 1
    return None


def judge(
    contents: SnapshotContents, *, reporter: str, host: str | None, observed_at: str,
    names: list[str],
) -> ReportOutcome | None:
    """The outcome read from the record alone; None when the record does not show the report."""
    record: HostSnapshot | ClusterSnapshot | None = (
        contents.cluster if host is None else contents.hosts.get(host))
    if record is None:
        return None
    applied = [n for n in names
               if (v := record.values.get(n)) is not None and v.reporter == reporter
               and v.observed_at == observed_at]
    if len(applied) == len(names):
        return ReportOutcome("applied", applied=applied)
    status = record.reporters.get(reporter)
    reasons = {}
    for why in status.rejections if status is not None else []:
        name = why.partition(":")[0]
        if name in names and name not in applied:
            reasons[name] = why
    if not applied and not reasons:
        return None  # nothing of ours in the record: not applied at all
    for n in names:
        if n not in applied and n not in reasons:
            reasons[n] = f"{n}: rejected (see `crr health --reporter {reporter}`)"
    return ReportOutcome("rejected", applied=applied, rejected=reasons)


async def outcome(
    nc: Connection, *, seq: int, reporter: str, host: str | None, observed_at: str,
    names: list[str], timeout: float,
) -> ReportOutcome:
    """Wait (at most `timeout` s) until the projector has handled event `seq`; say what it did."""
    contents = await wait_covered(nc, seq, host, timeout)
    found = judge(contents, reporter=reporter, host=host, observed_at=observed_at, names=names)
    if found is not None:
        return found
    try:
        letter = await find_deadletter(nc, seq)
    except BusError as exc:
        # e.g. reporter credentials, which may read the snapshot but not CRR_EVENTS
        return ReportOutcome("not_applied", reason=f"none of its values is in the snapshot; "
                             f"cannot read {DEADLETTER} to say why ({exc or type(exc).__name__})")
    if letter is not None:
        return ReportOutcome("deadlettered", reason=letter.reason)
    if contents.catalog is None:
        return ReportOutcome("pending", reason="no catalog is active yet: the projector keeps "
                             "the report and applies it once `crr catalog apply` has run")
    return ReportOutcome("not_applied", reason="none of its values is in the snapshot "
                         "(a later report may have replaced them)")
