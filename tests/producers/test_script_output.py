"""Parsing what scripts print: JSON reports, elim lines, and every way they can be wrong."""

from __future__ import annotations

import pytest

from crr.producers.script_output import (
    BadOutput,
    convert_elim_value,
    parse_elim_line,
    parse_elim_text,
    parse_json_report,
)
from crr.schemas.catalog import Kind
from crr.schemas.events import Pool

KINDS: dict[str, Kind] = {"load": "numeric", "up": "boolean", "os": "string", "ds": "string_set"}


def test_json_values_and_inventory_pass_through() -> None:
    """Values are not checked here (the projector does); inventory devices are decoded."""
    parsed = parse_json_report(
        b'{"values": {"a": 1.5, "b": "x", "c": null, "d": ["p"], "unknown": true},'
        b' "inventory": {"pool": {"name": "n/gpus", "generation": 7},'
        b' "devices": [{"name": "gpu0", "attributes": {"m": {"string": "H100"}}}]},'
        b' "future_member": 1}\n')
    assert parsed.values == {"a": 1.5, "b": "x", "c": None, "d": ["p"], "unknown": True}
    assert parsed.inventory is not None
    assert parsed.inventory.pool == Pool(name="n/gpus", generation=7)
    assert parsed.inventory.devices[0].attributes["m"].string == "H100"
    assert parsed.problems == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no output"),
        (b"  \n", "no output"),
        (b"hello", "not valid JSON"),
        (b'{"values": {"a": 1', "not valid JSON"),
        (b"[1, 2]", "not a crr report"),
        (b'{"values": [1]}', "not a crr report"),
        (b"{}", 'neither "values" nor "inventory"'),
        (b'{"inventory": {"devices": [{"attributes": {}}]}}', "not a crr report"),
    ],
)
def test_unusable_json_raises_bad_output(data: bytes, message: str) -> None:
    """Each unusable document is BadOutput with a message saying what is wrong."""
    with pytest.raises(BadOutput, match=message):
        parse_json_report(data)


def test_non_finite_numbers_are_dropped_and_named() -> None:
    """NaN/Infinity (Python json.dumps' default) drop just that value, named as a problem."""
    parsed = parse_json_report(b'{"values": {"a": NaN, "b": 2, "c": -Infinity}}')
    assert parsed.values == {"b": 2}
    assert len(parsed.problems) == 2
    assert parsed.problems[0].startswith("a: nan is not a finite number")


def test_a_script_can_name_its_own_problems() -> None:
    """`"problems"` beside the values: the values are kept, the texts become the problems
    (Health `bad_output`), each clipped to a bounded length."""
    parsed = parse_json_report(
        b'{"values": {"a_free": null}, "problems": ["a_free: vendor daemon down", "' +
        b"x" * 500 + b'"]}')
    assert parsed.values == {"a_free": None}
    assert parsed.problems[0] == "a_free: vendor daemon down"
    assert len(parsed.problems[1]) < 300


@pytest.mark.parametrize(
    ("raw", "kind", "value"),
    [
        ("0.5", "numeric", 0.5), ("12", "numeric", 12.0), ("1", "boolean", True),
        ("No", "boolean", False), ("TRUE", "boolean", True), ("rhel9", "string", "rhel9"),
        ("a,b,,c", "string_set", ["a", "b", "c"]), ("", "string_set", []),
        ("whatever", None, "whatever"),
    ],
)
def test_elim_values_convert_by_kind(raw: str, kind: Kind | None, value: object) -> None:
    """Elim tokens become the catalog kind's value; unknown names stay strings."""
    assert convert_elim_value(raw, kind) == value


@pytest.mark.parametrize(("raw", "kind"), [("x", "numeric"), ("nan", "numeric"),
                                           ("inf", "numeric"), ("maybe", "boolean")])
def test_elim_values_that_do_not_convert_raise(raw: str, kind: Kind) -> None:
    """A token that is not a valid value of its kind is a ValueError."""
    with pytest.raises(ValueError, match=r"not|could not"):
        convert_elim_value(raw, kind)


def test_elim_line_with_pairs() -> None:
    """`N name value …` gives N converted values."""
    parsed = parse_elim_line("3 load 1.5 up yes ds a,b", KINDS)
    assert parsed.values == {"load": 1.5, "up": True, "ds": ["a", "b"]}
    assert parsed.problems == []


@pytest.mark.parametrize("line", ["2 load 1", "x load 1", "-1", "1 load"])
def test_malformed_elim_line(line: str) -> None:
    """A count that does not match the pairs (or is no count) makes the line BadOutput."""
    with pytest.raises(BadOutput):
        parse_elim_line(line, KINDS)


def test_elim_text_keeps_good_lines_and_names_bad_ones() -> None:
    """Later lines override earlier ones; malformed lines are problems, not fatal."""
    parsed = parse_elim_text(b"1 load 1\nbad line\n2 load 2 os rhel9\n1 up maybe\n", KINDS)
    assert parsed.values == {"load": 2.0, "os": "rhel9"}
    assert len(parsed.problems) == 2


def test_elim_text_with_no_good_line_is_bad_output() -> None:
    """Nothing usable at all is BadOutput."""
    with pytest.raises(BadOutput, match="does not start with a count"):
        parse_elim_text(b"nonsense\n", KINDS)
    with pytest.raises(BadOutput, match="no output"):
        parse_elim_text(b"", KINDS)
