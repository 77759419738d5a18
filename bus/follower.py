"""One follower of compacted streams: last-per-subject load, then live, reload on regression.

Every reader of `CRR_SNAPSHOT` (the scheduler view, the CLI's snapshot read,
the replay cut, `crr latency`, the projector's restore) wants the same
thing: the last record of every subject, then — for those that stay on —
every later record in stream order, and a correct state again if the
server came back without records it had acknowledged.  `Follower` does all
of it once:

- **load**: one ordered consumer with `DeliverLastPerSubject`; each record
  goes to `load(state, m)` on a fresh state from `new_load()`; the record
  delivered with `pending == 0` (or an empty stream) completes it and
  `loaded(state)` swaps it in.  "Not loaded yet" is never "absent".
- **live**: the same consumer stays on; later records go to `live(m)`.
  nats-py's ordered consumer re-creates itself from the last delivered
  sequence + 1 after a gap or a server restart.
- **regression**: after every reconnect the follower asks whether the
  stream still holds the last record it handled (`crr.bus.stream_check`).  If
  not (a SIGKILLed server lost acknowledged records and re-used their
  sequence numbers), it **reloads**: a new consumer loads into a new state,
  records of the old consumer are ignored from then on (a generation
  number), and `loaded` swaps the new state in at once — until then the
  old state keeps serving.

`load_compacted` is the load alone, for one-shot readers (a CLI listing, the
replay cut, a projector restoring its checkpoint): the same load, then stop.

**Not behind the leader**: an ephemeral consumer is placed on any replica
of a replicated stream, and one that rejoined after a partition serves its
own, older copy while it catches up — a load from it completes with a
snapshot tens of seconds old.  So before the load the follower asks the
stream *leader* (`STREAM.MSG.GET`, never answered by a replica, unlike a
direct get) for the newest sequence of its subject, and is ready only once
it has handled that sequence (`LeaderFloor`); until then it logs that its
server's copy is behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from nats.aio.client import Client

from crr.bus.cancel import cancel_and_wait
from crr.bus.connection import add_reconnect_listener
from crr.bus.leader_floor import LeaderFloor, leader_last_seq
from crr.bus.ordered import Delivery, OrderedReader, StoredMessage
from crr.bus.stream_check import Generations, lost
from crr.schemas.errors import CrrError, CrrTimeoutError
from crr.schemas.subjects import SNAPSHOT_ALL, SNAPSHOT_STREAM

log = logging.getLogger("crr.bus.follower")

L = TypeVar("L")


class Follower(Generic[L]):
    """Follow `subject` of the compacted `stream` (see the module doc).

    `new_load()` makes the state of one (re)load, `load(state, m)` adds a
    record to it, `loaded(state)` is called once it is complete (the swap:
    keep it synchronous), `live(m)` gets every later record.  Callbacks run
    in the consumer's callback, in stream order; an exception in one
    propagates to nats-py's error callback, so handle bad records inside.
    `idle_heartbeat` (seconds) bounds how fast a lost consumer is noticed.
    `direct`: records are handled as they are read, with flow control answered
    by records handled (`OrderedReader`'s `direct` and `backpressure`): no
    per-record queue and task hop, and a backlog stays in the stream, where
    each record's `pending` counts it — a reader that falls behind sees how
    far and can apply what is waiting together.
    """

    def __init__(
        self,
        nc: Client,
        *,
        stream: str,
        subject: str,
        new_load: Callable[[], L],
        load: Callable[[L, StoredMessage], None],
        loaded: Callable[[L], None],
        live: Callable[[StoredMessage], None],
        idle_heartbeat: float = 2.0,
        name: str = "follower",
        direct: bool = False,
    ) -> None:
        self._nc = nc
        self._direct = direct
        self._stream = stream
        self._subject = subject
        self._new_load = new_load
        self._load = load
        self._loaded_cb = loaded
        self._live = live
        self._idle_heartbeat = idle_heartbeat
        self._name = name
        self._reader: OrderedReader | None = None
        self._generations = Generations()
        self._state: L | None = None
        """The state of the (re)load in progress."""
        self._loading = False
        self._remove_reconnect: Callable[[], None] | None = None
        self._check: asyncio.Task[bool] | None = None
        self._ready = asyncio.Event()
        self._floor = LeaderFloor(None)
        self._floor_check: asyncio.Task[None] | None = None
        self.last: StoredMessage | None = None
        """The last record handled (what the stream must still hold at its seq)."""
        self.received = 0
        """Records handled since `start` (every load and live)."""
        self.reloads = 0
        """Full reloads after the stream went backwards."""

    @property
    def ready(self) -> bool:
        """Whether the first load is complete (stays true during a reload)."""
        return self._ready.is_set()

    @property
    def check_task(self) -> asyncio.Task[bool] | None:
        """The check started by the last reconnect (None: no reconnect yet)."""
        return self._check

    @property
    def loading(self) -> bool:
        """Whether a (re)load is in progress."""
        return self._loading

    async def start(self) -> None:
        """Subscribe and start the first load; returns before it completes."""
        if self._reader is not None or self._remove_reconnect is not None:
            raise CrrError(f"{self._name} already started")
        self._remove_reconnect = add_reconnect_listener(self._nc, self._on_reconnect)
        await self._subscribe()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait for the first load (CrrTimeoutError after `timeout` seconds)."""
        if self._remove_reconnect is None:
            raise CrrError(f"{self._name} not started (call start() first)")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            behind = "" if self._state is not None else f"; {self._floor.describe(self.position)}"
            raise CrrTimeoutError(
                f"{self._name}: initial load of {self._stream} ({self._subject}) not complete "
                f"after {timeout:g}s ({self.received} record(s) so far{behind})"
            ) from None

    @property
    def position(self) -> int:
        """The stream sequence of the last record handled (0: none yet)."""
        return 0 if self.last is None else self.last.seq

    async def stop(self) -> None:
        """Unsubscribe; no callback runs after this returns."""
        if self._remove_reconnect is not None:
            self._remove_reconnect()
            self._remove_reconnect = None
        for task in (self._check, self._floor_check):
            await cancel_and_wait(task)
        self._check = self._floor_check = None
        self._generations.retire()
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    async def reload(self) -> None:
        """Load the stream again on a new consumer; the current state serves until the swap."""
        self.reloads += 1
        old = self._reader
        self._generations.retire()  # the old consumer's records are ignored from here on
        self._reader = None
        if old is not None:
            await old.stop()
        await self._subscribe()

    async def check(self) -> bool:
        """Whether the stream still holds the last record handled; reload if not.

        Run after every reconnect; True when nothing had to be done (or the
        check could not be made: logged, the consumer carries on).
        """
        last = self.last
        seen = None if last is None else (last.seq, last.subject, last.data)
        if not await lost(self._nc, {self._stream: seen}, who=self._name, log=log):
            return True
        log.warning("%s: reloading %s", self._name, self._stream)
        await self.reload()
        return False

    async def _subscribe(self) -> None:
        handler = self._generations.guard(self._handle)
        generation = self._generations.current
        if not self._ready.is_set():  # the first load must not come from a replica behind
            self._floor = await LeaderFloor.ask(self._nc, self._stream, self._subject)
        state = self._state = self._new_load()
        self._loading = True
        reader = self._reader = OrderedReader(
            self._nc, stream=self._stream, subject=self._subject, handler=handler,
            deliver=Delivery.LAST_PER_SUBJECT, idle_heartbeat=self._idle_heartbeat,
            backpressure=self._direct, direct=self._direct,
        )
        await reader.start()
        if reader.ready.is_set() and self._loading and generation == self._generations.current:
            self._finish(state)  # the stream was empty

    def _handle(self, m: StoredMessage) -> None:
        self.last = m
        self.received += 1
        if not self._loading:
            self._live(m)
            if not self._ready.is_set() and self._floor.reached(m.seq):
                self._caught_up()
            return
        state: L = self._state  # type: ignore[assignment]  # set with _loading
        self._load(state, m)
        if m.pending == 0:
            self._finish(state)

    def _finish(self, state: L) -> None:
        self._state = None
        self._loading = False
        self._loaded_cb(state)
        if self._ready.is_set() or self._floor.reached(self.position):
            self._ready.set()
            return
        log.warning("%s: loaded %s, but %s (a replica catching up after a partition?); "
                    "not ready until it has caught up", self._name, self._stream,
                    self._floor.describe(self.position))
        self._floor_check = asyncio.get_running_loop().create_task(self._recheck_floor())

    def _caught_up(self) -> None:
        log.info("%s: caught up with the stream leader (seq %d)", self._name, self.position)
        self._ready.set()  # (_recheck_floor, waiting on it, ends)

    async def _recheck_floor(self) -> None:
        """Ask the leader again every second while not caught up: a floor record deleted
        meanwhile (a purge) is never delivered, and the floor comes down to what is left."""
        while not self._ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), 1.0)
            if self._ready.is_set():
                return
            self._floor.lower(await leader_last_seq(self._nc, self._stream, self._subject))
            if self._floor.reached(self.position):
                self._caught_up()

    def _on_reconnect(self) -> None:
        if self._check is None or self._check.done():
            self._check = asyncio.get_running_loop().create_task(self.check())


