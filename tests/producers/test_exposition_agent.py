"""Exposition reporters in a real agent, against a real node_exporter and real collector scripts.

A real `prometheus-node-exporter` (skipped, with the reason, where it is not installed)
serves its filesystem and textfile collectors on a loopback port; a real agent on a real
nats-server scrapes it (`type: scrape`), reads the same textfile directory (`type:
textfile`), and runs a script whose stdout is the exposition (`format: prometheus`).  What
crr reports must equal node_exporter's own series; events are read on the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from crr.commands import health
from crr.producers.exposition import Exposition, evaluate, parse_exposition
from crr.schemas.catalog import Catalog
from crr.schemas.catalog_loader import catalog_from_mapping, load_catalog
from crr.schemas.events import Attribute, Report
from crr.schemas.exposition import compile_mapping
from crr.schemas.wire_time import parse_time
from tests.support.agent import Recorder, running_agent, write_script
from tests.support.faults import eventually
from tests.support.node_exporter import COLLECTORS, NodeExporter, running_node_exporter
from tests.support.projector import publish_catalog, running_projector

GIB = 1024**3
ROOT = Path(__file__).resolve().parents[2]
DCGM = ROOT / "tests" / "fixtures" / "dcgm"
EXAMPLE = ROOT / "ops" / "examples" / "gpu-node.yaml"


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[NodeExporter]:
    """node_exporter with the test's own textfile directory (`tmp_path/textfile`)."""
    directory = tmp_path / "textfile"
    directory.mkdir()
    with running_node_exporter(directory) as exporter:
        yield exporter


def write_atomically(path: Path, text: str) -> None:
    """As textfile-collector cron jobs do: a temporary name, then a rename into place."""
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(text)
    tmp.rename(path)


def run_collector(name: str, *args: str) -> str:
    """The stdout of one of Debian's prometheus-node-exporter-collectors scripts."""
    script = COLLECTORS / name
    if not os.access(script, os.X_OK):
        pytest.skip(f"{script} not installed (Debian: prometheus-node-exporter-collectors)")
    done = subprocess.run([str(script), *args], capture_output=True, timeout=30, check=True)
    return done.stdout.decode()


def catalog(reporter: str, spec: dict[str, Any], kinds: dict[str, str]) -> Catalog:
    """A validated catalog (as `crr catalog apply` checks it): one reporter owning `kinds`."""
    return catalog_from_mapping({
        "version": 1, "reporters": {reporter: spec},
        "resources": {name: {"kind": kind, "reporter": reporter} for name, kind in kinds.items()}})


def last_values(recorder: Recorder, reporter: str) -> dict[str, Any]:
    """The values of `reporter`'s newest report."""
    event = recorder.reports(reporter)[-1].event
    assert isinstance(event, Report)
    return dict(event.values)


def value(expo: Exposition, mapping: str) -> Any:
    """What `mapping` gives over node_exporter's own scrape."""
    return evaluate(compile_mapping(mapping), expo).value


def fill_textfile_dir(exporter: NodeExporter, data: Path) -> None:
    """Real collector outputs (directory-size.sh over `data`, fstab-check.sh) and a site file."""
    data.mkdir()
    (data / "weights.bin").write_bytes(b"\0" * 300_000)
    write_atomically(exporter.textfile_dir / "directory_size.prom",
                     run_collector("directory-size.sh", str(data)))
    write_atomically(exporter.textfile_dir / "fstab.prom", run_collector("fstab-check.sh"))
    write_atomically(exporter.textfile_dir / "site.prom",
                     '# TYPE site_dataset_cached gauge\nsite_dataset_cached{name="imagenet"} 1\n'
                     'site_dataset_cached{name="c4"} 1\n# TYPE site_ok gauge\nsite_ok 1\n')


