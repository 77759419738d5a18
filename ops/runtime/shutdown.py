"""Stopping long-running commands: SIGINT/SIGTERM end them within STOP_WITHIN seconds.

A service spends its first seconds (or, with NATS unreachable, forever) in
start-up awaits that never look at a stop flag: the connect retry, stream
provisioning, the projector's initial load or restore, the API's first
snapshot read.  A flag set by the signal handler is not enough there, so
`stopping()` owns the command's task:

* while the command is **starting** (before it calls `Stop.serving()`), a
  signal cancels the task at once: every start-up await is raced by the stop;
* once it is **serving** (its loop watches the event itself: `run(stop)`), a
  signal sets the event, the loop winds down cleanly (scripts' process groups
  killed, the projector's lease handed over), and whatever is still running
  after `grace` seconds is cancelled all the same;
* a second signal cancels at once;
* a cancellation that has not ended the command `AGAIN_AFTER` seconds later is
  made again (and again), because one can be lost: on Python 3.11 nats-py's
  requests wait with `asyncio.wait_for`, which drops a cancellation that lands
  in the same loop iteration as the answer (CPython gh-86296; `bus/cancel.py`) —
  a projector signalled as it started its rebuild ran the whole rebuild and its
  first write before it saw the stop.

The cancellation is the requested stop, not a failure: `stopping()` swallows
it and the command returns its normal status, 0 (`systemctl stop` sees a
clean exit; 143/130 would make systemd count every stop as a failure unless
each unit listed `SuccessExitStatus=`).  Cleanup runs in the `finally`
blocks and `async with` exits of the code being cancelled, so a command
needs nothing but::

    async def run(args):
        async with stopping() as stop:
            async with connect(..., attempts=None) as nc:  # retried until stopped
                service = Service(nc)
                stop.serving()
                await service.run(stop)
        return 0
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

log = logging.getLogger("crr.shutdown")

STOP_WITHIN = 2.0
"""What a command promises: ended this many seconds after SIGINT/SIGTERM, whatever its state."""

GRACE = 1.0
"""A serving command's time to end on its own after the signal before it is cancelled;
the rest of STOP_WITHIN is for the cleanup the cancellation runs."""

STOP_EPILOG = (f"SIGTERM or SIGINT stops it within {STOP_WITHIN:g}s in any state (connecting, "
               "reconnecting, NATS unreachable, loading) with exit status 0.  A second "
               "signal stops at once.")
"""The `--help` note of every command that runs under `stopping()` (docs/operations.md)."""

STOP_EPILOG_SCRIPTS = STOP_EPILOG.replace(
    "exit status 0.", "exit status 0; the scripts it runs are killed with their process groups.")
"""`STOP_EPILOG` for the commands that run scripts (`crr agent`, `crr external`)."""


AGAIN_AFTER = 0.25
"""Seconds after which a cancellation that has not ended the command is made again (the
module doc); room enough for the cleanup a cancellation runs, well inside STOP_WITHIN."""


class Stop(asyncio.Event):
    """The stop of one command: an `asyncio.Event` for its `run(stop)` loops, set by a signal
    (or `after` seconds), plus what `stopping()` needs to know: whether the command has
    reached the loop that watches it (`serving`), and which signal asked (`signal`)."""

    def __init__(self) -> None:
        super().__init__()
        self.signal: int | None = None
        """The signal that asked for the stop (None: not asked, or the `after` timer)."""
        self._serving: Callable[[], bool] = _never

    def serving(self, when: Callable[[], bool] | None = None) -> None:
        """The command now watches this event itself (its `run(stop)` loop is next), or
        will once `when()` is true (e.g. `projector.warm.is_set`: its loop begins after
        the initial load, which only a cancellation cuts short).

        From then on a signal sets the event and gives the loop `grace` seconds to
        end cleanly; before, a signal cancels the start-up at once."""
        self._serving = when or _always

    @property
    def is_serving(self) -> bool:
        """Whether a signal now asks the command's loop (True) or cancels its start-up."""
        return self._serving()


def _never() -> bool:
    return False


def _always() -> bool:
    return True


@asynccontextmanager
async def stopping(after: float | None = None, *, grace: float = GRACE) -> AsyncIterator[Stop]:
    """`async with stopping() as stop:` — SIGINT/SIGTERM (or `after` seconds) stop the body.

    See the module doc: while starting, the body is cancelled at once; once
    `stop.serving()` was called, the event is set and the body is cancelled only if
    it is still running `grace` seconds later.  A cancellation made here ends the
    `async with` normally (the caller returns its usual status); any other
    cancellation or error propagates.  Must be entered by the command's own task.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None, "stopping() needs a task"
    stop = Stop()
    ours = 0  # cancellations made here (to tell them from a caller's)
    handles: list[asyncio.TimerHandle] = []

    def cancel() -> None:
        nonlocal ours
        if not task.done():
            ours += 1
            task.cancel()
            handles.append(loop.call_later(AGAIN_AFTER, cancel))  # in case it is lost

    def request(sig: int | None) -> None:
        if stop.is_set():
            if sig is not None:
                log.info("second %s: stopping at once", signal.Signals(sig).name)
                cancel()
            return
        stop.signal = sig
        stop.set()
        if stop.is_serving:
            handles.append(loop.call_later(grace, cancel))
        else:
            cancel()

    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, request, sig)
    if after is not None:
        handles.append(loop.call_later(after, request, None))
    try:
        yield stop
    except asyncio.CancelledError:
        if ours and _uncancel(task, ours) == 0:
            log.info("stopped%s", f" by {signal.Signals(stop.signal).name}" if stop.signal
                     else "")
            return
        raise
    else:
        if ours:  # the body swallowed the cancellation and ended by itself
            _uncancel(task, ours)
    finally:
        for handle in handles:
            handle.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)


def _uncancel(task: asyncio.Task[object], times: int) -> int:
    """Take back `times` cancellation requests of `task`; the number still pending (a
    caller's: those propagate)."""
    left = task.cancelling()
    for _ in range(times):
        left = task.uncancel()
    return left


def stop_on_signals(after: float | None = None) -> asyncio.Event:
    """An event set on SIGINT or SIGTERM (or after `after` seconds), for one-shot loops that
    watch it at every await (`crr demo`'s table, `crr sim`): nothing is cancelled.

    Long-running services use `stopping()`.  Must be called from inside the running loop.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if after is not None:
        loop.call_later(after, stop.set)
    return stop
