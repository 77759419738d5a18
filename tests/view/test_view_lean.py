"""The scheduler view's lean read path on a real server: twins or not, bad records, no growth."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from crr.bus.connection import connect
from crr.bus.streams import provision
from crr.projections.host_table import HostTable, bulk_fill
from crr.projections.host_table import table as table_module
from crr.projections.host_table.staging import Staged
from crr.projections.record.columns import COLUMNS_HEADER, columns_of
from crr.projections.select import compile_select, explain
from crr.schemas.codec import DECODERS, encode
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import SNAPSHOT_CATALOG, SNAPSHOT_STREAM, host_snapshot_subject
from crr.schemas.wire_time import expires_seconds
from crr.view.scheduler_view import SchedulerView
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.select import CATALOG, NOW, STALE, StaleWas, host_snapshot

EXPRS = ["free > 3", 'os == "rhel9" && ok', 'tags has "a" || free < 2', "!ok"]


def _record(host: str, values: dict[str, Any], *, twins: bool) -> bytes:
    data = encode(host_snapshot(host, values))
    if not twins:
        return data
    doc: dict[str, Any] = msgspec.json.decode(data)
    for e in doc["values"].values():
        e["expires_ts"] = expires_seconds(e["expires_at"])
    return msgspec.json.encode(doc)


def _records(start: int, stop: int, *, twins: bool) -> list[tuple[str, bytes]]:
    out = []
    for i in range(start, stop):
        values: dict[str, Any] = {"free": float(i), "os": "rhel9" if i % 2 else "sles",
                                  "ok": i % 3 != 0, "tags": ["a", "b"][: i % 3]}
        if i % 5 == 0:
            values["free"] = STALE
        if i % 7 == 0:
            values["tags"] = StaleWas(["z"])
        host = f"h{i:03d}"
        out.append((host_snapshot_subject(host), _record(host, values, twins=twins)))
    return out


async def _publish(nc: Client, records: list[tuple[str, bytes]]) -> int:
    seq = 0
    for subject, data in records:
        seq = int((await nc.jetstream().publish(subject, data)).seq)
    return seq


def _full_table(records: list[tuple[str, bytes]]) -> HostTable:
    """What the view held before: every record decoded in full, last per subject."""
    table = HostTable(CATALOG)
    last = dict(records)
    for data in last.values():
        table.upsert(DECODERS[HostSnapshot].decode(data))
    return table


def _assert_answers_of(view: SchedulerView, full: HostTable) -> list[str]:
    """The view has `full`'s hosts, get(), select and explain, and rejected nothing; the
    hosts."""
    hosts = full.hosts()
    assert view.table.hosts() == hosts
    for host in hosts:
        assert view.table.get(host) == full.get(host)
    for text in EXPRS:
        compiled = compile_select(text, CATALOG)
        assert view.select(text) == compiled.select(full, NOW), text
        for host in hosts[::7]:
            assert view.explain(text, host) == explain(compiled, full, host, NOW)
    assert view.rejected == 0
    return hosts


async def _wait_position(view: SchedulerView, seq: int) -> None:
    done = asyncio.Event()
    unsubscribe = view.subscribe(lambda _s: done.set() if view.position >= seq else None)
    try:
        if view.position < seq:
            await asyncio.wait_for(done.wait(), 10)
    finally:
        unsubscribe()


async def test_old_and_new_records_load_and_live(nc: Client) -> None:
    """Records without twins (written before them) and with twins, loaded and then live: the
    view's get(), select and explain equal the full decode of the same records."""
    await provision(nc)
    await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(CATALOG))
    loaded = _records(0, 20, twins=False) + _records(20, 40, twins=True)
    await _publish(nc, loaded)
    view = SchedulerView(nc, idle_heartbeat=0.5, clock=lambda: NOW)
    try:
        await view.start()
        await view.wait_ready(10)
        live = _records(10, 30, twins=True) + _records(30, 45, twins=False)
        await _wait_position(view, await _publish(nc, live))
        full = _full_table(loaded + live)
        hosts = _assert_answers_of(view, full)
        await view.wait_packed(30)
        assert view.table.unpacked_count == 0
        assert view.packed >= len(hosts)
        last = dict(loaded + live)
        for host in hosts:  # compressed now, the same answers
            assert view.table.get(host) == full.get(host)
            assert view.table.record(host) == last[host_snapshot_subject(host)]
    finally:
        await view.stop()


