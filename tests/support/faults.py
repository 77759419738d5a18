"""Helpers for fault-injection tests: crr processes as real subprocesses, ground truth, waits.

Processes run as `python -m crr.cli …` in their own session so a test can
SIGKILL exactly the process it started.  Waits are bounded retries on
observable positions (the projector status records in CRR_SNAPSHOT against the
last CRR_EVENTS sequence), never sleeps that guess.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.js.api import DeliverPolicy

from crr.bus.ordered import OrderedReader, StoredMessage
from crr.schemas.codec import decode
from crr.schemas.snapshot import ProjectorStatus
from crr.schemas.subjects import EVENTS_STREAM, SNAPSHOT_PROJECTOR, SNAPSHOT_STREAM
from crr.view.snapshot_reader import SnapshotContents, read_snapshot

REPO = Path(__file__).resolve().parents[2]


class CrrProcess:
    """`crr <args>` as a child process in its own session, logging to a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CrrProcess:
        out = self.log.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crr.cli", *self.args], cwd=REPO, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        return self

    def kill(self) -> None:
        """SIGKILL the process group (the process and any script it spawned)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """Everything the process has logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


async def eventually(check: Callable[[], Any], timeout: float, what: str,
                     every: float = 0.1) -> Any:
    """Retry `check()` (sync or async) until it returns a truthy value (bounded).

    The one bounded-retry helper of the tests: a wait on a condition, never a
    sleep standing in for synchronisation.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except Exception as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s (last: {last!r})")
        await asyncio.sleep(every)


async def projector_status(nc: Client, subject: str = SNAPSHOT_PROJECTOR) -> ProjectorStatus:
    """The projector status record as CRR_SNAPSHOT holds it now."""
    msg = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, subject)
    assert msg.data is not None
    return decode(msg.data, ProjectorStatus)


async def caught_up(nc: Client, timeout: float = 30.0, *,
                    projector_id: str | Collection[str] | None = None) -> SnapshotContents:
    """Wait until the snapshot covers the last CRR_EVENTS sequence; the snapshot read then.

    Covered: `projector_position` (the current layout's minimum `covered_seq`, so
    partitioned projectors too) reaches the stream's last sequence.  With
    `projector_id` (one id, or a collection for partitions), every current status
    record must also have been written by that projector (or one of those).
    """
    js = nc.jetstream()
    ids = None if projector_id is None else (
        {projector_id} if isinstance(projector_id, str) else set(projector_id))

    async def check() -> SnapshotContents | None:
        last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        snap = await read_snapshot(nc)
        if not snap.projectors or snap.projector_position < last:
            return None
        if ids is not None and any(st.projector_id not in ids for st in snap.projectors):
            return None
        return snap

    found: SnapshotContents = await eventually(check, timeout, "projector caught up")
    return found


async def stored_events(nc: Client) -> list[StoredMessage]:
    """Every message CRR_EVENTS holds, in order (for duplicate checks)."""
    out: list[StoredMessage] = []
    reader = OrderedReader(nc, stream=EVENTS_STREAM, subject="crr.v1.>", handler=out.append,
                           deliver=DeliverPolicy.ALL)
    await reader.start()
    try:
        await reader.wait_ready(30)
    finally:
        await reader.stop()
    return out
