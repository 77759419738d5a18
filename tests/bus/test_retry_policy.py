"""The one retry policy (`crr.bus.retry`): what it retries, how long it waits, where it stops.

No test sleeps: the waits are recorded by an injected `sleep`.
"""

from __future__ import annotations

import nats.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crr.bus import retry
from crr.bus.retry import Backoff, is_retriable
from crr.schemas.errors import (
    AuthError,
    BusTimeoutError,
    CrrError,
    CrrTimeoutError,
    NotConnectedError,
    SequenceCheckBusyError,
    StreamNotFoundError,
)


class _Waits:
    """An injected sleep: records each wait instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class _Flaky:
    """Raises the given errors one per call, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def _retry(backoff: Backoff, flaky: _Flaky, waits: _Waits, *,
                 attempts: int | None = None, seconds: float | None = None,
                 on: tuple[type[CrrError], ...] = (CrrError,),
                 also: tuple[type[CrrError], ...] = ()) -> str:
    async for attempt in backoff.retrying(sleep=waits, attempts=attempts, seconds=seconds,
                                          on=on, also=also):
        with attempt:
            return flaky()
    raise AssertionError("unreachable: the policy re-raises")


async def test_retriable_errors_are_retried_with_the_backoff() -> None:
    """Retriable crr errors (and raw nats-py errors that map to one) are retried; the
    waits are the back-off's, in order."""
    backoff = Backoff(first=0.1, cap=0.3)
    waits = _Waits()
    flaky = _Flaky(BusTimeoutError("no ack"), nats.errors.TimeoutError(),
                   NotConnectedError("down"))
    assert await _retry(backoff, flaky, waits) == "ok"
    assert flaky.calls == 4
    assert waits.waits == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize("error", [
    AuthError("refused"),
    StreamNotFoundError("no stream", code=404, err_code=10059),
    CrrError("plain"),
    ValueError("not a bus error at all"),
])
async def test_non_retriable_errors_stop_at_once(error: Exception) -> None:
    """A non-retriable error (or one outside the tree) is raised after one attempt,
    with no wait."""
    waits = _Waits()
    flaky = _Flaky(error)
    with pytest.raises(type(error)):
        await _retry(Backoff(first=0.1, cap=1.0), flaky, waits)
    assert flaky.calls == 1
    assert waits.waits == []


async def test_attempts_bound_the_retries() -> None:
    """`attempts=3`: three tries, two waits, then the last error."""
    waits = _Waits()
    flaky = _Flaky(*(BusTimeoutError(f"try {i}") for i in range(5)))
    with pytest.raises(BusTimeoutError, match="try 2"):
        await _retry(Backoff(first=0.01, cap=1.0), flaky, waits, attempts=3)
    assert flaky.calls == 3
    assert len(waits.waits) == 2


async def test_seconds_bound_the_retries() -> None:
    """`seconds=0`: the deadline has passed after the first failure, so no retry."""
    waits = _Waits()
    flaky = _Flaky(BusTimeoutError("slow"), BusTimeoutError("slow"))
    with pytest.raises(BusTimeoutError):
        await _retry(Backoff(first=0.01, cap=1.0), flaky, waits, seconds=0.0)
    assert flaky.calls == 1


async def test_on_restricts_and_also_extends() -> None:
    """`on` retries only those retriable classes; `also` adds non-retriable ones."""
    waits = _Waits()
    busy = _Flaky(SequenceCheckBusyError("busy", code=400, err_code=10164))
    assert await _retry(Backoff(first=0.002, cap=0.2), busy, waits,
                        on=(SequenceCheckBusyError,)) == "ok"
    timeout = _Flaky(BusTimeoutError("no ack"))
    with pytest.raises(BusTimeoutError):
        await _retry(Backoff(first=0.002, cap=0.2), timeout, waits,
                     on=(SequenceCheckBusyError,))
    assert timeout.calls == 1
    missing = _Flaky(StreamNotFoundError("no stream", code=404, err_code=10059))
    assert await _retry(Backoff(first=0.5, cap=10.0), missing, waits,
                        also=(StreamNotFoundError,)) == "ok"


def test_is_retriable_reads_the_tree() -> None:
    """`retriable` decides, for crr errors and for raw nats-py errors alike."""
    assert is_retriable(CrrTimeoutError("wait ran out"))
    assert is_retriable(nats.errors.NoRespondersError())
    assert not is_retriable(nats.errors.MaxPayloadError())
    assert not is_retriable(AuthError("refused"))
    assert not is_retriable(RuntimeError("a bug"))


@given(st.integers(min_value=1, max_value=60))
def test_delays_are_the_hand_rolled_ones(failures: int) -> None:
    """Same timings as before the policy: the projector's write loop waited
    min(2, 0.05·2^min(n, 6)); tenacity's wait_exponential(multiplier=m, max=c) waits
    min(c, m·2ⁿ⁻¹) (plus the jitter's uniform(0, j))."""
    assert retry.SNAPSHOT_WRITE.delay(failures) == pytest.approx(
        min(2.0, 0.05 * 2 ** min(failures, 6)))
    assert retry.FENCE_BUSY.delay(failures) == pytest.approx(min(0.2, 0.002 * 2 ** (failures - 1)))
    top = retry.PUBLISH.delay(failures, rng=lambda _lo, hi: hi)
    assert top == pytest.approx(min(2.0, 0.05 * 2 ** (failures - 1)) + 0.1)
    assert retry.PUBLISH.delay(failures, rng=lambda lo, _hi: lo) == pytest.approx(top - 0.1)


@given(st.integers(min_value=1, max_value=40), st.floats(min_value=0.1, max_value=5),
       st.floats(min_value=1, max_value=100))
def test_full_jitter_stays_between_floor_and_cap(failures: int, floor: float,
                                                 factor: float) -> None:
    """A reporter's restart back-off: uniform between the floor and min(cap, floor·2ⁿ⁻¹)."""
    backoff = Backoff(first=floor, cap=floor * factor, full_jitter=True)
    low = backoff.delay(failures, rng=lambda lo, _hi: lo)
    high = backoff.delay(failures, rng=lambda _lo, hi: hi)
    assert low == floor
    assert high == pytest.approx(min(floor * factor, floor * 2 ** (failures - 1)))
    assert floor <= backoff.delay(failures) <= high
