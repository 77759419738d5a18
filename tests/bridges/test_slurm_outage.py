"""crr's own outage never looks like the cluster's, against a real slurmctld (20 nodes):
`crr projector` and `crr bridge slurm` as real processes, reporters that keep reporting.

(a) the projector is SIGKILLed for 3× the longest interval: Slurm is not touched, `crr
select` answers as before (saying it holds), the bridge says it holds; once a new
projector has caught up, no record it wrote shows a value stale then fresh, and Slurm was
never changed.  (b) the same with the NATS server that the bridge and the CLI read
stopped and started again.  (c) the projector stays silent past `outage_hold`: values
turn stale on every surface, and the honest state the bridge then proposes (every
`imagenet_cached` feature gone) goes through the guard like any change: it says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from crr.bus.server import NatsServer
from crr.schemas.catalog_loader import load_catalog_text
from crr.schemas.codec import decode
from crr.schemas.snapshot import HostSnapshot
from tests.support.cli import crr
from tests.support.faults import CrrProcess, eventually
from tests.support.projector import publish_catalog, publish_report
from tests.support.slurm import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

NODES = [f"node{i:03d}" for i in range(1, 21)]
CACHED = NODES[:10]
INTERVAL = 2.0
"""The longest interval of the catalog (seconds): an outage of 3× it outlasts every
value's `interval + grace` (3 s) twice."""


def catalog(outage_hold: str) -> str:
    return f"""
version: 1
outage_hold: {outage_hold}
resources:
  datasets:   {{kind: string_set, scope: host, reporter: site, interval: 2s}}
  fs_healthy: {{kind: boolean, scope: host, reporter: site, interval: 2s}}
reporters:
  site: {{type: external, interval: 2s}}
exports:
  features:
    imagenet_cached: 'datasets has "imagenet"'
  drain:
    - {{when: '!fs_healthy', reason: 'scratch file system unhealthy', resume_after: 0s}}
"""


def shown(slurm: SlurmCluster) -> dict[str, tuple[frozenset[str], str]]:
    """Per node: crr's features Slurm shows, and its state (the static admin tag left out)."""
    return {n: (frozenset(f - {"admin_static"}), state)
            for n, (f, state, _reason) in slurm.features().items()}


def steady(slurm: SlurmCluster) -> bool:
    now = shown(slurm)
    return all(now[n] == (frozenset({"imagenet_cached"} if n in CACHED else ()), "idle")
               for n in NODES)


@dataclass
class Rig:
    """The running parts of one scenario."""

    nc: Client
    url: str
    slurm: SlurmCluster
    tmp: Path
    projector: CrrProcess
    bridge: CrrProcess
    seen: list[dict[str, tuple[frozenset[str], str]]] = field(default_factory=list)
    """Every distinct Slurm state the watcher saw after the baseline (none: untouched)."""
    written: list[HostSnapshot] = field(default_factory=list)
    """Host records written while `recording`."""
    recording: bool = False
    reports: int = 0

    def new_projector(self) -> CrrProcess:
        self.projector = CrrProcess(["projector", "--server", self.url],
                                    self.tmp / "projector.log").start()
        return self.projector


async def select_cached(url: str) -> tuple[list[str], str]:
    ran = await crr("select", 'datasets has "imagenet"', "--json", "--server", url)
    assert ran.code == 0, ran.err
    return json.loads(ran.out), ran.err


async def _selects(url: str, hosts: list[str]) -> bool:
    return (await select_cached(url))[0] == hosts


@contextlib.asynccontextmanager
async def rig(nc: Client, url: str, slurm: SlurmCluster, tmp: Path,
              outage_hold: str) -> AsyncIterator[Rig]:
    """Catalog, reporters (every node, every second), `crr projector`, `crr bridge slurm
    --interval 1s`; yields once Slurm shows the steady state, with a watcher of Slurm."""
    await publish_catalog(nc, load_catalog_text(catalog(outage_hold)))
    r = Rig(nc, url, slurm, tmp,
            CrrProcess(["projector", "--server", url], tmp / "projector.log"),
            CrrProcess(["bridge", "slurm", "--server", url, "--interval", "1s"],
                       tmp / "bridge.log"))
    stop = asyncio.Event()

    async def report_forever() -> None:  # the cluster: healthy, half of it caching imagenet
        while not stop.is_set():
            r.reports += 1
            for node in NODES:
                values = {"datasets": ["imagenet"] if node in CACHED else [],
                          "fs_healthy": True}
                with contextlib.suppress(Exception):  # the server may be down: (b)
                    await asyncio.wait_for(
                        publish_report(nc, "site", node, values, seq=r.reports), 0.5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)  # the reporters' own period

    async def on_record(msg: Msg) -> None:
        if r.recording and msg.data:
            r.written.append(decode(msg.data, HostSnapshot))

    reporters = asyncio.create_task(report_forever())
    watcher: asyncio.Task[None] | None = None
    sub = None
    try:
        r.projector.start()
        sub = await nc.subscribe("crr.v1.snapshot.host.>", cb=on_record)
        # The bridge starts on a snapshot that has every node (its first cycle takes the
        # wanted state as it is: no mass change to guard), then Slurm shows it.
        await eventually(lambda: _selects(url, CACHED), 60, "every node's first report")
        r.bridge.start()
        await eventually(lambda: steady(slurm), 60, "the steady state in Slurm")
        baseline = shown(slurm)

        async def watch() -> None:
            while not stop.is_set():
                now = await asyncio.to_thread(shown, slurm)
                if now != baseline and (not r.seen or r.seen[-1] != now):
                    r.seen.append(now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)

        watcher = asyncio.create_task(watch())
        yield r
    finally:
        stop.set()
        await reporters
        if watcher is not None:
            await watcher
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        r.bridge.stop()
        r.projector.stop()


