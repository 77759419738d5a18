"""Shared builders for the select[] and host-table tests (no tests here).

`make_table` builds a HostTable from a compact description: per host, per
resource, either a plain value (fresh), `NULL` (reporter said null), `STALE`
(the snapshot says stale), `EXPIRED` wrapper (snapshot says fresh but
`expires_at` ≤ now) — an omitted resource was never reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from crr.projections.host_table import HostTable
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.snapshot import AsOf, ClusterSnapshot, HostSnapshot, ValueEntry
from crr.schemas.wire_time import format_time

NOW: Final = 1_800_000_000.0


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NULL: Final = _Marker("NULL")
STALE: Final = _Marker("STALE")


@dataclass(frozen=True)
class Expired:
    """A value the snapshot still calls fresh whose `expires_at` is ≤ now."""

    value: Any


@dataclass(frozen=True)
class StaleWas:
    """A stale value with a known last value."""

    last: Any


def _spec(kind: str, scope: str = "host", on_stale: str = "unknown") -> ResourceSpec:
    return ResourceSpec(kind=kind, reporter="r", scope=scope,  # type: ignore[arg-type]
                        on_stale=on_stale, interval=30.0)  # type: ignore[arg-type]


CATALOG: Final = Catalog(
    resources={
        "free": _spec("numeric"),
        "total": _spec("numeric"),
        "load": _spec("numeric"),
        "ok": _spec("boolean"),
        "drain": _spec("boolean"),
        "os": _spec("string"),
        "arch": _spec("string"),
        "tags": _spec("string_set"),
        "ds": _spec("string_set", on_stale="exclude"),
        "guard": _spec("numeric", on_stale="exclude"),
        "lic": _spec("numeric", scope="cluster"),
        "site_up": _spec("boolean", scope="cluster"),
        "region": _spec("string", scope="cluster"),
        "models": _spec("string_set", scope="cluster"),
        "cguard": _spec("boolean", scope="cluster", on_stale="exclude"),
    },
    reporters={"r": ReporterSpec(type="external", interval=30.0)},
)


def entry(spec: Any, now: float = NOW) -> ValueEntry:
    """A snapshot entry from a compact spec (see the module doc)."""
    t = format_time
    if spec is STALE or isinstance(spec, StaleWas):
        last = spec.last if isinstance(spec, StaleWas) else None
        return ValueEntry(value=None, state="stale", reporter="r", observed_at=t(now - 100),
                          received_at=t(now - 100), expires_at=t(now - 55), last_value=last,
                          stale_since=t(now - 55))
    if isinstance(spec, Expired):
        return ValueEntry(value=spec.value, state="fresh", reporter="r",
                          observed_at=t(now - 60), received_at=t(now - 60),
                          expires_at=t(now - 1))
    if spec is NULL:
        return ValueEntry(value=None, state="unknown", reporter="r", observed_at=t(now - 1),
                          received_at=t(now - 1), expires_at=t(now + 44))
    return ValueEntry(value=spec, state="fresh", reporter="r", observed_at=t(now - 1),
                      received_at=t(now - 1), expires_at=t(now + 44))


def host_snapshot(host: str, values: dict[str, Any], now: float = NOW) -> HostSnapshot:
    """A HostSnapshot with `values` in compact form."""
    return HostSnapshot(host=host, as_of=AsOf(seq=1, time=format_time(now)),
                        values={k: entry(v, now) for k, v in values.items()})


def cluster_snapshot(values: dict[str, Any], now: float = NOW) -> ClusterSnapshot:
    """A ClusterSnapshot with `values` in compact form."""
    return ClusterSnapshot(as_of=AsOf(seq=1, time=format_time(now)),
                           values={k: entry(v, now) for k, v in values.items()})


def make_table(hosts: dict[str, dict[str, Any]], cluster: dict[str, Any] | None = None,
               catalog: Catalog = CATALOG) -> HostTable:
    """A HostTable holding `hosts` (and the cluster values, if any)."""
    table = HostTable(catalog)
    for host, values in hosts.items():
        table.upsert(host_snapshot(host, values))
    if cluster is not None:
        table.set_cluster(cluster_snapshot(cluster))
    return table
