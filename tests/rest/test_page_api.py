"""The status page's REST endpoints over real HTTP: host table, summary, timeline, latency,
and bad input (a 4xx problem detail, never a 500)."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from crr.bridges.release import publish_release
from crr.bus.ordered import StoredMessage
from crr.history.latency import _Collector
from crr.projections.host_table import HostTable
from crr.rest.host_query import HostFacts, query
from crr.schemas.snapshot import AsOf, HostSnapshot, ValueEntry, ValueState
from crr.schemas.subjects import event_subject
from crr.schemas.wire_time import format_time
from tests.support.faults import eventually
from tests.support.projector import FAST_CATALOG, publish_catalog, publish_report
from tests.support.rest import ApiRig, running_api


def now_report(reporter: str, host: str | None, values: dict[str, Any], seq: int) -> bytes:
    """A Report observed now (so latencies are real)."""
    return json.dumps({"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
                       "observed_at": format_time(time.time()), "values": values}).encode()


async def populate(nc: Client, rig: ApiRig, hosts: int = 12) -> int:
    """`hosts` hosts with scratch_free = 10 * i (and node07, if any, datasets); returns the
    last seq."""
    await publish_catalog(nc)
    seq = 0
    for i in range(hosts):
        name = f"node{i:02d}"
        seq = await publish_report(nc, "scratch", name, {"scratch_free": 10.0 * i},
                                   raw=now_report("scratch", name, {"scratch_free": 10.0 * i}, 1))
    if hosts > 7:
        seq = await publish_report(nc, "datasets", "node07", {"datasets": ["c4"]})
    await rig.settle(seq)
    return seq


async def test_host_table_filters_sorts_and_pages(nc: Client) -> None:
    """match, select (a whole requirement string), sort by a resource, offset/limit."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await populate(nc, rig)
        first = (await http.get("/v1/host-table", params={"limit": 5})).json()
        assert first["total"] == 12
        assert first["hosts_total"] == 12
        assert [r["host"] for r in first["rows"]] == [f"node{i:02d}" for i in range(5)]
        assert first["rows"][0]["status"] == "ok"
        assert "scratch_free" in first["resources"]
        second = (await http.get("/v1/host-table", params={"limit": 5, "offset": 10})).json()
        assert [r["host"] for r in second["rows"]] == ["node10", "node11"]
        by_value = (await http.get("/v1/host-table",
                                   params={"sort": "-scratch_free", "limit": 3})).json()
        assert [r["host"] for r in by_value["rows"]] == ["node11", "node10", "node09"]
        globbed = (await http.get("/v1/host-table", params={"match": "node1*"})).json()
        assert [r["host"] for r in globbed["rows"]] == ["node10", "node11"]
        sel = (await http.get("/v1/host-table", params={
            "select": "select[scratch_free >= 50] rusage[mem=100]", "sort": "-scratch_free",
            "limit": 2})).json()
        assert sel["total"] == 7
        assert [r["host"] for r in sel["rows"]] == ["node11", "node10"]
        assert [s["name"] for s in sel["ignored_sections"]] == ["rusage"]
        assert sel["note"]
        has = (await http.get("/v1/host-table",
                              params={"select": 'datasets has "c4"'})).json()
        assert [r["host"] for r in has["rows"]] == ["node07"]


async def test_summary_counts(nc: Client) -> None:
    """Hosts, values by state, reporters by state and the projector's liveness."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await populate(nc, rig, hosts=3)
        body = (await http.get("/v1/summary")).json()
        assert body["hosts"] == 3
        assert body["values"] == {"fresh": 3}
        assert body["reporters"] == {"ok": 3}
        assert body["host_status"] == {"ok": 3}
        assert body["liveness"]["state"] == "live"
        assert body["projector_position"] > 0


async def test_timeline_shows_a_stale_period_after_a_reporter_stops(nc: Client) -> None:
    """blink (interval 200 ms) reported once: fresh, then stale from its expires_at."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await publish_catalog(nc)
        seq = await publish_report(nc, "blinker", "node1", {"blink": 3.0})
        await rig.settle(seq)

        async def is_stale() -> bool:
            body = (await http.get("/v1/hosts/node1")).json()
            return bool(body["values"]["blink"]["state"] == "stale")

        await eventually(is_stale, 10, "blink stale")
        body = (await http.get("/v1/hosts/node1/timeline", params={"window": "5m"})).json()
        blink = next(v for v in body["values"] if v["resource"] == "blink")
        states = [s["state"] for s in blink["spans"]]
        assert states == ["fresh", "stale"]
        fresh, stale = blink["spans"]
        assert fresh["value"] == 3.0
        assert stale["value"] == 3.0  # the last value, shaded as stale
        assert abs(stale["start"] - fresh["end"]) < 1e-9
        assert stale["end"] == body["until"]
        assert body["events"] == 1
        assert [r["reporter"] for r in body["reporters"]] == ["blinker"]
        lanes = body["reporters"][0]["spans"]
        assert [s["state"] for s in lanes] == ["ok", "silent"]
        assert lanes[1]["start"] < body["until"]


