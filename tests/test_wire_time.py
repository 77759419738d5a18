"""RFC 3339 formatting: the per-second cache gives the same text as formatting afresh."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from schemas import wire_time
from schemas.wire_time import format_time, parse_time


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
