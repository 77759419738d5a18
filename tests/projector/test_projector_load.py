"""The projector under load: events held during a flush, back-pressure, what it buffers
while behind, exactness (issues 8 and 13)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import pytest
import tenacity
from nats.aio.client import Client
from nats.js.api import DeliverPolicy

import crr.projector.input
from crr.bus.natspy.ordered_consumer import FLOW_WINDOW
from crr.bus.ordered import OrderedReader, StoredMessage
from crr.bus.pipeline_publish import PipelinePublisher
from crr.cli import build_parser
from crr.projector.snapshot_writer import SnapshotWriter
from crr.schemas.codec import decode
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import EVENTS_STREAM, event_subject, host_snapshot_subject
from tests.conftest import PUBLIC_PATHS_FORCED
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, read_consistent_snapshot, running_projector

HOSTS = 150
ROUNDS = 8


class _Moving(Exception):
    """The consumer is still being delivered messages."""


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@pytest.mark.skipif(PUBLIC_PATHS_FORCED, reason="backpressure by messages handled is the "
                    "flow_control fast path; CRR_NATS_FAST=0 forces nats-py's answers")
async def test_reader_backpressure_leaves_the_backlog_in_the_stream(nc: Client) -> None:
    """A blocked handler stalls delivery (not every message is buffered); then all arrive once."""
    total = 30_000
    js = nc.jetstream()
    body = b"x" * 1000
    for i in range(total):
        await js.publish_async(f"crr.v1.report.host.h{i % 500}.r", body)
    await asyncio.wait_for(js.publish_async_completed(), 30)
    gate = asyncio.Event()
    seqs: list[int] = []

    async def handler(m: StoredMessage) -> None:
        seqs.append(m.seq)
        if len(seqs) == 10:
            await gate.wait()

    reader = OrderedReader(nc, stream=EVENTS_STREAM, subject="crr.v1.>", handler=handler,
                           deliver=DeliverPolicy.ALL, backpressure=True)
    await reader.start()
    try:
        last = -1

        async def settled() -> int:
            nonlocal last
            sub: Any = reader._sub  # a JetStream PushSubscription
            info = await sub.consumer_info()
            delivered = info.delivered.stream_seq if info.delivered else 0
            if delivered != last:
                last = delivered
                raise _Moving
            return int(delivered or 0)

        async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_delay(20), wait=tenacity.wait_fixed(0.3),
                retry=tenacity.retry_if_exception_type(_Moving), reraise=True):
            with attempt:
                stalled_at = await settled()
        assert len(seqs) == 10
        assert stalled_at < total, "the server kept delivering to a blocked handler"
        gate.set()
        await reader.wait_ready(30)
        assert seqs == list(range(1, total + 1))  # every message once, in order
    finally:
        gate.set()
        await reader.stop()


def _gate_flushes(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """(gate, entered): a flush that cannot write while `gate` is clear (what arrives
    meanwhile is held, then waits in the reader); `entered` is set when a flush begins."""
    gate, entered = asyncio.Event(), asyncio.Event()
    gate.set()
    write = SnapshotWriter._pipelined

    async def gated(self: SnapshotWriter, records: Any, slow: Any, parents: Any) -> None:
        entered.set()
        await gate.wait()
        await write(self, records, slow, parents)

    monkeypatch.setattr(SnapshotWriter, "_pipelined", gated)
    return gate, entered


async def _burst_behind_a_flush(nc: Client, entered: asyncio.Event, *, hosts: int,
                                rounds: int) -> tuple[dict[str, float], int]:
    """`rounds` reports of `hosts` hosts, the first of which starts a flush (waiting at the
    gate) before the others are published: each host's last value, and the last seq."""
    expected: dict[str, float] = {}
    async with PipelinePublisher(nc) as pipe:
        for r in range(rounds):
            for h in range(hosts):
                host = f"node{h:03d}"
                value = float(r * 1000 + h)
                body = json.dumps({"reporter": "scratch", "host": host, "boot": "b",
                                   "seq": r + 1, "observed_at": "2026-12-02T14:00:00.000Z",
                                   "values": {"scratch_free": value}}).encode()
                await pipe.publish(event_subject("report", "scratch", host), body,
                                   {"Nats-Msg-Id": f"scratch/{host}/b/{r + 1}"})
                expected[host] = value
                if r == h == 0:  # the first report starts a flush, which waits at the gate
                    await pipe.flush(10)
                    await asyncio.wait_for(entered.wait(), 10)
        await pipe.flush(30)
        return expected, pipe.stats.last_seq


