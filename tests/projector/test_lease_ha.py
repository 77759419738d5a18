"""Fenced HA projectors on a real nats-server: one writer, bounded takeover, late writes refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats.js.errors
import pytest
from nats.aio.client import Client

from crr.bus.errors import WRONG_LAST_SEQUENCE
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.projector.lease import Lease
from crr.projector.service import Projector
from crr.schemas.errors import LeaseLostError
from crr.schemas.subjects import SNAPSHOT_STREAM
from tests.history.test_replay import cli
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, publish_report, stored_host

TTL = 1.0
TAKEOVER_BOUND = TTL + TTL / 6 + 1.5
"""Documented bound (ops/projector/lease.py): TTL + one standby poll + rebuild/write (CI slack)."""


class Running:
    """A projector task with its lease, for the tests to inspect and kill."""

    def __init__(self, nc: Client, name: str) -> None:
        self.lease = Lease(nc, name, ttl=TTL)
        self.projector = Projector(nc, projector_id=name, status_interval=0.5, lease=self.lease)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.projector.run(self.stop), name=name)

    async def warm(self) -> None:
        waiter = asyncio.create_task(self.projector.warm.wait())
        done, _ = await asyncio.wait({self.task, waiter}, timeout=20,
                                     return_when=asyncio.FIRST_COMPLETED)
        if self.task in done:
            waiter.cancel()
            self.task.result()
        assert waiter in done, "projector not warm in time"

    async def crash(self) -> None:
        """Cancel the task: no clean release, the lease has to expire."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def halt(self) -> None:
        self.stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)


@asynccontextmanager
async def pair(nc: Client) -> AsyncIterator[tuple[Running, Running]]:
    """Two HA projectors; the first holds the lease (it started first), the second is warm."""
    a = Running(nc, "proj-a")
    await asyncio.wait_for(a.projector.ready.wait(), 20)
    b = Running(nc, "proj-b")
    await b.warm()
    try:
        yield a, b
    finally:
        for r in (a, b):
            if not r.task.done():
                await r.halt()


async def wait_for(predicate: object, timeout: float) -> float:
    """Poll a cheap in-process predicate (no IO) until true; returns the seconds it took."""
    assert callable(predicate)
    start = time.monotonic()
    await eventually(predicate, timeout, "condition", every=0.02)
    return time.monotonic() - start


async def test_two_projectors_exactly_one_writes(nc: Client) -> None:
    """With two HA projectors only the lease holder writes; the standby folds the same state."""
    writers: set[str] = set()

    def record(m: StoredMessage) -> None:
        if m.subject == "crr.v1.snapshot.projector":
            writers.add(m.data.decode().split('"projector_id":"')[1].split('"')[0])

    watch = OrderedReader(nc, stream=SNAPSHOT_STREAM, subject="crr.v1.snapshot.>", handler=record)
    await watch.start()
    try:
        async with pair(nc) as (a, b):
            await publish_catalog(nc)
            for i in range(5):
                seq = await publish_report(nc, "scratch", f"h{i}", {"scratch_free": float(i)})
            await a.projector.wait_until(seq)
            await wait_for(lambda: b.projector.state.seq >= seq, 10)
            assert a.lease.held
            assert not b.lease.held
            assert b.projector.writes == 0
            assert a.projector.writes > 0
            _, snap = await stored_host(nc, "h4")
            assert snap.values["scratch_free"].value == 4.0
            assert writers == {"proj-a"}
    finally:
        await watch.stop()


