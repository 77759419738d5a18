"""Why a host matches a `select[]` expression or not (`crr explain EXPR --host H`).

Runs the reference interpreter on one host with a trace and reports, for
every resource, the value used and its freshness, for every sub-expression
its value or truth (true / false / unknown), and the verdict.  The result
is a msgspec Struct (for `--json` and REST) with a `render()` for people.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from crr.projections.host_table import HostTable
from crr.projections.select.ast import Bool, Call, Node, Num, Ref, Str, children
from crr.projections.select.compiled import CompiledSelect
from crr.projections.select.reference import Env, Lookup, evaluate, excluded_by
from crr.schemas.wire_time import format_time

Truth = Literal["true", "false", "unknown"]


class ResourceReport(msgspec.Struct, frozen=True, kw_only=True):
    """One resource named in the expression, as seen on the host."""

    name: str
    kind: str
    scope: str
    on_stale: str
    freshness: Literal["fresh", "stale", "unknown", "never_reported"]
    detail: str
    """`fresh`, `stale since <time>`, `unknown (reporter said null)`, `never reported`."""
    value: Any = None
    """The value `select[]` used; null unless fresh.  Sets are sorted lists."""
    last_value: Any = None
    reporter: str | None = None
    expires_at: str | None = None
    stale_since: str | None = None


class TermReport(msgspec.Struct, frozen=True, kw_only=True):
    """One sub-expression: its source text, where it starts, and what it evaluated to."""

    text: str
    column: int
    kind: str
    truth: Truth | None = None
    """For conditions: true, false or unknown."""
    value: Any = None
    """For numbers, strings and sets: the value (null when unknown)."""
    known: bool = True
    freshness: str | None = None
    """For a resource: its freshness on the host (as in `resources`)."""
    terms: list[TermReport] = msgspec.field(default_factory=list)


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """The whole answer of `explain`."""

    expression: str
    host: str
    now: str
    in_table: bool
    selected: bool
    truth: Truth
    verdict: str
    excluded_by: list[str] = msgspec.field(default_factory=list)
    resources: list[ResourceReport] = msgspec.field(default_factory=list)
    tree: TermReport | None = None

    def render(self) -> str:
        """Human-readable text."""
        head = "selected" if self.selected else "not selected"
        lines = [f"{self.expression} on {self.host} at {self.now}: {head}",
                 f"  verdict: {self.verdict}"]
        if self.resources:
            lines.append("resources:")
            width = max(len(r.name) for r in self.resources)
            for r in self.resources:
                shown = _show(r.value) if r.freshness == "fresh" else r.detail
                extra = []
                if r.freshness == "fresh":
                    extra.append("fresh")
                if r.freshness == "stale" and r.last_value is not None:
                    extra.append(f"last value {_show(r.last_value)}")
                if r.on_stale == "exclude":
                    extra.append("on_stale: exclude")
                if r.scope == "cluster":
                    extra.append("cluster scope")
                tail = f" ({'; '.join(extra)})" if extra else ""
                lines.append(f"  {r.name:<{width}}  {r.kind:<10}  {shown}{tail}")
        if self.tree is not None:
            lines.append("terms:")
            rows: list[tuple[str, str]] = []
            _term_rows(self.tree, 1, rows)
            width = min(60, max(len(t) for t, _ in rows))
            lines.extend(f"{t:<{width}}  {v}" for t, v in rows)
        return "\n".join(lines)


def _show(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return json.dumps(value) if isinstance(value, str | list) else str(value)


def _term_rows(term: TermReport, depth: int, out: list[tuple[str, str]]) -> None:
    shown = term.truth if term.truth is not None else _show(term.value)
    detail = term.freshness
    if detail is not None and detail != "fresh":
        shown = detail if detail.startswith("unknown") else f"unknown ({detail})"
    out.append(("  " * depth + term.text, shown))
    for sub in term.terms:
        _term_rows(sub, depth + 1, out)


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a value (sets become sorted lists)."""
    if isinstance(value, frozenset | set):
        return sorted(value)
    return value


