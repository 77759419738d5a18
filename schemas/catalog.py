"""The catalog: the custom resources and reporters an admin declares in `resources.yaml`.

The same Structs are the payload of `crr.v1.catalog` and
`crr.v1.snapshot.catalog`.  On the wire, durations are numbers of seconds;
in `resources.yaml` they may also be written `30s`, `5m`, `1h`
(see `crr.schemas.catalog_loader`).  Operator input, so unknown fields are an
error (`forbid_unknown_fields`): a typo must not be silently ignored.
"""

from __future__ import annotations

import fnmatch
from typing import Literal

import msgspec

from crr.schemas.errors import UnknownReporterError, WrongScopeError
from crr.schemas.exposition import InventoryMap

Kind = Literal["numeric", "boolean", "string", "string_set"]
Scope = Literal["host", "cluster"]
OnStale = Literal["unknown", "exclude"]
ReporterType = Literal["script", "external", "textfile", "scrape"]
"""`textfile` and `scrape` are exposition reporters the agent runs itself (no script)."""
Mode = Literal["periodic", "stream"]
OutputFormat = Literal["json", "elim", "prometheus"]

DEFAULT_INTERVAL = 30.0
DEFAULT_MAX_LENGTH = 256
DEFAULT_MAX_ITEMS = 1024
DEFAULT_NOT_APPLICABLE_EXIT = 97
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
DEFAULT_OUTAGE_HOLD = 600.0
"""`outage_hold` when `resources.yaml` sets none: 10 minutes.  Long enough to ride out a
projector restart or rebuild, or a NATS leader election, without a value of a reporter
that kept reporting turning stale; short enough that a real cluster-wide failure of the
reporters shows within minutes (docs/contract.md, "Freshness at the watermark")."""


class ResourceSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One custom resource: its kind, scope, owning reporter and freshness policy."""

    kind: Kind
    reporter: str
    scope: Scope = "host"
    interval: float | None = None
    """Seconds a value stays fresh before grace; defaults to the reporter's interval."""
    grace: float | None = None
    """Extra seconds before a value turns stale; defaults to half the interval."""
    on_stale: OnStale = "unknown"
    unit: str | None = None
    description: str | None = None
    min: float | None = None
    max: float | None = None
    max_length: int = DEFAULT_MAX_LENGTH
    max_items: int = DEFAULT_MAX_ITEMS
    precision: int | msgspec.UnsetType = msgspec.UNSET
    """Decimals a display shows of a numeric value (the status page; default 1): a change
    smaller than that is not a change there.  Left out of the encoded catalog unless set,
    like `ReporterSpec.tty`, so catalogs that do not use it stay readable by older readers."""


class ReporterSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A reporter: a script the agent runs on hosts, or an external publisher."""

    type: ReporterType = "script"
    command: list[str] | None = None
    mode: Mode = "periodic"
    """`periodic` or `stream`.  In `resources.yaml` (and any catalog validated by
    `crr.schemas.catalog_loader`) a reporter with `format: elim` and no `mode` gets
    `stream`: LSF starts an elim once and reads its lines as long as it runs.  An
    encoded catalog always spells `mode` out, so this default applies only where
    the operator left it out."""
    format: OutputFormat = "json"
    interval: float = DEFAULT_INTERVAL
    timeout: float | None = None
    """Seconds a periodic run may take; defaults to min(interval, 10s)."""
    hosts: list[str] = msgspec.field(default_factory=lambda: ["*"])
    env: list[str] = msgspec.field(default_factory=list)
    """Names of agent environment variables passed through to the script."""
    cwd: str = "/"
    not_applicable_exit: int = DEFAULT_NOT_APPLICABLE_EXIT
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    backoff_floor: float = 1.0
    backoff_cap: float = 300.0
    quarantine_after: int = 10
    """Consecutive failures after which the agent stops retrying (`quarantined`)."""
    description: str | None = None
    tty: bool | msgspec.UnsetType = msgspec.UNSET
    """Run the script with stdout on a pseudo-terminal instead of a pipe, so that
    stdio, perl and python line-buffer it as they do on a terminal.  Left out of
    the encoded catalog unless it was set (UNSET is falsy): a catalog that does
    not use it stays readable by agents from before it existed, which reject
    unknown fields."""
    directory: str | msgspec.UnsetType = msgspec.UNSET
    """`type: textfile`: the directory of `*.prom` files (node_exporter's textfile collector)."""
    url: str | msgspec.UnsetType = msgspec.UNSET
    """`type: scrape`: the exporter's metrics URL, e.g. `http://127.0.0.1:9400/metrics`."""
    series: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    """Exposition reporters: resource name → mapping (`crr.schemas.exposition`)."""
    inventory: InventoryMap | msgspec.UnsetType = msgspec.UNSET
    """Exposition reporters: devices from per-device series (`InventoryMap`).
    These four are left out of the encoded catalog unless set, as `tty`."""

    def exposition(self) -> bool:
        """Whether this reporter reads the Prometheus exposition format."""
        return self.type in ("textfile", "scrape") or self.format == "prometheus"

    def effective_timeout(self) -> float:
        """The run timeout, defaulted from the interval."""
        return self.timeout if self.timeout is not None else min(self.interval, 10.0)

    def runs_on(self, host: str) -> bool:
        """Whether the agent on `host` runs this reporter (`hosts` glob patterns)."""
        return self.type != "external" and any(fnmatch.fnmatchcase(host, p) for p in self.hosts)


DEFAULT_DRAIN_FOR = 0.0
"""`for:` of a drain rule left without it: drain at once.  Prometheus' `for:` defaults to
0 too; a broken file system should leave service now, and flapping is damped on the
way back (`resume_after`), where a too-early resume costs failed jobs."""
DEFAULT_RESUME_AFTER = 300.0
"""`resume_after:` of a drain rule left without it: 5 minutes false before crr resumes
the node — NVIDIA NVSentinel's breaker window, and half its 600 s flap window: a value
oscillating every interval gives at most one drain/resume pair per 5 minutes."""
DEFAULT_SETTLE = 0.0
"""`exports.settle` when not set: features follow their expression at once, as before
the field existed (a feature change moves no running job; `guard.max_changed` caps a
mass change)."""
DEFAULT_MAX_DRAINED = "10%"
"""`guard.max_drained` when not set: Google Distributed Cloud repairs at most
max(3, 10%) of a pool per hour; Kubernetes' node controller stops evicting past 55% of a
zone, EKS auto-repair past 20% of a node group.  10% (at least 1) is the most
conservative of the three shapes that still drains a real failure at once."""
DEFAULT_MAX_CHANGED = "20%"
"""`guard.max_changed` when not set: EKS turns node auto-repair off past 20% of a group."""
DEFAULT_GUARD_WINDOW = 300.0
"""`guard.window` when not set: 5 minutes, NVSentinel's circuit-breaker window."""

Limit = int | str
"""A guard limit: a count of nodes, or a percentage string like `"10%"` of the nodes the
bridge manages (rounded down, at least 1)."""


def limit_of(limit: Limit, nodes: int) -> int:
    """The node count `limit` allows out of `nodes` (a checked catalog's limit)."""
    if isinstance(limit, str):
        pct = float(limit.strip().removesuffix("%"))
        return max(1, int(nodes * pct / 100.0))
    return limit


class DrainRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Take a node out of service while `when` (a `select[]` expression) is TRUE.

    `for` (seconds): the rule must hold that long, continuously, before the node is
    drained; `resume_after`: it must stay false that long before crr resumes the node.
    Both UNSET unless written (old readers refuse unknown fields), then the defaults."""

    when: str
    reason: str
    for_: float | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="for")
    resume_after: float | msgspec.UnsetType = msgspec.UNSET

    @property
    def hold_for(self) -> float:
        """Seconds the rule must hold before the node is drained."""
        return DEFAULT_DRAIN_FOR if isinstance(self.for_, msgspec.UnsetType) else self.for_

    @property
    def resume_delay(self) -> float:
        """Seconds the rule must stay false before the node is resumed."""
        return (DEFAULT_RESUME_AFTER if isinstance(self.resume_after, msgspec.UnsetType)
                else self.resume_after)


class GuardSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`exports.guard`: how much a cluster-wide bridge may change (docs/bridges.md)."""

    max_drained: Limit = DEFAULT_MAX_DRAINED
    """Nodes drained by crr at any moment."""
    max_changed: Limit = DEFAULT_MAX_CHANGED
    """Nodes whose crr features change within `window`."""
    window: float = DEFAULT_GUARD_WINDOW


class Exports(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the scheduler bridges (`crr bridge …`) export: see docs/bridges.md.

    `features`: boolean tags, each held while its `select[]` expression is TRUE
    (Kleene: unknown = absent).  `drain`: rules, the first that holds gives the
    node's drain reason.  `values`: resources exported raw where the target has
    attributes (HTCondor ClassAds, LSF load indices, NFD label values).
    """

    features: dict[str, str] = msgspec.field(default_factory=dict)
    drain: list[DrainRule] = msgspec.field(default_factory=list)
    values: list[str] = msgspec.field(default_factory=list)
    guard: GuardSpec | msgspec.UnsetType = msgspec.UNSET
    """Limits of a cluster-wide bridge (UNSET: the defaults, `GuardSpec()`)."""
    settle: float | msgspec.UnsetType = msgspec.UNSET
    """Seconds a feature's new state must hold before it is applied (UNSET: 0)."""
    feature_settle: dict[str, float] | msgspec.UnsetType = msgspec.UNSET
    """Per-feature `settle` (resources.yaml's object form `{when, settle}`), overriding
    `settle`.  Its own field so that `features` keeps its type on the wire."""

    def guard_or_default(self) -> GuardSpec:
        """The declared guard, or the defaults."""
        return self.guard if isinstance(self.guard, GuardSpec) else DEFAULT_GUARD

    def settle_of(self, feature: str) -> float:
        """Seconds a change of `feature` must hold before it is applied."""
        if isinstance(self.feature_settle, dict) and feature in self.feature_settle:
            return self.feature_settle[feature]
        return DEFAULT_SETTLE if isinstance(self.settle, msgspec.UnsetType) else self.settle


DEFAULT_GUARD = GuardSpec()


class Catalog(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole of `resources.yaml`."""

    version: int = 1
    resources: dict[str, ResourceSpec] = msgspec.field(default_factory=dict)
    reporters: dict[str, ReporterSpec] = msgspec.field(default_factory=dict)
    exports: Exports | msgspec.UnsetType = msgspec.UNSET
    """Left out of the encoded catalog unless set (UNSET), as `ReporterSpec.tty`: a
    catalog without exports stays readable by readers from before they existed."""

    outage_hold: float | msgspec.UnsetType = msgspec.UNSET
    """Seconds readers hold values at the projector's watermark while it is silent or
    behind (`judged_at = max(watermark, now - outage_hold)`; 0: judge at now).  Left out of
    the encoded catalog unless set, as `exports`."""

    def outage_hold_s(self) -> float:
        """`outage_hold`, or `DEFAULT_OUTAGE_HOLD` when `resources.yaml` sets none."""
        return self.outage_hold if isinstance(self.outage_hold, float) else DEFAULT_OUTAGE_HOLD

    def longest_lifetime(self) -> float:
        """The longest `interval + grace` of a resource (a reporter's default interval
        and half of it when none is declared): after a NATS outage, the time every
        reporter gets to report again before its values are judged."""
        lifetimes = [self.lifetime_of(n) for n in self.resources]
        return max(lifetimes, default=DEFAULT_INTERVAL * 1.5)

    def exports_or_empty(self) -> Exports:
        """The declared exports, or none."""
        return self.exports if isinstance(self.exports, Exports) else EMPTY_EXPORTS

    def interval_of(self, resource: str) -> float:
        """Seconds a value of `resource` stays fresh, before grace."""
        spec = self.resources[resource]
        if spec.interval is not None:
            return spec.interval
        rep = self.reporters.get(spec.reporter)
        return rep.interval if rep is not None else DEFAULT_INTERVAL

    def grace_of(self, resource: str) -> float:
        """Grace seconds of `resource` (default: half its interval)."""
        spec = self.resources[resource]
        return spec.grace if spec.grace is not None else self.interval_of(resource) / 2

    def lifetime_of(self, resource: str) -> float:
        """`interval + grace`: how long after receipt a value of `resource` is fresh."""
        return self.interval_of(resource) + self.grace_of(resource)

    def outliving(self, max_age: float) -> list[str]:
        """The resources whose `interval + grace` exceeds `max_age` (CRR_EVENTS retention,
        seconds; 0: unlimited), sorted: a rebuild from the retained history may miss
        their last report while it is still fresh."""
        if max_age <= 0:
            return []
        return sorted(n for n in self.resources if self.lifetime_of(n) > max_age)

    def reporter_spec(self, name: str, *, where: str = "catalog") -> ReporterSpec:
        """The reporter `name`; UnknownReporterError (naming the declared ones) if it is not
        declared, which is what a report of it would be rejected for."""
        spec = self.reporters.get(name)
        if spec is None:
            raise UnknownReporterError(
                f"reporter {name!r} is not declared (reporters: "
                f"{', '.join(sorted(self.reporters)) or 'none'})", where=where)
        return spec

    def scope_problem(self, reporter: str, host: str | None) -> str | None:
        """Why `reporter` may not publish for `host` (None: the cluster), or None if it may.

        It may not when it owns resources, but none of that scope: a reporter of
        cluster-scope resources only reports without a host, one of host-scope resources
        only with one.  A reporter owning none (inventory, health) or both is not judged."""
        scope = "cluster" if host is None else "host"
        owned = [n for n, r in self.resources.items() if r.reporter == reporter]
        if not owned or any(self.resources[n].scope == scope for n in owned):
            return None
        names = ", ".join(sorted(owned)[:5]) + (", …" if len(owned) > 5 else "")
        if host is None:
            return (f"reporter {reporter!r} owns host-scope resources only ({names}): "
                    "each of its reports names its host")
        return (f"reporter {reporter!r} owns cluster-scope resources only ({names}): its "
                f"reports name no host (got host {host!r})")

    def check_scope(self, reporter: str, host: str | None, *, where: str = "catalog") -> None:
        """WrongScopeError with `scope_problem` when there is one."""
        problem = self.scope_problem(reporter, host)
        if problem is not None:
            raise WrongScopeError(f"{problem}; nothing published", where=where)

    def resources_of(self, reporter: str) -> list[str]:
        """Names of the resources `reporter` owns, sorted."""
        return sorted(n for n, r in self.resources.items() if r.reporter == reporter)

    def reporter_lifetime(self, reporter: str) -> float:
        """How long a reporter may stay quiet before it counts as `silent`.

        The longest `interval + grace` of the resources it owns; for a reporter
        that owns none, its own interval plus half.
        """
        owned = self.resources_of(reporter)
        if owned:
            return max(self.lifetime_of(r) for r in owned)
        rep = self.reporters.get(reporter)
        interval = rep.interval if rep is not None else DEFAULT_INTERVAL
        return interval * 1.5


EMPTY_EXPORTS = Exports()
EMPTY_CATALOG = Catalog()
