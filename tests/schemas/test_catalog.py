"""`resources.yaml` loading: every error reported with its path, all at once (docs/contract.md,
"`resources.yaml`")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crr.schemas.catalog_loader import catalog_from_wire, load_catalog, load_catalog_text
from crr.schemas.codec import encode
from crr.schemas.errors import CatalogError

EXAMPLE = Path(__file__).resolve().parents[2] / "ops" / "examples" / "resources.yaml"

BROKEN = """
version: 1
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 30s, colour: red}
  datasets:     {kind: stringset, scope: host, reporter: datasets}
  slow:         {kind: numeric, reporter: scratch, interval: soon}
  nokind:       {reporter: scratch}
  orphan:       {kind: numeric, reporter: ghost}
  lic:          {kind: numeric, scope: cluster, reporter: scratch}
  bounds:       {kind: numeric, reporter: scratch, min: 10, max: 1}
  flag:         {kind: boolean, reporter: scratch, max_length: 3}
  has:          {kind: boolean, reporter: scratch}
  9lives:       {kind: boolean, reporter: scratch}
reporters:
  scratch:  {type: script, command: [scratch.sh]}
  datasets: {type: script, command: [datasets.py]}
  "bad name!": {type: external}
"""


def problems_of(text: str) -> list[str]:
    """The problems a CatalogError lists for `text`."""
    with pytest.raises(CatalogError) as info:
        load_catalog_text(text)
    return info.value.problems


def test_every_error_reported_at_once_with_its_path() -> None:
    """One load lists every problem, each prefixed with its path."""
    problems = problems_of(BROKEN)
    expected_prefixes = [
        "resources.scratch_free.colour: unknown field",
        "resources.datasets.kind: expected one of numeric, boolean, string, string_set",
        "resources.slow.interval: expected a duration",
        "resources.nokind.kind: required field is missing",
        "resources.orphan.reporter: no reporter named 'ghost'",
        "resources.lic.scope: cluster-scope values must come from an external reporter",
        "resources.bounds.min: min (10) is greater than max (1)",
        "resources.flag.max_length: only applies to kind string, not boolean",
        "resources.has: 'has' is a reserved word of select[]",
        "resources.9lives: invalid resource name",
        "reporters.bad name!: invalid reporter name",
    ]
    for prefix in expected_prefixes:
        assert any(p.startswith(prefix) for p in problems), (prefix, problems)
    assert len(problems) == len(expected_prefixes)


@pytest.mark.parametrize(
    ("snippet", "prefix"),
    [
        ("resources: {a: {kind: numeric, reporter: r, colour: 1}}", "resources.a.colour: unknown"),
        ("resources: {a: {kind: number, reporter: r}}", "resources.a.kind: expected one of"),
        ("resources: {a: {kind: numeric, reporter: r, grace: 3x}}", "resources.a.grace:"),
        ("resources: {a: {kind: numeric}}", "resources.a.reporter: required field is missing"),
        ("resources: {a: {kind: numeric, reporter: nobody}}", "resources.a.reporter: no reporter"),
        ("resources: {a: {kind: numeric, reporter: r, scope: cluster}}", "resources.a.scope:"),
        ("resources: {a: {kind: numeric, reporter: r, min: 2, max: 1}}", "resources.a.min:"),
        ("resources: {a: {kind: numeric, reporter: r, max_items: 2}}", "resources.a.max_items:"),
        ("resources: {count: {kind: numeric, reporter: r}}", "resources.count: 'count' is"),
        ("resources: {a-b: {kind: numeric, reporter: r}}", "resources.a-b: invalid resource"),
        ("colour: red", "colour: unknown top-level field"),
    ],
)
def test_each_error_class_has_its_path(snippet: str, prefix: str) -> None:
    """Each class of mistake is reported at the right path."""
    text = "version: 1\nreporters: {r: {type: script, command: [x]}}\n" + snippet + "\n"
    problems = problems_of(text)
    assert any(p.startswith(prefix) for p in problems), problems


def test_yaml_syntax_error_has_line_and_column() -> None:
    """A YAML syntax error names the file position line:col."""
    with pytest.raises(CatalogError) as info:
        load_catalog_text("version: 1\nresources: {a: [1, 2\n", source="res.yaml")
    assert info.value.where is not None
    assert info.value.where.startswith("res.yaml:")
    line, col = info.value.where.split(":")[1:3]
    assert int(line) >= 2
    assert int(col) >= 1


def test_unreadable_file(tmp_path: Path) -> None:
    """A missing file is a CatalogError naming the file, not an OSError."""
    with pytest.raises(CatalogError) as info:
        load_catalog(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(info.value)
    assert "cannot read" in str(info.value)


def test_example_catalog_loads_and_round_trips_the_wire() -> None:
    """The shipped example loads, and its wire form validates back to the same catalog."""
    cat = load_catalog(EXAMPLE)
    assert "scratch_free" in cat.resources
    assert cat.lifetime_of("scratch_free") == 7.5
    assert catalog_from_wire(json.loads(encode(cat))) == cat


def test_a_duplicate_key_is_an_error_with_both_line_numbers() -> None:
    """Two resources called `a:`: PyYAML would keep the last; the catalog is refused instead."""
    text = ("resources:\n"
            "  a: {kind: numeric, reporter: x}\n"
            "  b: {kind: numeric, reporter: x}\n"
            "  a: {kind: string, reporter: x}\n"
            "reporters:\n"
            "  x: {type: external, interval: 5s, interval: 6s}\n")
    assert problems_of(text) == [
        "resources.a: duplicate key (lines 2 and 4); the second would silently replace the first",
        "reporters.x.interval: duplicate key (lines 6 and 6); "
        "the second would silently replace the first",
    ]


@pytest.mark.parametrize(("entry", "problem"), [
    ("{type: script, command: x.sh}",
     "reporters.x.command: must be a list of strings, e.g. `[x.sh]` (got 'x.sh')"),
    ("{type: external, hosts: '*'}",
     "reporters.x.hosts: must be a list of strings, e.g. `[\"*\"]` (got '*')"),
    ("{type: external, quarantine_after: many}",
     "reporters.x.quarantine_after: must be a whole number (got 'many')"),
    ("{type: external, cwd: [a]}", "reporters.x.cwd: must be a string (got ['a'])"),
    ("{type: external, tty: [a]}", "reporters.x.tty: must be true or false (got ['a'])"),
])
def test_a_wrong_type_is_said_in_the_catalogs_terms(entry: str, problem: str) -> None:
    """Not msgspec's `Expected array | null, got str`: what the field must be, with an example."""
    assert problems_of(f"reporters:\n  x: {entry}\n") == [problem]