def _truth(value: Any) -> Truth:
    return "unknown" if value is None else "true" if value else "false"


def _detail(found: Lookup) -> str:
    entry = found.entry
    if found.freshness == "fresh":
        return "fresh"
    if found.freshness == "never_reported":
        return "never reported"
    assert entry is not None
    if found.freshness == "stale":
        since = entry.stale_since if entry.state == "stale" and entry.stale_since else None
        return f"stale since {since or entry.expires_at}"
    if entry.value is None:
        return "unknown (reporter said null)"
    return f"unknown (not a valid {found.kind})"


def _resource(found: Lookup) -> ResourceReport:
    entry = found.entry
    detail = _detail(found)
    stale_since = detail.removeprefix("stale since ") if found.freshness == "stale" else None
    last = None
    if entry is not None and found.freshness == "stale":
        last = entry.last_value if entry.state == "stale" else entry.value
    return ResourceReport(
        name=found.name, kind=found.kind, scope=found.scope, on_stale=found.on_stale,
        freshness=found.freshness, detail=detail, value=_plain(found.value),
        last_value=_plain(last), reporter=entry.reporter if entry else None,
        expires_at=entry.expires_at if entry else None, stale_since=stale_since,
    )


def _term(node: Node, expression: str, trace: dict[int, Any],
          details: dict[str, str]) -> TermReport:
    value = trace.get(id(node))
    subs = [
        _term(c, expression, trace, details) for c in children(node)
        if not isinstance(c, Num | Str | Bool) and not (isinstance(node, Call) and
                                                           isinstance(c, Ref))
    ]
    text = expression[node.start:node.end] or "(no select section: every host)"
    kind = node.ty or "unknown"
    if node.ty == "boolean":
        return TermReport(text=text, column=node.start, kind=kind, truth=_truth(value),
                          known=value is not None, terms=subs,
                          freshness=details.get(node.name) if isinstance(node, Ref) else None)
    return TermReport(text=text, column=node.start, kind=kind, value=_plain(value),
                      known=value is not None, terms=subs,
                      freshness=details.get(node.name) if isinstance(node, Ref) else None)


def explain(compiled: CompiledSelect, table: HostTable, host: str, now: float) -> Explanation:
    """Why `host` is or is not selected by `compiled` at `now`."""
    env = Env(table, host, now)
    trace: dict[int, Any] = {}
    value = evaluate(compiled.tree, env, trace)
    names = list(dict.fromkeys(compiled.kinds))
    found = [env.lookup(n, compiled.kinds[n]) for n in names]
    resources = [_resource(f) for f in sorted(found, key=lambda f: f.name)]
    excluded = excluded_by(compiled.tree, env)
    in_table = table.row_of(host) is not None
    selected = in_table and not excluded and value is True
    if not in_table:
        verdict = f"not selected: host {host} is not in the table"
    elif excluded:
        verb = "is" if len(excluded) == 1 else "are"
        verdict = f"excluded: {', '.join(excluded)} {verb} stale and on_stale: exclude"
    elif value is True:
        verdict = "selected"
    elif value is False:
        verdict = "not selected: the expression is false"
    else:
        why = [f"{r.name} is {r.detail}" if r.freshness != "never_reported"
               else f"{r.name} was never reported"
               for r in resources if r.freshness != "fresh"]
        because = f" because {'; '.join(why)}" if why else ""
        verdict = f"not selected: the expression is unknown{because}"
    return Explanation(
        expression=compiled.expression, host=host, now=format_time(now), in_table=in_table,
        selected=selected, truth=_truth(value), verdict=verdict, excluded_by=excluded,
        resources=resources, tree=_term(compiled.tree, compiled.expression, trace,
                   {r.name: r.detail for r in resources}),
    )
