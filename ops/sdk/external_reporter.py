"""The external-reporter SDK as `crr` exports it: publishing, and what became of it.

`crr.producers.external.ExternalPublisher` publishes (outbox, `boot`/`seq`,
`Nats-Msg-Id`, buffering through outages).  Saying what became of a report
needs the snapshot's coverage (`crr.projections.coverage`, read by
`crr.sdk.report_outcome`), which the producers layer may not import; so
the SDK users get this subclass, which adds:

* at connect, the reporter is checked against the active catalog: one the
  catalog does not declare raises `UnknownReporterError` before anything is
  published (every value it sent would be rejected and leave a `rejecting` row);
* `await rep.submit(values, host=…)`: publish one report and wait for the
  projector's verdict, as `crr report` does — the `ReportOutcome` when every
  value was applied, else `ReportRejectedError` with each rejected value's
  reason (or why the report was not applied at all);
* `CycleLog`: one line per published report with its verdict (`crr external
  run`), from the outbox's acknowledgements.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from crr.bus import jetstream
from crr.bus.catalog_watch import check_declared
from crr.bus.connection import Connection
from crr.producers.external import ExternalPublisher
from crr.schemas.catalog import Catalog
from crr.schemas.codec import decode, event_message
from crr.schemas.errors import BusError, CrrError
from crr.schemas.events import Health, Report, check_finite
from crr.schemas.subjects import REPORT_PREFIX, parse_event_subject
from crr.sdk.report_outcome import ReportOutcome, outcome

log = logging.getLogger("crr.external")


class ExternalReporter(ExternalPublisher):
    """The SDK: `crr.producers.external.ExternalPublisher` plus the catalog check and `submit`."""

    catalog: Catalog | None = None
    """The active catalog as last read (at connect, and by each `submit`)."""

    async def start(self) -> None:
        """Check the reporter against the active catalog, then start the sender.

        UnknownReporterError when the catalog does not declare it.  Credentials that
        may not read the catalog skip the check (with a warning): the projector still
        rejects what it must.
        """
        try:
            self.catalog = await check_declared(self.nc, self.reporter)
        except BusError as exc:
            log.warning("cannot read the active catalog (%s): reporter %s is not checked "
                        "before publishing", exc, self.reporter)
        await super().start()

    async def submit(
        self, values: Mapping[str, Any], *, host: str | None = None,
        observed_at: float | None = None, timeout: float = 10.0,
    ) -> ReportOutcome:
        """Publish `values` and wait (at most `timeout` s) for the projector's verdict.

        Returns the outcome when every value was applied; raises ReportRejectedError
        (`.rejected`: name → why, `.applied`, `.state`) when any was rejected, the
        report was dead-lettered, or no catalog is active yet (`pending`);
        UnknownReporterError before publishing for an undeclared reporter;
        CrrTimeoutError when no projector covered it in time (it stays stored).
        Reports queued with `report()` are flushed first, so this one is never
        overtaken by an older value.
        """
        check_finite(values)
        self.catalog = await check_declared(self.nc, self.reporter)
        await self.flush(timeout)
        event = self.publisher(host).next_report(
            values, time.time() if observed_at is None else observed_at)
        msg = event_message(event)
        seq = await jetstream.publish(self.nc, msg.subject, msg.payload, headers=msg.headers,
                                      timeout=timeout, where=msg.subject)
        verdict = await outcome(self.nc, seq=seq, reporter=self.reporter, host=host,
                                observed_at=event.observed_at, names=list(values),
                                timeout=timeout)
        if not verdict.ok:
            raise verdict.error()
        return verdict


def _show(values: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items()) or "no values"


class CycleLog:
    """One line per report a reporter published, with the projector's verdict, and one per
    health change (`crr external run` without `--quiet`).

    Fed by the outbox's acknowledgements (`Outbox.on_ack`): only what was stored is
    shown, each report once.  The verdict is waited for in a task per report, so a
    slow projector never holds the sender.
    """

    def __init__(self, nc: Connection, reporter: str, *, out: Callable[[str], None],
                 timeout: float = 10.0) -> None:
        self.nc = nc
        self.reporter = reporter
        self.out = out
        self.timeout = timeout
        self._tasks: set[asyncio.Task[None]] = set()

    def acked(self, subject: str, payload: bytes, seq: int) -> None:
        """`Outbox.on_ack`: a report gets its verdict looked up, a health change a line."""
        try:
            if subject.startswith(REPORT_PREFIX):
                task = asyncio.create_task(self._judge(decode(payload, Report), seq))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif parse_event_subject(subject).kind == "health":
                health = decode(payload, Health)
                detail = f": {health.detail}" if health.detail else ""
                self.out(f"{self.reporter}: health {health.state}{detail}")
        except CrrError as exc:  # our own event, so not expected: say so, keep running
            log.warning("cannot show the event on %s: %s", subject, exc)

    async def _judge(self, report: Report, seq: int) -> None:
        head = f"{self.reporter}: published {_show(report.values)} (seq {seq})"
        try:
            verdict = await outcome(self.nc, seq=seq, reporter=report.reporter,
                                    host=report.host, observed_at=report.observed_at,
                                    names=list(report.values), timeout=self.timeout)
        except CrrError as exc:
            self.out(f"{head}: no verdict ({exc})")
            return
        self.out(f"{head}: " + ("applied" if verdict.ok else "; ".join(verdict.lines())))

    async def close(self) -> None:
        """Stop waiting for verdicts still outstanding."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
