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
