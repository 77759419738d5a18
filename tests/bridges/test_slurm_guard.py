"""The Slurm bridge's brakes against a real slurmctld (20 nodes): the guard holds a bad
rollout and `crr bridge release` lets it through (d), an oscillating value does not flap
(e), a real failure is drained after `for:` and no later than `for:` + `--interval` (f);
`--dry-run` shows what is held and pending."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.admin.forget import wait_for_position
from crr.bridges.slurm import SlurmCommands, SlurmDoor
from crr.bridges.slurm_bridge import SlurmBridge
from crr.schemas.catalog_loader import load_catalog_text
from crr.view.scheduler_view import loaded_view
from tests.support.cli import crr
from tests.support.faults import CrrProcess, eventually
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.slurm import SlurmCluster

NODES = [f"node{i:03d}" for i in range(1, 21)]
REASON = "crr: scratch file system unhealthy"


def catalog(drain: str, guard: str = "") -> str:
    """A catalog whose drain rule is `{when: '!fs_healthy', reason: …, <drain>}`."""
    return f"""
version: 1
resources:
  fs_healthy: {{kind: boolean, scope: host, reporter: scratch, interval: 60s}}
reporters:
  scratch: {{type: external, interval: 60s}}
exports:
  drain:
    - {{when: '!fs_healthy', reason: 'scratch file system unhealthy', {drain}}}
{guard}
"""


def drained(slurm: SlurmCluster) -> set[str]:
    """The nodes Slurm shows drained by crr."""
    return {n for n, (_f, state, reason) in slurm.features().items()
            if state == "drained" and reason == REASON}


async def report_all(nc: Client, healthy: bool, seq: int, nodes: list[str] = NODES) -> int:
    last = 0
    for node in nodes:
        last = await publish_report(nc, "scratch", node, {"fs_healthy": healthy}, seq=seq)
    return last


async def test_bad_rollout_is_held_and_released(nc: Client, nats_url: str,
                                                slurm: SlurmCluster, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """(d) Every node reports fs_healthy=false at once: `crr bridge slurm` drains
    max_drained (10% of 20 = 2, the default) and holds 18; `crr health` shows it `held`
    with the numbers and exits 1; `crr bridge release slurm` applies the 18, and the
    release is in `crr events export` and `crr replay --diff`."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    await publish_catalog(nc, load_catalog_text(catalog("for: 0s, resume_after: 0s")))
    async with running_projector(nc):
        await wait_for_position(nc, await report_all(nc, True, 1), 20)
        proc = CrrProcess(["bridge", "slurm", "--server", nats_url, "--interval", "1s"],
                          tmp_path / "bridge.log").start()
        try:
            await eventually(lambda: "following the snapshot" in proc.output(), 30,
                             "the bridge to start")
            await report_all(nc, False, 2)
            await eventually(lambda: "held: 20 of 20 nodes would drain; limit 2"
                             in proc.output(), 30, f"the bridge to trip: {proc.output()}")

            async def health_says_held() -> bool:
                ran = await crr("health", "--server", nats_url)
                return ran.code == 1 and "held" in ran.out and "limit 2" in ran.out

            await eventually(health_says_held, 30, "crr health to show the bridge held")
            ran = await crr("health", "--json", "--server", nats_url)
            row = next(r for r in json.loads(ran.out) if r["reporter"] == "bridge-slurm")
            assert row["state"] == "held"
            assert row["failing"] is True
            assert "20 of 20 nodes would drain; limit 2 (18 held)" in row["detail"]
            assert "crr bridge release slurm" in row["detail"]
            assert drained(slurm) == {"node001", "node002"}  # the oldest conditions first
            ran = await crr("bridge", "release", "slurm", "--reason", "rollout checked",
                            "--server", nats_url)
            assert ran.code == 0, ran.err
            assert "released bridge slurm: the held changes, once" in ran.out
            await eventually(lambda: drained(slurm) == set(NODES), 30, "all 20 drained")
            assert "released by" in proc.output()
        finally:
            assert proc.stop() == 0, proc.output()
        exported = await crr("events", "export", "--subject", "crr.v1.admin.>",
                             "--server", nats_url)
        assert exported.code == 0, exported.err
        (line,) = exported.out.splitlines()
        assert '"crr.v1.admin.bridge.slurm.release"' in line
        assert "rollout checked" in line
        replay = await crr("replay", "--diff", "-10m", "now", "--server", nats_url)
        assert replay.code == 0, replay.err
        assert "bridge-slurm released: by " in replay.out
        assert "the held changes, once (rollout checked)" in replay.out