async def test_latency_reports_percentiles_and_slowest(nc: Client) -> None:
    """Reports observed now: every leg has samples; the slowest list names hosts."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await populate(nc, rig, hosts=4)
        body = (await http.get("/v1/latency", params={"since": "5m"})).json()
        scratch = next(r for r in body["reporters"] if r["reporter"] == "scratch")
        assert scratch["reports"] == 4
        assert scratch["observed_to_stored"]["n"] == 4
        assert scratch["observed_to_stored"]["p50"] is not None
        assert body["slowest"]
        assert body["slowest"][0]["host"].startswith("node")
        assert body["left_out"] == 0


def test_latency_collector_keeps_at_most_its_limit() -> None:
    """Beyond `limit` reports the collector only counts (memory stays bounded)."""
    col = _Collector(limit=2)
    for seq in range(1, 6):
        col.event(StoredMessage(seq, 1000.0 + seq, event_subject("report", "scratch", "n1"),
                                now_report("scratch", "n1", {"scratch_free": 1.0}, seq),
                                {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01"}, 0))
    assert [e.seq for e in col.events] == [1, 2]
    assert col.dropped == 3
    assert col.events[0].trace_id == "a" * 32


async def test_bad_input_is_a_4xx_never_a_500(nc: Client) -> None:
    """Huge and malicious expressions, odd host names, windows beyond retention, bad sorts."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await populate(nc, rig, hosts=2)
        cases: list[tuple[str, dict[str, Any]]] = [
            ("/v1/host-table", {"select": "scratch_free > " * 600 + "1"}),
            ("/v1/host-table", {"select": "(" * 3000 + "scratch_free > 1" + ")" * 3000}),
            ("/v1/host-table", {"select": "!" * 5000 + "blink"}),
            ("/v1/host-table", {"select": "scratch_free >"}),
            ("/v1/host-table", {"select": "select[a] bogus[x]"}),
            ("/v1/select", {"expr": "(" * 3000 + "scratch_free > 1" + ")" * 3000}),
            ("/v1/host-table", {"sort": "nope"}),
            ("/v1/host-table", {"reporter_state": "sleepy"}),
            ("/v1/host-table", {"limit": 0}),
            ("/v1/host-table", {"limit": 10**9}),
            ("/v1/host-table", {"offset": -1}),
            ("/v1/host-table", {"match": "[" * 600}),
            ("/v1/host-table", {"status": "sideways"}),
            ("/v1/hosts/node00/timeline", {"window": "400d"}),
            ("/v1/hosts/node00/timeline", {"window": "0s"}),
            ("/v1/hosts/node00/timeline", {"window": "soon"}),
            ("/v1/latency", {"since": "30d"}),
            ("/v1/latency", {"since": "-5m"}),
            ("/v1/hosts/a.*.%3E%20b/timeline", {}),
            ("/v1/hosts/%00%FF%E2%80%AE/timeline", {}),
            ("/v1/hosts/no%2Fsuch", {}),
        ]
        for path, params in cases:
            r = await http.get(path, params=params)
            assert 400 <= r.status_code < 500, (path, params, r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("application/problem+json"), path
            assert len(r.content) < 20_000, (path, len(r.content))
        caret = (await http.get("/v1/host-table", params={"select": "scratch_free >"})).json()
        assert 0 <= caret["column"] <= len("scratch_free >")
        assert "^" in caret["detail"]
        retained = (await http.get("/v1/hosts/node00/timeline",
                                   params={"window": "400d"})).json()
        assert "keeps" in retained["detail"]


def test_query_pages_concatenate_to_the_whole_sorted_list() -> None:
    """Pages of any size, in order, are the whole sorted, filtered list (pure)."""
    at = format_time(time.time() + 3600)
    table = HostTable(FAST_CATALOG)
    table.load(HostSnapshot(host=f"h{i:03d}", as_of=AsOf(seq=i, time=at), values={
        "scratch_free": ValueEntry(value=float(i % 7), state="fresh", reporter="scratch",
                                   observed_at=at, received_at=at, expires_at=at)}
        if i % 5 else {}) for i in range(60))
    facts = HostFacts()
    now = time.time()
    res = ["scratch_free"]
    for sort in ("-scratch_free", "scratch_free", "host", "-host", "status"):
        total, whole = query(table, facts, now, sort=sort, resources=res, limit=1000)
        assert total == 60
        for size in (1, 7, 13, 60):
            pages = []
            for off in range(0, 60, size):
                _, rows = query(table, facts, now, sort=sort, resources=res, offset=off,
                                limit=size)
                pages += rows
            assert [r.host for r in pages] == [r.host for r in whole]
    _, whole = query(table, facts, now, sort="-scratch_free", resources=res, limit=1000)
    shown = [r.snapshot.values["scratch_free"].value for r in whole if r.snapshot.values]
    assert shown == sorted(shown, reverse=True)
    assert len(shown) == 48
    assert all(not r.snapshot.values for r in whole[len(shown):])
    _, empty_last = query(table, facts, now, sort="status", resources=res, limit=1000)
    assert [r.status for r in empty_last][-12:] == ["empty"] * 12


async def test_odd_host_names_work_end_to_end(nc: Client) -> None:
    """A host whose name needs subject-token encoding (docs/contract.md, "Subjects and streams")
    has its page data: the record, the host table match and the timeline (its subjects, not a
    wildcard's)."""
    odd = "gpu node.1 *>é"
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await publish_catalog(nc)
        await publish_report(nc, "scratch", "gpu node", {"scratch_free": 1.0})
        seq = await publish_report(nc, "scratch", odd, {"scratch_free": 42.0})
        await rig.settle(seq)
        quoted = urllib.parse.quote(odd, safe="")
        assert (await http.get(f"/v1/hosts/{quoted}")).json()["host"] == odd
        table = (await http.get("/v1/host-table", params={"match": "*.1 [*]>*"})).json()
        assert [r["host"] for r in table["rows"]] == [odd]
        body = (await http.get(f"/v1/hosts/{quoted}/timeline", params={"window": "5m"})).json()
        assert body["host"] == odd
        assert body["events"] == 1
        lane = body["values"][0]
        assert lane["resource"] == "scratch_free"
        assert [s["value"] for s in lane["spans"]] == [42.0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["fresh", "stale", "unknown", None]),
                          st.integers(-3, 3)), min_size=1, max_size=30),
       st.sampled_from(["scratch_free", "-scratch_free", "host", "-host", "status"]),
       st.integers(1, 7))
