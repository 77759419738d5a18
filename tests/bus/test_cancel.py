"""`crr.bus.cancel.cancel_and_wait` ends a task whose cancellation was lost in `wait_for`.

Up to Python 3.11, `asyncio.wait_for` (what nats-py waits on for every request's
answer) returns the answer and drops a cancellation that arrives in the same loop
iteration.  A projector's `rebuilding` status reporter, cancelled mid-publish, ran
on for ever so, and the rebuild never went live (400k events, reproducible).
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from crr.bus.cancel import cancel_and_wait


def _looping_on_wait_for(answers: list[asyncio.Future[int]]) -> asyncio.Task[None]:
    """A task that waits on request after request as nats-py does (`wait_for`)."""
    async def requests() -> None:
        loop = asyncio.get_running_loop()
        while True:
            fut: asyncio.Future[int] = loop.create_future()
            answers.append(fut)
            await asyncio.wait_for(fut, 30)

    return asyncio.create_task(requests())


async def _answered_and_cancelled(task: asyncio.Task[None],
                                  answers: list[asyncio.Future[int]]) -> None:
    """The answer and the cancellation in the same loop iteration."""
    await asyncio.sleep(0)  # one loop iteration: the task makes its first request
    assert answers
    answers[-1].set_result(1)
    task.cancel()


async def test_a_lost_cancellation_is_made_again() -> None:
    answers: list[asyncio.Future[int]] = []
    task = _looping_on_wait_for(answers)
    await _answered_and_cancelled(task, answers)
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert task.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for keeps it")
async def test_python_311_loses_it() -> None:
    """Why the helper exists: the plain `cancel(); await` waits for ever here."""
    answers: list[asyncio.Future[int]] = []
    task = _looping_on_wait_for(answers)
    await _answered_and_cancelled(task, answers)
    for _ in range(100):  # loop iterations, not time
        if task.done() or len(answers) == 2:
            break
        await asyncio.sleep(0)
    assert not task.done(), "the cancellation was kept"
    assert len(answers) == 2  # it ran on to its next request
    await cancel_and_wait(task)


async def test_its_own_error_is_raised_and_none_is_nothing() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            raise ValueError("cleanup failed")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="cleanup failed"):
        await cancel_and_wait(task)
    await cancel_and_wait(None)
