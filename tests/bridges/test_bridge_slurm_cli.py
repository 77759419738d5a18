"""`crr bridge slurm` as an operator runs it: --once/--json/--dry-run, and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import pytest
from nats.aio.client import Client

from crr.admin.forget import wait_for_position
from tests.support.cli import cli_env, crr
from tests.support.faults import CrrProcess, eventually
from tests.support.projector import (
    publish_catalog,
    publish_report,
    running_projector,
)
from tests.support.slurm import SlurmCluster


async def test_once_json_reads_every_node(nc: Client, nats_url: str, slurm: SlurmCluster,
                                          ) -> None:
    """One dry-run cycle reads the 20 nodes, changes nothing, says so, exits 0."""
    await publish_catalog(nc)
    async with running_projector(nc):
        ran = await crr("bridge", "slurm", "--once", "--dry-run", "--json",
                        "--server", nats_url, env=cli_env(**slurm.env))
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert lines[0] == "# slurm: nothing to change"
    status = json.loads(lines[-1])
    assert status["nodes"] == 20
    assert status["healthy"] is True
    assert status["dry_run"] is True


async def test_once_with_slurmctld_down_fails_in_one_line(nc: Client, nats_url: str,
                                                          slurm: SlurmCluster) -> None:
    """--once when slurmctld is down: exit 1 with one line naming the command."""
    await publish_catalog(nc)
    slurm.stop_slurmctld()
    async with running_projector(nc):
        ran = await crr("bridge", "slurm", "--once", "--server", nats_url, "--timeout", "5s",
                        env=cli_env(**slurm.env))
    assert ran.code == 1
    assert ran.err_lines[-1].startswith("crr bridge slurm: error: scontrol"), ran.err


async def _stops_within(nats_url: str, slurm: SlurmCluster, bound: float) -> float:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crr.cli", "bridge", "slurm", "--server", nats_url,
        "--interval", "1s", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=cli_env(**slurm.env))
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 30)
    assert b"following the snapshot" in line, line
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(proc.wait(), 10)
    took = time.monotonic() - t0
    assert code == 0, (await proc.stderr.read()).decode()
    assert took < bound, took
    return took


async def test_sigterm_stops_within_two_seconds(nc: Client, nats_url: str,
                                                slurm: SlurmCluster) -> None:
    """SIGTERM ends the bridge within 2 s, with slurmctld up and with it down (a hung
    scontrol is killed, not waited for)."""
    await publish_catalog(nc)
    async with running_projector(nc):
        await _stops_within(nats_url, slurm, 2.0)
        slurm.stop_slurmctld()
        await _stops_within(nats_url, slurm, 2.0)


async def test_bridge_health_in_crr_health(nc: Client, nats_url: str, slurm: SlurmCluster,
                                           ) -> None:
    """`crr health` lists the bridge: `failed` with the cause while slurmctld is down (the
    bridge keeps running), `ok` once it is back, `stopped` after SIGTERM."""
    await publish_catalog(nc)
    slurm.stop_slurmctld()

    async def row() -> dict[str, object] | None:
        ran = await crr("health", "--json", "--reporter", "bridge-slurm", "--server", nats_url)
        rows = [r for r in json.loads(ran.out) if r["reporter"] == "bridge-slurm"]
        return rows[0] if rows else None

    async def state_is(state: str) -> dict[str, object] | None:
        r = await row()
        return r if r is not None and r["state"] == state else None

    async with running_projector(nc):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crr.cli", "bridge", "slurm", "--server", nats_url,
            "--interval", "1s", "--timeout", "3s", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env=cli_env(**slurm.env))
        try:
            failed = await eventually(lambda: state_is("failed"), 40, "bridge failed in health")
            assert "scontrol" in str(failed["detail"])
            assert proc.returncode is None
            slurm.start_slurmctld()
            ok = await eventually(lambda: state_is("ok"), 60, "bridge ok in health")
            assert "20 Slurm nodes" in str(ok["detail"])
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        await eventually(lambda: state_is("stopped"), 20, "bridge stopped in health")


EXPORTS_YAML = """
version: 1
resources:
  datasets:   {kind: string_set, scope: host, reporter: datasets, interval: 60s}
  fs_healthy: {kind: boolean, scope: host, reporter: scratch, interval: 60s}
reporters:
  datasets: {type: external, interval: 60s}
  scratch:  {type: external, interval: 60s}
exports:
  features:
    imagenet_cached: 'datasets has "imagenet"'
  drain:
    - when: '!fs_healthy'
      reason: 'scratch file system unhealthy'
"""


async def test_catalog_exports_end_to_end(nc: Client, nats_url: str, slurm: SlurmCluster,
                                          tmp_path: Path) -> None:
    """`crr catalog apply` of a resources.yaml with `exports:`, reports, then
    `crr bridge slurm --once`: Slurm shows crr's feature and drain, and `sbatch
    --test-only --constraint` agrees with `crr select`."""
    spec = tmp_path / "resources.yaml"
    spec.write_text(EXPORTS_YAML)
    async with running_projector(nc):
        ran = await crr("catalog", "apply", str(spec), "--server", nats_url)
        assert ran.code == 0, ran.err
        await publish_report(nc, "datasets", "node005", {"datasets": ["imagenet"]})
        await publish_report(nc, "datasets", "node006", {"datasets": ["imagenet"]})
        last = await publish_report(nc, "scratch", "node007", {"fs_healthy": False})
        assert await wait_for_position(nc, last, 20) >= last
        ran = await crr("bridge", "slurm", "--once", "--server", nats_url,
                        env=cli_env(**slurm.env))
        assert ran.code == 0, ran.err
        selected = await crr("select", 'datasets has "imagenet"', "--json",
                             "--server", nats_url)
    assert json.loads(selected.out) == ["node005", "node006"]
    seen = slurm.features()
    assert seen["node005"][0] == {"admin_static", "imagenet_cached"}
    assert seen["node007"][1:] == ("drained", "crr: scratch file system unhealthy")
    job = slurm.sbatch_test_only("-N2", "--constraint=imagenet_cached")
    assert "node[005-006]" in job.stderr, job.stderr


async def test_bridge_serves_prometheus_metrics(nc: Client, nats_url: str,
                                                slurm: SlurmCluster, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With `OTEL_METRICS_EXPORTER=prometheus` the running bridge serves its counters:
    Slurm's 20 nodes, healthy, calls made."""
    pytest.importorskip("opentelemetry.exporter.prometheus",
                        reason="needs the prometheus extra: pip install -e '.[prometheus]'")
    from tests.projector.test_metrics_prometheus import _endpoint, _scrape_until  # noqa: PLC0415 - after the skip

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    await publish_catalog(nc)
    async with running_projector(nc):
        proc = CrrProcess(["bridge", "slurm", "--server", nats_url, "--interval", "1s"],
                          tmp_path / "bridge.log").start()
        try:
            url = await _endpoint(proc)
            await _scrape_until(url, [r"crr_bridge_slurm_nodes\{.*\} 20\.0$",
                                      r"crr_bridge_slurm_healthy\{.*\} 1\.0$",
                                      r"crr_bridge_slurm_calls_total\{.*\} [1-9]"])
        finally:
            assert proc.stop() == 0, proc.output()
