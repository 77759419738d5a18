"""The one percentile definition (`crr.projections.percentile`): nearest rank, given/when/then
and as properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crr.projections.percentile import percentiles


def test_nearest_rank_examples() -> None:
    """Given 1..10, p50 is 5, p90 is 9, p95 and p99 are 10, p0 is the minimum."""
    assert percentiles(range(10, 0, -1), [0, 50, 90, 95, 99, 100]) == [1, 5, 9, 10, 10, 10]


def test_a_single_sample_is_every_percentile() -> None:
    """One sample answers every percentile."""
    assert percentiles([0.25], [0, 50, 99]) == [0.25, 0.25, 0.25]


def test_no_samples_or_a_bad_p_is_an_error() -> None:
    """Empty input and a p outside 0..100 raise, not return a made-up figure."""
    with pytest.raises(ValueError, match="no samples"):
        percentiles([], [50])
    with pytest.raises(ValueError, match="not within"):
        percentiles([1.0], [101])


samples = st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=200)
ps = st.floats(min_value=0, max_value=100)


@given(samples, ps)
def test_the_rank_definition(xs: list[float], p: float) -> None:
    """The answer is a sample; at least p% of the samples are at or below it, and fewer
    than p% are strictly below it."""
    (q,) = percentiles(xs, [p])
    assert q in xs
    n = len(xs)
    assert sum(x <= q for x in xs) >= math.ceil(p * n / 100)
    assert sum(x < q for x in xs) < max(1, math.ceil(p * n / 100))


@given(samples, ps, ps)
def test_monotonic_in_p(xs: list[float], p: float, r: float) -> None:
    """A higher percentile is never smaller."""
    lo, hi = sorted((p, r))
    a, b = percentiles(xs, [lo, hi])
    assert a <= b
