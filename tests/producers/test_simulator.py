"""Simulated reporters: deterministic values, published as claimed, faults as designed."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from collections.abc import Callable

import msgspec
import pytest
from nats.aio.client import Client

from crr.bus.pipeline_publish import PipelinePublisher
from crr.bus.server import NatsServer
from crr.producers.simulator import FAILING, NORMAL, SILENT, Faults, Fleet, run_fleet, sim_catalog
from crr.schemas.codec import encode
from crr.schemas.errors import CrrError
from crr.schemas.events import Report
from crr.schemas.snapshot import HostSnapshot
from crr.schemas.subjects import CATALOG, event_subject
from crr.view.scheduler_view import SchedulerView
from tests.support.projector import running_projector

INTERVAL = 0.5


def _values(fleet: Fleet, rounds: int) -> list[list[dict[str, object]]]:
    out = []
    for _ in range(rounds):
        row = []
        for i in range(len(fleet)):
            for _subject, payload, _h in fleet.events(i, "2026-12-02T14:00:00.000Z"):
                row.append(msgspec.json.decode(payload, type=Report).values)
        out.append(row)
    return out


def test_same_seed_gives_same_values() -> None:
    """Two fleets with one seed send identical values (boots differ); another seed differs."""
    catalog = sim_catalog(20, 10.0)
    faults = Faults(invalid=0.2)
    a, b = Fleet(catalog, 30, seed=7, faults=faults), Fleet(catalog, 30, seed=7, faults=faults)
    c = Fleet(catalog, 30, seed=8, faults=faults)
    va, vb, vc = _values(a, 5), _values(b, 5), _values(c, 5)
    assert va == vb
    assert va != vc
    assert a.boots != b.boots  # a re-run must not be de-duplicated by Nats-Msg-Id
    assert a.expected == b.expected


def test_values_are_realistic() -> None:
    """Numerics walk within bounds, booleans rarely flap, sets keep most members."""
    catalog = sim_catalog(20, 10.0)
    fleet = Fleet(catalog, 20, seed=1)
    rounds = _values(fleet, 40)
    nums = [[r[h]["num000"] for r in rounds] for h in range(20)]
    assert all(0 <= v <= 1000 for series in nums for v in series)  # type: ignore[operator]
    steps = [abs(s[k + 1] - s[k]) for s in nums for k in range(39)]  # type: ignore[operator]
    assert max(steps) <= 20.1
    assert sum(steps) > 0
    flips = sum(r1[h]["flag016"] != r2[h]["flag016"]
                for r1, r2 in itertools.pairwise(rounds) for h in range(20))
    assert flips <= 10


def test_faults_parse_and_reject_bad_specs() -> None:
    """--faults parses every documented item and refuses unknown or out-of-range ones."""
    f = Faults.parse("silent=0.1, invalid=0.01,failing=0.05,burst=30")
    assert f == Faults(silent=0.1, invalid=0.01, failing=0.05, burst=30)
    assert Faults.parse("") == Faults()
    for bad in ("slow=1", "silent", "silent=x", "invalid=2", "silent=0.6,failing=0.6"):
        with pytest.raises(CrrError):
            Faults.parse(bad)


async def _wait_for(view: SchedulerView, cond: Callable[[], bool], timeout: float) -> None:
    """Wait until `cond()` holds, re-checked after every record the view applies."""
    changed = asyncio.Event()
    unsubscribe = view.subscribe(lambda _s: changed.set())
    try:
        async with asyncio.timeout(timeout):
            while not cond():
                changed.clear()
                await changed.wait()
    finally:
        unsubscribe()


async def test_sim_publishes_what_it_claims_and_faults_show(nc: Client) -> None:
    """Real server + projector: every host's snapshot is its last valid report; faults show."""
    catalog = sim_catalog(20, INTERVAL)
    await nc.jetstream().publish(CATALOG, encode(catalog))
    fleet = Fleet(catalog, 40, seed=3, faults=Faults(silent=0.1, failing=0.1, invalid=0.3))
    async with running_projector(nc) as projector, PipelinePublisher(nc) as pipe:
        view = SchedulerView(nc)
        await view.start()
        await view.wait_ready(10)
        stats = await run_fleet(fleet, pipe.publish, interval=INTERVAL, rounds=3)
        await pipe.flush(10)
        assert pipe.stats.acked == stats.events
        assert pipe.stats.rejected == 0
        await projector.wait_until(pipe.stats.last_seq, 15)
        await view.wait_until(pipe.stats.last_seq, 15)

        def snap(i: int) -> HostSnapshot:
            s = view.table.get(fleet.names[i])
            assert s is not None, fleet.names[i]
            return s

        for i in range(len(fleet)):  # zero loss: the last valid value of every resource
            got = {n: e.value if e.state == "fresh" else e.last_value
                   for n, e in snap(i).values.items()}
            assert got == fleet.expected[i], fleet.names[i]
        failing = [i for i in range(len(fleet)) if fleet.role[i] == FAILING]
        silent = [i for i in range(len(fleet)) if fleet.role[i] == SILENT]
        spoiled = [i for i in range(len(fleet))
                   if fleet.role[i] == NORMAL and fleet.last_invalid[i]]
        assert failing
        assert silent
        assert spoiled
        assert fleet.invalid_sent >= len(spoiled)
        for i in failing:
            assert snap(i).reporters["sim0"].state == "failed"
        for i in spoiled:
            rs = snap(i).reporters["sim0"]
            assert rs.state == "rejecting"
            assert rs.rejected == 1
        # Silent hosts: values turn stale (interval + grace after their only report).
        await _wait_for(view, lambda: all(
            all(e.state == "stale" for e in snap(i).values.values())
            and snap(i).reporters["sim0"].state == "silent" for i in silent), 10)
        await view.stop()


async def test_pipeline_counts_refusals_instead_of_hanging(nc: Client) -> None:
    """A publish the server refuses is counted as rejected; flush returns (nats-py #985)."""
    subject = event_subject("report", "sim0", "h1")
    refused: list[str] = []
    async with PipelinePublisher(nc, on_error=lambda s, why: refused.append(why)) as pipe:
        await pipe.publish(subject, b"{}", {"Nats-Expected-Last-Sequence": "999"})
        await pipe.publish(subject, b"{}", None)
        await pipe.flush(5)
    assert pipe.stats.rejected == 1
    assert pipe.stats.acked == 1
    assert len(refused) == 1


def test_cli_sim_reporters_publishes_and_summarises(nats_server: NatsServer) -> None:
    """`crr sim reporters --apply-catalog --rounds 2 --json` publishes every event, all acked."""
    out = subprocess.run(
        [sys.executable, "-m", "crr.cli", "sim", "reporters", "--server", nats_server.url,
         "--hosts", "50", "--resources", "8", "--interval", "0.2", "--rounds", "2",
         "--apply-catalog", "--seed", "1", "--json", "--faults", "invalid=0.1"],
        capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["events"] == 100
    assert summary["acked"] == 100
    assert summary["rejected"] == 0
    assert summary["invalid_values"] > 0
