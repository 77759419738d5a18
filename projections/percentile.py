"""Percentiles of samples: the one definition every figure crr prints uses.

Nearest rank: the `p`-th percentile of `n` samples is the smallest sample
with at least `p`% of the samples at or below it — the sorted samples'
element `ceil(p/100 · n)` (1-based; the first for `p = 0`).  Always an
observed value (no interpolation), so a count stays a count and a latency
is one that happened; `crr latency`, `/v1/latency`, `crr sim scheduler` and
the benchmarks all read their p50/p95/p99 this way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T", int, float)


def percentiles(samples: Iterable[T], ps: Sequence[float]) -> list[T]:
    """The nearest-rank percentile of `samples` for each `p` in `ps` (0 ≤ p ≤ 100), in order.

    Sorts once for all of `ps`; ValueError when there are no samples or a `p`
    is out of range.
    """
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("percentile of no samples")
    out = []
    for p in ps:
        if not 0 <= p <= 100:
            raise ValueError(f"percentile {p} is not within 0..100")
        out.append(ordered[max(0, math.ceil(p * n / 100) - 1)])
    return out
