"""One rule per value: the typed decode of the fold's fast path agrees with `validate_value`.

`crr.projections.validation.value_type` is the msgspec form of `validate_value`:
whatever it lets through, `validate_value` accepts unchanged (up to sorting a
string set), so a report that decodes with it needs no per-value check.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.validation import Rejected, normalize, validate_value, value_type
from crr.schemas.catalog import Kind, ResourceSpec

KINDS: list[Kind] = ["numeric", "boolean", "string", "string_set"]

_bounds = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.integers(-10**6, 10**6))


@st.composite
def specs(draw: st.DrawFn) -> ResourceSpec:
    kind = draw(st.sampled_from(KINDS))
    lo, hi = draw(_bounds), draw(_bounds)
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    return ResourceSpec(kind=kind, reporter="r", min=lo, max=hi,
                        max_length=draw(st.integers(0, 8)), max_items=draw(st.integers(0, 4)))


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10),
)
values = st.one_of(_scalars, st.lists(st.one_of(st.text(max_size=3), st.integers(0, 3)),
                                      max_size=6))


def _typed(spec: ResourceSpec, value: Any) -> tuple[bool, Any]:
    """(decoded?, the value as decoded) with `value_type(spec)`."""
    try:
        return True, msgspec.json.decode(msgspec.json.encode(value), type=value_type(spec))
    except msgspec.ValidationError:
        return False, None


@settings(max_examples=400, deadline=None)
@given(spec=specs(), value=values)
def test_what_the_typed_decode_accepts_validates_unchanged(spec: ResourceSpec,
                                                           value: Any) -> None:
    """A value the typed decoder lets through is one `validate_value` keeps as it is."""
    ok, decoded = _typed(spec, value)
    if not ok:
        return
    checked = validate_value("x", spec, decoded)
    assert not isinstance(checked, Rejected), (spec, value, checked)
    if spec.kind == "string_set" and decoded is not None:
        assert checked == sorted(set(decoded))
    else:
        assert checked == decoded
        assert type(checked) is type(decoded)


@pytest.mark.parametrize(("spec", "value"), [
    (ResourceSpec(kind="numeric", reporter="r", min=0), 812.5),
    (ResourceSpec(kind="numeric", reporter="r", min=0, max=10), 10),
    (ResourceSpec(kind="boolean", reporter="r"), True),
    (ResourceSpec(kind="string", reporter="r", max_length=5), "lustr"),
    (ResourceSpec(kind="string_set", reporter="r", max_items=2), ["b", "a"]),
    (ResourceSpec(kind="numeric", reporter="r"), None),
])
def test_the_typed_decode_lets_valid_values_through(spec: ResourceSpec, value: Any) -> None:
    """The fast path is not empty: ordinary valid values pass the typed decode."""
    assert _typed(spec, value) == (True, value)


def test_a_rejection_names_the_resource_and_the_rule() -> None:
    """The value-by-value path says why, in one line naming the resource."""
    spec = ResourceSpec(kind="numeric", reporter="r", min=0)
    assert validate_value("scratch_free", spec, -1) == Rejected(
        "scratch_free: -1 is below the minimum 0")
    assert validate_value("scratch_free", spec, math.inf) == Rejected(
        "scratch_free: expected a finite number, got Infinity")


@settings(max_examples=400, deadline=None)
@given(spec=specs(), value=values)
def test_a_reader_sees_every_value_the_rule_accepted(spec: ResourceSpec, value: Any) -> None:
    """`normalize` (the snapshot reader's half) keeps what `validate_value` accepted, in its
    `select[]` form, and refuses only what the rule refuses too."""
    checked = validate_value("x", spec, value)
    seen = normalize(spec.kind, value)
    if isinstance(checked, Rejected):
        return
    if checked is None:
        assert seen is None
    elif spec.kind == "numeric":
        assert seen == float(checked)
    elif spec.kind == "string_set":
        assert seen == frozenset(checked)
    else:
        assert seen == checked
