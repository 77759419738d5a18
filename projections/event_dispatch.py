"""A decoded event applied by what it is: a report (`crr.projections.reports`), an inventory
(the reporter's pool on a host) or a health event (the runner's view of the reporter)."""

from __future__ import annotations

from crr.projections.changes import Acc, stamp
from crr.projections.deadlines import push, reporter_of
from crr.projections.reports import apply_report
from crr.projections.state import InventorySlot, ProjectionState
from crr.projections.validation import validate_devices
from crr.schemas.events import Health, Inventory, Report


def apply_event(state: ProjectionState, event: Report | Inventory | Health, host: str | None,
                received_at: float, acc: Acc, *, strict_scope: bool) -> str | None:
    """Apply a decoded event whose identity matches its subject; a dead-letter reason or None.

    `strict_scope`: dead-letter a report whose every value is of the other scope
    (else those values are rejected one by one and show on the reporter).
    """
    match event:
        case Report():
            return apply_report(state, event, host, received_at, acc, strict_scope=strict_scope)
        case Inventory():
            _apply_inventory(state, event, host, received_at, acc)
        case Health():
            _apply_health(state, event, host, received_at, acc)
    return None


def _apply_inventory(
    state: ProjectionState, inv: Inventory, host: str | None, received_at: float, acc: Acc
) -> None:
    """Apply an Inventory: replaces the reporter's pool on that host unless it is malformed."""
    reporter = inv.reporter
    rec = state.record(host)
    rs = reporter_of(state, rec, reporter, host, received_at)
    life = state.plan.reporter_lifetime(reporter)
    bad = validate_devices(inv.devices)
    if bad is None:
        rec.inventory[reporter] = InventorySlot(
            pool=inv.pool, devices=inv.devices, observed_at=inv.observed_at,
            received_at=received_at, expires_at=received_at + life)
        rs.rejected, rs.rejections = 0, []
    else:
        rs.rejected, rs.rejections = 1, [bad.reason]  # the previous inventory stays
        rs.rejected_total += 1
    rs.last_report_at = received_at
    rs.silent = False
    rs.restate(received_at)
    push(state, received_at + life, host, reporter, None)
    stamp(rec, acc)
    acc.touch(host)


def _apply_health(
    state: ProjectionState, health: Health, host: str | None, received_at: float, acc: Acc
) -> None:
    """Apply a Health event: the runner's view of the reporter's lifecycle."""
    reporter = health.reporter
    rec = state.record(host)
    new = reporter not in rec.reporters
    rs = reporter_of(state, rec, reporter, host, received_at)
    rs.health = health.state
    rs.detail = health.detail
    rs.exit_code = health.exit_code
    rs.boot = health.boot
    rs.restate(received_at)
    if new:
        # A reporter seen only through Health turns silent if it never reports.
        push(state, received_at + state.plan.reporter_lifetime(reporter), host, reporter,
              None)
    stamp(rec, acc)
    acc.touch(host)