async def test_standby_takes_over_within_bound_and_converges(nc: Client) -> None:
    """Killing the active: the standby takes over within TTL + poll (+slack) and the
    snapshot then equals ground truth, including events published while nobody wrote."""
    async with pair(nc) as (a, b):
        await publish_catalog(nc)
        truth = {}
        for i in range(4):
            truth[f"h{i}"] = float(i)
            seq = await publish_report(nc, "scratch", f"h{i}", {"scratch_free": float(i)})
        await a.projector.wait_until(seq)
        await a.crash()
        killed_at = time.monotonic()
        # Events during the gap: the standby folds them warm and writes them on takeover.
        for i in range(2, 6):
            truth[f"h{i}"] = 100.0 + i
            seq = await publish_report(nc, "scratch", f"h{i}", {"scratch_free": 100.0 + i},
                                       seq=2)
        await b.projector.wait_until(seq, timeout=TAKEOVER_BOUND + 5)
        took = time.monotonic() - killed_at
        assert b.lease.held
        assert b.lease.epoch == 2
        assert took <= TAKEOVER_BOUND, took
        assert took >= TTL * 0.9, f"took over before the lease could expire ({took:.2f}s)"
        for host, value in truth.items():
            _, snap = await stored_host(nc, host)
            assert snap.values["scratch_free"].value == value, host
            assert snap.values["scratch_free"].state == "fresh"


async def test_clean_stop_hands_over_at_once(nc: Client) -> None:
    """A projector that stops cleanly releases the lease: takeover well before the TTL."""
    async with pair(nc) as (a, b):
        await a.halt()
        took = await wait_for(lambda: b.lease.held, TTL)
        assert took < TTL


async def test_deposed_writer_late_write_is_refused(nc: Client) -> None:
    """A holder that stalls past its TTL is deposed; its next snapshot write is refused by
    the server, it turns standby, and the record keeps the new writer's content."""
    async with pair(nc) as (a, b):
        await publish_catalog(nc)
        seq = await publish_report(nc, "scratch", "h1", {"scratch_free": 1.0})
        await a.projector.wait_until(seq)
        old_fence = a.lease.fence()
        await a.lease.close()  # "paused": stops renewing but still believes it holds the lease
        await wait_for(lambda: b.lease.held, TAKEOVER_BOUND)
        # (A may already have noticed through a refused periodic status write; either way
        # the server refuses its old fence:)
        # A raw late write with the old fence: refused by the server.
        with pytest.raises(nats.js.errors.APIError) as refused:
            await nc.jetstream().publish("crr.v1.snapshot.host.h1", b"{}", headers=old_fence)
        assert refused.value.err_code == WRONG_LAST_SEQUENCE
        # Through the projector: the next flush is refused and A steps down.
        seq = await publish_report(nc, "scratch", "h1", {"scratch_free": 2.0}, seq=2)
        await b.projector.wait_until(seq)
        await wait_for(lambda: not a.lease.held, 10)
        with pytest.raises(LeaseLostError):
            a.lease.fence()
        stored_seq, snap = await stored_host(nc, "h1")
        assert snap.values["scratch_free"].value == 2.0
        msg = await nc.jetstream().get_last_msg(SNAPSHOT_STREAM, "crr.v1.snapshot.projector")
        assert b'"projector_id":"proj-b"' in (msg.data or b"")
        assert stored_seq < int(msg.seq or 0)


async def test_racing_acquirers_one_wins(nc: Client) -> None:
    """Ten leases racing for a free lease: exactly one acquires it."""
    leases = [Lease(nc, f"l{i}", ttl=TTL) for i in range(10)]
    results = await asyncio.gather(*(lease.try_acquire(0, None) for lease in leases))
    try:
        assert sum(results) == 1
    finally:
        for lease in leases:
            await lease.close()


async def test_verify_with_a_lease_holder(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`crr replay --verify` against HA projectors: the lease record, renewed in CRR_SNAPSHOT
    all the time, is neither compared nor taken for a flush in progress."""
    async with pair(nc) as (a, _b):
        await publish_catalog(nc)
        last = await publish_report(nc, "scratch", "h1", {"scratch_free": 1.0})
        await a.projector.wait_until(last)
        renewed = a.lease.seq
        await wait_for(lambda: a.lease.seq != renewed, 5 * TTL)  # a renewal after the status
        code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 0, out + err
    assert out.startswith("verified: 3 record(s) byte-identical")