async def caught_up(url: str, within: float = 60.0) -> None:
    """Until `crr select` no longer says it holds (the projector's watermark is recent)."""
    async def check() -> bool:
        _, err = await select_cached(url)
        return "holding" not in err and "outage_hold" not in err
    await eventually(check, within, "the projector to catch up")


def flaps(written: list[HostSnapshot]) -> list[str]:
    """`host value: states` of every value written stale and then fresh."""
    out = []
    for host in NODES:
        for name in ("datasets", "fs_healthy"):
            states = [w.values[name].state for w in written
                      if w.host == host and name in w.values]
            if any(a == "stale" and b == "fresh" for a, b in itertools.pairwise(states)):
                out.append(f"{host} {name}: {states}")
    return out


async def outage(seconds: float, during: Callable[[], object] | None = None) -> None:
    """Let `seconds` of an outage pass (the outage's length is what is tested), checking
    `during` about once a second meanwhile."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if during is not None:
            result = during()
            if asyncio.iscoroutine(result):
                await result
        await asyncio.sleep(min(1.0, max(0.0, left)))


async def test_a_projector_outage_changes_nothing(nc: Client, nats_url: str,
                                                  slurm: SlurmCluster, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) SIGKILL the projector for 3× the longest interval while every node keeps
    reporting: 0 Slurm changes, `crr select` unchanged (with a holding warning), the bridge
    holding; after a restart, no stale → fresh in what the new projector writes."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    async with rig(nc, nats_url, slurm, tmp_path, "10m") as r:
        before, _ = await select_cached(nats_url)
        assert before == CACHED
        r.projector.kill()

        async def still_selected() -> None:
            hosts, _err = await select_cached(nats_url)
            assert hosts == CACHED

        await outage(3 * INTERVAL, still_selected)
        hosts, err = await select_cached(nats_url)
        assert hosts == CACHED
        assert "holding" in err, err
        await eventually(lambda: "bridge slurm: holding" in r.bridge.output(), 10,
                         f"the bridge to say it holds: {r.bridge.output()}")
        r.recording = True
        r.new_projector()
        await caught_up(nats_url)
        seq = r.reports
        await eventually(lambda: r.reports >= seq + 3, 20, "3 s of reports after")
        assert r.written, "the new projector wrote no host record"
        assert flaps(r.written) == []
        assert r.seen == [], f"Slurm changed: {r.seen}"
        assert (await select_cached(nats_url))[0] == CACHED


async def test_a_server_outage_changes_nothing(nc: Client, nats_server: NatsServer,
                                               slurm: SlurmCluster, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """(b) Stop the NATS server that the bridge, the CLI and the projector use for 3× the
    longest interval, then start it again (same port, same store): 0 Slurm changes, the
    bridge holding meanwhile, and no stale → fresh written once every part is back."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    url = nats_server.url
    async with rig(nc, url, slurm, tmp_path, "10m") as r:
        r.recording = True
        await asyncio.to_thread(nats_server.stop)
        await outage(3 * INTERVAL)
        await eventually(lambda: "bridge slurm: holding" in r.bridge.output(), 10,
                         f"the bridge to say it holds: {r.bridge.output()}")
        await asyncio.to_thread(nats_server.start)
        await caught_up(url)
        seq = r.reports
        await eventually(lambda: r.reports >= seq + 3, 20, "3 s of reports after")
        assert flaps(r.written) == []
        assert r.seen == [], f"Slurm changed: {r.seen}"
        assert (await select_cached(url))[0] == CACHED


async def test_past_outage_hold_the_honest_state_goes_through_the_guard(
        nc: Client, nats_url: str, slurm: SlurmCluster, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(c) The projector stays silent past `outage_hold` (4 s): values turn stale on every
    surface; the bridge says the hold ran out, and the honest state — 10 nodes losing
    `imagenet_cached` — goes through the guard (max_changed 20% of 20 = 4): 4 change, 6
    are held, and the bridge says so."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    async with rig(nc, nats_url, slurm, tmp_path, "4s") as r:
        r.projector.kill()

        async def past_the_hold() -> bool:
            hosts, err = await select_cached(nats_url)
            return hosts == [] and "outage_hold" in err

        await eventually(past_the_hold, 30, "select to judge past outage_hold")
        ran = await crr("hosts", NODES[0], "--json", "--server", nats_url)
        assert ran.code == 0, ran.err
        (record,) = json.loads(ran.out)
        assert record["values"]["datasets"]["state"] == "stale"
        await eventually(lambda: "past outage_hold" in r.bridge.output(), 20,
                         f"the bridge to say the hold ran out: {r.bridge.output()}")
        await eventually(lambda: "held:" in r.bridge.output(), 20,
                         f"the guard to hold the mass change: {r.bridge.output()}")
        await eventually(lambda: bool(r.seen), 20, "the changes that fit to be applied")
        lost = {n for n, (features, _s) in r.seen[-1].items()
                if n in CACHED and "imagenet_cached" not in features}
        assert 0 < len(lost) <= 4, r.seen[-1]
