"""The raw relay: the floor `crr bench` measures the pipeline against.

Publisher → a process that only republishes each message to a
last-per-subject stream → a reader.  The same process layout as crr's
pipeline (the simulated reporters publishing into CRR_EVENTS; the projector
process; the scheduler view in the bench process) with no work in the
middle: the relay process follows CRR_EVENTS and republishes every report,
padded to the size of a host record, into `RELAY_OUT` (one message kept per
subject, as CRR_SNAPSHOT); the reader follows `RELAY_OUT` and times each
message from the report's `observed_at` — the clock crr's latency uses.

    python -m tests.bench.relay --server URL --pad BYTES      (the relay process)

`crr bench` starts it (`RelayProcess`), drives it with the same publisher
and rates as crr, and reads it with `RelayReader`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from typing import Final

import msgspec
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import DeliverPolicy, StorageType, StreamConfig

from crr.bus.connection import connect
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.schemas.subjects import EVENTS_STREAM, EVERYTHING

RELAY_STREAM: Final = "BENCH_RELAY"
RELAY_PREFIX: Final = "relay."
_EVENTS_FILTER: Final = EVERYTHING


class _Head(msgspec.Struct):
    observed_at: str | None = None


_head = msgspec.json.Decoder(_Head)


async def provision_relay(nc: Client) -> None:
    """(Re)create RELAY_OUT: file storage, the last message per subject (as CRR_SNAPSHOT)."""
    js = nc.jetstream()
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream(RELAY_STREAM)
    await js.add_stream(StreamConfig(name=RELAY_STREAM, subjects=[RELAY_PREFIX + ">"],
                                     storage=StorageType.FILE, max_msgs_per_subject=1))


async def relay(url: str, pad: int) -> None:
    """Republish every new CRR_EVENTS message (padded by `pad` bytes) until SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    padding = b" " * max(0, pad)
    async with connect(url, name="crr-bench-relay") as nc:
        js = nc.jetstream()

        async def forward(m: StoredMessage) -> None:
            await js.publish_async(RELAY_PREFIX + m.subject, m.data + padding)

        reader = OrderedReader(nc, stream=EVENTS_STREAM, subject=_EVENTS_FILTER,
                               handler=forward, deliver=DeliverPolicy.NEW, backpressure=True)
        await reader.start()
        print("relay ready", flush=True)
        await stop.wait()
        await reader.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(js.publish_async_completed(), 10)


class RelayProcess:
    """The relay as a child process (ready once it printed so)."""

    def __init__(self, url: str, pad: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.relay", "--server", url, "--pad", str(pad)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        """Block until the relay's consumer is on (its first output line)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "relay ready" not in line:
            raise RuntimeError(f"relay process did not start: {line!r}")

    def stop(self) -> None:
        """SIGTERM, then wait (kill after 10 s)."""
        terminate(self.proc)


def terminate(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGTERM a child process, then wait (kill after 10 s)."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RelayReader:
    """Follows RELAY_OUT from now on: counts messages and times each from its `observed_at`."""

    def __init__(self, nc: Client) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self.hops: list[float] = []
        """Stored in RELAY_OUT (server time) → received here."""
        self.timing = True
        self._target = 0
        self._reached = asyncio.Event()
        self._reader = OrderedReader(nc, stream=RELAY_STREAM, subject=RELAY_PREFIX + ">",
                                     handler=self._on, deliver=DeliverPolicy.NEW)

    def _on(self, m: StoredMessage) -> None:
        self.count += 1
        if self.count >= self._target:
            self._reached.set()
        if not self.timing:
            return
        now = time.time()
        self.hops.append(now - m.time)
        try:
            observed = _head.decode(m.data).observed_at
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if observed is not None:
            self.latencies.append(now - _epoch(observed))

    async def wait_count(self, target: int, stall: float = 10.0) -> float:
        """Wait until `target` messages arrived, or none did for `stall` seconds (the rest
        is lost); returns when (monotonic)."""
        self._target = target
        while self.count < target:
            seen = self.count
            self._reached.clear()
            try:
                await asyncio.wait_for(self._reached.wait(), stall)
            except TimeoutError:
                if self.count == seen:
                    break
        return time.monotonic()

    async def start(self) -> None:
        """Subscribe (new messages only)."""
        await self._reader.start()

    async def stop(self) -> None:
        """Unsubscribe."""
        await self._reader.stop()


def _epoch(text: str) -> float:
    from crr.schemas.wire_time import expires_seconds  # noqa: PLC0415 - keeps relay start light

    return expires_seconds(text)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the relay process."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.relay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--pad", type=int, default=0,
                        help="bytes added to each republished message (record size)")
    args = parser.parse_args(argv)
    asyncio.run(relay(args.server, args.pad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