async def test_scrape_equals_node_exporter(
        nats_url: str, tmp_path: Path, node_exporter: NodeExporter) -> None:
    """A scrape reporter's values equal node_exporter's own series (filesystems, textfiles)."""
    fill_textfile_dir(node_exporter, tmp_path / "data")
    first = parse_exposition(node_exporter.scrape())
    mount = sorted(labels["mountpoint"]
                   for labels, _ in first.series["node_filesystem_size_bytes"])[0]
    data = str(tmp_path / "data")
    mappings = {
        "fs_size_gib": f'node_filesystem_size_bytes{{mountpoint="{mount}"}} / {GIB}',
        "fs_files": f'node_filesystem_files{{mountpoint="{mount}"}}',
        "fs_avail": f'node_filesystem_avail_bytes{{mountpoint="{mount}"}}',
        "mounts": "labels(node_filesystem_size_bytes, mountpoint)",
        "data_bytes": f'node_directory_size_bytes{{directory="{data}"}}',
        "datasets": "labels(site_dataset_cached, name)",
        "textfiles_ok": "max(node_textfile_scrape_error) == 0",
    }
    kinds = {"fs_size_gib": "numeric", "fs_files": "numeric", "fs_avail": "numeric",
             "mounts": "string_set", "data_bytes": "numeric", "datasets": "string_set",
             "textfiles_ok": "boolean"}
    cat = catalog("node", {
        "type": "scrape", "url": node_exporter.url.replace("http://", "http://crr:s3cret@"),
        "interval": "0.3s", "timeout": "5s", "max_output_bytes": 4 << 20, "series": mappings,
    }, kinds)
    async with running_agent(nats_url, cat, tmp_path) as rig:
        await rig.recorder.wait_state("node", "ok")
        await rig.recorder.wait_reports("node", 1)
    got = last_values(rig.recorder, "node")
    own = parse_exposition(node_exporter.scrape())
    for name in ("fs_size_gib", "fs_files", "mounts", "data_bytes", "datasets", "textfiles_ok"):
        assert got[name] == value(own, mappings[name]), name
    assert got["datasets"] == ["c4", "imagenet"]
    assert got["data_bytes"] >= 300_000
    # Free space moves as others write: crr's value lies between node_exporter's before and after.
    avail = [value(first, mappings["fs_avail"]), value(own, mappings["fs_avail"])]
    assert min(avail) * 0.99 <= got["fs_avail"] <= max(avail) * 1.01


async def test_textfile_reporter_reads_what_node_exporter_reads(
        nats_url: str, tmp_path: Path, node_exporter: NodeExporter) -> None:
    """The same directory read by crr (`type: textfile`) and by node_exporter: same series;
    the report's observation time is the oldest file's mtime, as node_exporter shows it."""
    fill_textfile_dir(node_exporter, tmp_path / "data")
    data = str(tmp_path / "data")
    cat = catalog("files", {
        "type": "textfile", "directory": str(node_exporter.textfile_dir), "interval": "0.3s",
        "timeout": "5s", "series": {
            "data_bytes": f'node_directory_size_bytes{{directory="{data}"}}',
            "datasets": "labels(site_dataset_cached, name)", "site_ok": "site_ok == 1",
            "fstab_mounts": "labels(node_fstab_mount_status, mountpoint)"},
    }, {"data_bytes": "numeric", "datasets": "string_set", "site_ok": "boolean",
        "fstab_mounts": "string_set"})
    async with running_agent(nats_url, cat, tmp_path) as rig:
        await rig.recorder.wait_state("files", "ok")
        await rig.recorder.wait_reports("files", 1)
    own = parse_exposition(node_exporter.scrape())
    got = last_values(rig.recorder, "files")
    # fstab-check.sh declares its family even with no entries (crr: the empty set); node_exporter
    # leaves an empty family out of its scrape.
    fstab = sorted({labels["mountpoint"]
                    for labels, _ in own.series.get("node_fstab_mount_status", [])})
    assert got == {"data_bytes": value(own, f'node_directory_size_bytes{{directory="{data}"}}'),
                   "datasets": ["c4", "imagenet"], "site_ok": True, "fstab_mounts": fstab}
    event = rig.recorder.reports("files")[-1].event
    assert isinstance(event, Report)
    oldest = value(own, "min(node_textfile_mtime_seconds)")  # whole seconds there
    assert oldest <= parse_time(event.observed_at) < oldest + 1


