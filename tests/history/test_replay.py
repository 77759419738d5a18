"""Replay and history tools against a real server and a real Projector task (issue 7)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import tenacity
from nats.aio.client import Client

from crr.cli import build_parser
from crr.projections.host_table import HostTable
from crr.projections.select import compile_select
from crr.projector.service import Projector
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode, encode
from crr.schemas.errors import CrrError
from crr.schemas.snapshot import ClusterSnapshot, HostSnapshot, ProjectorStatus
from crr.schemas.subjects import CATALOG, event_subject, host_snapshot_subject
from crr.schemas.wire_time import format_time, parse_time
from tests.support.projector import read_consistent_snapshot

CATALOG_YAML = """
version: 1
resources:
  scratch_free:  {kind: numeric, scope: host, reporter: scratch, interval: 200ms, min: 0}
  scratch_total: {kind: numeric, scope: host, reporter: scratch, interval: 200ms}
  datasets:      {kind: string_set, scope: host, reporter: datasets, interval: 1h}
  matlab_free:   {kind: numeric, scope: cluster, reporter: flexlm, interval: 1h}
reporters:
  scratch:  {type: external, interval: 200ms}
  datasets: {type: external, interval: 1h}
  flexlm:   {type: external, interval: 1h}
"""
"""scratch values live 0.3 s (interval + grace): they turn stale within the test."""

CAT: Catalog = load_catalog_text(CATALOG_YAML)
EXPR = 'scratch_free > 60 || datasets has "c4"'


async def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run a `crr` sub-command's coroutine in this loop; (exit code, stdout, stderr)."""
    ns: argparse.Namespace = build_parser().parse_args(args)
    try:
        code: int = await ns.func(ns)
    except CrrError as exc:
        out = capsys.readouterr()
        return 1, out.out, out.err + str(exc)
    out = capsys.readouterr()
    return code, out.out, out.err


class _NotYet(Exception):
    """The awaited condition does not hold yet."""