async def test_columns_headers_give_the_answers_of_the_records(
        nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records with their columns header (as the projector writes them), without one, and with
    one that does not decode, in runs, at load and then live: the view reads the headers
    where it can and answers as the records themselves do (get(), select, explain)."""
    await provision(nc)
    await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(CATALOG))
    records = _records(0, 150, twins=True)
    fills: list[int] = []
    fill = bulk_fill.fill_headers

    def counted(columns: Any, codec: Any, pool: Any, rows: Any, *args: Any,
                **kwargs: Any) -> None:
        fills.append(len(rows))
        fill(columns, codec, pool, rows, *args, **kwargs)

    monkeypatch.setattr(table_module, "fill_headers", counted)

    async def publish(records: list[tuple[str, bytes]], broken: range) -> int:
        seq = 0
        for k, (subject, data) in enumerate(records):
            snap = DECODERS[HostSnapshot].decode(data)
            columns = encode(columns_of(snap.host, snap.values)).decode()
            if k in broken:
                columns = "" if k % 2 else '{"host": ["not", "a", "name"]}'
            headers = {COLUMNS_HEADER: columns} if columns else None
            seq = int((await nc.jetstream().publish(subject, data, headers=headers)).seq)
        return seq

    await publish(records, range(60, 100))
    view = SchedulerView(nc, idle_heartbeat=0.5, clock=lambda: NOW)
    try:
        await view.start()
        await view.wait_ready(10)
        assert fills == [60, 50]  # records 60-99 (broken or no headers) were read whole
        _assert_answers_of(view, _full_table(records))
        live = _records(140, 170, twins=True)  # (20 new hosts: states other than before)
        from_headers: list[str] = []
        stage = Staged.add_header

        def spied(self: Staged, row: int, decoded: Any, codec: Any) -> bool:
            from_headers.append(decoded.host)
            return stage(self, row, decoded, codec)

        monkeypatch.setattr(Staged, "add_header", spied)
        await _wait_position(view, await publish(live, range(5, 12)))
        assert len(from_headers) == len(live) - 7  # the rest were read whole
        _assert_answers_of(view, _full_table(records + live))
    finally:
        await view.stop()


async def test_the_projector_writes_each_host_record_with_its_columns(nc: Client) -> None:
    """Every host record the projector writes carries its columns header: `columns_of` the
    record's own entries (fresh, and stale after a second report left one value behind)."""
    async with running_projector(nc) as p:
        seq = await publish_catalog(nc)
        for i in range(5):
            seq = await publish_report(nc, "scratch", f"n{i}", {"scratch_free": float(i)})
        await p.wait_until(seq)
    js = nc.jetstream()
    for i in range(5):
        msg = await js.get_last_msg(SNAPSHOT_STREAM, host_snapshot_subject(f"n{i}"))
        assert msg.data is not None
        assert msg.headers is not None
        snap = DECODERS[HostSnapshot].decode(msg.data)
        assert msgspec.json.decode(msg.headers[COLUMNS_HEADER]) == msgspec.json.decode(
            encode(columns_of(snap.host, snap.values)))
        assert snap.values["scratch_free"].value == float(i)


async def test_bad_records_are_reported_and_the_rest_served(
        nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    """Records that do not decode — at load and live — are logged and counted, never crash
    the view; one whose values decode but whose other parts do not is a row whose get()
    answers None (logged, counted as unreadable).  Every other host is served."""
    await provision(nc)
    await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(CATALOG))
    good = _records(0, 10, twins=True)
    await _publish(nc, [*good, (host_snapshot_subject("junk"), b"\x00not json")])
    view = SchedulerView(nc, idle_heartbeat=0.5, clock=lambda: NOW)
    caplog.set_level(logging.WARNING, logger="crr.view")
    try:
        await view.start()
        await view.wait_ready(10)
        assert view.rejected == 1
        half: dict[str, Any] = msgspec.json.decode(_record("half", {"free": 99.0}, twins=True))
        half["inventory"] = "not an object"
        seq = await _publish(nc, [
            (host_snapshot_subject("worse"), b'{"host": "worse", "values": {"free": 3}}'),
            (host_snapshot_subject("half"), msgspec.json.encode(half)),
            *_records(10, 12, twins=False),
        ])
        await _wait_position(view, seq)
        assert view.rejected == 2
        assert view.select("free > 50") == ["half"]
        assert view.table.get("half") is None
        assert view.unreadable == 1
        assert view.table.get("h011") is not None
        assert view.select("free >= 0") == sorted(["half", *[f"h{i:03d}" for i in range(12)
                                                            if i % 5]])
    finally:
        await view.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any("skipping record" in m and "junk" in m for m in messages)
    assert any("skipping record" in m and "worse" in m for m in messages)
    assert any("host half does not decode in full" in m for m in messages)


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
async def test_the_view_keeps_no_object_tree_per_host(nc: Client) -> None:
    """The objects the cyclic GC tracks (what makes its pauses long) stay near one per host
    after the load — a string set's frozenset — and repeated live updates of the same hosts
    do not add any: nothing of a decoded record outlives its apply."""
    await provision(nc)
    await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(CATALOG))
    hosts = 600
    await _publish(nc, _records(0, 50, twins=True))
    await _publish(nc, [(host_snapshot_subject(f"x{i}"),
                         _record(f"x{i}", {"free": 1.0, "tags": ["a"], "os": "rhel9"},
                                 twins=False))
                        for i in range(hosts - 50)])
    view = SchedulerView(nc, idle_heartbeat=0.5, clock=lambda: NOW)
    try:
        gc.collect()
        empty = len(gc.get_objects())
        await view.start()
        await view.wait_ready(10)
        await _wait_position(view, await _publish(nc, _records(0, 50, twins=True)))
        gc.collect()
        loaded = len(gc.get_objects())
        assert len(view.table) == hosts
        assert (loaded - empty) / hosts < 2.0, loaded - empty
        for _ in range(6):
            await _wait_position(view, await _publish(nc, _records(0, 50, twins=True)))
        staged = view.table.staged_count
        view.table.column("free")  # a query: the staged rows go into the columns
        assert 0 < staged <= 50
        assert view.table.staged_count == 0
        gc.collect()
        grown = len(gc.get_objects()) - loaded
        assert grown < 150, grown  # 300 updates: far less than one object per update
    finally:
        await view.stop()


