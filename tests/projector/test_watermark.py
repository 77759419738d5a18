"""The projector's watermark (ops/projector/watermark.py) and the status that carries it.

The rule in pure form (`Watermark.advance`), then a real Projector against a real
nats-server: its status carries a watermark that advances on an idle stream, readers
judge at it, and catching up after a stop writes no stale → fresh flap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.aio.msg import Msg

from crr.bus.server import NatsServer
from crr.projector.watermark import Watermark, previous_watermark
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode, encode
from crr.schemas.snapshot import HostSnapshot, ProjectorStatus
from crr.schemas.subjects import status_subject
from crr.schemas.wire_time import format_time, parse_time
from tests.support.faults import eventually
from tests.support.projector import (
    publish_catalog,
    publish_report,
    read_consistent_snapshot,
    running_projector,
)

T0 = 1_800_000_000.0


def test_behind_it_is_the_stored_time_of_the_last_event_folded() -> None:
    wm = Watermark()
    assert wm.advance(T0, connected=True, caught_up=False, last_stored=T0 - 30) == T0 - 30
    assert wm.advance(T0 + 1, connected=True, caught_up=False, last_stored=T0 - 20) == T0 - 20
    # Caught up: the round's tick (it advances on an idle stream too).
    assert wm.advance(T0 + 2, connected=True, caught_up=True, last_stored=T0 - 1) == T0 + 2
    assert wm.advance(T0 + 3, connected=True, caught_up=True, last_stored=T0 - 1) == T0 + 3


def test_cut_off_it_stays_and_after_a_reconnect_it_waits_one_lifetime() -> None:
    wm = Watermark()
    assert wm.advance(T0, connected=True, caught_up=True, last_stored=None) == T0
    # NATS down: does not advance, however long.
    assert wm.advance(T0 + 40, connected=False, caught_up=True, last_stored=None) == T0
    wm.reconnected(T0 + 41, 15.0)
    assert wm.advance(T0 + 41, connected=True, caught_up=True, last_stored=T0 + 41) == T0
    assert wm.advance(T0 + 55.9, connected=True, caught_up=True, last_stored=T0 + 55) == T0
    # One longest interval + grace later: it jumps to now.
    assert wm.advance(T0 + 56, connected=True, caught_up=True, last_stored=T0 + 55) == T0 + 56
    assert wm.resume_at is None


def test_after_a_reconnect_the_lifetime_counts_from_the_first_event_stored_since() -> None:
    """A restarted server's JetStream may take seconds to store reports again: the
    reporters' interval + grace counts from the first event stored after the reconnect,
    and the whole hold is at most the catalog's outage_hold after the reconnect."""
    wm = Watermark()
    wm.advance(T0, connected=True, caught_up=True, last_stored=T0)
    # A round sees the connection down, a later one sees it back (before any listener).
    wm.advance(T0 + 1, connected=False, caught_up=True, last_stored=T0)
    assert wm.advance(T0 + 5, connected=True, caught_up=True, last_stored=T0,
                      reconnect_wait=1.5, reconnect_cap=600.0) == T0
    assert wm.advance(T0 + 9, connected=True, caught_up=True, last_stored=T0,
                      reconnect_wait=1.5, reconnect_cap=600.0) == T0  # nothing stored yet
    assert wm.advance(T0 + 9.1, connected=True, caught_up=True, last_stored=T0 + 9,
                      reconnect_wait=1.5, reconnect_cap=600.0) == T0
    assert wm.advance(T0 + 10.6, connected=True, caught_up=True, last_stored=T0 + 10.5,
                      reconnect_wait=1.5, reconnect_cap=600.0) == T0 + 10.6
    # No event ever stored again: held at most outage_hold after the reconnect.
    wm = Watermark()
    wm.advance(T0, connected=True, caught_up=True, last_stored=T0)
    wm.reconnected(T0 + 5, 1.5, 60.0)
    assert wm.advance(T0 + 64, connected=True, caught_up=True, last_stored=T0) == T0
    assert wm.advance(T0 + 65, connected=True, caught_up=True, last_stored=T0) == T0 + 65