async def test_bad_prom_file_keeps_the_last_values(
        nats_url: str, tmp_path: Path) -> None:
    """A .prom syntax error: Health `bad_output` names file and line; the last values stay;
    a declared series that disappears is named `missing` and left out of the report."""
    directory = tmp_path / "textfile"
    directory.mkdir()
    write_atomically(directory / "site.prom", "site_ok 1\nsite_temp 41\n")
    cat = catalog("files", {
        "type": "textfile", "directory": str(directory), "interval": "0.2s",
        "series": {"site_ok": "site_ok == 1", "site_temp": "site_temp"},
    }, {"site_ok": "boolean", "site_temp": "numeric"})
    async with running_agent(nats_url, cat, tmp_path) as rig:
        await rig.recorder.wait_state("files", "ok")
        write_atomically(directory / "site.prom", "site_ok 0\nsite_temp{ 41\n")
        bad = await rig.recorder.wait_state("files", "bad_output")
        await rig.recorder.wait_more_reports("files", 1)
        assert last_values(rig.recorder, "files") == {"site_ok": True, "site_temp": 41.0}
        assert bad.detail is not None
        assert bad.detail.startswith("site.prom:2: not the Prometheus exposition format")
        write_atomically(directory / "site.prom", "site_ok 1\nsite_temp 42\n")
        await rig.recorder.wait("ok again", lambda: rig.recorder.states("files")[-1] == "ok")
        # A new exporter version renamed the metric: site_temp is missing.
        write_atomically(directory / "site.prom", "site_ok 1\nsite_temperature 42\n")
        await rig.recorder.wait("bad_output after ok",
                                lambda: rig.recorder.states("files")[-1] == "bad_output")
        await rig.recorder.wait_more_reports("files", 1)
        health = rig.recorder.health("files")[-1]
    assert last_values(rig.recorder, "files") == {"site_ok": True}
    assert health.detail == ("site_temp: series site_temp: missing (site_temp is not in the "
                             "exposition)")


async def test_failed_scrape_is_failed_with_the_reason(
        nats_url: str, tmp_path: Path) -> None:
    """A scrape that cannot connect makes the reporter `failed`, reason in the detail, and the
    URL's credentials are never shown."""
    (tmp_path / "tf").mkdir()
    with running_node_exporter(tmp_path / "tf") as exporter:
        url = exporter.url  # stopped on leaving the block: nothing listens there any more
    cat = catalog("node", {
        "type": "scrape", "url": url.replace("http://", "http://crr:s3cret@"),
        "interval": "0.2s", "timeout": "1s", "backoff_floor": 0.05, "backoff_cap": 0.1,
        "series": {"up": "count(node_filesystem_size_bytes)"},
    }, {"up": "numeric"})
    async with running_agent(nats_url, cat, tmp_path) as rig:
        failed = await rig.recorder.wait_state("node", "failed")
    assert failed.detail is not None
    assert failed.detail.startswith(f"scrape of {url} failed: ")
    assert "s3cret" not in failed.detail
    assert "crr:" not in failed.detail
    assert rig.recorder.reports("node") == []


async def test_script_with_prometheus_output(nats_url: str, tmp_path: Path) -> None:
    """`format: prometheus`: a script's stdout is the exposition (here a real collector's)."""
    script = COLLECTORS / "directory-size.sh"
    if not os.access(script, os.X_OK):
        pytest.skip(f"{script} not installed (Debian: prometheus-node-exporter-collectors)")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 50_000)
    write_script(tmp_path, "dirsize.sh", f"#!/bin/sh\nexec {script} {tmp_path / 'd'}\n")
    cat = catalog("dirsize", {
        "command": ["dirsize.sh"], "format": "prometheus", "interval": "0.3s", "timeout": "5s",
        "series": {"d_bytes": "sum(node_directory_size_bytes)"},
    }, {"d_bytes": "numeric"})
    async with running_agent(nats_url, cat, tmp_path) as rig:
        await rig.recorder.wait_state("dirsize", "ok")
        await rig.recorder.wait_reports("dirsize", 1)
    want = value(parse_exposition(run_collector("directory-size.sh", str(tmp_path / "d"))),
                 "sum(node_directory_size_bytes)")
    assert last_values(rig.recorder, "dirsize") == {"d_bytes": want}


