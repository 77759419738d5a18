"""Plain-text tables of hosts × values with freshness marks (CLI listings, `crr demo`)."""

from __future__ import annotations

from typing import Any

from schemas.snapshot import ClusterSnapshot, HostSnapshot, ValueEntry

MARKS = {"fresh": "", "stale": "~", "unknown": "?"}
LEGEND = "~ stale (last value shown)   ? unknown (reporter said null)   - never reported"


def show_value(entry: ValueEntry | None) -> str:
    """A value as a cell: `812.5`, `~812.5` (stale), `?` (unknown), `-` (absent)."""
    if entry is None:
        return "-"
    if entry.state == "unknown":
        return "?"
    v: Any = entry.value if entry.state == "fresh" else entry.last_value
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, float):
        text = f"{v:.1f}" if abs(v) < 1e6 else f"{v:.3g}"
    elif isinstance(v, list):
        text = ",".join(str(x) for x in v) or "{}"
    elif v is None:
        text = "null"
    else:
        text = str(v)
    if len(text) > 24:
        text = text[:21] + "..."
    return MARKS[entry.state] + text


def render_hosts(
    hosts: list[HostSnapshot], cluster: ClusterSnapshot | None = None,
    resources: list[str] | None = None,
) -> str:
    """A table with one row per host and one column per resource (sorted), then cluster values."""
    names = resources or sorted({n for h in hosts for n in h.values})
    header = ["HOST", *names, "REPORTERS"]
    rows = [header]
    for h in sorted(hosts, key=lambda s: s.host):
        bad = sorted(f"{r}:{s.state}" for r, s in h.reporters.items() if s.state != "ok")
        rows.append([h.host, *(show_value(h.values.get(n)) for n in names),
                     " ".join(bad) or "ok"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if cluster is not None and cluster.values:
        lines.append("")
        lines.append("cluster: " + "  ".join(
            f"{n}={show_value(e)}" for n, e in sorted(cluster.values.items())))
    return "\n".join(lines)
