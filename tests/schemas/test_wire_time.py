"""crr.schemas.wire_time: formatting (the per-second cache gives the same text as formatting
afresh), the fast and vectorised parsers, and the numeric roundings that replaced string
round trips."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.schemas import wire_time
from crr.schemas.wire_time import (
    expires_many,
    expires_seconds,
    floor_millis,
    format_time,
    format_time_precise,
    parse_time,
    seconds_of,
    wire_rounded,
)


def _afresh(t: float) -> str:
    secs, millis = divmod(round(t * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{millis:03d}Z"


@given(st.lists(st.floats(min_value=0, max_value=4e9, allow_nan=False), max_size=50))
def test_cached_format_equals_a_fresh_one(ts: list[float]) -> None:
    for t in ts + ts:  # the second time from the cache
        assert format_time(t) == _afresh(t)
        assert abs(parse_time(format_time(t)) - round(t * 1000) / 1000) < 1e-6


def test_the_cache_stays_bounded() -> None:
    for s in range(3 * wire_time._SECONDS_KEPT):
        assert format_time(1.7e9 + s + 0.25) == _afresh(1.7e9 + s + 0.25)
    assert len(wire_time._SECONDS) <= wire_time._SECONDS_KEPT


WIRE_TIMES = st.one_of(
    st.floats(min_value=0.0, max_value=4_102_444_800.0, allow_nan=False).map(format_time),
    st.sampled_from(["garbage", "2026-12-02T14:00:00+01:00", "2026-02-30T00:00:00.000Z",
                     "1969-12-31T23:59:59.500Z", "2026-12-02T14:00:00.123z", ""]),
)
"""Timestamps as records may carry them: canonical ones, other RFC 3339 forms, garbage."""

_EPOCHS = st.floats(min_value=0.0, max_value=4_102_444_800.0, allow_nan=False)


@pytest.mark.parametrize(
    "t",
    [0.0, 1.0, 951782400.5, 1_800_000_000.123, 4102444800.999, 1709164800.0, 1582934400.25],
)
def test_expires_fast_path_matches_parse_time(t: float) -> None:
    """The fast timestamp parser agrees with parse_time."""
    text = format_time(t)
    assert expires_seconds(text) == parse_time(text)


def test_expires_other_forms() -> None:
    """Non-canonical timestamps go through parse_time; garbage counts as already expired."""
    assert expires_seconds("2026-12-02T14:00:00+01:00") == parse_time("2026-12-02T13:00:00Z")
    assert expires_seconds("garbage") == -math.inf


@settings(max_examples=200, deadline=None)
@given(st.lists(WIRE_TIMES, max_size=40))
def test_expires_many_matches_expires_seconds(texts: list[str]) -> None:
    """The vectorised timestamp parser gives expires_seconds' floats, bit for bit."""
    got = expires_many(texts)
    assert [float(x) for x in got] == [expires_seconds(t) for t in texts]


@settings(max_examples=500)
@given(_EPOCHS)
def test_wire_rounded_is_the_string_round_trip(t: float) -> None:
    """Rounding numerically gives the float the text round trip gave, and the same text."""
    assert wire_rounded(t) == parse_time(format_time(t))
    assert format_time(wire_rounded(t)) == format_time(t)


@settings(max_examples=500)
@given(_EPOCHS)
def test_floor_millis_is_the_old_tick(t: float) -> None:
    """`floor_millis` equals what the projector's tick computed through the strings."""
    old = parse_time(format_time(math.floor(t * 1000) / 1000))
    assert floor_millis(t) == old
    assert format_time(floor_millis(t)) == format_time(math.floor(t * 1000) / 1000)
    assert floor_millis(t) <= t


@given(_EPOCHS)
def test_precise_format(t: float) -> None:
    """Export lines: microseconds, `Z`, and parse_time reads them back to the microsecond."""
    text = format_time_precise(t)
    assert text.endswith("Z")
    assert len(text) == 27
    assert abs(parse_time(text) - t) < 2e-6


def test_seconds_of_prefers_the_twin() -> None:
    """A record's twin wins over its text; without one the text is read (garbage: passed)."""
    assert seconds_of(1.0004, "1970-01-01T00:00:01.000Z") == 1.0004
    assert seconds_of(None, "1970-01-01T00:00:01.000Z") == 1.0
    assert seconds_of(None, "garbage") == -math.inf
