"""Bridges say what they do, and never leave a trace a trial should not (issue 40 items 1-2).

Real nats-server, real projector, real `crr bridge` processes.  Given a catalog with
no `exports:` the bridge fails at start naming the fix and the doc; given a `--host`
the snapshot does not know, `--once` fails and a long-running bridge says so once and
waits — and nothing is ever published for that host; a condor `--once` for a host
whose values are all unknown prints its block, `undefined`s included; a run says in
one line what it wrote (unless `--quiet`); a `--once` run publishes no health.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.projections.exports import export_problems
from crr.schemas.catalog_loader import load_catalog_text
from tests.bridges.test_bridge_cli import CATALOG
from tests.support.cli import cli_env, crr
from tests.support.faults import CrrProcess, eventually, stored_events
from tests.support.projector import publish_catalog, publish_report, running_projector
from tests.support.slurm import SlurmCluster

NO_EXPORTS = load_catalog_text("""
resources:
  scratch_free: {kind: numeric, reporter: ext, interval: 60s}
reporters:
  ext: {type: external, interval: 60s}
""", exports_check=export_problems)


@pytest.fixture
async def world(nc: Client) -> AsyncIterator[Client]:
    """The exports catalog active; n1 reported, n2 reported with every value unknown."""
    async with running_projector(nc) as projector:
        seq = await publish_catalog(nc, CATALOG)
        await publish_report(nc, "ext", "n1", {"scratch_free": 812.5,
                                               "datasets": ["imagenet"], "fs_healthy": True})
        last = await publish_report(nc, "ext", "n2", {"scratch_free": None, "datasets": None,
                                                      "fs_healthy": True})
        await projector.wait_until(max(seq, last), 10)
        yield nc


async def _subjects(nc: Client) -> list[str]:
    return [m.subject for m in await stored_events(nc)]


@pytest.mark.parametrize("door", [["elim"], ["condor"], ["nfd", "--dir"]])
async def test_a_catalog_without_exports_is_an_error_naming_the_fix(
        nc: Client, nats_url: str, door: list[str], tmp_path: Path) -> None:
    """No `exports:`: exit 1 with the fix and the doc, not exit 0 having written nothing."""
    if door[-1] == "--dir":
        door = [*door, str(tmp_path)]
    async with running_projector(nc) as projector:
        await projector.wait_until(await publish_catalog(nc, NO_EXPORTS), 10)
        ran = await crr("bridge", *door, "--host", "n1", "--once", "--server", nats_url)
    assert ran.code == 1, (ran.out, ran.err)
    assert ran.out == ""
    assert "has no `exports:`" in ran.err
    assert "docs/bridges.md" in ran.err
    assert "crr catalog apply" in ran.err
    assert not (tmp_path / "crr").exists()


async def test_once_for_a_host_the_snapshot_does_not_know_is_an_error(world: Client,
                                                                      nats_url: str) -> None:
    """`--host nodeZ` (a typo) with `--once`: exit 1 naming the host; nothing published."""
    ran = await crr("bridge", "elim", "--host", "nodeZ", "--once", "--server", nats_url)
    assert ran.code == 1, ran.err
    assert "host 'nodeZ' is not in crr's snapshot" in ran.err
    assert ran.out == ""
    assert not [s for s in await _subjects(world) if "nodeZ" in s]


async def test_a_long_running_bridge_for_an_unknown_host_says_so_and_creates_nothing(
        world: Client, nats_url: str, tmp_path: Path) -> None:
    """Long-running, `--host nodeZ`: said once, then it waits; its health (which created the
    phantom host `nodeZ`) is never published."""
    features = tmp_path / "features.d"
    features.mkdir()
    proc = CrrProcess(["bridge", "nfd", "--host", "nodeZ", "--dir", str(features),
                       "--server", nats_url], tmp_path / "nfd.log").start()
    try:
        await eventually(lambda: "not in crr's snapshot" in proc.output(), 20, "the warning")
        assert "waiting for it" in proc.output()
    finally:
        assert proc.stop(5.0) == 0, proc.output()
    assert proc.output().count("not in crr's snapshot") == 1
    assert not [s for s in await _subjects(world) if "nodeZ" in s]
    assert not (features / "crr").exists()


async def test_condor_once_prints_the_block_of_a_host_with_only_unknown_values(
        world: Client, nats_url: str) -> None:
    """Every exported value unknown: the block still comes, `undefined`s and all."""
    ran = await crr("bridge", "condor", "--host", "n2", "--once", "--server", nats_url)
    assert ran.code == 0, ran.err
    assert ran.out.splitlines() == [
        "crr_big_scratch = false", "crr_blinking = false", "crr_imagenet_cached = false",
        "crr_drained = false", "crr_drain_reason = undefined",
        "crr_scratch_free = undefined", "crr_datasets = undefined", "crr_blink = undefined",
        "-"]
    assert ran.err == ("crr bridge condor: wrote n2: features: none; not drained; "
                       "3 value(s), 3 unknown\n")


async def test_a_run_says_what_it_wrote_unless_quiet(world: Client, nats_url: str,
                                                     tmp_path: Path) -> None:
    """One line on stderr after a successful run; none with `--quiet`."""
    ran = await crr("bridge", "nfd", "--host", "n1", "--once", "--dir", str(tmp_path),
                    "--server", nats_url)
    assert ran.code == 0, ran.err
    assert ran.err == ("crr bridge nfd: wrote n1: features: big_scratch, imagenet_cached; "
                       "not drained; 3 value(s), 1 unknown\n")
    assert "crr-imagenet_cached=true" in (tmp_path / "crr").read_text()
    quiet = await crr("bridge", "nfd", "--host", "n1", "--once", "--quiet", "--dir",
                      str(tmp_path), "--server", nats_url)
    assert (quiet.code, quiet.out, quiet.err) == (0, "", "")


@pytest.mark.parametrize("trial", [["--once"], ["--once", "--dry-run"]])
async def test_a_trial_publishes_no_health(world: Client, nats_url: str,
                                           trial: list[str]) -> None:
    """`--once` (the README's first try) and `--dry-run` leave no `bridge-<door>` row that
    would go `silent` 45 s later and mark the host failing."""
    ran = await crr("bridge", "elim", "--host", "n1", *trial, "--server", nats_url)
    assert ran.code == 0, ran.err
    assert not [s for s in await _subjects(world) if "bridge-" in s]


@pytest.mark.slurm
async def test_a_slurm_trial_publishes_no_health(nc: Client, nats_url: str,
                                                 slurm: SlurmCluster) -> None:
    """`crr bridge slurm --once` and `--dry-run --once` (the README's first try) leave no
    `bridge-slurm` row behind."""
    async with running_projector(nc) as projector:
        await projector.wait_until(await publish_catalog(nc, CATALOG), 10)
        for trial in (["--once"], ["--once", "--dry-run"]):
            ran = await crr("bridge", "slurm", *trial, "--server", nats_url,
                            env=cli_env(**slurm.env))
            assert ran.code == 0, ran.err
    assert not [s for s in await _subjects(nc) if "bridge-" in s]
