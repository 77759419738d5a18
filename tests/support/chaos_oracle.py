"""The chaos run's ground truth: what every host should hold, folded with plain dictionaries.

Deliberately independent of crr's fold (`crr.projections.fold`): no crr import,
no Structs, just the rules of docs/contract.md ("Subjects and streams", "Payloads",
"`resources.yaml`") as the chaos run exercises them —

- a report refreshes the values it carries (those its reporter owns in the
  catalog in force and that are valid); every value it omits stays;
- an invalid value is not stored and the previous value stays;
- `null` is stored (the value is unknown);
- a forgotten host is gone (until it reports again);
- a new catalog keeps a stored value only while the catalog still declares its
  resource, with the same reporter, at host scope, and the value still
  validates (`crr.projections.catalog_change._recatalog`); a value dropped stays dropped.

Intervals are one hour, so nothing expires during a run and the oracle needs
no clock.  The catalogs themselves are plain dictionaries too, rendered as
`resources.yaml` text for `crr catalog apply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Spec = dict[str, Any]
"""One resource: `reporter`, `kind` and the bounds the variants use (`min`, `max`)."""

INTERVAL = "1h"

BASE: dict[str, Spec] = {
    "r_free": {"reporter": "sys", "kind": "numeric", "min": 0, "max": 1_000_000},
    "r_os": {"reporter": "sys", "kind": "string"},
    "r_sets": {"reporter": "sys", "kind": "string_set"},
    "r_ok": {"reporter": "sys", "kind": "boolean"},
    "d_free": {"reporter": "ds", "kind": "numeric", "min": 0},
    "d_cache": {"reporter": "ds", "kind": "string_set"},
}
"""The first catalog: two reporters per host, every kind of value."""

REPORTERS: dict[str, list[str]] = {"sys": ["r_free", "r_os", "r_sets", "r_ok"],
                                   "ds": ["d_free", "d_cache"]}
"""What each reporter measures (its script does not know which catalog is in force)."""


def _variant(drop: tuple[str, ...] = (), **changes: Spec) -> dict[str, Spec]:
    out = {n: dict(s) for n, s in BASE.items() if n not in drop}
    for name, change in changes.items():
        out[name] = {**out[name], **change}
    return out


CATALOGS: dict[str, dict[str, Spec]] = {
    "base": BASE,
    "no_sets": _variant(drop=("r_sets",)),  # r_sets values go, later ones are rejected
    "tight": _variant(r_free={"max": 500}),  # r_free above 500 goes, and is rejected
    "moved": _variant(d_cache={"reporter": "sys"}),  # ds's d_cache goes (wrong reporter)
    "slower": _variant(r_os={"interval": "2h"}),  # a lifetime change: everything stays
}
"""Catalogs the run applies (`crr catalog apply`), by name."""


def catalog_yaml(name: str) -> str:
    """`resources.yaml` text of catalog `name` (every interval 1 h unless the variant says)."""
    lines = ["version: 1", "resources:"]
    for res, spec in CATALOGS[name].items():
        fields = [f"kind: {spec['kind']}", "scope: host", f"reporter: {spec['reporter']}",
                  f"interval: {spec.get('interval', INTERVAL)}"]
        fields += [f"{bound}: {spec[bound]}" for bound in ("min", "max") if bound in spec]
        lines.append(f"  {res}: {{{', '.join(fields)}}}")
    lines.append("reporters:")
    lines += [f"  {rep}: {{type: external, interval: {INTERVAL}}}" for rep in REPORTERS]
    return "\n".join(lines) + "\n"


def valid(spec: Spec, value: Any) -> bool:
    """Whether `value` may be stored under `spec` (the kinds and bounds the run uses)."""
    if value is None:
        return True
    kind = spec["kind"]
    if kind == "numeric":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return ok and spec.get("min", value) <= value <= spec.get("max", value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass
class Oracle:
    """Per host, per resource: (reporter, value) — what the snapshot must show."""

    catalog: dict[str, Spec] = field(default_factory=lambda: CATALOGS["base"])
    hosts: dict[str, dict[str, tuple[str, Any]]] = field(default_factory=dict)

    def report(self, host: str, reporter: str, values: dict[str, Any]) -> None:
        """A stored report: it refreshes what it carries; rejected values change nothing."""
        held = self.hosts.setdefault(host, {})
        for name, value in values.items():
            spec = self.catalog.get(name)
            if spec is not None and spec["reporter"] == reporter and valid(spec, value):
                held[name] = (reporter, sorted(set(value)) if isinstance(value, list)
                              else value)

    def forget(self, host: str) -> None:
        """`crr hosts forget`: the host is gone."""
        self.hosts.pop(host, None)

    def apply_catalog(self, name: str) -> None:
        """A new catalog: keep what it still declares for the same reporter and accepts."""
        new = CATALOGS[name]
        if new == self.catalog:
            return
        self.catalog = new
        for held in self.hosts.values():
            for res, (reporter, value) in list(held.items()):
                spec = new.get(res)
                if spec is None or spec["reporter"] != reporter or not valid(spec, value):
                    del held[res]

    def values(self) -> dict[str, dict[str, Any]]:
        """host -> resource -> value, as the snapshot must show them."""
        return {h: {n: v for n, (_, v) in held.items()} for h, held in self.hosts.items()}
