"""`crr bridge nfd|condor|elim` end to end: real nats-server, real projector, real `crr` processes.

Given a catalog with exports and reports for a host, when a bridge runs for that
host, then its target (the NFD feature file, the startd cron stream, the elim
line) follows the reports and their staleness, the bridge's health shows in the
host's record as reporter `bridge-<door>`, and SIGTERM stops it within 2 s in
every state (waiting for a catalog, following).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.projections.exports import export_problems
from crr.schemas.catalog_loader import load_catalog_text
from tests.support.cli import ROOT, cli_env, crr
from tests.support.faults import CrrProcess, eventually
from tests.support.projector import publish_catalog, publish_report, running_projector, stored_host

CATALOG_YAML = """
resources:
  scratch_free: {kind: numeric, reporter: ext, interval: 60s}
  datasets: {kind: string_set, reporter: ext, interval: 60s}
  fs_healthy: {kind: boolean, reporter: ext, interval: 60s}
  blink: {kind: numeric, reporter: blinker, interval: 1s, grace: 0s}
reporters:
  ext: {type: external, interval: 60s}
  blinker: {type: external, interval: 1s}
exports:
  features:
    imagenet_cached: 'datasets has "imagenet"'
    big_scratch: 'scratch_free > 500'
    blinking: 'blink > 0'
  drain:
    - when: '!fs_healthy'
      reason: 'scratch file system unhealthy'
  values: [scratch_free, datasets, blink]
"""
CATALOG = load_catalog_text(CATALOG_YAML, exports_check=export_problems)
PREFIX = "feature.node.kubernetes.io/crr-"


@pytest.fixture
async def world(nc: Client) -> AsyncIterator[Client]:
    """A running projector with the exports catalog active and host n1 reported."""
    async with running_projector(nc) as projector:
        seq = await publish_catalog(nc, CATALOG)
        await publish_report(nc, "ext", "n1", {"scratch_free": 812.5,
                                               "datasets": ["imagenet"], "fs_healthy": True})
        await projector.wait_until(seq + 1, 10)
        yield nc


def _stop_within(proc: CrrProcess, seconds: float) -> int | None:
    started = time.monotonic()
    code = proc.stop(timeout=seconds)
    assert time.monotonic() - started < seconds, proc.output()
    return code


async def test_elim_once_prints_the_load_update_string(world: Client, nats_url: str) -> None:
    """`--once`: one line with the features, the drain flag and the values."""
    ran = await crr("bridge", "elim", "--host", "n1", "--once", "--no-health",
                    "--server", nats_url)
    assert ran.code == 0, ran.err
    assert ran.out == ("7 crr_big_scratch 1 crr_blinking 0 crr_imagenet_cached 1 crr_drained 0 "
                       "scratch_free 812.5 datasets imagenet blink -\n")


async def test_nfd_bridge_follows_reports_staleness_and_stops(world: Client, nats_url: str,
                                                              tmp_path: Path) -> None:
    """The feature file follows a new report and a value going stale; health is published;
    SIGTERM ends the bridge within 2 s."""
    features = tmp_path / "features.d"
    features.mkdir()
    proc = CrrProcess(["bridge", "nfd", "--host", "n1", "--dir", str(features),
                       "--server", nats_url], tmp_path / "nfd.log").start()
    try:
        path = features / "crr"

        def labels() -> str:
            return path.read_text() if path.exists() else ""

        await eventually(lambda: f"{PREFIX}imagenet_cached=true" in labels(), 20, "first file")
        assert f"{PREFIX}big_scratch=true" in labels()
        await publish_report(world, "ext", "n1", {"fs_healthy": False}, seq=2)
        await eventually(lambda: f"{PREFIX}drained=true" in labels(), 10, "drained label")
        await publish_report(world, "blinker", "n1", {"blink": 3.0})
        await eventually(lambda: f"{PREFIX}blinking=true" in labels(), 10, "blinking label")
        # blink goes stale after 1 s (no grace): the label goes by expiry, without a report.
        await eventually(lambda: f"{PREFIX}blinking" not in labels(), 10, "stale label gone")

        async def health() -> bool:
            _, rec = await stored_host(world, "n1")
            status = rec.reporters.get("bridge-nfd")
            return status is not None and status.health == "ok"

        await eventually(health, 10, "bridge-nfd health in the host record")
        assert list(features.iterdir()) == [path]  # no temp file left behind
    finally:
        code = _stop_within(proc, 2.0)
    assert code == 0, proc.output()


async def test_condor_bridge_streams_blocks_and_stops(world: Client, nats_url: str) -> None:
    """A block per update ending with '-'; a change brings a new block; SIGTERM ends it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "bridge", "condor", "--host", "n1", "--no-health",
        "--server", nats_url, cwd=ROOT, env=cli_env(), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None

        async def block() -> list[str]:
            assert proc.stdout is not None
            lines: list[str] = []
            while (line := (await proc.stdout.readline()).decode()) != "-\n":
                assert line, "stream ended"
                lines.append(line.rstrip("\n"))
            return lines

        first = await asyncio.wait_for(block(), 20)
        assert "crr_scratch_free = 812.5" in first
        assert "crr_drained = false" in first
        await publish_report(world, "ext", "n1", {"scratch_free": None}, seq=2)
        second = await asyncio.wait_for(block(), 10)
        assert "crr_scratch_free = undefined" in second
        assert "crr_big_scratch = false" in second
    finally:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 2.0)
        assert time.monotonic() - started < 2.0
    assert code == 0


async def test_bridge_without_a_catalog_stops_on_sigterm(nc: Client, nats_url: str,
                                                         tmp_path: Path) -> None:
    """No catalog yet: the bridge waits (and says so), and SIGTERM still ends it within 2 s."""
    proc = CrrProcess(["bridge", "elim", "--host", "n1", "--no-health", "--server", nats_url,
                       "--log-level", "INFO"], tmp_path / "elim.log").start()
    await eventually(lambda: "no valid exports yet" in proc.output(), 20, "waiting message")
    assert _stop_within(proc, 2.0) == 0


async def test_bad_dir_is_one_line(tmp_path: Path) -> None:
    """A features directory that does not exist: one line, exit 1, before connecting."""
    ran = await crr("bridge", "nfd", "--host", "n1", "--dir", str(tmp_path / "nope"),
                    "--server", "nats://127.0.0.1:1")
    assert ran.code == 1
    assert ran.err_lines == [f"crr bridge: error: crr bridge nfd --dir: {tmp_path / 'nope'}: "
                             "not a directory (nfd-worker's features.d)"]


async def test_bad_catalog_apply_names_the_export(tmp_path: Path) -> None:
    """`crr catalog apply --dry-run` reports export errors with their path (no server needed)."""
    bad = tmp_path / "resources.yaml"
    bad.write_text(CATALOG_YAML.replace("'scratch_free > 500'", "'scratch_fre > 500'"))
    ran = await crr("catalog", "apply", str(bad), "--dry-run")
    assert ran.code == 1
    assert any(line.strip().startswith("exports.features.big_scratch: unknown resource "
                                       "'scratch_fre'") for line in ran.err_lines), ran.err
