"""The scheduler view's packer: keeps the host records of its table compressed (LZ4).

Records arrive uncompressed; the packer compresses those the table keeps
whenever rows were loaded or updated, a few at a time between the event
loop's other work, and trims the heap after a big load.  `get` decompresses.

On the loop, not in a worker thread: a thread that compresses contends for
the GIL with the loop (the loop then waits out switch intervals and the
view falls behind its stream); small batches keep each step around a
millisecond.  Compression is deferrable, applying records is not: while the
consumer is behind its stream (the last live record had more pending behind
it) the packer waits, so on a saturated machine the CPU goes to staying
current and records are kept uncompressed (as with `pack_records=False`)
until the view catches up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from crr.bus.cancel import cancel_and_wait
from crr.projections.host_table import HostTable
from crr.projections.record.packing import pack
from crr.runtime.heap import trim
from crr.schemas.errors import CrrTimeoutError

PACK_BATCH: Final = 32
"""Records compressed per step of the packer (about a millisecond)."""
TRIM_AFTER: Final = 4096
"""Records compressed in one go after which the heap is trimmed (their buffers are free)."""


def _pack_all(records: list[bytes]) -> list[bytes]:
    return [pack(r) for r in records]


class RecordPacker:
    """Compresses the records of `table()` (the view's current table, which a reload
    replaces) from `start` to `stop` (see the module doc)."""

    def __init__(self, table: Callable[[], HostTable]) -> None:
        self._table = table
        self._task: asyncio.Task[None] | None = None
        self._wanted = asyncio.Event()
        self._packed_all = asyncio.Event()
        self._caught_up = asyncio.Event()
        """Set while the consumer is caught up (the last live record had nothing pending
        behind it): the packer compresses only then."""
        self._caught_up.set()
        self.pauses = 0
        """Times the packer stopped for the view to catch up with its stream."""
        self.packed = 0
        """Records compressed since `start`."""

    def start(self) -> None:
        """Run the packer on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the packer (what is not compressed yet stays as it is)."""
        await cancel_and_wait(self._task)
        self._task = None

    def wanted(self, *, behind: bool) -> None:
        """Rows were loaded or updated; `behind`: more records are pending behind them (the
        packer waits until they are applied)."""
        self._wanted.set()
        if behind:
            self._caught_up.clear()
        else:
            self._caught_up.set()

    async def wait_packed(self, timeout: float) -> None:
        """Wait until every host record the table keeps is compressed (none to wait for
        when not running)."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(timeout):
                while self._table().unpacked_count or self._wanted.is_set():
                    self._packed_all.clear()
                    await self._packed_all.wait()
        except TimeoutError:
            raise CrrTimeoutError(f"scheduler view: {self._table().unpacked_count} record(s) "
                                  f"still not compressed after {timeout:g}s") from None

    async def _run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            done = 0
            while True:
                if not self._caught_up.is_set():  # records waiting: applying them comes first
                    self.pauses += 1
                    while not self._caught_up.is_set():  # (set, then cleared again before
                        await self._caught_up.wait()     # this task ran: wait on)
                table = self._table()
                batch = table.unpacked(PACK_BATCH)
                if not batch:
                    break
                done += table.packed(batch, _pack_all([raw for _, raw in batch]))
                await asyncio.sleep(0)  # the loop's other work (records, queries) goes first
            self.packed += done
            if done >= TRIM_AFTER:
                trim()  # (the uncompressed records freed)
            self._packed_all.set()