async def test_crr_health_shows_failed_scrape_and_missing_series(
        nc: Client, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a real projector: `crr health` shows the failed scrape with its reason, and a
    series that disappeared as the reporter's `bad_output` detail and, once its value has
    expired, as a missing resource."""
    (tmp_path / "tf").mkdir()
    with running_node_exporter(tmp_path / "tf") as exporter:
        url = exporter.url  # nothing listens there once the block is left
    directory = tmp_path / "textfile"
    directory.mkdir()
    write_atomically(directory / "site.prom", "site_temperature 41\n")  # renamed: site_temp
    cat = catalog_from_mapping({"version": 1, "resources": {
        "up": {"kind": "numeric", "reporter": "node"},
        "site_temp": {"kind": "numeric", "reporter": "files", "interval": "0.2s"}},
        "reporters": {
            "node": {"type": "scrape", "url": url, "interval": "0.2s", "timeout": "1s",
                     "backoff_floor": 0.05, "backoff_cap": 0.1,
                     "series": {"up": "count(node_filesystem_size_bytes)"}},
            "files": {"type": "textfile", "directory": str(directory), "interval": "0.2s",
                      "series": {"site_temp": "site_temp"}}}})
    async with running_projector(nc) as projector:
        await projector.wait_until(await publish_catalog(nc, cat))
        async with running_agent(nats_url, cat, tmp_path) as rig:
            await rig.recorder.wait_state("node", "failed")
            await rig.recorder.wait_state("files", "bad_output")

            async def rows() -> dict[str, dict[str, Any]] | None:
                await health.run(argparse.Namespace(server=nats_url, creds=None, tls_ca=None,
                                                    reporter=None, json=True))
                got = {r["reporter"]: r for r in json.loads(capsys.readouterr().out)}
                done = got.get("files", {}).get("missing") and "node" in got
                return got if done else None

            got = await eventually(rows, 10, "crr health rows of node and files")
    assert got["node"]["state"] == "failed"
    assert got["node"]["detail"].startswith(f"scrape of {url} failed: ")
    assert got["files"]["state"] == "bad_output"
    assert got["files"]["detail"] == ("site_temp: series site_temp: missing (site_temp is not "
                                      "in the exposition)")
    assert got["files"]["missing"] == ["site_temp"]
    assert got["files"]["failing"] is True


async def test_dcgm_scrape_publishes_values_and_inventory(nats_url: str, tmp_path: Path) -> None:
    """A real agent scraping a dcgm-exporter output (served over HTTP): the values, and an
    Inventory event of 8 devices in the pool `<host>/<reporter>`; GPU 5 gone: 7 devices,
    a new pool generation."""
    body = {"now": (DCGM / "a100x8.prom").read_bytes()}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body["now"])
            await writer.drain()
        finally:
            writer.close()

    gpu_node = load_catalog(EXAMPLE)
    async with await asyncio.start_server(handle, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        dcgm = msgspec.structs.replace(gpu_node.reporters["dcgm"], interval=0.2,
                                       url=f"http://127.0.0.1:{port}/metrics")
        cat = Catalog(resources={n: gpu_node.resources[n] for n in gpu_node.resources_of("dcgm")},
                      reporters={"dcgm": dcgm})
        async with running_agent(nats_url, cat, tmp_path) as rig:
            await rig.recorder.wait_state("dcgm", "ok")
            await rig.recorder.wait("an inventory", lambda: bool(rig.recorder.inventories("dcgm")))
            first = rig.recorder.inventories("dcgm")[-1]
            body["now"] = (DCGM / "a100x8-gpu5-missing.prom").read_bytes()
            await rig.recorder.wait(
                "an inventory of 7", lambda: len(rig.recorder.inventories("dcgm")[-1].devices) == 7)
            second = rig.recorder.inventories("dcgm")[-1]
    assert first.pool.name == "node1/dcgm"
    assert [d.name for d in first.devices] == [f"gpu{i}" for i in range(8)]
    assert first.devices[0].attributes["model"] == Attribute(string="NVIDIA A100 80GB PCIe")
    assert second.pool.generation == first.pool.generation + 1
    values = last_values(rig.recorder, "dcgm")
    assert values["gpu_count"] == 7.0
    assert values["gpu_xid_clear"] is True