async def load_compacted(nc: Client, *, stream: str, subject: str,
                         handler: Callable[[StoredMessage], None],
                         timeout: float = 30.0) -> int:
    """Hand the last record of every subject to `handler`, then stop; the records read.

    The `Follower`'s load alone (one ordered consumer, DeliverLastPerSubject,
    on the direct receive path) for one-shot readers, with the same floor:
    when the consumer's server holds an older copy than the stream leader,
    reading goes on until it has caught up, so `handler` may get a newer
    record of a subject it already had (keep the last).  CrrTimeoutError when
    not complete after `timeout`; StreamNotFoundError (and the rest of
    `crr.bus.errors`' tree) when it cannot start.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    floor = await LeaderFloor.ask(nc, stream, subject)
    count = 0
    reached = asyncio.Event()

    def keep(m: StoredMessage) -> None:
        nonlocal count
        count += 1
        handler(m)
        if floor.reached(m.seq):
            reached.set()

    # Records handled as they are read (`crr.bus.natspy.ordered_consumer`: no Msg, queue and task
    # hop
    # per record; flow control answered by records handled): a one-shot load is mostly
    # receiving, and a projector's restart is mostly this load.
    reader = OrderedReader(nc, stream=stream, subject=subject, handler=keep,
                           backpressure=True, direct=True)
    await reader.start()
    try:
        await reader.wait_ready(timeout)
        if not floor.reached(reader.last_seq):
            log.warning("%s: %s; reading on until it has caught up", stream,
                        floor.describe(reader.last_seq))
        while not floor.reached(reader.last_seq):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise CrrTimeoutError(f"load of {stream} ({subject}) not complete after "
                                      f"{timeout:g}s: {floor.describe(reader.last_seq)}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reached.wait(), min(1.0, left))
            floor.lower(await leader_last_seq(nc, stream, subject))
    finally:
        await reader.stop()
    return count


async def read_snapshot_bytes(nc: Client, timeout: float = 30.0,
                              ) -> dict[str, tuple[int, bytes]]:
    """CRR_SNAPSHOT as subject -> (stream sequence, raw bytes), last per subject."""
    out: dict[str, tuple[int, bytes]] = {}

    def keep(m: StoredMessage) -> None:
        out[m.subject] = (m.seq, m.data)

    await load_compacted(nc, stream=SNAPSHOT_STREAM, subject=SNAPSHOT_ALL,
                         handler=keep, timeout=timeout)
    return out