def test_query_order_matches_a_reference_sort(cells: list[tuple[ValueState | None, int]],
                                              sort: str,
                                              size: int) -> None:
    """Any mix of fresh, stale, unknown and absent (None) values: the pages, joined, are the hosts
    sorted by the reference rule (fresh values by value, the rest last by name)."""
    now = time.time()
    later, past = format_time(now + 3600), format_time(now - 5)
    snaps = []
    for i, (state, v) in enumerate(cells):
        values = {} if state is None else {"scratch_free": ValueEntry(
            value=None if state != "fresh" else float(v), state=state, reporter="scratch",
            observed_at=later, received_at=later,
            expires_at=past if state == "stale" else later,
            last_value=float(v) if state == "stale" else None)}
        snaps.append(HostSnapshot(host=f"h{i:02d}", as_of=AsOf(seq=1, time=later),
                                  values=values))
    table = HostTable(FAST_CATALOG)
    table.load(snaps)
    facts = HostFacts()
    got: list[str] = []
    for off in range(0, len(cells), size):
        got += [r.host for r in query(table, facts, now, sort=sort, resources=["scratch_free"],
                                      offset=off, limit=size)[1]]
    names = [s.host for s in snaps]
    if sort.lstrip("-") == "host":
        want = sorted(names, reverse=sort.startswith("-"))
    elif sort == "status":
        rank = {"stale": 1, "unknown": 2, "fresh": 3, None: 4}
        want = sorted(names, key=lambda h: (rank[cells[int(h[1:])][0]], h))
    else:
        desc = sort.startswith("-")
        fresh = [h for h in names if cells[int(h[1:])][0] == "fresh"]
        rest = sorted(h for h in names if h not in fresh)
        value = {h: cells[int(h[1:])][1] for h in fresh}
        want = sorted(fresh, key=lambda h: (-value[h] if desc else value[h], h)) + rest
    assert got == want


async def test_timeline_says_who_released_a_bridge(nc: Client) -> None:
    """`crr bridge release slurm` inside the window is a `released` happening on every
    host's timeline (a release acts on the cluster): who, how, why."""
    async with running_api(nc) as rig, httpx.AsyncClient(base_url=rig.url) as http:
        await publish_catalog(nc)
        await rig.settle(await publish_report(nc, "blinker", "node1", {"blink": 3.0}))
        seq, event = await publish_release(nc, "slurm", for_seconds=600.0,
                                           reason="maintenance")
        await rig.settle(seq)
        body = (await http.get("/v1/hosts/node1/timeline", params={"window": "5m"})).json()
        (h,) = [h for h in body["happenings"] if h["what"] == "released"]
        assert h["reporter"] == "bridge-slurm"
        assert h["seq"] == seq
        assert h["detail"] == f"by {event.by}: for 600s (maintenance)"
