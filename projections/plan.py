"""The compiled catalog: what the fold derives from a `Catalog`, built once per catalog.

A `CatalogPlan` is frozen and holds no state: the fold (`crr.projections.fold`)
keeps one in `ProjectionState.plan` and replaces it whole when a catalog
event changes the catalog.  It answers the questions the fold asks of every
report, without looking at the catalog again:

- which resources a reporter may report on a host or on the cluster subject
  (`ReporterPlan.rules`), and how long each value stays fresh (`lifetimes`);
- how to decode a report that sets any of them validly in a single typed
  msgspec decode (`ReporterPlan.decoder`: the fast path — the decode *is*
  the validation, see `crr.projections.validation.value_type`);
- when the reporter turns silent (`ReporterPlan.silent_life`,
  `CatalogPlan.reporter_lifetime`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from crr.projections.validation import value_type
from crr.schemas.catalog import EMPTY_CATALOG, Catalog, ResourceSpec

Scope = str
"""`"host"` or `"cluster"`: the kind of subject a report arrived on."""


class ReporterPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How the fold applies reports of one reporter on one kind of subject."""

    rules: dict[str, ResourceSpec]
    """resource -> its descriptor: the resources this reporter may set on this scope."""
    names: tuple[str, ...]
    """The same names, sorted: the field order of `decoder`'s values."""
    keyset: frozenset[str]
    """The same names as a set (the keyset of a batch that sets them all)."""
    decoder: msgspec.json.Decoder[Any]
    """Decodes a Report only if every value it sets is one of `rules`, valid (the rest
    left `msgspec.UNSET`): a full report sets them all, a partial one some."""
    set_names: tuple[str, ...]
    """The string sets among `names`."""
    set_fields: tuple[str, ...]
    """Attributes of `decoder`'s values struct that are string sets (sorted after decoding)."""
    uniform_life: float | None
    """The lifetime every resource of `rules` shares, when they share one."""
    silent_life: float
    """Seconds the reporter may stay quiet before it is `silent`."""


class CatalogPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the fold derives from one catalog (see the module doc)."""

    catalog: Catalog | None
    """The catalog compiled (None: no catalog yet)."""
    reporters: dict[tuple[str, Scope], ReporterPlan]
    """(reporter, scope) -> how to apply its reports."""
    lifetimes: dict[str, float]
    """resource -> interval + grace."""
    reporter_life: dict[str, float]
    """reporter -> seconds it may stay quiet (the reporters the catalog names)."""
    uniform_life: dict[tuple[str, Scope], float]
    """(reporter, scope) -> `ReporterPlan.uniform_life` where there is one (one lookup
    for the snapshot record builders)."""

    def declared(self, reporter: str, scope: Scope) -> dict[str, ResourceSpec]:
        """The resources `reporter` may report on a `scope` subject (empty if none)."""
        plan = self.reporters.get((reporter, scope))
        return plan.rules if plan is not None else _NO_RULES

    def scope_refusal(self, reporter: str, host: str | None) -> str | None:
        """Why an event of `reporter` for `host` (None: the cluster) is refused: the
        reporter owns resources, none of that scope (`Catalog.scope_problem`); else None."""
        if (reporter, "cluster" if host is None else "host") in self.reporters \
                or self.catalog is None:
            return None
        return self.catalog.scope_problem(reporter, host)

    def reporter_lifetime(self, reporter: str) -> float:
        """Seconds a reporter may stay quiet before it counts as `silent`."""
        life = self.reporter_life.get(reporter)
        if life is None:
            life = (self.catalog or EMPTY_CATALOG).reporter_lifetime(reporter)
        return life


_NO_RULES: Final[dict[str, ResourceSpec]] = {}

EMPTY_PLAN: Final = CatalogPlan(catalog=None, reporters={}, lifetimes={}, reporter_life={},
                                uniform_life={})
"""The plan of a state that has seen no catalog: nothing can be validated yet."""


def compile_plan(catalog: Catalog) -> CatalogPlan:
    """The plan for `catalog`."""
    rules: dict[tuple[str, Scope], dict[str, ResourceSpec]] = {}
    for name, spec in catalog.resources.items():
        rules.setdefault((spec.reporter, spec.scope), {})[name] = spec
    lifetimes = {n: catalog.lifetime_of(n) for n in catalog.resources}
    named = set(catalog.reporters) | {s.reporter for s in catalog.resources.values()}
    reporter_life = {r: catalog.reporter_lifetime(r) for r in named}
    reporters: dict[tuple[str, Scope], ReporterPlan] = {}
    for key, table in rules.items():
        names = tuple(sorted(table))
        lives = {lifetimes[n] for n in names}
        reporters[key] = ReporterPlan(
            rules=table, names=names, keyset=frozenset(names),
            decoder=_report_decoder(key[0], names, table),
            set_names=tuple(n for n in names if table[n].kind == "string_set"),
            set_fields=tuple(f"f{i}" for i, n in enumerate(names)
                             if table[n].kind == "string_set"),
            uniform_life=lives.pop() if len(lives) == 1 else None,
            silent_life=reporter_life[key[0]],
        )
    uniform_life = {key: rp.uniform_life for key, rp in reporters.items()
                    if rp.uniform_life is not None}
    return CatalogPlan(catalog=catalog, reporters=reporters, lifetimes=lifetimes,
                       reporter_life=reporter_life, uniform_life=uniform_life)


def _report_decoder(reporter: str, names: tuple[str, ...],
                    rules: dict[str, ResourceSpec]) -> msgspec.json.Decoder[Any]:
    """A Report decoder whose `values` may hold only these resources, each valid (the
    others `msgspec.UNSET`).

    The values struct's fields are `f0`, `f1`, ... (renamed to the resource
    names on the wire) in the order of `names` (sorted); `crr.projections.reports.apply_typed`
    stores the values a report sets of it as its `astuple`, without what is `UNSET`
    (`crr.projections.state.Batch`), in name order.
    """
    fields: list[tuple[str, Any, Any]] = [
        (f"f{i}", value_type(rules[n]) | msgspec.UnsetType, msgspec.UNSET)
        for i, n in enumerate(names)]
    values = msgspec.defstruct(
        f"Values_{reporter}", fields,
        kw_only=True, forbid_unknown_fields=True, gc=False,
        rename={f"f{i}": n for i, n in enumerate(names)},
    )
    report = msgspec.defstruct(
        f"Report_{reporter}",
        [("reporter", str), ("boot", str), ("seq", int), ("observed_at", str),
         ("values", values), ("host", str | None, None)],
        kw_only=True, frozen=True, gc=False,  # (no cycle: strings, numbers, `values`)
    )
    return msgspec.json.Decoder(report)