@contextlib.asynccontextmanager
async def bridge(nc: Client, slurm: SlurmCluster, yaml: str,
                 ) -> AsyncIterator[SlurmBridge]:
    """Projector, view and bridge (1 s interval) running until the block ends."""
    await publish_catalog(nc, load_catalog_text(yaml))
    async with running_projector(nc), loaded_view(nc, 20) as view:
        door = SlurmDoor(SlurmCommands(env=slurm.env, timeout=20))
        b = SlurmBridge(view, door, interval=1.0, min_gap=0.05)
        stop = asyncio.Event()
        task = asyncio.create_task(b.run(stop))
        try:
            yield b
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def test_an_oscillating_value_does_not_flap(nc: Client, slurm: SlurmCluster) -> None:
    """(e) fs_healthy flips every 0.4 s for 6 s (resume_after 3s): one drain, no resume
    while it flips, then one resume 3 s after it settles healthy."""
    async with bridge(nc, slurm, catalog("for: 0s, resume_after: 3s")) as b:
        await report_all(nc, True, 1, ["node005"])
        await eventually(lambda: b.gated is not None, 20, "a first cycle")
        start = time.monotonic()
        seq = 2
        while time.monotonic() - start < 6.0:  # the input's own rhythm, not a wait
            await publish_report(nc, "scratch", "node005", {"fs_healthy": seq % 2 == 1},
                                 seq=seq)
            seq += 1
            await asyncio.sleep(0.4)
        await publish_report(nc, "scratch", "node005", {"fs_healthy": True}, seq=seq)
        flipped_at = time.time()
        await eventually(lambda: any(c.kind == "resume" for _, c in b.history), 20,
                         "the resume after 3 s healthy")
    changes = [(t, c.kind) for t, c in b.history if c.node == "node005"]
    kinds = [k for _, k in changes]
    assert kinds == ["drain", "resume"], changes
    assert changes[1][0] - flipped_at >= 3.0 - 0.05  # resume_after, from the last flip


async def test_a_real_failure_drains_after_for(nc: Client, slurm: SlurmCluster) -> None:
    """(f) `for: 2s`, `--interval 1s`: node007's failure (it stays) is drained between 2 s
    and 3 s after its report; node008's 0.5 s glitch is never drained."""
    async with bridge(nc, slurm, catalog("for: 2s, resume_after: 0s")) as b:
        await report_all(nc, True, 1, ["node007", "node008"])
        await eventually(lambda: b.gated is not None, 20, "a first cycle")
        await publish_report(nc, "scratch", "node008", {"fs_healthy": False}, seq=2)
        glitch = time.monotonic()
        await publish_report(nc, "scratch", "node007", {"fs_healthy": False}, seq=2)
        failed = time.monotonic()
        await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - glitch)))  # the glitch's length
        await publish_report(nc, "scratch", "node008", {"fs_healthy": True}, seq=3)
        await eventually(lambda: "node007" in drained(slurm), 10, "node007 drained",
                         every=0.02)
        took = time.monotonic() - failed
        assert drained(slurm) == {"node007"}
        assert not [c for _, c in b.history if c.node == "node008"]
    assert 2.0 <= took <= 3.0, took


async def test_dry_run_shows_held_and_pending(nc: Client, slurm: SlurmCluster) -> None:
    """`--dry-run` prints what the guard holds (with the numbers) and what is pending with
    its time; Slurm stays as it was."""
    yaml = catalog("for: 0s, resume_after: 0s", "  guard: {max_drained: 1}").replace(
        "exports:\n", "exports:\n  features: {tagged: {when: 'fs_healthy', settle: 30s}}\n")
    out = io.StringIO()
    await publish_catalog(nc, load_catalog_text(yaml))
    async with running_projector(nc), loaded_view(nc, 20) as view:
        b = SlurmBridge(view, SlurmDoor(SlurmCommands(env=slurm.env, timeout=20)),
                        interval=1.0, min_gap=0.05, dry_run=True, out=out)
        stop = asyncio.Event()
        task = asyncio.create_task(b.run(stop))
        try:
            await eventually(lambda: b.gated is not None, 20, "a first cycle")
            await report_all(nc, False, 1, ["node001", "node002", "node003"])
            await report_all(nc, True, 1, ["node004"])
            await eventually(lambda: "# pending: node004" in out.getvalue()
                             and "# held: node003" in out.getvalue(), 20, "held and pending")
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    text = out.getvalue()
    assert "# held: 3 of 20 nodes would drain; limit 1 (2 held)" in text
    assert "# held: node002 drains (scratch file system unhealthy)" in text
    assert re.search(r"# pending: node004 features -> tagged in (29|30)s unless the value "
                     r"goes back", text), text
    assert "scontrol update NodeName=node001 State=DRAIN" in text
    assert drained(slurm) == set()
    assert b.door.status.changes == 0