@given(st.lists(st.tuples(st.floats(0, 10), st.booleans(), st.booleans(),
                          st.floats(-50, 10)), max_size=30))
def test_never_goes_back_and_never_passes_the_tick(
        rounds: list[tuple[float, bool, bool, float]]) -> None:
    wm, tick, last = Watermark(), T0, None
    for step, connected, caught_up, stored in rounds:
        tick += step
        at = wm.advance(tick, connected=connected, caught_up=caught_up,
                        last_stored=tick + stored)
        assert at <= tick
        assert last is None or at >= last
        last = at


async def _status_watermark(nc: Client, after: float | None = None) -> float:
    """The projector status's `watermark_ts` (once later than `after`: a bounded retry)."""
    for _ in range(100):
        status, _ = await read_consistent_snapshot(nc)
        assert status.watermark_ts is not None
        assert status.watermark == "" or parse_time(status.watermark) == status.watermark_ts
        assert status.watermark_ts <= parse_time(status.last_tick)
        if after is None or status.watermark_ts > after:
            return status.watermark_ts
        await asyncio.sleep(0.05)  # a bounded retry on the status written every 0.5 s
    raise AssertionError(f"watermark did not advance past {after}")


async def test_status_carries_a_watermark_that_advances_on_an_idle_stream(
        nc: Client) -> None:
    await publish_catalog(nc)
    seq = await publish_report(nc, "scratch", "n1", {"scratch_free": 5.0})
    async with running_projector(nc) as projector:
        await projector.wait_until(seq)
        first = await _status_watermark(nc)
        assert abs(first - time.time()) < 5
        later = await _status_watermark(nc, after=first)  # nothing published meanwhile
        assert later > first
        assert projector.watermark is not None
        assert projector.watermark >= later


SHORT = load_catalog_text("""
version: 1
resources:
  load: {kind: numeric, scope: host, reporter: ticker, interval: 1s}
reporters:
  ticker: {type: script, command: [t.sh], interval: 1s}
""")
"""`load`: fresh for 1.5 s (interval + grace) after each report."""


@pytest.mark.slow
async def test_catching_up_after_a_stop_writes_no_stale_then_fresh(
        nc: Client) -> None:
    """The projector stops for 3x the interval while two hosts keep reporting every
    0.25 s; a new one catches up: no host record it writes shows a value stale and then
    fresh again (the value was reported all along)."""
    await publish_catalog(nc, SHORT)
    n = 0

    async def report_round() -> int:
        nonlocal n
        n += 1
        last = 0
        for host in ("n1", "n2"):
            last = await publish_report(nc, "ticker", host, {"load": float(n)}, seq=n)
        return last

    written: list[HostSnapshot] = []

    async def on_record(msg: Msg) -> None:
        if msg.data:
            written.append(decode(msg.data, HostSnapshot))

    async with running_projector(nc) as projector:
        await projector.wait_until(await report_round())
    stopped_at = time.monotonic()
    while time.monotonic() - stopped_at < 3.0:  # 3x the interval, reports kept coming
        await report_round()
        await asyncio.sleep(0.25)
    sub = await nc.subscribe("crr.v1.snapshot.host.>", cb=on_record)
    try:
        async with running_projector(nc) as projector:
            for _ in range(6):  # 1.5 s of catching up and live reports
                seq = await report_round()
                await asyncio.sleep(0.25)
            await projector.wait_until(seq)
            await nc.flush()
    finally:
        await sub.unsubscribe()
    assert {r.host for r in written} == {"n1", "n2"}
    for host in ("n1", "n2"):
        states = [r.values["load"].state for r in written if r.host == host]
        flaps = [i for i in range(1, len(states))
                 if states[i - 1] == "stale" and states[i] == "fresh"]
        assert not flaps, f"{host}: stale then fresh in {states}"
        assert states[-1] == "fresh"