def _burst_from_another_client(url: str, records: list[tuple[str, bytes]]) -> int:
    """Publish `records` (acked) on a client of its own in a thread of its own, and wait
    for it: called from the test's event loop, it holds the view's loop until the whole
    burst is stored, so the view is behind it by construction (not by a race)."""

    async def publish() -> int:
        async with connect(url, name="burst") as pub:
            js = pub.jetstream()
            acks = [await js.publish_async(subject, data) for subject, data in records]
            return max([int((await ack).seq) for ack in acks])

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, publish()).result(timeout=60)


async def test_packer_waits_while_the_view_is_behind(nc: Client, nats_url: str) -> None:
    """Applying records comes before compressing them: from a live record with more pending
    behind it until one with nothing pending, no kept record is compressed; once caught up
    the packer compresses every record."""
    await provision(nc)
    await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(CATALOG))
    view = SchedulerView(nc, idle_heartbeat=0.5, clock=lambda: NOW)
    seen: list[tuple[int, int]] = []  # (pending behind the record, records kept uncompressed)

    def on_record(_subject: str) -> None:
        last = view._follower.last
        assert last is not None
        seen.append((last.pending, view.table.unpacked_count))

    try:
        await view.start()
        await view.wait_ready(10)
        unsubscribe = view.subscribe(on_record)
        seq = _burst_from_another_client(nats_url, _records(0, 300, twins=True) * 2)
        await _wait_position(view, seq)
        unsubscribe()
        assert any(pending for pending, _ in seen), "the burst never left the view behind"
        for (pending, before), (_, after) in itertools.pairwise(seen):
            if pending:
                assert after >= before  # nothing compressed while records were pending
        await view.wait_packed(30)
        assert view.table.unpacked_count == 0
        assert view.packed >= 300
        assert view.table.record("h007") == dict(_records(0, 300, twins=True))[
            host_snapshot_subject("h007")]
    finally:
        await view.stop()
