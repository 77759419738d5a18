"""Listing cells and host STATUS (crr.host_listing, crr.admin.host_status): pure, given `now`."""

from __future__ import annotations

import msgspec
import pytest

from crr.admin.host_status import host_status
from crr.host_listing import render_host_long, render_hosts, show_age, show_number, show_value
from crr.schemas.snapshot import ReporterStatus
from tests.support.select import (
    CATALOG,
    NOW,
    NULL,
    STALE,
    Expired,
    StaleWas,
    entry,
    host_snapshot,
)


@pytest.mark.parametrize(("value", "wide", "shown"), [
    (812.0, False, "812"), (812.5, False, "812.5"), (4.0, False, "4"), (-3.0, False, "-3"),
    (0.25, False, "0.2"), (0.004, False, "0.004"), (2.5e9, False, "2500000000"),
    (2.5e15, False, "2.5e+15"),
    (1234567.5, False, "1.23e+06"),
    (1e300, False, "1e+300"), (812.56, False, "812.6"), (812.56, True, "812.56"),
    (2000000.0, False, "2000000"),
])
def test_numbers(value: float, wide: bool, shown: str) -> None:
    """Whole numbers print without `.0`; `wide` keeps every digit."""
    assert show_number(value, wide) == shown


def test_value_cells_and_marks() -> None:
    """Marks: `~` stale (also a fresh value past expires_at at `now`), `?` unknown, `-` absent."""
    assert show_value(entry(5.0)) == "5"
    assert show_value(entry(StaleWas(7.0))) == "~7"
    assert show_value(entry(NULL)) == "?"
    assert show_value(None) == "-"
    assert show_value(entry(Expired(9.0))) == "9"  # as recorded
    assert show_value(entry(Expired(9.0)), now=NOW) == "~9"  # as it is at now
    long = entry(["x" * 10, "y" * 10, "z" * 10])
    assert show_value(long) == "xxxxxxxxxx,yyyyyyyyyy..."
    assert show_value(long, wide=True) == ",".join(["x" * 10, "y" * 10, "z" * 10])
    assert show_value(entry(True)) == "true"


def test_host_status() -> None:
    """failing > stale > unknown > ok; a host without values is empty."""
    assert host_status(host_snapshot("h", {"free": 1.0, "os": "a"}), NOW) == "ok"
    assert host_status(host_snapshot("h", {"free": 1.0, "os": NULL}), NOW) == "unknown"
    assert host_status(host_snapshot("h", {"free": STALE, "os": NULL}), NOW) == "stale"
    assert host_status(host_snapshot("h", {"free": Expired(1.0)}), NOW) == "stale"
    assert host_status(host_snapshot("h", {}), NOW) == "empty"
    failing = msgspec.structs.replace(host_snapshot("h", {"free": 1.0}),
                                      reporters={"r": ReporterStatus(state="silent")})
    assert host_status(failing, NOW) == "failing"
    ok = msgspec.structs.replace(host_snapshot("h", {"free": 1.0}),
                                 reporters={"r": ReporterStatus(state="restarting")})
    assert host_status(ok, NOW) == "ok"


def test_table_and_long_view() -> None:
    """The table gets STATUS beside HOST when given `now`; the long view lists catalog
    resources never reported, with ages and expiry relative to `now`."""
    snap = host_snapshot("h1", {"free": 50.0, "os": StaleWas("rhel9")})
    table = render_hosts([snap], None, ["free", "os"], now=NOW)
    assert table.splitlines()[0].split() == ["HOST", "STATUS", "free", "os", "REPORTERS"]
    assert table.splitlines()[1].split() == ["h1", "stale", "50", "~rhel9", "ok"]
    assert render_hosts([snap], None, ["free"]).splitlines()[0].split() == [
        "HOST", "free", "REPORTERS"]
    long = render_host_long(snap, NOW, CATALOG)
    rows = {line.split()[0]: line.split() for line in long.splitlines()[1:] if line.strip()}
    assert rows["free"] == ["free", "50", "fresh", "1s", "r", "in", "44s"]
    assert rows["os"] == ["os", "~rhel9", "stale", "1m40s", "r", "55s", "ago"]
    assert rows["drain"] == ["drain", "-", "never_reported", "-", "r", "-"]
    assert "lic" not in rows  # cluster scope
    assert "no reporter status for this host" in long


def test_ages() -> None:
    """Durations read like LSF's: seconds, minutes, hours, days."""
    assert [show_age(s) for s in (0, 59, 125, 3720, 90000)] == [
        "0s", "59s", "2m05s", "1h02m", "1d01h"]
