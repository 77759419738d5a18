"""`compile_select`: parse, typecheck and package a `select[]` expression for evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from crr.projections.host_table import HostTable
from crr.projections.select import columnar, reference
from crr.projections.select.ast import Node, refs
from crr.projections.select.parser import parse_requirement
from crr.projections.select.requirement import Section, note
from crr.projections.select.typecheck import check
from crr.schemas.catalog import Catalog, Kind
from crr.schemas.errors import ExpressionError

MAX_EXPRESSION: Final = 8192
"""Longest expression compiled (characters): a requirement string is a line, not a file."""


@dataclass(frozen=True, slots=True)
class CompiledSelect:
    """A checked expression, ready to run over any `HostTable` at any `now`.

    Evaluation follows the table's catalog: a resource that has since left
    it (or changed kind) is treated as never reported; recompile after a
    catalog change to get errors instead.
    """

    expression: str
    tree: Node
    catalog: Catalog
    kinds: dict[str, Kind]
    """Each resource the expression names, with its kind when compiled."""
    ignored_sections: tuple[Section, ...] = ()
    """The sections of a whole requirement string other than select (`rusage[...]`,
    `order[...]`, …): the scheduler's, not evaluated by crr."""
    has_select: bool = True
    """False for a requirement string without a select section (every host matches)."""

    @property
    def note(self) -> str | None:
        """What to tell the operator about `ignored_sections` (None: nothing ignored)."""
        return note(self.ignored_sections, self.has_select)

    @property
    def resources(self) -> frozenset[str]:
        """Names of the resources the expression uses."""
        return frozenset(self.kinds)

    def select(self, table: HostTable, now: float) -> list[str]:
        """Sorted names of the hosts where the whole expression is TRUE at `now`."""
        return columnar.select(self.tree, table, now)

    def matches(self, table: HostTable, host: str, now: float) -> bool:
        """Whether `host` would be in `select(table, now)`."""
        return reference.matches(self.tree, table, host, now)


def compile_select(expr: str, catalog: Catalog) -> CompiledSelect:
    """Compile `expr` (bare, `select[...]`, or a whole LSF requirement string) against `catalog`.

    Raises `crr.schemas.errors.ExpressionError` with the column of the offending token; also
    for an expression longer than `MAX_EXPRESSION` or nested too deeply to parse (so
    pasted garbage is a clear error, never a crash).
    """
    if len(expr) > MAX_EXPRESSION:
        raise ExpressionError(f"expression too long: {len(expr)} characters (at most "
                              f"{MAX_EXPRESSION}); it starts", expression=expr[:60] + "…",
                              column=60)
    try:
        return _compile(expr, catalog)
    except RecursionError:
        raise ExpressionError("expression nested too deeply", expression=expr,
                              column=0) from None


def _compile(expr: str, catalog: Catalog) -> CompiledSelect:
    strings = frozenset(n for n, spec in catalog.resources.items() if spec.kind == "string")
    parsed, req = parse_requirement(expr, strings)
    tree = check(parsed, expr, catalog)
    kinds: dict[str, Kind] = {}
    for ref in refs(tree):
        assert ref.ty is not None
        kinds[ref.name] = ref.ty
    return CompiledSelect(expression=expr, tree=tree, catalog=catalog, kinds=kinds,
                          ignored_sections=req.ignored, has_select=req.select is not None)
