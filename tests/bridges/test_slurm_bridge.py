"""The Slurm bridge end to end: reports → projector → view → bridge → a real slurmctld."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator

import msgspec
from nats.aio.client import Client

from crr.bridges.slurm import SlurmCommands, SlurmDoor
from crr.bridges.slurm_bridge import SlurmBridge
from crr.schemas.catalog_loader import load_catalog_text
from crr.view.scheduler_view import SchedulerView, loaded_view
from tests.support.cli import crr
from tests.support.faults import eventually
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.slurm import SlurmCluster

CATALOG_YAML = """
version: 1
resources:
  scratch_free: {kind: numeric, scope: host, reporter: scratch, interval: 60s, min: 0}
  datasets:     {kind: string_set, scope: host, reporter: datasets, interval: 60s}
  fs_healthy:   {kind: boolean, scope: host, reporter: scratch, interval: 60s}
  blink_sets:   {kind: string_set, scope: host, reporter: blinker, interval: 400ms}
reporters:
  scratch:  {type: external, interval: 60s}
  datasets: {type: external, interval: 60s}
  blinker:  {type: external, interval: 400ms}
exports:
  features:
    imagenet_cached: 'datasets has "imagenet"'
    big_scratch: 'scratch_free > 500 && defined(scratch_free)'
    blinking: 'blink_sets has "x"'
  drain:
    - {when: '!fs_healthy', reason: 'scratch file system unhealthy', resume_after: 0s}
"""
CATALOG = load_catalog_text(CATALOG_YAML)


@contextlib.asynccontextmanager
async def bridge(nc: Client, slurm: SlurmCluster, **kw: object,
                 ) -> AsyncIterator[tuple[SlurmBridge, SchedulerView]]:
    """Projector, view and bridge (1 s drift interval) running until the block ends."""
    await publish_catalog(nc, CATALOG)
    async with running_projector(nc), loaded_view(nc, 20) as view:
        door = SlurmDoor(SlurmCommands(env=slurm.env, timeout=20))
        b = SlurmBridge(view, door, interval=1.0, min_gap=0.05, **kw)  # type: ignore[arg-type]
        stop = asyncio.Event()
        task = asyncio.create_task(b.run(stop))
        try:
            yield b, view
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def shows(slurm: SlurmCluster, node: str, features: set[str], state: str = "idle", *,
                reason: str = "", timeout: float = 20.0) -> None:
    """Until `sinfo --format` shows `node` with these active features, state and reason."""
    want = (features, state, reason)
    await eventually(lambda: slurm.features()[node] == want, timeout,
                     f"sinfo shows {node} as {want}")


async def test_features_and_drain_follow_reports(nc: Client, slurm: SlurmCluster) -> None:
    """A report turns features on, a later one off; an unhealthy file system drains with
    crr's reason and a healthy one resumes; the admin's static feature stays throughout;
    `sbatch --test-only --constraint` picks exactly `crr select`'s hosts."""
    async with bridge(nc, slurm) as (_b, view):
        for i, host in enumerate(["node001", "node002", "node003"], 1):
            await publish_report(nc, "datasets", host, {"datasets": ["imagenet"]}, seq=i)
        await publish_report(nc, "scratch", "node004",
                             {"scratch_free": 900, "fs_healthy": False}, seq=1)
        await shows(slurm, "node003", {"admin_static", "imagenet_cached"})
        await shows(slurm, "node004", {"admin_static", "big_scratch"}, "drained",
                    reason="crr: scratch file system unhealthy")
        selected = view.select('datasets has "imagenet"')
        ran = slurm.sbatch_test_only(f"-N{len(selected)}", "--constraint=imagenet_cached")
        assert "node[001-003]" in ran.stderr
        assert selected == ["node001", "node002", "node003"]
        assert slurm.sbatch_test_only(f"-N{len(selected) + 1}",
                                      "--constraint=imagenet_cached").returncode != 0
        await publish_report(nc, "datasets", "node002", {"datasets": ["c4"]}, seq=10)
        await publish_report(nc, "scratch", "node004", {"fs_healthy": True}, seq=2)
        await shows(slurm, "node002", {"admin_static"})
        await shows(slurm, "node004", {"admin_static", "big_scratch"})