async def until(cond: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Bounded wait for a condition checked against the server (no fixed sleeps)."""
    async def check() -> None:
        if not await cond():
            raise _NotYet

    async for attempt in tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(timeout), wait=tenacity.wait_fixed(0.02),
            retry=tenacity.retry_if_exception_type(_NotYet), reraise=True):
        with attempt:
            await check()


@asynccontextmanager
async def projector(nc: Client) -> AsyncIterator[Projector]:
    """A real Projector task, stopped on exit."""
    p = Projector(nc, status_interval=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    await asyncio.wait_for(p.ready.wait(), 10)
    try:
        yield p
    finally:
        stop.set()
        await task


async def report(nc: Client, reporter: str, host: str | None, values: dict[str, Any],
                 seq: int) -> int:
    """Publish a Report; its CRR_EVENTS sequence."""
    body = {"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
            "observed_at": "2027-01-15T08:00:00.000Z", "values": values}
    ack = await nc.jetstream().publish(event_subject("report", reporter, host),
                                       json.dumps(body).encode())
    return ack.seq


async def health(nc: Client, reporter: str, host: str, state: str, seq: int) -> int:
    """Publish a Health event; its sequence."""
    body = {"reporter": reporter, "host": host, "boot": "b1", "seq": seq,
            "at": "2027-01-15T08:00:00.000Z", "state": state, "detail": "exit 3"}
    ack = await nc.jetstream().publish(event_subject("health", reporter, host),
                                       json.dumps(body).encode())
    return ack.seq


async def event_time(nc: Client, seq: int) -> float:
    """Server time of a stored event."""
    msg = await nc.jetstream().get_msg("CRR_EVENTS", seq=seq)
    assert msg.time is not None
    return msg.time.timestamp()


@dataclass
class Live:
    """What CRR_SNAPSHOT held at one settled moment."""

    status: ProjectorStatus
    records: dict[str, bytes]

    @property
    def tick(self) -> str:
        return self.status.last_tick


async def settled(nc: Client, p: Projector, seq: int) -> Live:
    """CRR_SNAPSHOT once the projector wrote everything up to `seq`, ticked past its time."""
    await p.wait_until(seq)
    t = await event_time(nc, seq)
    found: list[Live] = []

    async def ok() -> bool:
        status, records = await read_consistent_snapshot(nc)
        if status.last_seq >= seq and parse_time(status.last_tick) >= t:
            found.append(Live(status, records))
            return True
        return False

    await until(ok)
    return found[0]


async def stale_in_snapshot(nc: Client, host: str, name: str) -> bool:
    """Whether CRR_SNAPSHOT shows `name` stale on `host`."""
    _, records = await read_consistent_snapshot(nc)
    raw = records.get(host_snapshot_subject(host))
    if raw is None:
        return False
    entry = decode(raw, HostSnapshot).values.get(name)
    return entry is not None and entry.state == "stale"


@dataclass
class Run:
    """Captures from the scenario."""

    first: Live
    """After the first reports (values fresh, a rejection, a failure)."""
    second: Live
    """After the scratch values went stale and node1 re-reported only scratch_free."""
    last_seq: int


async def scenario(nc: Client) -> Run:
    """Reports, a rejection, a failure, stale transitions, a dead letter, a projector restart."""
    js = nc.jetstream()
    async with projector(nc) as p:
        await js.publish(CATALOG, encode(CAT))
        await report(nc, "scratch", "node1", {"scratch_free": 100, "scratch_total": 500}, 1)
        await report(nc, "scratch", "node2", {"scratch_free": -5, "scratch_total": 400}, 1)
        await report(nc, "datasets", "node1", {"datasets": ["c4", "imagenet"]}, 1)
        await report(nc, "flexlm", None, {"matlab_free": 3}, 1)
        seq = await health(nc, "datasets", "node2", "failed", 1)
        first = await settled(nc, p, seq)
        await until(lambda: stale_in_snapshot(nc, "node1", "scratch_total"))
        await until(lambda: stale_in_snapshot(nc, "node2", "scratch_total"))
        # A later report that omits scratch_total (it stays stale under full history).
        seq = await report(nc, "scratch", "node1", {"scratch_free": 120}, 2)
        second = await settled(nc, p, seq)
    # Restart: the new projector restores from CRR_SNAPSHOT (the snapshot is the checkpoint).
    async with projector(nc) as p2:
        await js.publish(event_subject("report", "scratch", "node2"), b"{not json")
        await report(nc, "scratch", "node2", {"scratch_free": 70, "scratch_total": 400}, 2)
        seq = await health(nc, "datasets", "node2", "ok", 2)
        await settled(nc, p2, seq)
        await until(lambda: stale_in_snapshot(nc, "node2", "scratch_free"))
        last = await settled(nc, p2, seq)
    return Run(first=first, second=second, last_seq=last.status.last_seq)


def hosts_of(out: str) -> dict[str, bytes]:
    """Host records (canonical bytes) from `crr replay --json` output."""
    doc = msgspec.json.decode(out.encode())
    return {host_snapshot_subject(h["host"]): encode(msgspec.convert(h, HostSnapshot))
            for h in doc["hosts"]}


async def test_verify_passes_after_live_run_with_restart(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--verify is byte-exact after reports, rejections, stale transitions and a restart."""
    run = await scenario(nc)
    code, out, err = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 0, out + err
    assert "byte-identical" in out
    # And the restart lost nothing: full history keeps node1's stale scratch_total, which
    # the last report omitted, and so does the restarted projector (restored from its records).
    code, out, _ = await cli(["replay", "--server", nats_url, "--at", str(run.last_seq),
                              "--json"], capsys)
    full = msgspec.convert(msgspec.json.decode(out.encode())["hosts"][0], HostSnapshot)
    assert full.host == "node1"
    assert full.values["scratch_total"].state == "stale"
    _, live = await read_consistent_snapshot(nc)
    kept = decode(live[host_snapshot_subject("node1")], HostSnapshot).values["scratch_total"]
    assert kept == full.values["scratch_total"]


async def test_replay_at_time_equals_live_snapshot_then(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Replay --at T (between two reports) gives the live records of T, byte for byte."""
    run = await scenario(nc)
    for live in (run.first, run.second):
        code, out, err = await cli(["replay", "--server", nats_url, "--at", live.tick,
                                    "--json"], capsys)
        assert code == 0, err
        mine = hosts_of(out)
        theirs = {s: b for s, b in live.records.items() if s.startswith("crr.v1.snapshot.host.")}
        assert mine == theirs
        cluster = msgspec.json.decode(out.encode())["cluster"]
        assert encode(msgspec.convert(cluster, ClusterSnapshot)) == \
            live.records["crr.v1.snapshot.cluster"]


async def test_explain_at_time_agrees_with_select_then(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Explain at T (replayed) agrees with select[] over the live snapshot captured at T."""
    run = await scenario(nc)
    for live in (run.first, run.second):
        table = HostTable(CAT)
        for subject, raw in live.records.items():
            if subject.startswith("crr.v1.snapshot.host."):
                table.upsert(decode(raw, HostSnapshot))
        table.set_cluster(decode(live.records["crr.v1.snapshot.cluster"], ClusterSnapshot))
        selected = compile_select(EXPR, CAT).select(table, parse_time(live.tick))
        for host in ("node1", "node2"):
            code, out, err = await cli(["replay", "--server", nats_url, "--explain", EXPR,
                                        "--host", host, "--at", live.tick, "--json"], capsys)
            assert code == 0, err
            assert msgspec.json.decode(out.encode())["selected"] == (host in selected)
        code, out, _ = await cli(["replay", "--server", nats_url, "--select", EXPR, "--at",
                                  live.tick, "--json"], capsys)
        assert msgspec.json.decode(out.encode()) == selected
    assert selected == ["node1"]  # at the second capture: node1 by scratch_free and datasets


async def test_diff_shows_stale_rejected_and_failed(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--diff T1 T2 lists values that changed or turned stale, rejections and failures."""
    run = await scenario(nc)
    code, out, err = await cli(["replay", "--server", nats_url, "--diff", run.first.tick,
                                run.second.tick, "--json"], capsys)
    assert code == 0, err
    d = msgspec.json.decode(out.encode())
    changes = {(v["host"], v["resource"], v["change"]) for v in d["values"]}
    assert ("node1", "scratch_total", "turned_stale") in changes
    assert ("node1", "scratch_free", "changed") in changes
    assert ("node2", "scratch_total", "turned_stale") in changes
    code, out, err = await cli(["replay", "--server", nats_url, "--diff", "1",
                                run.second.tick, "--json"], capsys)
    d = msgspec.json.decode(out.encode())
    assert ("node1", "scratch_free", "appeared") in {
        (v["host"], v["resource"], v["change"]) for v in d["values"]}
    what = {(h["host"], h["reporter"], h["what"]) for h in d["happenings"]}
    assert ("node2", "scratch", "rejected") in what
    assert ("node2", "datasets", "failed") in what
    code, out, _ = await cli(["replay", "--server", nats_url, "--diff", run.second.tick,
                              "now"], capsys)
    assert code == 0
    assert "deadletter" in out
    assert "turned stale" in out


async def test_export_file_replays_identically(
        nc: Client, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An exported file replays to the stream's result, twice identically; --verify --file too."""
    run = await scenario(nc)
    path = tmp_path / "events.jsonl"
    code, _, err = await cli(["events", "export", "--server", nats_url, "-o", str(path)],
                             capsys)
    assert code == 0, err
    lines = path.read_bytes().splitlines()
    assert len(lines) >= run.last_seq
    assert any(b'"payload_encoding":"base64"' in ln for ln in lines)  # the {not json event
    outs = []
    for source in (["--file", str(path)], ["--file", str(path)], []):
        code, out, err = await cli(["replay", "--server", nats_url, *source, "--at",
                                    run.second.tick, "--json"], capsys)
        assert code == 0, err
        outs.append(out)
    assert outs[0] == outs[1] == outs[2]
    code, out, err = await cli(["replay", "--server", nats_url, "--verify", "--file",
                                str(path)], capsys)
    assert code == 0, out + err
    # Filters: one host (plus the catalog), and a time range.
    code, out, _ = await cli(["events", "export", "--server", nats_url, "--host", "node2",
                              "--since", "2", "--until", run.first.tick], capsys)
    subjects = [json.loads(ln)["subject"] for ln in out.splitlines()]
    assert subjects
    assert all(".host.node2." in s or s == CATALOG for s in subjects)


async def test_malformed_line_reported_and_rest_replayed(
        nc: Client, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed line is reported with its number; every other line is still replayed."""
    run = await scenario(nc)
    good = tmp_path / "good.jsonl"
    await cli(["events", "export", "--server", nats_url, "-o", str(good)], capsys)
    lines = good.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join([*lines[:3], b'{"seq": oops\n', *lines[3:]]))
    args = ["replay", "--file", "", "--at", run.second.tick, "--json"]
    args[2] = str(good)
    _, clean, _ = await cli(args, capsys)
    args[2] = str(bad)
    code, out, err = await cli(args, capsys)
    assert code == 0
    assert "1 malformed line(s)" in err
    assert "line 4:" in err
    assert out == clean


async def test_verify_reports_a_difference(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--verify exits 1 and prints the differing field when a live record was tampered with."""
    await scenario(nc)
    status, records = await read_consistent_snapshot(nc)
    subject = host_snapshot_subject("node1")
    doc = msgspec.json.decode(records[subject])
    doc["values"]["scratch_free"]["last_value"] = 999
    js = nc.jetstream()
    await js.publish(subject, msgspec.json.encode(doc, order="sorted"))
    await js.publish("crr.v1.snapshot.projector", encode(status))  # keep the cut consistent
    code, out, _ = await cli(["replay", "--server", nats_url, "--verify"], capsys)
    assert code == 1
    assert "values.scratch_free.last_value: replay 120 != live 999" in out


async def test_range_outside_retention_is_a_clear_error(
        nc: Client, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for history that aged out names the first sequence still available."""
    for i in range(5):
        await report(nc, "flexlm", None, {"matlab_free": i}, i + 1)
    await nc.jetstream().purge_stream("CRR_EVENTS", seq=4)  # keeps seq 4 and 5
    code, _, err = await cli(["replay", "--server", nats_url, "--at", "2"], capsys)
    assert code == 1
    assert "outside retention" in err
    assert "seq 4" in err
    code, _, err = await cli(["events", "export", "--server", nats_url, "--since", "1"],
                             capsys)
    assert code == 1
    assert "starts at seq 4" in err
    when = format_time(await event_time(nc, 4) - 60)
    code, _, err = await cli(["replay", "--server", nats_url, "--at", when], capsys)
    assert code == 1
    assert "outside retention" in err