@pytest.mark.slow
@pytest.mark.parametrize("hosts", [
    pytest.param(("n1",), id="one-host"),
    pytest.param(("n1", "n2"), id="two-hosts"),
    pytest.param(("n1", "n2", "n3", "n4"), id="four-hosts"),
])
async def test_a_nats_server_restart_writes_no_stale_then_fresh(
        server_and_client: tuple[NatsServer, Client], hosts: tuple[str, ...]) -> None:
    """The server stops for 3x the interval while the projector runs; the reporters report
    again as soon as it is back.  The projector's watermark does not advance while it is
    cut off and waits one interval + grace after the reconnect, so its own expiry writes
    no value stale and then fresh again (without that hold, the first round after the
    reconnect expires every value)."""
    server, nc = server_and_client
    await publish_catalog(nc, SHORT)
    written: list[HostSnapshot] = []

    async def on_record(msg: Msg) -> None:
        if msg.data:
            written.append(decode(msg.data, HostSnapshot))

    n = 0
    stop = asyncio.Event()

    async def reporters() -> None:  # every 0.25 s; a report that cannot be stored is lost
        nonlocal n
        while not stop.is_set():
            n += 1
            for host in hosts:  # hosts 0.4 s apart, as reporters' phases are
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        publish_report(nc, "ticker", host, {"load": float(n)}, seq=n), 0.5)
                await asyncio.sleep(0.25 if len(hosts) == 1 else 1.2 / len(hosts))

    reconnected = asyncio.Event()
    nc.options["crr_reconnect_listeners"].append(reconnected.set)
    async with running_projector(nc) as projector:
        task = asyncio.create_task(reporters())
        try:
            first = await publish_report(nc, "ticker", "n1", {"load": 0.0}, seq=10_000)
            await projector.wait_until(first)
            sub = await nc.subscribe("crr.v1.snapshot.host.>", cb=on_record)
            await asyncio.to_thread(server.stop)
            await asyncio.sleep(3.0)  # the outage: 3x the interval (not a synchronisation)
            await asyncio.to_thread(server.start)
            await asyncio.wait_for(reconnected.wait(), 30)
            seen = n
            await eventually(lambda: n >= seen + 8, 10, "2 s of reports after the outage")
            await projector.wait_until(await publish_report(nc, "ticker", "n1", {"load": 0.0},
                                                            seq=20_000))
            await nc.flush()
            await sub.unsubscribe()
        finally:
            stop.set()
            await task
    assert {r.host for r in written} == set(hosts)
    for host in hosts:
        states = [r.values["load"].state for r in written if r.host == host]
        flaps = [i for i in range(1, len(states))
                 if states[i - 1] == "stale" and states[i] == "fresh"]
        assert not flaps, f"{host}: stale then fresh in {states}"
        assert states[-1] == "fresh"


def test_a_rebuilding_status_keeps_the_previous_watermark() -> None:
    """While a projector rebuilds, readers keep the previous records: its `rebuilding`
    status carries the watermark of the status CRR_SNAPSHOT held, so they hold at it."""
    old = ProjectorStatus(last_seq=9, stream_last_seq=9, lag=0, last_tick=format_time(T0 + 1),
                          started_at=format_time(T0 - 60), watermark=format_time(T0),
                          watermark_ts=T0)
    raw = {status_subject(None): (7, encode(old)), status_subject(1): (8, b"")}
    assert previous_watermark(raw, None) == T0
    assert previous_watermark(raw, 1) is None  # deleted
    assert previous_watermark(raw, 2) is None  # none
    older = msgspec.structs.replace(old, watermark="", watermark_ts=None)
    assert previous_watermark({status_subject(None): (7, encode(older))}, None) == T0 + 1
    assert previous_watermark({status_subject(None): (7, b"{not json")}, None) is None
