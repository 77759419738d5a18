"""Plain-text tables of hosts × values with freshness marks (CLI listings, `crr demo`).

`render_hosts` is the one-row-per-host table (`crr hosts`, like `lsload`);
`render_host_long` the vertical per-host view (`crr hosts -l`, like
`lsload -l` / `bhosts -l`).  Values are cut at `CELL_WIDTH` characters
unless `wide` (`-w`); whole numbers print without `.0`.
"""

from __future__ import annotations

import math
from typing import Any, Final

from crr.admin.host_status import STATUS_HELP, host_status
from crr.admin.reporter_health import FAILING_STATES
from crr.projections.freshness import entry_state
from crr.schemas.catalog import Catalog
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry
from crr.schemas.wire_time import seconds_of

MARKS = {"fresh": "", "stale": "~", "unknown": "?"}
LEGEND = "~ stale (last value shown)   ? unknown (reporter said null)   - never reported"
CELL_WIDTH: Final = 24


def show_number(v: float, wide: bool = False) -> str:
    """`812.5`, `4` (whole numbers without `.0`), `1.2e+09`; every digit with `wide`."""
    if math.isfinite(v) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    if wide:
        return repr(v)
    return f"{v:.1f}" if 0.1 <= abs(v) < 1e6 else f"{v:.3g}"


def show_plain(v: Any, wide: bool = False) -> str:
    """A value without freshness mark: booleans as true/false, sets joined with commas."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return show_number(float(v), wide) if isinstance(v, float) else str(v)
    if isinstance(v, list):
        return ",".join(str(x) for x in v) or "{}"
    if v is None:
        return "null"
    return str(v)


def show_value(entry: ValueEntry | None, *, wide: bool = False, now: float | None = None) -> str:
    """A value as a cell: `812.5`, `~812.5` (stale), `?` (unknown), `-` (absent).

    With `now`, a fresh value past its `expires_at` shows as stale.
    """
    if entry is None:
        return "-"
    state = entry.state if now is None else entry_state(entry, now)
    if state == "unknown":
        return "?"
    text = show_plain(entry.value if state == "fresh" else
                      (entry.last_value if entry.state == "stale" else entry.value), wide)
    if not wide and len(text) > CELL_WIDTH:
        text = text[:CELL_WIDTH - 3] + "..."
    return MARKS[state] + text


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def reporter_problems(snap: HostSnapshot) -> str:
    """The REPORTERS cell: `name:state` of each reporter that is not ok, else `ok`."""
    bad = sorted(f"{r}:{s.state}" for r, s in snap.reporters.items() if s.state != "ok")
    return " ".join(bad) or "ok"


def render_hosts(
    hosts: list[HostSnapshot], cluster: ClusterSnapshot | None = None,
    resources: list[str] | None = None, *, now: float | None = None, wide: bool = False,
) -> str:
    """A table with one row per host and one column per resource (sorted), then cluster values.

    With `now`, a STATUS column (see `crr.admin.host_status`) follows HOST and values
    are shown as they are at `now`.
    """
    names = resources or sorted({n for h in hosts for n in h.values})
    status = ["STATUS"] if now is not None else []
    header = ["HOST", *status, *names, "REPORTERS"]
    rows = [header]
    for h in sorted(hosts, key=lambda s: s.host):
        cells = [host_status(h, now)] if now is not None else []
        rows.append([h.host, *cells,
                     *(show_value(h.values.get(n), wide=wide, now=now) for n in names),
                     reporter_problems(h)])
    lines = _columns(rows)
    if cluster is not None and cluster.values:
        lines.append("")
        lines.append("cluster: " + "  ".join(
            f"{n}={show_value(e, wide=wide, now=now)}" for n, e in sorted(cluster.values.items())))
    return "\n".join(lines)


def legend(status: bool = False) -> str:
    """The legend under a table (with the STATUS values when the table has that column)."""
    return f"{LEGEND}\n{STATUS_HELP}" if status else LEGEND


def show_age(seconds: float) -> str:
    """A duration for people: `3s`, `2m05s`, `1h02m`, `3d04h`."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _since(text: str | None, ts: float | None, now: float) -> str:
    """`12s ago` for a past time, `in 30s` for a future one, `-` for none (`ts`: the
    time's numeric twin, None for a record from an older writer)."""
    if not text:
        return "-"
    t = seconds_of(ts, text)
    if t == -math.inf:
        return text
    return f"{show_age(now - t)} ago" if t <= now else f"in {show_age(t - now)}"


def _cut(text: str, wide: bool, width: int = 60) -> str:
    return text if wide or len(text) <= width else text[:width - 3] + "..."


def render_host_long(
    snap: HostSnapshot, now: float, catalog: Catalog | None = None, *, wide: bool = False,
) -> str:
    """The vertical view of one host: status, every value (state, age, reporter, expiry) —
    also the catalog's host resources never reported — inventory, and reporter health."""
    lines = [f"HOST {snap.host}   STATUS {host_status(snap, now)}   "
             f"as of {snap.as_of.time} (CRR_EVENTS seq {snap.as_of.seq})"]
    names = set(snap.values)
    if catalog is not None:
        names |= {n for n, r in catalog.resources.items() if r.scope == "host"}
    rows = [["RESOURCE", "VALUE", "STATE", "AGE", "REPORTER", "EXPIRES"]]
    for name in sorted(names):
        entry = snap.values.get(name)
        if entry is None:
            reporter = catalog.resources[name].reporter if catalog is not None else "-"
            rows.append([name, "-", "never_reported", "-", reporter, "-"])
            continue
        state = entry_state(entry, now)
        value = entry.value if state == "fresh" else (
            entry.last_value if entry.state == "stale" else entry.value)
        shown = "?" if state == "unknown" else MARKS[state] + _cut(show_plain(value, wide),
                                                                   wide, CELL_WIDTH)
        age = show_age(now - seconds_of(entry.received_ts, entry.received_at))
        rows.append([name, shown, state, age, entry.reporter,
                     _since(entry.expires_at, entry.expires_ts, now)])
    lines.append("")
    lines.extend(_columns(rows))
    if snap.inventory:
        rows = [["INVENTORY", "DEVICES", "STATE", "REPORTER", "EXPIRES"]]
        for name, inv in sorted(snap.inventory.items()):
            inv_state = entry_state(inv, now)
            rows.append([name, str(len(inv.devices)), inv_state, inv.reporter,
                         _since(inv.expires_at, inv.expires_ts, now)])
        lines.append("")
        lines.extend(_columns(rows))
    lines.append("")
    if snap.reporters:
        rows = [["REPORTER", "STATE", "SINCE", "LAST REPORT", "REJECTED", "DETAIL"]]
        for name, st in sorted(snap.reporters.items()):
            shown_state = st.state + (" (failing)" if st.state in FAILING_STATES else "")
            rows.append([name, shown_state, _since(st.since, st.since_ts, now),
                         _since(st.last_report_at, st.last_report_ts, now),
                         str(st.rejected), _cut(st.detail or "", wide)])
        lines.extend(_columns(rows))
    else:
        lines.append("no reporter status for this host")
    return "\n".join(lines)
