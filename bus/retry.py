"""The one retry policy of crr: exponential back-off with jitter, keyed on the error tree.

An error is retried iff it is a `CrrError` whose `retriable` flag is set
(`is_retriable`); nats-py errors are mapped to the tree first (`crr.bus.errors`),
so a call may raise either.  A `Backoff` holds the numbers of one retrying
place (its first delay, cap and jitter; the defaults of each place are kept
as they were measured) and gives:

- `retrying(...)`: a `tenacity.AsyncRetrying` for `async for attempt in ...:
  with attempt: ...`, bounded by attempts or seconds where the caller needs it;
- `delay(n)`: the wait after the n-th consecutive failure, for the service
  loops that keep doing other work between failures (the projector's write
  loop, the outbox's flush loop) instead of retrying one call.

Both take the same numbers through the same function, so a loop and a
tenacity retry with one `Backoff` wait alike.  Tests inject `sleep` (and
`random`) to check the policy without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from crr.bus.errors import describe as _describe
from crr.bus.errors import from_nats
from crr.schemas.errors import CrrError

Sleep = Callable[[float], Awaitable[None]]


def is_retriable(exc: BaseException) -> bool:
    """Whether trying again can help: `exc` (mapped to crr's tree) says it is retriable."""
    mapped = from_nats(exc)
    return isinstance(mapped, CrrError) and mapped.retriable


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Delays `min(cap, first·2ⁿ⁻¹) + uniform(0, jitter)` after the n-th failure.

    `full_jitter`: `uniform(first, min(cap, first·2ⁿ⁻¹))` instead (a reporter
    script's restarts: a fleet of agents must not restart in step).
    """

    first: float
    cap: float
    jitter: float = 0.0
    full_jitter: bool = False

    def delay(self, failures: int, *, rng: Callable[[float, float], float] = random.uniform,
              ) -> float:
        """Seconds to wait after `failures` (>= 1) consecutive failures."""
        base = min(self.cap, self.first * 2.0 ** (max(1, failures) - 1))
        if self.full_jitter:
            return rng(self.first, max(self.first, base))
        return base + (rng(0.0, self.jitter) if self.jitter > 0 else 0.0)

    def retrying(
        self,
        *,
        attempts: int | None = None,
        seconds: float | None = None,
        on: tuple[type[CrrError], ...] = (CrrError,),
        also: tuple[type[CrrError], ...] = (),
        log: logging.Logger | None = None,
        level: int = logging.WARNING,
        what: str = "",
        sleep: Sleep = asyncio.sleep,
    ) -> tenacity.AsyncRetrying:
        """Retry a block while it raises a retriable error, `attempts` times or for
        `seconds` at most (None: no bound), then re-raise the last error.

        `on`: only these (retriable) crr errors are retried here, others go to the
        caller's own retry (the fenced writes retry `SequenceCheckBusyError` at once,
        the projector's loop everything else).
        `also`: crr error classes retried here although not retriable in general
        (a follower that may start before the streams exist retries
        `StreamNotFoundError`).  `log`: say each retry there, as `what (error); retrying`.
        """
        stops: list[tenacity.stop.stop_base] = []
        if attempts is not None:
            stops.append(tenacity.stop_after_attempt(attempts))
        if seconds is not None:
            stops.append(tenacity.stop_after_delay(seconds))
        stop: Any = tenacity.stop_any(*stops) if stops else tenacity.stop_never
        before_sleep = None
        if log is not None:
            logger = log

            def before_sleep(state: tenacity.RetryCallState) -> None:
                exc = state.outcome.exception() if state.outcome is not None else None
                said = _describe(exc) if exc is not None else "?"
                if what:
                    logger.log(level, "%s (%s); retrying", what, said)
                else:
                    logger.log(level, "%s; retrying", said)

        return tenacity.AsyncRetrying(
            stop=stop,
            wait=lambda state: self.delay(state.attempt_number),
            retry=tenacity.retry_if_exception(
                lambda exc: (is_retriable(exc) and isinstance(from_nats(exc), on))
                or isinstance(from_nats(exc), also)),
            reraise=True,
            sleep=sleep,
            before_sleep=before_sleep,
        )


# The retrying places and their numbers (unchanged from their hand-rolled versions).
CONNECT = Backoff(first=0.2, cap=5.0, jitter=0.5)
"""The initial connect (`crr.bus.connection`)."""
RECONNECT = Backoff(first=0.05, cap=2.0, jitter=0.25)
"""nats-py's reconnects once connected (`crr.bus.connection`'s server picker)."""
PUBLISH = Backoff(first=0.05, cap=2.0, jitter=0.1)
"""The outbox's flushes, and one-shot stream checks."""
FOLLOW = Backoff(first=0.5, cap=10.0, jitter=0.5)
"""Following the catalog (`crr.bus.catalog_watch`)."""
START = Backoff(first=0.5, cap=10.0, jitter=0.5)
"""A long-running service's start-up steps (the projector's stream checks and first load),
while the server does not answer yet (a cluster electing its meta leader)."""
BRIDGE_APPLY = Backoff(first=0.5, cap=30.0, jitter=0.5)
"""A scheduler bridge re-trying a target command that failed (slurmctld down, a file
system full): the bridge keeps following the snapshot meanwhile."""
SNAPSHOT_WRITE = Backoff(first=0.1, cap=2.0)
"""The projector's write loop after a failed snapshot or status write."""
TAKEOVER_READ = Backoff(first=0.05, cap=1.0)
"""A new lease holder reading CRR_SNAPSHOT (often during a leader election)."""
FENCE_BUSY = Backoff(first=0.002, cap=0.2)
"""A fenced snapshot write refused only because another one is in flight."""
TORN_READ = Backoff(first=0.02, cap=0.5, jitter=0.05)
"""Re-reading a snapshot that changed while it was read (`crr.replay`)."""