async def test_stale_value_drops_the_feature(nc: Client, slurm: SlurmCluster) -> None:
    """A value that goes stale (its reporter stopped) is unknown in select[], so the
    feature goes too — Slurm's own features would linger forever."""
    async with bridge(nc, slurm):
        await publish_report(nc, "blinker", "node007", {"blink_sets": ["x"]}, seq=1)
        await shows(slurm, "node007", {"admin_static", "blinking"}, timeout=10)
        await shows(slurm, "node007", {"admin_static"}, timeout=10)


async def test_forgotten_host_and_restart(nc: Client, nats_url: str, slurm: SlurmCluster,
                                          ) -> None:
    """`crr hosts forget` removes crr's features and lifts crr's drain; a slurmctld
    restart wipes the features and the bridge puts them back; the admin's drain on
    another node is never lifted."""
    slurm.scontrol("update", "NodeName=node010", "State=DRAIN", "Reason=admin: psu")
    async with bridge(nc, slurm):
        await publish_report(nc, "datasets", "node009", {"datasets": ["imagenet"]}, seq=1)
        await publish_report(nc, "scratch", "node008", {"fs_healthy": False}, seq=1)
        await publish_report(nc, "scratch", "node010", {"fs_healthy": True}, seq=2)
        await shows(slurm, "node009", {"admin_static", "imagenet_cached"})
        await shows(slurm, "node008", {"admin_static"}, "drained",
                    reason="crr: scratch file system unhealthy")
        slurm.restart_slurmctld()
        await shows(slurm, "node009", {"admin_static", "imagenet_cached"})
        ran = await crr("hosts", "forget", "node008", "node009", "--server", nats_url)
        assert ran.code == 0, ran.err
        await shows(slurm, "node009", {"admin_static"})
        await shows(slurm, "node008", {"admin_static"})
        assert slurm.features()["node010"] == ({"admin_static"}, "drained", "admin: psu")


async def test_dry_run_prints_and_changes_nothing(nc: Client, slurm: SlurmCluster) -> None:
    """--dry-run prints the batched scontrol updates it would run; Slurm stays as it was."""
    out = io.StringIO()
    async with bridge(nc, slurm, dry_run=True, out=out) as (b, _view):
        for i, host in enumerate(["node011", "node012", "node013", "node015"], 1):
            await publish_report(nc, "datasets", host, {"datasets": ["imagenet"]}, seq=i)
        await eventually(lambda: "node[011-013,015]" in out.getvalue(), 20, "dry-run diff")
        assert b.door.status.changes == 0
    line = next(ln for ln in out.getvalue().splitlines() if "node[011-013,015]" in ln)
    assert line == ("scontrol update NodeName=node[011-013,015] "
                    "AvailableFeatures=admin_static,imagenet_cached "
                    "ActiveFeatures=admin_static,imagenet_cached")
    assert slurm.features()["node011"][0] == {"admin_static"}


async def test_bad_exports_keep_the_last_good_plan(nc: Client, slurm: SlurmCluster) -> None:
    """A catalog change under which an export no longer type-checks keeps the last good
    plan (features stay applied) and says so in the status."""
    async with bridge(nc, slurm) as (b, view):
        await publish_report(nc, "datasets", "node014", {"datasets": ["imagenet"]}, seq=1)
        await shows(slurm, "node014", {"admin_static", "imagenet_cached"})
        # `crr catalog apply` refuses such a catalog; another writer (an older crr, a
        # hand-made publish) may not: datasets turned numeric, `has` no longer applies.
        datasets = msgspec.structs.replace(CATALOG.resources["datasets"], kind="numeric")
        changed = msgspec.structs.replace(
            CATALOG, resources={**CATALOG.resources, "datasets": datasets})
        await publish_catalog(nc, changed)
        await eventually(lambda: b.status.plan_error is not None, 20, "plan error noted")
        assert "exports.features.imagenet_cached" in str(b.status.plan_error)
        assert "keeping the last good plan" in str(b.status.plan_error)
        assert view.catalog is not None
        assert slurm.features()["node014"][0] == {"admin_static", "imagenet_cached"}
