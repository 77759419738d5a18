"""Helpers for tests that run a real Projector against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from nats.aio.client import Client

from crr.bus.streams import StreamSettings
from crr.history.replay import read_consistent_cut
from crr.projector.service import Projector
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode, encode
from crr.schemas.snapshot import HostSnapshot, ProjectorStatus
from crr.schemas.subjects import CATALOG, event_subject, host_snapshot_subject

FAST_CATALOG_YAML = """
version: 1
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 60s, min: 0}
  datasets:     {kind: string_set, scope: host, reporter: datasets, interval: 60s}
  blink:        {kind: numeric, scope: host, reporter: blinker, interval: 200ms}
  matlab_free:  {kind: numeric, scope: cluster, reporter: flexlm, interval: 60s}
reporters:
  scratch:  {type: script, command: [scratch.sh], interval: 60s}
  datasets: {type: script, command: [datasets.py], interval: 60s}
  blinker:  {type: script, command: [blink.sh], interval: 200ms}
  flexlm:   {type: external, interval: 60s}
"""
FAST_CATALOG: Catalog = load_catalog_text(FAST_CATALOG_YAML)


async def read_consistent_snapshot(nc: Client) -> tuple[ProjectorStatus, dict[str, bytes]]:
    """`read_consistent_cut` of a test that runs one unpartitioned projector: its status
    and the records."""
    statuses, records = await read_consistent_cut(nc)
    assert len(statuses) == 1, statuses
    assert statuses[0].partition is None, statuses
    return statuses[0], records


async def publish_catalog(nc: Client, catalog: Catalog = FAST_CATALOG) -> int:
    """Publish a catalog event; returns its CRR_EVENTS sequence."""
    ack = await nc.jetstream().publish(CATALOG, encode(catalog))
    return int(ack.seq)


async def publish_report(
    nc: Client, reporter: str, host: str | None, values: dict[str, Any], *, seq: int = 1,
    boot: str = "b1", raw: bytes | None = None,
) -> int:
    """Publish a Report (or `raw` bytes) on the reporter's subject; returns the stream seq."""
    body = raw if raw is not None else json.dumps({
        "reporter": reporter, "host": host, "boot": boot, "seq": seq,
        "observed_at": "2026-12-02T14:00:00.000Z", "values": values}).encode()
    ack = await nc.jetstream().publish(
        event_subject("report", reporter, host), body,
        headers={"Nats-Msg-Id": f"{reporter}/{host or '_cluster'}/{boot}/{seq}"})
    return int(ack.seq)


async def stored_host(nc: Client, host: str) -> tuple[int, HostSnapshot]:
    """(CRR_SNAPSHOT seq, decoded record) of a host as the stream holds it now."""
    msg = await nc.jetstream().get_last_msg("CRR_SNAPSHOT", host_snapshot_subject(host))
    assert msg.data is not None
    assert msg.seq is not None
    return msg.seq, decode(msg.data, HostSnapshot)


@asynccontextmanager
async def running_projector(nc: Client, **options: Any) -> AsyncIterator[Projector]:
    """A Projector (`options` as for `Projector`) running as a task until the block ends;
    ready on entry."""
    stop = asyncio.Event()
    projector = Projector(nc, **{"status_interval": 0.5, **options})
    task = asyncio.create_task(projector.run(stop))
    ready = asyncio.create_task(projector.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        ready.cancel()
        task.result()  # re-raise why it stopped
    assert ready in done, "projector not ready in time"
    try:
        yield projector
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


@asynccontextmanager
async def running_partitions(nc: Client, n: int, **options: Any) -> AsyncIterator[list[Projector]]:
    """`n` partition projectors (one unpartitioned for n == 1), `options` as for `Projector`
    (default `status_interval=0.5`, `projector_id=p<k>`), running as tasks until the block
    ends; all ready on entry (a projector that stops first re-raises why)."""
    stop = asyncio.Event()
    settings = StreamSettings(partitions=n)
    running = [Projector(nc, **{"status_interval": 0.5, "projector_id": f"p{k}",
                                "settings": settings, "partition": None if n == 1 else k,
                                **options}) for k in range(n)]
    tasks = [asyncio.create_task(p.run(stop)) for p in running]

    async def all_ready() -> None:
        for p in running:
            await p.ready.wait()

    ready = asyncio.create_task(all_ready())
    try:
        done, _ = await asyncio.wait([*tasks, ready], timeout=30,
                                     return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        for t in tasks:
            if t in done:
                t.result()  # why it stopped
        assert ready in done, "projectors not ready in time"
        yield running
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(t, 10)