async def _assert_records(nc: Client, expected: dict[str, float]) -> None:
    """Every host's record holds the last value sent."""
    _, records = await read_consistent_snapshot(nc)
    for host, value in expected.items():
        snap = decode(records[host_snapshot_subject(host)], HostSnapshot)
        assert snap.values["scratch_free"].value == value


async def test_burst_with_held_events_is_exact(
        nc: Client, nats_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Events held during a flush (reader made to wait) are folded exactly once; --verify agrees."""
    # The reader waits after 2 held.
    monkeypatch.setattr(crr.projector.input, "HOLD_LIMIT", 2)
    gate, entered = _gate_flushes(monkeypatch)
    async with running_projector(nc) as p:
        await p.wait_until(await publish_catalog(nc))
        applied_before = p.applied
        gate.clear()
        entered.clear()
        expected, last_seq = await _burst_behind_a_flush(nc, entered, hosts=HOSTS, rounds=ROUNDS)
        gate.set()
        await p.wait_until(last_seq, 30)
        assert p.applied - applied_before == HOSTS * ROUNDS  # none lost, none applied twice
        assert p.held >= 2
        await _assert_records(nc, expected)
        ns: argparse.Namespace = build_parser().parse_args(
            ["replay", "--server", nats_url, "--verify"])
        code = await ns.func(ns)
        out = capsys.readouterr().out
        assert code == 0, out
        assert "byte-identical" in out


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@pytest.mark.skipif(PUBLIC_PATHS_FORCED, reason="the bound is the fast ordered-consumer "
                    "path's backlog; CRR_NATS_FAST=0 forces nats-py's queue")
async def test_behind_the_projector_buffers_a_bounded_amount(
        nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that cannot write (the projector falls behind): it holds at most HOLD_LIMIT
    events, its reader's backlog at most the server's flow-control window, and the server
    waits (its stalled heartbeats unanswered) with the rest in CRR_EVENTS; once the flush
    goes on, every event is folded once, and the freed memory is given back."""
    limit = 50
    monkeypatch.setattr(crr.projector.input, "HOLD_LIMIT", limit)
    gate, entered = _gate_flushes(monkeypatch)
    hosts, rounds = 500, 24  # 12k reports, ~4 MB as stored: more than the server's first window
    async with running_projector(nc) as p:
        await p.wait_until(await publish_catalog(nc))
        applied_before, trims_before = p.applied, p.trims
        gate.clear()
        entered.clear()
        expected, last_seq = await _burst_behind_a_flush(nc, entered, hosts=hosts, rounds=rounds)
        events = p._input.reader
        assert events is not None
        direct = events._direct
        assert direct is not None
        await eventually(lambda: direct.stalls >= 1, 30, "the server stalled on flow control")
        buffered = p.buffered
        await eventually(lambda: direct.stalls >= 2, 30, "another stalled heartbeat")
        assert p.buffered == buffered, "the server sent more while the projector was behind"
        assert p._input.held_events is not None
        assert len(p._input.held_events) == limit
        assert 0 < events.waiting < hosts * rounds
        assert direct.backlog.peak <= FLOW_WINDOW
        gate.set()
        await p.wait_until(last_seq, 60)
        assert p.applied - applied_before == hosts * rounds  # none lost, none applied twice
        assert p.buffered == 0
        await eventually(lambda: p.trims > trims_before, 10, "freed memory given back")
        await _assert_records(nc, expected)
