"""Cancel a task and wait until it has ended — even on Python 3.11, where a cancellation
can be lost inside a nats-py request.

nats-py waits for every request's answer (a JetStream publish acknowledgement, an
API call) with `asyncio.wait_for`.  Up to Python 3.11, `wait_for` returns the
answer and drops the cancellation when the answer and the cancellation arrive
in the same loop iteration (CPython gh-86296; 3.12 rewrote `wait_for` on
`asyncio.timeout`).  A task that loops around such a request then runs on, and a
`task.cancel(); await task` waits for ever: a projector that had rebuilt from
CRR_EVENTS hung so, its `rebuilding` status reporter cancelled mid-publish.

`cancel_and_wait` cancels again every `again_after` seconds until the task has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

AGAIN_AFTER = 0.1
"""Seconds between cancellations of a task that ran on after one."""


async def cancel_and_wait(task: asyncio.Future[Any] | None, *,
                          again_after: float = AGAIN_AFTER) -> None:
    """Cancel `task` (None: nothing) and return once it has ended.  Its own error, if it
    ended with one other than the cancellation, is raised here; a cancellation of the
    caller propagates as usual."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_after)
    with contextlib.suppress(asyncio.CancelledError):
        await task
